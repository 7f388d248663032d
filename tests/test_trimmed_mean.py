"""Trimmed mean as Fed-NCL's code computes it (baselines.md §4): hand-computed cases and a short run."""

from __future__ import annotations

import pytest
import torch

from fnlcore.errors import ConfigError
from fnlcore.fl.settings import TrainSettings
from fnlcore.fl.simulation import Simulation
from fnlcore.methods.trimmed_mean import TrimmedMean, TrimmedMeanParams, keep_count, trimmed_mean
from tests.engine_helpers import make_ctx

FIVE = torch.tensor([[1.0, 10.0], [2.0, -5.0], [3.0, 0.0], [4.0, 8.0], [100.0, 1.0]])


def trimmed(clients: torch.Tensor, keep: int, rule: str = "code_scalar") -> torch.Tensor:
    """The server step on one entry whose client values are the rows of ``clients``."""
    return trimmed_mean([{"w": v} for v in clients], keep, rule)["w"]


def test_code_rule_adds_one_scalar_to_the_median():
    # coordinate 0: median 3, deviations -2,-1,0,1,97 -> keep -1,0,1; coordinate 1: median 1,
    # deviations 9,-6,-1,7,0 -> keep 0,-1,-6. One scalar: (0 - 7) / 6 added to both medians.
    out = trimmed(FIVE, 3)
    torch.testing.assert_close(out, torch.tensor([3 - 7 / 6, 1 - 7 / 6]))


def test_per_coordinate_rule_is_the_mean_closest_to_median():
    out = trimmed(FIVE, 3, "per_coordinate")
    torch.testing.assert_close(out, torch.tensor([3.0, 1 - 7 / 3]))  # {2,3,4} -> 3; {1,0,-5} -> -4/3


def test_even_count_uses_the_lower_median():
    # torch.median of (1, 2, 4, 10) is 2 (numpy's would be 3): deviations -1,0,2,8 -> keep 0,-1 -> 2 - 0.5
    assert float(trimmed(torch.tensor([[1.0], [2.0], [4.0], [10.0]]), 2)) == 1.5


def test_keep_count_of_the_code():
    assert [keep_count(20, p, 1.0) for p in (0.6, 0.7, 0.8, 0.5)] == [11, 13, 15, 9]


def test_state_entries_and_integer_buffers():
    a = {"w": torch.tensor([1.0, 10.0]), "n": torch.tensor(3)}
    states = [{"w": FIVE[i], "n": torch.tensor(3)} for i in range(5)]
    out = trimmed_mean(states, 3)
    torch.testing.assert_close(out["w"], torch.tensor([3 - 7 / 6, 1 - 7 / 6]))  # as test_code_rule_adds_one_scalar
    assert out["n"].dtype == a["n"].dtype and int(out["n"]) == 3
    perm = [states[i] for i in (4, 2, 0, 3, 1)]  # client order does not matter (no ties here)
    torch.testing.assert_close(trimmed_mean(perm, 3)["w"], out["w"])


def test_short_run_and_keep_check():
    s = TrainSettings(rounds=2, local_epochs=1, batch_size=16, optimizer="sgd", lr=0.05, momentum=0.9)
    ctx = make_ctx(s, seed=0)
    m = TrimmedMean(TrimmedMeanParams(clean_fraction=0.75), ctx)  # int(4 * 0.75) - 1 = 2
    assert m.keep == 2
    out = Simulation(m, ctx, progress=lambda x: None).run()
    assert len(out) == 2 and out["acc"].notna().all()
    with pytest.raises(ConfigError, match="keep"):
        TrimmedMean(TrimmedMeanParams(clean_fraction=0.25), make_ctx(s, seed=0))  # int(1) - 1 = 0


@pytest.mark.parametrize("rule", ["code_scalar", "per_coordinate"])
@pytest.mark.parametrize("chunk", [3, 40, 2**22])
def test_chunks_of_coordinates_give_the_whole_entrys_result_bit_for_bit(rule, chunk, monkeypatch):
    """The server step takes an entry a chunk of coordinates at a time (memory); nothing changes."""
    import fnlcore.methods.trimmed_mean as tm

    g = torch.Generator().manual_seed(3)
    states = []
    for c in range(7):
        w = torch.randn(9, 5, 3, generator=g)
        states.append({"w": w.round() if c % 2 else w, "b": torch.randn(5, generator=g),
                       "n": torch.tensor(c), "i": torch.randint(0, 5, (4,), generator=g)})
    monkeypatch.setattr(tm, "CHUNK_VALUES", 10**9)  # each entry in one chunk
    whole = trimmed_mean(states, 3, rule)
    monkeypatch.setattr(tm, "CHUNK_VALUES", chunk)
    out = trimmed_mean(states, 3, rule)
    for k, v in whole.items():
        assert out[k].dtype == v.dtype and out[k].shape == v.shape and torch.equal(out[k], v), k
        assert torch.equal(v, _entry_reference([s[k] for s in states], 3, rule)), k


def _entry_reference(values: list[torch.Tensor], keep: int, rule: str) -> torch.Tensor:
    """One entry as the code computes it, whole (float32 stack, lower median over clients, the ``keep``
    deviations of smallest magnitude in client order on ties, their mean: one scalar or per coordinate)."""
    x = torch.stack([v.to(torch.float32) for v in values])  # (clients, *shape)
    med = x.median(dim=0).values
    dev = x - med
    kept = torch.take_along_dim(dev, torch.argsort(dev.abs(), dim=0, stable=True)[:keep], dim=0)
    return (med + (kept.mean() if rule == "code_scalar" else kept.mean(dim=0))).to(values[0].dtype)
