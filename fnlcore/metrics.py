"""Evaluation metrics and their summaries over rounds.

Every metric takes numpy arrays and returns a float in [0, 1] (tables scale by
100). All of them are vectorised over samples; the macro metrics loop only over
classes. Semantics follow scikit-learn, which the official code calls:

* single-label (FedNoRo, Fed-NCL, FedGR, FedDiv, FedCorr): ``accuracy``,
  ``balanced_accuracy`` (= ``sklearn.metrics.balanced_accuracy_score``, FedNoRo's
  BACC), ``macro_auc_ovr`` and ``confusion_matrix``;
* multi-label (FedMLP, fedmlp.md section 7): ``multilabel_balanced_accuracy``,
  ``macro_auc`` (``roc_curve`` + ``auc`` per class) and
  ``macro_average_precision`` (``average_precision_score`` per class).

Per-round tables are summarised with :class:`SummaryRule` (Best, mean of the
last n rounds, final round; optionally restricted to training stages), and
noisy-client detection is scored with :func:`detection_scores`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal

import numpy as np
import pandas as pd

from .errors import ConfigError, DataError

Undefined = Literal["nan", "skip"]

__all__ = [
    "accuracy",
    "balanced_accuracy",
    "confusion_matrix",
    "macro_auc_ovr",
    "multilabel_balanced_accuracy",
    "macro_auc",
    "macro_average_precision",
    "evaluate_single_label",
    "evaluate_multi_label",
    "SummaryRule",
    "best",
    "last_mean",
    "final",
    "summarise",
    "detection_scores",
    "mean_detection_scores",
]


# --------------------------------------------------------------------------- input checks


def _labels_1d(y: object, name: str) -> np.ndarray:
    """A 1-D array of integer class labels (integral floats are accepted and cast)."""
    a = np.asarray(y)
    if a.ndim != 1:
        raise DataError(f"{name}: expected a 1-D array of class labels, got shape {a.shape}")
    if a.dtype.kind in "iu":
        return a
    if a.dtype.kind == "b":
        return a.astype(np.int64)
    if a.dtype.kind == "f":
        if not np.all(np.isfinite(a)) or not np.all(a == np.round(a)):
            raise DataError(f"{name}: class labels must be whole numbers; found non-integral or non-finite values")
        return a.astype(np.int64)
    raise DataError(f"{name}: class labels must be integers, got dtype {a.dtype}")


def _pair(y_true: object, y_pred: object) -> tuple[np.ndarray, np.ndarray]:
    t = _labels_1d(y_true, "y_true")
    p = _labels_1d(y_pred, "y_pred")
    if t.shape != p.shape:
        raise DataError(f"y_true and y_pred differ in length: {t.shape[0]} vs {p.shape[0]}")
    if t.size == 0:
        raise DataError("y_true is empty: a metric needs at least one sample")
    return t, p


def _scores_2d(scores: object, name: str, n: int | None = None) -> np.ndarray:
    s = np.asarray(scores)
    if s.ndim != 2:
        raise DataError(f"{name}: expected a 2-D array (samples x classes), got shape {s.shape}")
    if s.dtype.kind not in "fiub":
        raise DataError(f"{name}: expected numbers, got dtype {s.dtype}")
    if n is not None and s.shape[0] != n:
        raise DataError(f"{name} has {s.shape[0]} rows but y_true has {n} samples")
    if s.dtype.kind == "f" and not np.all(np.isfinite(s)):
        raise DataError(f"{name} contains NaN or infinite values; check the model outputs")
    return s


def _multilabel_targets(y_true: object, scores: object, scores_name: str) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(y_true)
    if y.ndim != 2:
        raise DataError(f"y_true: expected a 2-D 0/1 matrix (samples x classes), got shape {y.shape}")
    if y.shape[0] == 0:
        raise DataError("y_true is empty: a metric needs at least one sample")
    if not np.all((y == 0) | (y == 1)):
        raise DataError(
            "y_true: multi-label targets must be 0/1 (missing labels must be resolved before evaluation)"
        )
    s = _scores_2d(scores, scores_name, y.shape[0])
    if s.shape[1] != y.shape[1]:
        raise DataError(f"{scores_name} has {s.shape[1]} classes but y_true has {y.shape[1]}")
    return y.astype(bool), s


def _check_undefined(undefined: str) -> None:
    if undefined not in ("nan", "skip"):
        raise ConfigError(f"undefined={undefined!r} is not valid; use 'nan' or 'skip'")


def _macro(per_class: np.ndarray, defined: np.ndarray, undefined: Undefined) -> float:
    """Mean over classes; undefined classes either poison the mean (NaN) or are left out."""
    if undefined == "skip":
        per_class = per_class[defined]
        return float(np.mean(per_class)) if per_class.size else float("nan")
    return float(np.mean(per_class))


# --------------------------------------------------------------------------- single-label


def accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Fraction of correct predictions (``sklearn.metrics.accuracy_score`` for 1-D labels).

    Used as "test accuracy" by Fed-NCL, FedGR, FedDiv and FedCorr.
    """
    t, p = _pair(y_true, y_pred)
    return float(np.count_nonzero(t == p) / t.size)


