"""Reading never runs code: a crafted checkpoint, per-client file or rehearsal spec is refused, not
executed, and a checkpoint that does not load is moved aside (never deleted) while the run restarts.

The payload is harmless: unpickled, it creates a marker file (``Path.touch``), as the one in the
issue did. A group-writable ``results/`` lets anyone in the group place such a file.
"""

from __future__ import annotations

import dataclasses
import io
import json
import pathlib
import pickle

import numpy as np
import pandas as pd
import pytest
import torch

from fnlcore.errors import ConfigError, DataError
from fnlcore.fl import persist
from fnlcore.fl.persist import ClientStore
from fnlcore.fl.settings import TrainSettings
from fnlcore.fl.simulation import Simulation
from fnlcore.methods import METHODS

from .engine_helpers import make_ctx

SETTINGS = TrainSettings(rounds=3, local_epochs=1, batch_size=32, checkpoint_every=1, client_fraction=0.5)


class _Touch:
    """Unpickled, this creates ``marker``: what arbitrary code run by a load would look like."""

    def __init__(self, marker: pathlib.Path):
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def _torch_file(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _crafted(kind: str, marker: pathlib.Path) -> bytes:
    if kind == "torch.save":  # a zip checkpoint whose dict carries the payload
        return _torch_file({"version": 4, "next_round": 2, "x": _Touch(marker)})
    if kind == "pickle":  # a bare pickle (torch.load's legacy format)
        return pickle.dumps(_Touch(marker), protocol=2)
    # the format of fnlcore before checkpoint version 5: numpy arrays in the random states
    return _torch_file({"version": 4, "rng": {"numpy": np.random.RandomState(0).get_state()}, "x": _Touch(marker)})


def _sim(log=None, **kw):
    ctx = make_ctx(SETTINGS)
    m = METHODS["fedavg"](METHODS["fedavg"].Params(), ctx)
    return Simulation(m, ctx, progress=(log.append if log is not None else lambda s: None), **kw)


def _metrics(sim) -> pd.DataFrame:
    return sim.run().drop(columns="seconds")


@pytest.mark.parametrize("kind", ["torch.save", "pickle", "old format"])
def test_a_crafted_checkpoint_runs_nothing_is_moved_aside_and_the_run_restarts(tmp_path, kind):
    marker = tmp_path / "marker"
    ckpt = tmp_path / "run.ckpt.pt"
    payload = _crafted(kind, marker)
    ckpt.write_bytes(payload)
    (tmp_path / "run.ckpt.pt.corrupt").write_bytes(b"moved aside by an earlier run")
    log: list[str] = []
    got = _metrics(_sim(log=log, checkpoint_path=ckpt, stop_after=SETTINGS.rounds))
    assert not marker.exists(), "loading the checkpoint ran the code in it"
    pd.testing.assert_frame_equal(got, _metrics(_sim()), check_exact=True)  # every round, from round 0
    kept = tmp_path / "run.ckpt.pt.corrupt.1"  # the earlier file is not overwritten
    assert kept.read_bytes() == payload and (tmp_path / "run.ckpt.pt.corrupt").read_bytes().startswith(b"moved")
    (line,) = [s for s in log if "restarting" in s]
    assert str(ckpt) in line and f"moved it to {kept}" in line and "unreadable" in line and "\n" not in line
    assert "refused, nothing in it was run" in line and "GLOBAL" in line  # torch names the global it refused


def test_a_checkpoint_written_now_loads_safely_and_resumes_exactly(tmp_path):
    ckpt = tmp_path / "run.ckpt.pt"
    _sim(checkpoint_path=ckpt, stop_after=2).run()
    raw = torch.load(ckpt, map_location="cpu", weights_only=True)  # no allow-listed global needed
    assert raw["version"] == 5 and isinstance(raw["rng"]["numpy"][1], dict)  # the numpy state, as tensor bytes
    log: list[str] = []
    got = _metrics(_sim(log=log, checkpoint_path=ckpt))
    assert any(s.startswith(f"resumed from {ckpt} at round 2") for s in log), log
    pd.testing.assert_frame_equal(got, _metrics(_sim()), check_exact=True)


def test_the_safe_form_rebuilds_every_kind_of_state_exactly():
    state = {
        "f64": np.arange(6, dtype=np.float64).reshape(2, 3) / 7,
        "fortran": np.asfortranarray(np.arange(6, dtype=np.int64).reshape(3, 2)),
        "u32": np.random.RandomState(1).get_state(), "bool": np.zeros(0, dtype=bool), "scalar": np.float32(0.1),
        "ns": [np.int64(3), np.bool_(True), np.float64(0.1), np.str_("a")], "fs": frozenset({3, 1, 2}), "s": {5, 4}, "t": torch.arange(3),
        "odd keys": {np.int64(1): "a", (2, 3): "b"}, "tag-like": {persist._TAG: 1}, "plain": (1, 2.5, "x", None, True),
    }
    back = persist.from_safe_form(torch.load(io.BytesIO(_torch_file(persist.to_safe_form(state))), weights_only=True))
    assert list(back) == list(state)
    for k, v in state.items():
        b = back[k]
        if k == "u32":
            assert b[0] == v[0] and b[1].dtype == np.uint32 and np.array_equal(b[1], v[1]) and b[2:] == v[2:]
        elif isinstance(v, np.ndarray):
            assert b.dtype == v.dtype and b.shape == v.shape and np.array_equal(b, v)
            assert b.flags.f_contiguous == v.flags.f_contiguous
        elif isinstance(v, torch.Tensor):
            assert torch.equal(b, v)
        else:
            assert type(b) is type(v) and b == v, k
            if k == "ns":
                assert [type(x) for x in b] == [type(x) for x in v]
    assert type(back["scalar"]) is np.float32 and {type(k) for k in back["odd keys"]} == {np.int64, tuple}
    with pytest.raises(TypeError, match=r"state\['obj'\].*cannot be checkpointed safely"):
        persist.to_safe_form({"obj": object()})


def test_a_checkpoint_naming_a_file_outside_its_store_is_moved_aside_and_the_file_kept(tmp_path):
    from .test_persist import _keeper_run

    ckpt = tmp_path / "run.ckpt.pt"
    _keeper_run(checkpoint_path=ckpt, stop_after=2)[0].run()
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    payload = torch.load(ckpt, map_location="cpu", weights_only=True)
    files = payload["method"]["attrs"]["personal"]["files"]
    for k in files:
        files[k] = "../../precious.txt"  # the store reads, and once superseded removes, what the checkpoint names
    torch.save(payload, ckpt)
    crafted = ckpt.read_bytes()
    sim, _ = _keeper_run(checkpoint_path=ckpt)
    log: list[str] = []
    sim.progress = log.append
    sim.run()
    assert victim.read_text() == "keep me"
    assert (tmp_path / "run.ckpt.pt.corrupt").read_bytes() == crafted
    assert any("not a per-client state file name" in s and "restarting the run from round 0" in s for s in log), log


def test_a_crafted_per_client_file_is_refused_and_named(tmp_path):
    marker = tmp_path / "marker"
    st = ClientStore("ema")
    st.attach(tmp_path / "run.ckpt.pt.clients" / "ema")
    st.put(3, {"w": torch.ones(4)})
    st.end_round()
    f = tmp_path / "run.ckpt.pt.clients" / "ema" / "client3.r0.pt"
    f.write_bytes(_torch_file({"w": _Touch(marker)}))
    with pytest.raises(DataError, match=rf"{f}: client 3's saved ema state is unreadable \(refused, nothing"):
        st.get(3)
    assert not marker.exists() and f.exists()


# -- the rehearsal's spec ---------------------------------------------------------------------------


def _toy_spec(workdir: pathlib.Path) -> dict:
    from fnlcore.app.plan import build_plan, validate_schema
    from fnlcore.app.rehearse import Options, distinct_configs

    plan = build_plan(validate_schema({"tables": ["demo"], "scale": "smoke", "data_grid": []}))
    r = next(iter(distinct_configs(plan).values()))
    return {"run": r.run, "dataset_options": dict(r.dataset_options), "workdir": str(workdir),
            **dataclasses.asdict(Options())}


@pytest.mark.parametrize("name", ["spec.json", "spec.pkl"])
def test_a_crafted_rehearsal_spec_is_refused_not_run(tmp_path, name):
    from fnlcore.app import rehearse_job

    marker = tmp_path / "marker"
    spec = tmp_path / name
    spec.write_bytes(pickle.dumps(_Touch(marker)))
    assert rehearse_job.main([str(spec), "1"]) == 1
    assert not marker.exists(), "reading the spec ran the code in it"
    (event,) = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert event["event"] == "error" and str(spec) in event["error"] and "refused" in event["error"]


def test_the_rehearsal_spec_is_json_and_rebuilds_the_run(tmp_path):
    from fnlcore.app.rehearse import read_spec, write_spec

    spec = _toy_spec(tmp_path)
    path = write_spec(tmp_path / "spec.json", spec)
    assert json.loads(path.read_text())["run"]["method"]["name"] == spec["run"].method.name
    back = read_spec(path)
    assert back == spec and repr(back["run"]) == repr(spec["run"])
    assert back["run"].fields() == spec["run"].fields()  # the same run folder
    broken = json.loads(path.read_text())
    broken["run"]["method"]["no_such_key"] = 1
    path.write_text(json.dumps(broken))
    with pytest.raises(ConfigError, match="not a rehearsal spec.*unknown key"):
        read_spec(path)
