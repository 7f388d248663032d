"""Batched engine with several networks per client stepped together (Co-teaching's pair) and
per-client state after every step: per-client results equal the sequential engine's."""

from __future__ import annotations

import pytest
import torch

from fnlcore.methods.coteaching import small_loss_masks
from tests.test_batched import _assert_same_run, _run


def test_small_loss_masks_select_what_the_sequential_sort_selects_with_ties_and_padding():
    gen = torch.Generator().manual_seed(0)
    losses = torch.randint(0, 4, (3, 10), generator=gen).float()  # many ties
    mask = torch.ones(3, 10, dtype=torch.bool)
    mask[1, 7:] = False  # a short last batch
    mask[2, 3:] = False
    m = torch.tensor([4.0, 5.0, 1.0])
    sel = small_loss_masks(losses, m, mask)
    for i in range(3):
        n = int(mask[i].sum())
        expected = torch.zeros(10, dtype=torch.bool)
        expected[torch.argsort(losses[i, :n], stable=True)[: int(m[i])]] = True  # a stable sort of the real rows
        assert torch.equal(sel[i], expected)


@pytest.mark.parametrize("params,settings", [
    ({"tau": 0.5, "t_k": 2}, {}),
    ({"tau": 0.3, "t_k": 1, "tau_scope": "noisy_only"}, {"optimizer": "adam", "lr": 3e-3, "rounds": 2}),
])
def test_coteaching_pair_batched_equals_sequential(params, settings):
    a = _run("coteaching", "sequential", params, local_epochs=1, **settings)
    b = _run("coteaching", "batched", params, local_epochs=1, **settings)
    _assert_same_run(a, b, 1e-6)
    for name in ("net1", "net2"):  # both networks, not only the evaluated one
        sa, sb = a[1].globals[name].state_dict(), b[1].globals[name].state_dict()
        for key in sa:
            assert torch.allclose(sa[key].double(), sb[key].double(), rtol=1e-4, atol=1e-6), (name, key)