def balanced_accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Mean recall over the classes present in ``y_true`` (FedNoRo's BACC, fednoro.md section 6).

    Identical to ``sklearn.metrics.balanced_accuracy_score``: classes that occur
    only in ``y_pred`` do not count (their recall is undefined).
    """
    t, p = _pair(y_true, y_pred)
    classes, inv = np.unique(t, return_inverse=True)
    support = np.bincount(inv, minlength=classes.size)
    hits = np.bincount(inv[t == p], minlength=classes.size)
    return float(np.mean(hits / support))


def confusion_matrix(y_true: np.ndarray, y_pred: np.ndarray, num_classes: int) -> np.ndarray:
    """``num_classes x num_classes`` int64 counts; rows = true class, columns = predicted.

    Same layout as ``sklearn.metrics.confusion_matrix(..., labels=range(C))``.
    """
    if not isinstance(num_classes, (int, np.integer)) or isinstance(num_classes, bool) or num_classes < 1:
        raise ConfigError(f"num_classes={num_classes!r}: must be a positive integer")
    t, p = _pair(y_true, y_pred)
    for name, a in (("y_true", t), ("y_pred", p)):
        bad = (a < 0) | (a >= num_classes)
        if bad.any():
            raise DataError(
                f"{name} holds labels outside 0..{num_classes - 1} (e.g. {a[bad][:5].tolist()}); "
                "pass the dataset's num_classes or fix the labels"
            )
    flat = t.astype(np.int64) * num_classes + p.astype(np.int64)
    return np.bincount(flat, minlength=num_classes * num_classes).reshape(num_classes, num_classes)


def _binary_curve(y: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative true/false positives at each distinct score, highest first.

    The same points as sklearn's ``_binary_clf_curve``: tied scores form one
    threshold, which is how sklearn's ROC and PR curves treat ties. Only the
    counts at the end of each tie group are kept, so the order inside a group
    does not matter and the fast unstable sort is enough.
    """
    s = np.ascontiguousarray(s)  # a matrix column is strided; sorting a contiguous copy is faster
    order = np.argsort(s)[::-1]
    s_sorted = s[order]
    y_sorted = y[order]
    last_of_group = np.r_[np.flatnonzero(np.diff(s_sorted)), y_sorted.size - 1]
    tps = np.cumsum(y_sorted, dtype=np.float64)[last_of_group]
    fps = (last_of_group + 1) - tps
    return tps, fps


def _binary_auc(y: np.ndarray, s: np.ndarray) -> float:
    """ROC-AUC as ``auc(*roc_curve(y, s)[:2])``; NaN when ``y`` has one value only."""
    return _auc_from_curve(*_binary_curve(y, s))


def _auc_from_curve(tps: np.ndarray, fps: np.ndarray) -> float:
    if tps[-1] == 0 or fps[-1] == 0:
        return float("nan")
    tpr = np.r_[0.0, tps / tps[-1]]
    fpr = np.r_[0.0, fps / fps[-1]]
    return float(np.trapezoid(tpr, fpr))


def _binary_ap(y: np.ndarray, s: np.ndarray) -> float:
    """``average_precision_score(y, s)``: sum over thresholds of (R_n - R_{n-1}) * P_n.

    sklearn defines 0.0 when there is no positive sample (and the formula gives
    1.0 when there is no negative); both are reproduced.
    """
    return _ap_from_curve(*_binary_curve(y, s))


def _ap_from_curve(tps: np.ndarray, fps: np.ndarray) -> float:
    if tps[-1] == 0:
        return 0.0
    precision = tps / (tps + fps)
    recall_steps = np.diff(np.r_[0.0, tps]) / tps[-1]
    return float(np.sum(recall_steps * precision))


def macro_auc_ovr(
    y_true: np.ndarray, probs: np.ndarray, undefined: Undefined = "skip"
) -> float:
    """Single-label macro one-vs-rest ROC-AUC from per-class scores (probabilities).

    Equals ``roc_auc_score(y_true, probs, multi_class="ovr", average="macro")``
    when every class occurs in ``y_true`` (and is not the only class). Class c's
    AUC ranks all samples by ``probs[:, c]``; note that this ranking differs
    between logits and softmax probabilities, so pass probabilities.

    A class absent from ``y_true`` (or the only class present) has no ROC-AUC.
    ``undefined="skip"`` (default) averages over the other classes, the same
    rule as :func:`balanced_accuracy` (classes present in ``y_true``);
    ``undefined="nan"`` returns NaN. sklearn itself raises in that case.
    """
    _check_undefined(undefined)
    t = _labels_1d(y_true, "y_true")
    if t.size == 0:
        raise DataError("y_true is empty: a metric needs at least one sample")
    s = _scores_2d(probs, "probs", t.size)
    num_classes = s.shape[1]
    if t.min() < 0 or t.max() >= num_classes:
        raise DataError(f"y_true holds labels outside 0..{num_classes - 1}, the columns of probs")
    per_class = np.array([_binary_auc(t == c, s[:, c]) for c in range(num_classes)])
    return _macro(per_class, ~np.isnan(per_class), undefined)


# --------------------------------------------------------------------------- multi-label (FedMLP)


def _multilabel_defined(y: np.ndarray) -> np.ndarray:
    """Classes with both positive and negative samples (all three metrics are defined there)."""
    pos = y.sum(axis=0)
    return (pos > 0) & (pos < y.shape[0])


def multilabel_balanced_accuracy(
    y_true: np.ndarray, probs: np.ndarray, threshold: float = 0.5, undefined: Undefined = "nan"
) -> float:
    """FedMLP BACC: mean over classes of (TPR_c + TNR_c) / 2 (fedmlp.md section 7).

    Hard predictions are ``probs > threshold`` (strict, as in FedMLP's
    ``globaltest``). For a class without positives (TPR = 0/0) or without
    negatives (TNR = 0/0) FedMLP's code yields NaN, which makes the macro mean
    NaN: that is ``undefined="nan"`` (default). ``undefined="skip"`` averages
    over the classes that have both label values.
    """
    _check_undefined(undefined)
    if not np.isfinite(threshold):
        raise ConfigError(f"threshold={threshold!r}: must be a finite number")
    y, s = _multilabel_targets(y_true, probs, "probs")
    pred = s > threshold
    pos = y.sum(axis=0).astype(np.float64)
    neg = y.shape[0] - pos
    tp = (y & pred).sum(axis=0)
    tn = (~y & ~pred).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_class = 0.5 * (tp / pos + tn / neg)
    per_class[(pos == 0) | (neg == 0)] = np.nan
    return _macro(per_class, _multilabel_defined(y), undefined)


def macro_auc(y_true: np.ndarray, scores: np.ndarray, undefined: Undefined = "nan") -> float:
    """FedMLP AUC: mean over classes of ROC-AUC (sklearn ``roc_curve`` + ``auc``; ties as sklearn).

    A class with a single label value has an undefined ROC curve: sklearn (and
    so FedMLP's code) gives NaN and the macro mean is NaN (``undefined="nan"``,
    default); ``undefined="skip"`` averages over the classes with both values.
    """
    _check_undefined(undefined)
    y, s = _multilabel_targets(y_true, scores, "scores")
    per_class = np.array([_binary_auc(y[:, c], s[:, c]) for c in range(y.shape[1])])
    return _macro(per_class, _multilabel_defined(y), undefined)


def macro_average_precision(y_true: np.ndarray, scores: np.ndarray, undefined: Undefined = "nan") -> float:
    """FedMLP mAP: mean over classes of ``sklearn.metrics.average_precision_score``.

    With ``undefined="nan"`` (default, FedMLP's code) single-valued classes keep
    sklearn's own values (0.0 without positives, 1.0 without negatives); with
    ``undefined="skip"`` they are left out, like in the other two metrics.
    """
    _check_undefined(undefined)
    y, s = _multilabel_targets(y_true, scores, "scores")
    per_class = np.array([_binary_ap(y[:, c], s[:, c]) for c in range(y.shape[1])])
    return _macro(per_class, _multilabel_defined(y), undefined)


# --------------------------------------------------------------------------- per-round bundles


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64) - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _looks_like_probs(s: np.ndarray) -> bool:
    return bool(s.min() >= 0 and s.max() <= 1 and np.allclose(s.sum(axis=1), 1.0, atol=1e-4))


