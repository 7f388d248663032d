"""The engine's declared-state checkpoints: per-client stores on disk, exact restore, refusal of foreign state."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import pytest
import torch

from fnlcore.errors import ConfigError
from fnlcore.fl.contract import Stage
from fnlcore.fl.persist import ClientStore, load_method_state
from fnlcore.fl.settings import TrainSettings
from fnlcore.fl.simulation import Simulation
from fnlcore.fl.state import load, snapshot
from fnlcore.methods.base import FLMethod, MethodParams

from .engine_helpers import make_ctx


def _state(v: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((3,), v), "n": torch.tensor([int(v)])}


def test_store_keeps_a_round_in_memory_and_the_rest_on_disk(tmp_path):
    st = ClientStore("ema")
    st.attach(tmp_path)
    st.begin_round(0)
    st.put(2, _state(1.0))
    st.put(5, _state(2.0))
    assert 2 in st and 7 not in st and st.get(7) is None and len(st) == 2
    st.end_round()
    assert st._mem == {} and sorted(p.name for p in tmp_path.iterdir()) == ["client2.r0.pt", "client5.r0.pt"]
    assert torch.equal(st.get(5)["w"], torch.full((3,), 2.0))  # read back from disk
    st.begin_round(1)
    st.put(2, _state(3.0))
    st.end_round()  # no checkpoint names r0 yet: the older version goes at once
    assert sorted(p.name for p in tmp_path.iterdir()) == ["client2.r1.pt", "client5.r0.pt"]
    assert st.clients() == [2, 5] and torch.equal(st.get(2)["w"], torch.full((3,), 3.0))


def test_store_checkpoint_writes_only_what_changed_and_keeps_what_a_checkpoint_names(tmp_path):
    st = ClientStore("ema")
    st.attach(tmp_path)
    st.begin_round(0)
    st.put(0, _state(1.0))
    st.put(1, _state(1.0))
    saved = st.checkpoint()
    st.committed()
    assert saved == {"files": {0: "client0.r0.pt", 1: "client1.r0.pt"}}
    before = (tmp_path / "client1.r0.pt").stat().st_mtime_ns
    st.begin_round(1)
    st.put(0, _state(5.0))
    st.end_round()
    # the last checkpoint still names client0.r0: kept until a newer checkpoint supersedes it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["client0.r0.pt", "client0.r1.pt", "client1.r0.pt"]
    # a run killed now resumes from the checkpoint's files
    back = ClientStore("ema")
    back.attach(tmp_path)
    back.restore(saved)
    assert torch.equal(back.get(0)["w"], torch.full((3,), 1.0))
    newer = st.checkpoint()
    st.committed()
    assert newer == {"files": {0: "client0.r1.pt", 1: "client1.r0.pt"}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["client0.r1.pt", "client1.r0.pt"]
    assert (tmp_path / "client1.r0.pt").stat().st_mtime_ns == before  # unchanged entry not rewritten


def test_store_restore_names_missing_files(tmp_path):
    st = ClientStore("ema")
    st.attach(tmp_path)
    with pytest.raises(ConfigError, match="gone from.*move the checkpoint aside"):
        st.restore({"files": {0: "client0.r3.pt"}})


# -- a method with every kind of declared state ---------------------------------------------------


@dataclass(frozen=True)
class _KeepParams(MethodParams):
    name = "test_keep"


class _Keeper(FLMethod):
    """Per-sample counts on the device, a per-client model store, a plain number."""

    Params = _KeepParams
    client_networks = ("personal",)
    persistent = ("seen", "personal", "rounds_done")

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.seen = torch.zeros(len(ctx.data.train), dtype=torch.int64, device=ctx.device)
        self.personal = ClientStore("personal")
        self.rounds_done = 0

    def prepare(self, r, k, nets):
        idx = self.ctx.data.clients[k]
        self.seen[idx] += 1
        prev = self.personal.get(k)
        load(nets["personal"], prev if prev is not None else self.global_model.state_dict())
        return None

    def upload(self, r, k, job, nets):
        # the personal model drifts towards the client's trained model, kept across rounds on disk
        mixed = {n: (0.5 * v + 0.5 * nets["model"].state_dict()[n]) if v.is_floating_point() else v
                 for n, v in nets["personal"].state_dict().items()}
        self.personal.put(k, mixed)
        return {}

    stages = {"main": Stage(loss=FLMethod.loss, prepare=prepare, upload=upload)}

    def end_round(self, r):
        self.rounds_done += 1
        self.round_info["personal_norm"] = float(sum(self.personal.get(k)["head.weight"].norm()
                                                     for k in self.personal.clients()))


def _keeper_run(**kw):
    ctx = make_ctx(TrainSettings(rounds=5, local_epochs=1, batch_size=32, checkpoint_every=2, client_fraction=0.5))
    m = _Keeper(_KeepParams(), ctx)
    return Simulation(m, ctx, progress=lambda s: None, **kw), m


def test_declared_state_resumes_exactly_with_the_store_beside_the_checkpoint(tmp_path):
    full_sim, full = _keeper_run()
    expect = full_sim.run().drop(columns="seconds")
    ckpt = tmp_path / "run.ckpt.pt"
    _keeper_run(checkpoint_path=ckpt, stop_after=3)[0].run()
    folder = tmp_path / "run.ckpt.pt.clients" / "personal"
    assert folder.is_dir() and any(folder.glob("client*.pt"))
    sim, m = _keeper_run(checkpoint_path=ckpt)
    got = sim.run().drop(columns="seconds")
    pd.testing.assert_frame_equal(got, expect, check_exact=True)
    assert m.rounds_done == 5 and torch.equal(m.seen, full.seen)
    for k in full.personal.clients():
        assert all(torch.equal(v, m.personal.get(k)[n]) for n, v in full.personal.get(k).items())
    sim.remove_checkpoint()
    assert not ckpt.exists() and not folder.exists()


def test_state_round_trips_in_memory_and_refuses_a_foreign_checkpoint():
    sim, m = _keeper_run()
    sim.run()
    st = m.state_dict()
    assert set(st["attrs"]) == {"seen", "personal", "rounds_done"} and set(st["globals"]) == {"model"}
    _, fresh = _keeper_run()
    fresh.load_state_dict(st)
    assert torch.equal(fresh.seen, m.seen) and fresh.rounds_done == 5
    assert snapshot(fresh.global_model).keys() == snapshot(m.global_model).keys()
    bad = dict(st, attrs={k: v for k, v in st["attrs"].items() if k != "seen"})
    with pytest.raises(ConfigError, match="does not match.*move it aside"):
        load_method_state(fresh, bad)
    wrong = dict(st, attrs=dict(st["attrs"], seen=torch.zeros(3, dtype=torch.int64)))
    with pytest.raises(ConfigError, match="'seen'.*another run"):
        load_method_state(fresh, wrong)

