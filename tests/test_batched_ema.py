"""Methods with per-client EMA teachers on the batched engine (FedGR, RSCFed, FedIRM) against the sequential one.

Each run trains the same clients on both engines (tests/test_batched.py's small digits run: clients of
134/133/133 samples, so short last batches are padded; batch size 7 leaves client 0 one step more, so the
others ride along masked). Besides the global model, the generators and the metrics, the clients' EMA
teachers kept between rounds must agree, and every stage the run should batch must have run batched.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fnlcore.fl.one_client import OneClientBatch
from fnlcore.methods.base import METHODS

from .test_batched import _assert_same_run, _run


def _spy_batched(monkeypatch, method: str) -> dict[str, int]:
    """Count, per stage row, the batched steps the method's stage table runs."""
    cls = METHODS[method]
    calls: dict[str, int] = {}
    table = {}
    for key, st in cls.stages.items():
        if not st.batchable:
            table[key] = st
            continue

        def counted(self, sb, _loss=st.loss, _key=key):
            if not isinstance(sb, OneClientBatch):  # the batched engine's steps, not the sequential K = 1
                calls[_key] = calls.get(_key, 0) + 1
            return _loss(self, sb)

        table[key] = dataclasses.replace(st, loss=counted)
    monkeypatch.setattr(cls, "stages", table)
    return calls


def _assert_same_stores(store_a, store_b, clients, atol=1e-6):
    for k in clients:
        a, b = store_a.get(k), store_b.get(k)
        assert (a is None) == (b is None), k
        if a is None:
            continue
        for key in a:
            assert torch.allclose(a[key].double(), b[key].double(), rtol=1e-4, atol=atol), (k, key)


def _same(monkeypatch, method, params, batched_rows, multi_label=False, **settings):
    seq = _run(method, "sequential", params, multi_label=multi_label, **settings)
    calls = _spy_batched(monkeypatch, method)
    bat = _run(method, "batched", params, multi_label=multi_label, **settings)
    assert set(calls) == set(batched_rows), calls  # every stage meant to batch did, no other
    _assert_same_run(seq, bat, 1e-6)
    return seq, bat


# -- FedGR ----------------------------------------------------------------------------------------

FEDGR_ROWS = {"warmup", "main"}  # every stage batches: a preparation's weak-view draws keep their place


def _fedgr_same(monkeypatch, params, **settings):
    """One warm-up round, one main round, on both engines; the EMA models and sieving state agree too."""
    seq, bat = _same(monkeypatch, "fedgr", {"warmup_rounds": 1, **params}, FEDGR_ROWS, rounds=2, local_epochs=1,
                     **settings)
    (_, ma, _), (_, mb, _) = seq, bat
    _assert_same_stores(ma.ema, mb.ema, range(3))
    for name in ("loss_mean", "clean_prob", "noisy_flag", "has_reliable"):
        assert torch.allclose(getattr(ma, name).double(), getattr(mb, name).double(), atol=1e-5), name
    return seq, bat


def test_fedgr_default_settings_batch_both_stages(monkeypatch):
    # the main stage's preparation draws weak views (pseudo-labels, the revised teacher's logits) and relabels
    _fedgr_same(monkeypatch, {})


def test_fedgr_online_teacher_cached_features_and_high_noise_mix_with_riders(monkeypatch):
    # batch 7: client 0 has one step more, the others ride along (their EMA models must not move);
    # cached R_k targets (the warm-up's preparation draws a weak view too); 'pseudo_only' with r_k above β
    # for some clients and below for others (checked on the r_k the main round used)
    params = {"teacher": "online", "global_features": "cached", "high_noise_labels": "pseudo_only", "beta": 0.25,
              "confidence": 0.3}
    (_, m, _), _ = _fedgr_same(monkeypatch, params, batch_size=7)
    ratios = m._stats["noise_ratio"]
    assert max(ratios) >= params["beta"] > min(ratios), ratios


def test_fedgr_ablations_on_a_cnn(monkeypatch):
    # w/o weak aug, w/o strong aug, w/o LR, w/o FS (local sieving in the upload); BatchNorm buffers in the EMA
    _fedgr_same(monkeypatch, {"weak_aug": False, "strong_aug": False, "label_refining": False, "sieving": "local"},
                model="tiny")


# -- RSCFed (multi-label: FedMLP's partial labels) ---------------------------------------------------


@pytest.mark.parametrize("settings", [{}, {"batch_size": 7, "client_fraction": 0.67}])
def test_rscfed_batched_equals_sequential_with_its_teachers(monkeypatch, settings):
    params = {"group_size": 2, "num_groups": 3, "ema_decay": 0.9}  # a fast teacher: differences show
    seq, bat = _same(monkeypatch, "rscfed", params, {"main"}, multi_label=True, local_epochs=1, **settings)
    _assert_same_stores(seq[1].teachers, bat[1].teachers, range(3))


# -- FedIRM (multi-label): every stage batches, relation matching with per-client EMA alphas -----------


@pytest.mark.parametrize("params,settings,rows", [
    # round 0 collects relation rows, rounds 1-2 match them (the teachers and step counters carried over);
    # looser confidence bounds: the relation mask selects some samples (4 to 14 %); alpha capped by ema_decay
    ({"sup_rounds": 1, "ramp_rounds": 2, "upper": 0.6, "lower": 0.4, "max_entropy": 10.0, "ema_decay": 0.9}, {},
     {"collect", "relation"}),
    # supervised, collect, relation; batch 7: riders in every stage
    ({"sup_rounds": 2, "ramp_rounds": 2}, {"batch_size": 7}, {"supervised", "collect", "relation"}),
])
def test_fedirm_batched_equals_sequential(monkeypatch, params, settings, rows):
    seq, bat = _same(monkeypatch, "fedirm", params, rows, multi_label=True, local_epochs=1, **settings)
    (ma, a, _), (mb, b, _) = seq, bat
    assert a.relation_g is not None and torch.allclose(a.relation_g, b.relation_g, atol=1e-5)
    assert a.steps == b.steps and min(a.steps) > 0
    _assert_same_stores(a.teachers, b.teachers, range(3))
    share = ma["fedirm_masked_share"].dropna().tolist()
    assert share == pytest.approx(mb["fedirm_masked_share"].dropna().tolist(), abs=1e-9)
    assert max(share) > 0  # the relation mask selected samples: the source matrices carry gradients