def evaluate_single_label(
    y_true: np.ndarray,
    logits_or_probs: np.ndarray,
    scores_kind: Literal["auto", "logits", "probs"] = "auto",
    with_auc: bool = True,
) -> dict[str, float]:
    """Per-round metrics of a single-label classifier: ``acc``, ``bacc`` and (optionally) ``auc``.

    Predictions are the argmax of the scores (the same for logits and
    probabilities). ``auc`` (:func:`macro_auc_ovr`) needs probabilities: logits
    are turned into softmax probabilities first. ``scores_kind="auto"`` treats
    the input as probabilities when every row is in [0, 1] and sums to 1
    (tolerance 1e-4), otherwise as logits.
    """
    if scores_kind not in ("auto", "logits", "probs"):
        raise ConfigError(f"scores_kind={scores_kind!r} is not valid; use 'auto', 'logits' or 'probs'")
    t = _labels_1d(y_true, "y_true")
    s = _scores_2d(logits_or_probs, "logits_or_probs", t.size)
    pred = np.argmax(s, axis=1)
    out = {"acc": accuracy(t, pred), "bacc": balanced_accuracy(t, pred)}
    if with_auc:
        is_probs = scores_kind == "probs" or (scores_kind == "auto" and _looks_like_probs(s))
        out["auc"] = macro_auc_ovr(t, s if is_probs else _softmax(s))
    return out


