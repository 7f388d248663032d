"""Metrics against scikit-learn (the official code calls it), hand-checked cases, and round summaries."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn import metrics as skm

from fnlcore import metrics as M
from fnlcore.errors import ConfigError, DataError

# --------------------------------------------------------------------------- strategies


@st.composite
def label_pairs(draw):
    n = draw(st.integers(1, 60))
    c = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    return rng.integers(0, c, n), rng.integers(0, c, n), c


@st.composite
def multilabel_data(draw, both_values: bool = True):
    """0/1 targets and scores; coarse scores (few distinct values) exercise ties."""
    n = draw(st.integers(2, 50))
    c = draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**32 - 1))
    levels = draw(st.sampled_from([3, 11, 1000]))
    rng = np.random.default_rng(seed)
    y = (rng.random((n, c)) < rng.uniform(0.1, 0.9, c)).astype(np.int64)
    if both_values:
        y[0, :], y[1, :] = 1, 0  # every class has a positive and a negative
    s = np.round(rng.random((n, c)) * (levels - 1)) / (levels - 1)
    return y, s.astype(np.float32)


def _sk_quiet(fn, *a, **k):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*a, **k)


# --------------------------------------------------------------------------- single-label


def test_accuracy_and_bacc_hand_case():
    y = np.array([0, 0, 0, 0, 1, 1, 2])
    p = np.array([0, 0, 0, 1, 1, 0, 2])
    assert M.accuracy(y, p) == pytest.approx(5 / 7)
    # recalls 3/4, 1/2, 1/1 -> mean 0.75
    assert M.balanced_accuracy(y, p) == pytest.approx(0.75)


def test_bacc_ignores_classes_only_predicted():
    # class 2 occurs only in y_pred: sklearn leaves it out (recall undefined)
    assert M.balanced_accuracy([0, 0, 1, 1], [0, 2, 1, 1]) == pytest.approx(0.75)


@settings(max_examples=80, deadline=None)
@given(label_pairs())
def test_accuracy_bacc_confusion_match_sklearn(data):
    y, p, c = data
    assert M.accuracy(y, p) == pytest.approx(skm.accuracy_score(y, p), abs=1e-12)
    assert M.balanced_accuracy(y, p) == pytest.approx(_sk_quiet(skm.balanced_accuracy_score, y, p), abs=1e-12)
    expected_cm = _sk_quiet(skm.confusion_matrix, y, p, labels=np.arange(c))
    np.testing.assert_array_equal(M.confusion_matrix(y, p, c), expected_cm)


def test_confusion_matrix_layout_and_errors():
    cm = M.confusion_matrix([0, 1, 1, 2], [0, 2, 1, 2], 3)
    np.testing.assert_array_equal(cm, [[1, 0, 0], [0, 1, 1], [0, 0, 1]])
    assert cm.dtype == np.int64
    with pytest.raises(DataError, match="outside 0..1"):
        M.confusion_matrix([0, 2], [0, 1], 2)
    with pytest.raises(ConfigError, match="num_classes"):
        M.confusion_matrix([0], [0], 0)


def test_label_input_errors():
    with pytest.raises(DataError, match="differ in length"):
        M.accuracy([0, 1], [0])
    with pytest.raises(DataError, match="empty"):
        M.balanced_accuracy([], [])
    with pytest.raises(DataError, match="whole numbers"):
        M.accuracy([0.5, 1.0], [0, 1])
    with pytest.raises(DataError, match="1-D"):
        M.accuracy(np.zeros((2, 2), int), np.zeros((2, 2), int))
    assert M.accuracy(np.array([0.0, 1.0]), np.array([0, 1])) == 1.0  # integral floats are fine


@settings(max_examples=60, deadline=None)
@given(st.integers(3, 60), st.integers(2, 5), st.integers(0, 2**32 - 1))
def test_macro_auc_ovr_matches_sklearn(n, c, seed):
    rng = np.random.default_rng(seed)
    y = np.r_[np.arange(c), rng.integers(0, c, n)]  # every class present
    logits = np.round(rng.normal(size=(y.size, c)), 1)  # rounding creates ties
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    per_class = np.mean([skm.roc_auc_score(y == k, probs[:, k]) for k in range(c)])
    assert M.macro_auc_ovr(y, probs) == pytest.approx(per_class, abs=1e-12)
    if c > 2:  # (for c = 2 sklearn takes its binary path, which scores class 1 only)
        expected = skm.roc_auc_score(y, probs, multi_class="ovr", average="macro", labels=np.arange(c))
        assert M.macro_auc_ovr(y, probs) == pytest.approx(expected, abs=1e-12)


def test_macro_auc_ovr_absent_class():
    y = np.array([0, 0, 1, 1])
    probs = np.array([[0.6, 0.3, 0.1], [0.5, 0.4, 0.1], [0.2, 0.7, 0.1], [0.4, 0.5, 0.1]])
    # class 2 absent: skip -> mean of the AUCs of classes 0 and 1 (both 1.0)
    assert M.macro_auc_ovr(y, probs) == pytest.approx(1.0)
    assert np.isnan(M.macro_auc_ovr(y, probs, undefined="nan"))
    with pytest.raises(ConfigError, match="undefined"):
        M.macro_auc_ovr(y, probs, undefined="drop")


# --------------------------------------------------------------------------- multi-label


def test_multilabel_bacc_hand_case():
    y = np.array([[1, 0], [1, 1], [0, 1], [0, 0]])
    probs = np.array([[0.9, 0.2], [0.4, 0.8], [0.6, 0.5], [0.1, 0.7]])
    # class 0: TPR 1/2, TNR 1/2 -> 0.5; class 1: preds [0,1,0,1] -> TPR 1/2, TNR 1/2 -> 0.5
    # 0.5 is not > 0.5: the threshold is strict, as in FedMLP
    assert M.multilabel_balanced_accuracy(y, probs) == pytest.approx(0.5)
    assert M.multilabel_balanced_accuracy(y, probs, threshold=0.45) == pytest.approx((0.5 + 0.75) / 2)


@settings(max_examples=80, deadline=None)
@given(multilabel_data())
def test_multilabel_metrics_match_sklearn_per_class(data):
    y, s = data
    c = y.shape[1]
    bacc = np.mean([skm.balanced_accuracy_score(y[:, k], s[:, k] > 0.5) for k in range(c)])
    aucs = []
    for k in range(c):
        fpr, tpr, _ = skm.roc_curve(y[:, k], s[:, k])
        aucs.append(skm.auc(fpr, tpr))
    ap = np.mean([skm.average_precision_score(y[:, k], s[:, k]) for k in range(c)])
    assert M.multilabel_balanced_accuracy(y, s) == pytest.approx(bacc, abs=1e-12)
    assert M.macro_auc(y, s) == pytest.approx(np.mean(aucs), abs=1e-12)
    assert M.macro_average_precision(y, s) == pytest.approx(ap, abs=1e-12)
    out = M.evaluate_multi_label(y, s)
    assert set(out) == {"bacc", "auc", "map"}
    assert out["map"] == pytest.approx(ap, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(multilabel_data(both_values=False))
def test_multilabel_degenerate_classes_follow_documented_rules(data):
    y, s = data
    pos = y.sum(0)
    defined = (pos > 0) & (pos < y.shape[0])
    ap_sk = np.array([_sk_quiet(skm.average_precision_score, y[:, k], s[:, k]) for k in range(y.shape[1])])
    # FedMLP's code: AP keeps sklearn's own values for single-valued classes
    assert M.macro_average_precision(y, s) == pytest.approx(ap_sk.mean(), abs=1e-12)
    if defined.all():
        return
    assert np.isnan(M.macro_auc(y, s)) and np.isnan(M.multilabel_balanced_accuracy(y, s))
    if defined.any():
        keep = np.flatnonzero(defined)
        assert M.macro_auc(y, s, undefined="skip") == pytest.approx(M.macro_auc(y[:, keep], s[:, keep]), abs=1e-12)
        assert M.macro_average_precision(y, s, undefined="skip") == pytest.approx(ap_sk[keep].mean(), abs=1e-12)
        assert M.multilabel_balanced_accuracy(y, s, undefined="skip") == pytest.approx(
            M.multilabel_balanced_accuracy(y[:, keep], s[:, keep]), abs=1e-12
        )
    else:
        assert np.isnan(M.macro_auc(y, s, undefined="skip"))


def test_auc_and_ap_hand_case_with_ties():
    y = np.array([[0], [0], [1], [1], [1]])
    s = np.array([[0.1], [0.5], [0.5], [0.8], [0.3]])
    # pairs (pos, neg): 0.5 vs 0.1 win, 0.5 vs 0.5 tie (1/2), 0.8 wins both, 0.3 beats 0.1 only -> 4.5/6
    assert M.macro_auc(y, s) == pytest.approx(4.5 / 6)
    # thresholds 0.8: P=1 R=1/3; 0.5: P=2/3 R=2/3; 0.3: P=3/4 R=1 -> AP = 1/3 + 2/9 + 1/4
    assert M.macro_average_precision(y, s) == pytest.approx(1 / 3 + 2 / 9 + 1 / 4)


def test_multilabel_input_errors():
    y = np.array([[1, 0], [0, 1]])
    with pytest.raises(DataError, match="0/1"):
        M.macro_auc(np.array([[1, -1], [0, 1]]), np.zeros((2, 2)))
    with pytest.raises(DataError, match="classes"):
        M.macro_auc(y, np.zeros((2, 3)))
    with pytest.raises(DataError, match="NaN"):
        M.macro_average_precision(y, np.array([[np.nan, 0.1], [0.2, 0.3]]))
    with pytest.raises(DataError, match="sigmoid"):
        M.evaluate_multi_label(y, np.array([[2.0, -1.0], [0.3, 0.4]]))


def test_evaluate_single_label_logits_and_probs():
    rng = np.random.default_rng(3)
    y = np.r_[0, 1, 2, rng.integers(0, 3, 40)]
    logits = rng.normal(size=(y.size, 3)) * 3
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    a = M.evaluate_single_label(y, logits)
    b = M.evaluate_single_label(y, probs)
    pred = logits.argmax(1)
    assert a["acc"] == pytest.approx(skm.accuracy_score(y, pred))
    assert a["bacc"] == pytest.approx(skm.balanced_accuracy_score(y, pred))
    expected_auc = skm.roc_auc_score(y, probs, multi_class="ovr")
    assert a["auc"] == pytest.approx(expected_auc, abs=1e-12)  # logits were softmaxed first
    assert b == pytest.approx(a)
    assert "auc" not in M.evaluate_single_label(y, logits, with_auc=False)
    with pytest.raises(ConfigError, match="scores_kind"):
        M.evaluate_single_label(y, logits, scores_kind="raw")


# --------------------------------------------------------------------------- summaries


@pytest.fixture
def fednoro_like():
    """Warm-up rounds 0-2 (high accuracy that must not count), stage-2 rounds 3-14, shuffled rows."""
    rounds = np.arange(15)
    bacc = np.r_[0.95, 0.96, 0.97, np.linspace(0.50, 0.72, 12)]
    df = pd.DataFrame(
        {"round": rounds, "stage": ["warmup"] * 3 + ["stage2"] * 12, "bacc": bacc, "acc": bacc / 2}
    )
    return df.sample(frac=1.0, random_state=0).reset_index(drop=True)


def test_best_last_final_over_stages(fednoro_like):
    df = fednoro_like
    stage2 = M.SummaryRule("best", stages=("stage2",))
    assert M.summarise(df, "bacc", stage2) == pytest.approx(0.72)
    assert M.summarise(df, "bacc", M.SummaryRule("best")) == pytest.approx(0.97)
    last = np.linspace(0.50, 0.72, 12)[-10:].mean()
    assert M.summarise(df, "bacc", M.SummaryRule("last_mean", n=10, stages=("stage2",))) == pytest.approx(last)
    assert M.last_mean(df, "bacc", n=10) == pytest.approx(last)  # the last 10 rounds are all stage 2 anyway
    assert M.last_mean(df, "bacc", n=3) == pytest.approx(np.linspace(0.50, 0.72, 12)[-3:].mean())
    assert M.summarise(df, "acc", M.SummaryRule("final")) == pytest.approx(0.36)
    assert M.best(df, "bacc", rounds=range(3, 6)) == pytest.approx(np.linspace(0.50, 0.72, 12)[2])
    assert M.final(df, "bacc", rounds=[0, 1]) == pytest.approx(0.96)


def test_last_mean_with_fewer_rounds_than_n_and_unevaluated_rounds():
    df = pd.DataFrame({"round": [0, 1, 2, 3], "acc": [0.1, np.nan, 0.3, np.nan]})
    assert M.last_mean(df, "acc", n=10) == pytest.approx(0.2)  # NaN = not evaluated, dropped
    assert M.final(df, "acc") == pytest.approx(0.3)
    assert M.best(df, "acc") == pytest.approx(0.3)


def test_summary_errors(fednoro_like):
    with pytest.raises(ConfigError, match="kind"):
        M.SummaryRule("mean")
    with pytest.raises(ConfigError, match="n="):
        M.SummaryRule("last_mean", n=0)
    with pytest.raises(ConfigError, match="not a string"):
        M.SummaryRule("best", stages="stage2")
    with pytest.raises(DataError, match="no column 'bacc'"):
        M.best(pd.DataFrame({"round": [0], "acc": [0.1]}), "bacc")
    with pytest.raises(DataError, match="stage"):
        M.summarise(pd.DataFrame({"round": [0], "acc": [0.1]}), "acc", M.SummaryRule("best", stages=("s2",)))
    with pytest.raises(DataError, match="stages present"):
        M.summarise(fednoro_like, "acc", M.SummaryRule("best", stages=("stage3",)))
    with pytest.raises(DataError, match="repeat"):
        M.best(pd.DataFrame({"round": [0, 0], "acc": [0.1, 0.2]}), "acc")
    with pytest.raises(DataError, match="no evaluated rounds"):
        M.best(pd.DataFrame({"round": [0], "acc": [np.nan]}), "acc")


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=40), st.integers(1, 15), st.integers(0, 2**32 - 1))
def test_summary_invariants(values, n, seed):
    df = pd.DataFrame({"round": np.arange(len(values)), "m": values})
    shuffled = df.sample(frac=1.0, random_state=seed % 2**31)
    lm = M.last_mean(shuffled, "m", n=n)
    assert lm == pytest.approx(np.mean(values[-n:]))
    assert min(values) - 1e-12 <= lm <= M.best(shuffled, "m") + 1e-12
    assert M.final(shuffled, "m") == values[-1]


# --------------------------------------------------------------------------- detection


def test_detection_scores_hand_cases():
    assert M.detection_scores({1, 2, 3, 4}, {2, 3, 9}) == {
        "recall": 0.5,
        "precision": pytest.approx(2 / 3),
        "exact_match": 0.0,
    }
    assert M.detection_scores(np.array([5, 7]), [7, 5]) == {"recall": 1.0, "precision": 1.0, "exact_match": 1.0}
    assert M.detection_scores([1, 2], []) == {"recall": 0.0, "precision": 0.0, "exact_match": 0.0}
    assert M.detection_scores([], []) == {"recall": 1.0, "precision": 0.0, "exact_match": 1.0}
    mean = M.mean_detection_scores([1, 2], [[1, 2], [1], [1, 2, 3]])
    expected = {"recall": (1 + 0.5 + 1) / 3, "precision": (1 + 1 + 2 / 3) / 3, "exact_match": 1 / 3}
    assert mean == pytest.approx(expected)
    with pytest.raises(DataError, match="client ids"):
        M.detection_scores([0.5], [1])
    with pytest.raises(DataError, match="empty"):
        M.mean_detection_scores([1], [])


@settings(max_examples=80, deadline=None)
@given(st.sets(st.integers(0, 19)), st.sets(st.integers(0, 19)))
def test_detection_scores_properties(truth, found):
    s = M.detection_scores(truth, found)
    assert all(0.0 <= v <= 1.0 for v in s.values())
    assert (s["exact_match"] == 1.0) == (truth == found)
    if truth and truth == found:
        assert s["recall"] == s["precision"] == 1.0
    if found and truth and not (truth & found):
        assert s["recall"] == s["precision"] == 0.0
