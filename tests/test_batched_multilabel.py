"""FedMLP's multi-label family on the batched engine: each batched stage equals the sequential engine.

Clients of 134/133/133 samples with batch 16 (short last batches, padded and masked in the
batched engine); params chosen so that every batched stage is entered within the rounds.
"""

from __future__ import annotations

import pytest

from .test_batched import _assert_same_run, _run

SMALL = {"rounds": 3, "local_epochs": 1}


def _same(method: str, params: dict | None = None, **settings):
    kw = {**SMALL, **settings}
    seq = _run(method, "sequential", params, multi_label=True, **kw)
    bat = _run(method, "batched", params, multi_label=True, **kw)
    _assert_same_run(seq, bat, 1e-6)
    return seq, bat


def test_fedlsr_ml_two_weak_views_and_a_beta_draw_batched_equal_sequential():
    _same("fedlsr_ml", {"t_w": 2})
    _same("fedlsr_ml", {"t_w": 1, "cls_on_probs": False}, augmentation="affine_flip")


def test_fedfixmatch_weak_and_strong_views_and_confident_counts_batched_equal_sequential():
    # loose bounds: samples confident on both missing classes from round 1 on, so L_u counts
    (ms, _, _), (mb, _, _) = _same("fedfixmatch", {"upper": 0.55, "lower": 0.45})
    assert ms["fixmatch_confident_share"].tolist() == mb["fixmatch_confident_share"].tolist()
    assert ms["fixmatch_confident_share"].iloc[-1] > 0
    _same("fedfixmatch", {"upper": 0.55, "lower": 0.45, "unsup_pos_weight": "client_index"}, rounds=2)


def test_cbafed_warmup_and_pseudo_label_stages_batched_equal_sequential():
    (ms, _, _), (mb, _, _) = _same("cbafed", {"warmup_rounds": 1, "period": 1})
    assert mb["stage"].tolist() == ["warmup", "pseudo", "pseudo"]
    cols = ["cbafed_pseudo_labels"] + [f"cbafed_tau_{c}" for c in range(4)]
    assert ms[cols].fillna(-1).values.tolist() == mb[cols].fillna(-1).values.tolist()  # the upload's counts, exactly
    assert ms["cbafed_pseudo_labels"].iloc[-1] > 0


def _count_batched_rounds(monkeypatch) -> list[int]:
    """The rounds the batched engine trains (one call per chunk; one chunk per round here)."""
    from fnlcore.fl import batched

    rounds, train_clients = [], batched.train_clients
    monkeypatch.setattr(batched, "train_clients", lambda ctx, g, c, f, r, *a, **k: rounds.append(r) or
                        train_clients(ctx, g, c, f, r, *a, **k))
    return rounds


def test_fedmlp_with_mld_batches_every_round_equal_the_sequential_engine(monkeypatch):
    # from round 1 (the last warm-up round) on every upload runs the prototypes' augmented pass, drawn
    # ahead by Stage.reserve; stage 2's detection (an augmented pass in the prepare) keeps its place too
    rounds = _count_batched_rounds(monkeypatch)
    (ms, _, _), (mb, m, _) = _same("fedmlp", {"warmup_rounds": 2, "st": False, "lambda0": 0.2, "lambda1": 0.2})
    assert rounds == [0, 1, 2] and mb["stage"].tolist() == ["warmup", "warmup", "stage2"]
    assert int((m.pseudo != -1).sum()) > 0  # the detection labelled entries
    cols = [c for c in ms.columns if c.startswith("mld_")]
    assert ms[cols].fillna(-1).values.tolist() == mb[cols].fillna(-1).values.tolist()


@pytest.mark.parametrize("params", [{}, {"cr": "warmup"}, {"wpc": False}, {"wpc": False, "cr": "none", "tau": 0.0}])
def test_fedmlp_without_mld_batches_both_stages_equal_sequential(monkeypatch, params):
    rounds = _count_batched_rounds(monkeypatch)
    _same("fedmlp", {"warmup_rounds": 1, "mld": False, **params})
    assert rounds == [0, 1, 2]