def evaluate_multi_label(
    y_true: np.ndarray, probs: np.ndarray, threshold: float = 0.5, undefined: Undefined = "nan"
) -> dict[str, float]:
    """Per-round metrics of FedMLP: ``bacc``, ``auc`` and ``map`` (fedmlp.md section 7).

    ``probs`` are sigmoid outputs in [0, 1] (a DataError otherwise: apply the
    sigmoid to logits first).
    """
    _check_undefined(undefined)
    y, s = _multilabel_targets(y_true, probs, "probs")
    if s.min() < 0 or s.max() > 1:
        raise DataError("probs must be probabilities in [0, 1]; apply a sigmoid to the logits first")
    curves = [_binary_curve(y[:, c], s[:, c]) for c in range(y.shape[1])]  # one sort per class for AUC and AP
    defined = _multilabel_defined(y)
    return {
        "bacc": multilabel_balanced_accuracy(y, s, threshold, undefined),
        "auc": _macro(np.array([_auc_from_curve(*c) for c in curves]), defined, undefined),
        "map": _macro(np.array([_ap_from_curve(*c) for c in curves]), defined, undefined),
    }


# --------------------------------------------------------------------------- summaries over rounds


SummaryKind = Literal["best", "last_mean", "final"]


@dataclass(frozen=True)
class SummaryRule:
    """How a paper turns a per-round metric curve into one table number.

    kind: ``"best"`` (max over rounds: FedNoRo "Best", FedDiv/FedCorr, FedGR
        Tables 14-16), ``"last_mean"`` (mean of the last ``n`` rounds: FedNoRo
        "Last", Fed-NCL, FedGR Tables 1-7) or ``"final"`` (value at the last
        evaluated round: FedMLP, round 500).
    n: number of final rounds averaged by ``last_mean`` (10 in every paper).
    stages: if given, only rounds whose ``stage`` column is one of these count
        (FedNoRo: its stage 2; FedCorr: stages 2 and 3). ``None`` = all rounds.
    """

    kind: SummaryKind
    n: int = 10
    stages: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("best", "last_mean", "final"):
            raise ConfigError(f"SummaryRule.kind={self.kind!r} is not valid; use 'best', 'last_mean' or 'final'")
        if not isinstance(self.n, (int, np.integer)) or isinstance(self.n, bool) or self.n < 1:
            raise ConfigError(f"SummaryRule.n={self.n!r}: must be a positive integer (number of final rounds)")
        if self.stages is not None:
            if isinstance(self.stages, str):
                raise ConfigError(f"SummaryRule.stages={self.stages!r}: give a tuple of stage names, not a string")
            stages = tuple(str(s) for s in self.stages)
            if not stages:
                raise ConfigError("SummaryRule.stages is empty; use None to count every round")
            object.__setattr__(self, "stages", stages)


