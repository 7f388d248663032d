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

from fnlcore.methods.base import METHODS

from .test_batched import _assert_same_run, _run


def _spy_batched(monkeypatch, method: str) -> dict[str, int]:
    """Count, per stage row, the batched steps the method's stage table runs."""
    cls = METHODS[method]
    calls: dict[str, int] = {}
    table = {}
    for key, st in cls.stages.items():
        if st.batched_loss is None:
            table[key] = st
            continue

        def counted(self, sb, _loss=st.batched_loss, _key=key):
            calls[_key] = calls.get(_key, 0) + 1
            return _loss(self, sb)

        table[key] = dataclasses.replace(st, batched_loss=counted)
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

FEDGR = [
    # warm-up batched (per-step R_k targets); the main stage's preparation draws weak views: sequential
    ({"warmup_rounds": 1}, {}, {"warmup"}),
    # 'w/o weak aug': nothing drawn before training, both stages batch; online EMA teacher; riders
    ({"warmup_rounds": 1, "weak_aug": False, "teacher": "online"}, {"batch_size": 7}, {"warmup", "main"}),
    # cached R_k targets, 'pseudo_only' with clients above β and below
    ({"warmup_rounds": 1, "weak_aug": False, "global_features": "cached", "high_noise_labels": "pseudo_only",
      "beta": 0.25, "confidence": 0.3}, {}, {"warmup", "main"}),
    # w/o strong aug, w/o LR, w/o FS (local sieving in the upload), a tiny CNN
    ({"warmup_rounds": 2, "weak_aug": False, "strong_aug": False, "label_refining": False, "sieving": "local"},
     {"rounds": 3, "model": "tiny"}, {"warmup", "main"}),
]


@pytest.mark.parametrize("params,settings,rows", FEDGR)
def test_fedgr_batched_equals_sequential_with_its_ema_models(monkeypatch, params, settings, rows):
    kw = {"local_epochs": 1, **settings}
    seq, bat = _same(monkeypatch, "fedgr", params, rows, **kw)
    (_, ma, _), (_, mb, _) = seq, bat
    _assert_same_stores(ma.ema, mb.ema, range(3))
    for name in ("loss_mean", "clean_prob", "noisy_flag", "has_reliable"):
        assert torch.allclose(getattr(ma, name).double(), getattr(mb, name).double(), atol=1e-5), name


def test_fedgr_high_noise_client_mix_is_reached():
    # the 'pseudo_only' case above checks the per-client r_k ≥ β only if some clients are above β, some below
    params = FEDGR[2][0]
    _, m, _ = _run("fedgr", "sequential", params, local_epochs=1)
    ratios = [m.noise_ratio(k) for k in range(3)]
    assert max(ratios) >= params["beta"] > min(ratios), ratios


# -- RSCFed (multi-label: FedMLP's partial labels) ---------------------------------------------------


@pytest.mark.parametrize("settings", [{}, {"batch_size": 7, "client_fraction": 0.67}])
def test_rscfed_batched_equals_sequential_with_its_teachers(monkeypatch, settings):
    params = {"group_size": 2, "num_groups": 3, "ema_decay": 0.9}  # a fast teacher: differences show
    seq, bat = _same(monkeypatch, "rscfed", params, {"main"}, multi_label=True, local_epochs=1, **settings)
    _assert_same_stores(seq[1].teachers, bat[1].teachers, range(3))


# -- FedIRM (multi-label): the supervised and collecting stages batch, relation matching does not yet -----


@pytest.mark.parametrize("settings", [{}, {"batch_size": 7}])
def test_fedirm_batched_equals_sequential(monkeypatch, settings):
    # round 0 supervised, round 1 collects relation rows (batched), round 2 matches them (sequential)
    params = {"sup_rounds": 2, "ramp_rounds": 2}
    seq, bat = _same(monkeypatch, "fedirm", params, {"supervised", "collect"}, multi_label=True, local_epochs=1,
                     **settings)
    ra, rb = seq[1].relation_g, bat[1].relation_g
    assert ra is not None and torch.allclose(ra, rb, atol=1e-5)
    _assert_same_stores(seq[1].teachers, bat[1].teachers, range(3))