def _curve(
    df: pd.DataFrame, metric: str, rounds: Iterable[int] | None, stages: tuple[str, ...] | None
) -> pd.Series:
    """The metric over the selected rounds, sorted by round, unevaluated (NaN) rounds dropped."""
    if not isinstance(df, pd.DataFrame):
        raise DataError(f"expected a per-round metrics DataFrame, got {type(df).__name__}")
    for col in ("round", metric):
        if col not in df.columns:
            raise DataError(
                f"per-round metrics table has no column {col!r} (columns: {list(df.columns)}); "
                "it needs 'round' and one column per metric"
            )
    sel = df
    if stages is not None:
        if "stage" not in df.columns:
            raise DataError(f"summary restricted to stages {stages} but the metrics table has no 'stage' column")
        sel = sel[sel["stage"].astype(str).isin(stages)]
        if sel.empty:
            present = sorted(df["stage"].astype(str).unique().tolist())
            raise DataError(f"no rounds with stage in {stages}; stages present: {present}")
    if rounds is not None:
        sel = sel[sel["round"].isin(list(rounds))]
    dup = sel["round"].duplicated(keep=False)
    if dup.any():
        raise DataError(
            f"round numbers repeat in the metrics table ({sorted(set(sel['round'][dup].tolist()))[:5]}...); "
            "use one global round index across stages"
        )
    values = pd.to_numeric(sel[metric], errors="coerce")
    curve = pd.Series(values.to_numpy(dtype=np.float64), index=sel["round"].to_numpy()).sort_index(kind="stable")
    curve = curve.dropna()
    if curve.empty:
        raise DataError(
            f"no evaluated rounds of {metric!r} in the selection (rounds={rounds!r}, stages={stages!r})"
        )
    return curve


def best(df: pd.DataFrame, metric: str, rounds: Iterable[int] | None = None) -> float:
    """Maximum of ``metric`` over the selected rounds (all rounds if ``rounds`` is None).

    Rounds where the metric is NaN (not evaluated) are ignored.
    """
    return float(_curve(df, metric, rounds, None).max())


def last_mean(df: pd.DataFrame, metric: str, n: int = 10, rounds: Iterable[int] | None = None) -> float:
    """Mean of ``metric`` over the last ``n`` selected (evaluated) rounds.

    With fewer than ``n`` evaluated rounds (e.g. smoke-scale runs) the mean is
    over all of them.
    """
    SummaryRule("last_mean", n=n)  # validates n
    return float(_curve(df, metric, rounds, None).iloc[-n:].mean())


def final(df: pd.DataFrame, metric: str, rounds: Iterable[int] | None = None) -> float:
    """``metric`` at the highest selected round that was evaluated (FedMLP reports the final model)."""
    return float(_curve(df, metric, rounds, None).iloc[-1])


def summarise(df: pd.DataFrame, metric: str, rule: SummaryRule, rounds: Iterable[int] | None = None) -> float:
    """Apply ``rule`` (kind, n, stages) to one run's per-round metrics table.

    ``df`` has a ``round`` column (global round index), one column per metric
    and, when ``rule.stages`` is set, a ``stage`` column.
    """
    if not isinstance(rule, SummaryRule):
        raise ConfigError(f"rule must be a SummaryRule, got {type(rule).__name__}")
    curve = _curve(df, metric, rounds, rule.stages)
    if rule.kind == "best":
        return float(curve.max())
    if rule.kind == "last_mean":
        return float(curve.iloc[-rule.n :].mean())
    return float(curve.iloc[-1])


# --------------------------------------------------------------------------- noisy-client detection


def _client_set(ids: object, name: str) -> set[int]:
    if isinstance(ids, (set, frozenset)):
        ids = sorted(ids)
    elif not isinstance(ids, np.ndarray):
        ids = list(ids)  # type: ignore[call-overload]
    a = np.asarray(ids)
    if a.size == 0:
        return set()
    if a.ndim != 1 or a.dtype.kind not in "iu":
        raise DataError(
            f"{name}: expected client ids (a set or 1-D array of integers), got {a.dtype} shape {a.shape}"
        )
    return set(a.tolist())


def detection_scores(true_noisy: Iterable[int], detected: Iterable[int]) -> dict[str, float]:
    """Recall, precision and exact match of a detected noisy-client set (FedNoRo Table 3, fednoro.md section 6).

    recall = |detected & true| / |true|, 1.0 when there is no noisy client
    (nothing was missed); precision = |detected & true| / |detected|, 0.0 when
    nothing is detected (the spec's rule); exact_match = 1.0 if the sets are
    equal, else 0.0 (the paper's "MR").
    """
    truth = _client_set(true_noisy, "true_noisy")
    found = _client_set(detected, "detected")
    hit = len(truth & found)
    return {
        "recall": hit / len(truth) if truth else 1.0,
        "precision": hit / len(found) if found else 0.0,
        "exact_match": 1.0 if truth == found else 0.0,
    }


def mean_detection_scores(true_noisy: Iterable[int], detections: Iterable[Iterable[int]]) -> dict[str, float]:
    """Average of :func:`detection_scores` over many detections (Table 3: 10,000 GMM seeds)."""
    rows = [detection_scores(true_noisy, d) for d in detections]
    if not rows:
        raise DataError("detections is empty: nothing to average")
    return {k: float(np.mean([r[k] for r in rows])) for k in ("recall", "precision", "exact_match")}
