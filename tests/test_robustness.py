"""Results that are never stale, never unreadable, never private; errors that name the file and the fix.

* checkpoints record the code and settings that made them; another code or settings restarts the run, saying so;
* artifacts get the umask's mode, not a temporary file's 0600;
* a truncated parquet file or checkpoint, and a full disk, are named with the fix; failures a retry
  cannot fix are not retried;
* an unknown model, an absent CUDA device and a YAML syntax error are found before any job runs;
* ``fnl plan`` says what it measures and warns about step costs timed on a busy machine.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import stat

import numpy as np
import pandas as pd
import pytest
import torch

from fnlcore import io, provenance
from fnlcore.app import cost as cost_mod
from fnlcore.app.train import failure_marker, run_attempt
from fnlcore.app.plan import build_plan, load_plan, validate_schema
from fnlcore.errors import (
    ConfigError,
    DataError,
    NotRetried,
    StorageError,
    retry_cannot_fix,
)
from fnlcore.fl import persist
from fnlcore.fl.context import device_problem
from fnlcore.fl.persist import ClientStore, load_safely, to_safe_form
from fnlcore.fl.settings import TrainSettings
from fnlcore.fl.simulation import Simulation
from fnlcore.methods import METHODS
from fnlcore.schemas import load_yaml

from .engine_helpers import make_ctx

SETTINGS = TrainSettings(rounds=4, local_epochs=1, batch_size=32, checkpoint_every=1, client_fraction=0.5)


def _sim(settings=SETTINGS, log=None, **kw):
    ctx = make_ctx(settings)
    m = METHODS["fedavg"](METHODS["fedavg"].Params(), ctx)
    return Simulation(m, ctx, progress=(log.append if log is not None else lambda s: None), **kw)


def _metrics(sim) -> pd.DataFrame:
    return sim.run().drop(columns="seconds")


# -- 3. checkpoints carry what made them ----------------------------------------------------------


def test_checkpoint_of_other_settings_restarts_from_scratch_and_says_so(tmp_path):
    ckpt = tmp_path / "run.ckpt.pt"
    _sim(checkpoint_path=ckpt, stop_after=2).run()
    other = dataclasses.replace(SETTINGS, lr=0.05)
    expect = _metrics(_sim(other))
    log: list[str] = []
    got = _metrics(_sim(other, log=log, checkpoint_path=ckpt))
    pd.testing.assert_frame_equal(got, expect, check_exact=True)  # all four rounds, none taken from the old run
    (line,) = [s for s in log if "restarting" in s]
    assert str(ckpt) in line and line.count("settings ") == 2 and line.count("code ") == 2
    assert not any(s.startswith("resumed") for s in log)


def test_checkpoint_of_other_code_restarts_and_names_both_versions(tmp_path, monkeypatch):
    ckpt = tmp_path / "run.ckpt.pt"
    monkeypatch.setattr(provenance, "source_digest", lambda: "0ldc0de0ldc0")
    _sim(checkpoint_path=ckpt, stop_after=2).run()
    old = provenance.code_version()
    monkeypatch.undo()
    log: list[str] = []
    got = _metrics(_sim(log=log, checkpoint_path=ckpt))
    pd.testing.assert_frame_equal(got, _metrics(_sim()), check_exact=True)
    (line,) = [s for s in log if "restarting" in s]
    assert old in line and provenance.code_version() in line and old != provenance.code_version()


def test_same_code_and_settings_resume_and_the_checkpoint_interval_is_not_part_of_the_run(tmp_path):
    ckpt = tmp_path / "run.ckpt.pt"
    _sim(checkpoint_path=ckpt, stop_after=2).run()
    log: list[str] = []
    every2 = dataclasses.replace(SETTINGS, checkpoint_every=2)
    got = _metrics(_sim(every2, log=log, checkpoint_path=ckpt))
    assert any(s.startswith(f"resumed from {ckpt} at round 2") for s in log), log
    pd.testing.assert_frame_equal(got, _metrics(_sim()), check_exact=True)


def test_a_checkpoint_without_a_record_of_its_code_is_not_resumed(tmp_path):
    ckpt = tmp_path / "run.ckpt.pt"
    _sim(checkpoint_path=ckpt, stop_after=2).run()
    payload = load_safely(ckpt)
    payload.pop("made_by")
    payload["version"] = 3  # what the code before checkpoints recorded their maker wrote
    torch.save(to_safe_form(payload), ckpt)
    log: list[str] = []
    _sim(log=log, checkpoint_path=ckpt, stop_after=1).run()
    assert any("format 3" in s and "restarting the run from round 0" in s for s in log), log


def test_code_version_is_the_package_version_and_a_source_digest():
    from fnlcore import __version__

    v = provenance.code_version()
    assert v.startswith(__version__ + "+src.") and len(v.split("+src.")[1]) == 12
    assert provenance.settings_digest({"a": 1, "b": (1, 2)}) == provenance.settings_digest({"b": [1, 2], "a": 1})
    assert provenance.settings_digest({"a": 1}) != provenance.settings_digest({"a": 2})
    # a user's plug-in method lives outside the package: its own file's digest joins the run's identity
    assert provenance.plugin_digest(Simulation) is None
    assert provenance.plugin_digest(_PluginLike) == provenance.file_digest(__file__)


class _PluginLike:
    """Stands for a method defined outside fnlcore."""


# -- 6. the umask, not 0600 -------------------------------------------------------------------------


@pytest.fixture(params=[0o022, 0o077], ids=["umask022", "umask077"])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def _mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_artifacts_get_the_mode_a_plain_open_would_give(tmp_path, umask):
    folder = tmp_path / "new" / "deeper"
    io.write_json({"a": 1}, folder / "x.json")
    io.write_parquet(pd.DataFrame({"a": [1, 2]}), folder / "x.parquet")
    io.write_csv(pd.DataFrame({"a": [1]}), folder / "x.csv")
    io.write_npz(folder / "x.npz", a=np.arange(3))
    with open(tmp_path / "plain.txt", "w") as fh:
        fh.write("x")
    assert _mode(tmp_path / "plain.txt") == 0o666 & ~umask
    for name in ("x.json", "x.parquet", "x.csv", "x.npz"):
        assert _mode(folder / name) == 0o666 & ~umask, name
    assert _mode(folder) == _mode(tmp_path / "new") == 0o777 & ~umask
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temporary left behind


def test_checkpoints_and_per_client_files_get_the_umask_mode(tmp_path, umask):
    ckpt = tmp_path / "run.ckpt.pt"
    _sim(checkpoint_path=ckpt, stop_after=1).run()
    assert _mode(ckpt) == 0o666 & ~umask
    st = ClientStore("ema")
    st.attach(tmp_path / "store")
    st.put(0, {"w": torch.ones(2)})
    st.end_round()
    assert _mode(tmp_path / "store" / "client0.r0.pt") == 0o666 & ~umask


# -- 7. truncated inputs and checkpoints, a full disk, no retries of what cannot change ---------------


def test_truncated_parquet_names_the_file_and_the_fix(tmp_path):
    path = tmp_path / "noise.parquet"
    io.write_parquet(pd.DataFrame({"a": np.arange(1000)}), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=rf"{path}: not a readable parquet file .*truncated or corrupt: delete it and rerun"):
        io.read_parquet(path)
    with pytest.raises(FileNotFoundError):  # a missing file stays a missing file
        io.read_parquet(tmp_path / "absent.parquet")


def test_truncated_checkpoint_is_moved_aside_and_the_run_restarts_saying_so(tmp_path):
    ckpt = tmp_path / "run.ckpt.pt"
    _sim(checkpoint_path=ckpt, stop_after=2).run()
    data = ckpt.read_bytes()
    ckpt.write_bytes(data[: len(data) // 3])
    log: list[str] = []
    got = _metrics(_sim(log=log, checkpoint_path=ckpt))
    pd.testing.assert_frame_equal(got, _metrics(_sim()), check_exact=True)
    (line,) = [s for s in log if "unreadable" in s]
    aside = f"{ckpt}.corrupt"
    assert str(ckpt) in line and f"moved it to {aside}" in line and "restarting the run from round 0" in line
    assert os.path.exists(aside)


def test_a_truncated_per_client_file_names_itself_and_the_fix(tmp_path):
    st = ClientStore("ema")
    st.attach(tmp_path / "run.ckpt.pt.clients" / "ema")
    st.put(3, {"w": torch.ones(100)})
    st.end_round()
    f = tmp_path / "run.ckpt.pt.clients" / "ema" / "client3.r0.pt"
    f.write_bytes(f.read_bytes()[:50])
    with pytest.raises(DataError, match=rf"{f}: client 3's saved ema state is unreadable.*move .* aside to restart"):
        st.get(3)


def test_free_space_is_checked_before_a_checkpoint(tmp_path, monkeypatch):
    ckpt = tmp_path / "run.ckpt.pt"
    _sim(checkpoint_path=ckpt, stop_after=1).run()
    before = ckpt.read_bytes()
    monkeypatch.setattr(io, "free_bytes", lambda folder: 4096)
    with pytest.raises(StorageError) as err:
        _sim(checkpoint_path=ckpt, stop_after=2).run()
    msg = str(err.value)
    assert str(tmp_path) in msg and "4.0 KiB are free" in msg and "needs about" in msg and "free some space" in msg
    assert ckpt.read_bytes() == before  # the last good checkpoint is untouched


def test_estimated_checkpoint_size_covers_the_written_file(tmp_path):
    ckpt = tmp_path / "run.ckpt.pt"
    sim = _sim(checkpoint_path=ckpt, stop_after=1)
    sim.run()
    payload = load_safely(ckpt)
    assert persist.estimated_size(payload) >= ckpt.stat().st_size


def test_a_disk_filling_during_a_write_names_the_folder_and_leaves_no_partial_file(tmp_path, monkeypatch):
    ckpt = tmp_path / "run.ckpt.pt"
    _sim(checkpoint_path=ckpt, stop_after=1).run()
    before = ckpt.read_bytes()

    def full(obj, path):
        with open(path, "wb") as fh:
            fh.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(persist.torch, "save", full)
    with pytest.raises(StorageError, match=rf"disk holding {tmp_path} filled up while writing run.ckpt.pt"):
        _sim(checkpoint_path=ckpt, stop_after=2).run()
    assert ckpt.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_torchs_write_error_on_a_full_disk_is_named_as_one(tmp_path, monkeypatch):
    """torch reports ENOSPC as 'file write failed' / 'unexpected pos': the folder's free space tells."""

    def torch_style(obj, path):
        raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 41344 vs 41232")

    monkeypatch.setattr(io, "free_bytes", lambda folder: 512)
    full = rf"disk holding {tmp_path} filled up while writing x.pt \(512 bytes free now\)"
    with pytest.raises(StorageError, match=full), io.atomic_path(tmp_path / "x.pt") as tmp:
        torch_style(None, tmp)
    monkeypatch.setattr(io, "free_bytes", lambda folder: 10 << 30)
    # with room left it is not a full disk
    with pytest.raises(RuntimeError, match="unexpected pos"), io.atomic_path(tmp_path / "x.pt") as tmp:
        torch_style(None, tmp)


def test_failures_a_retry_cannot_fix_are_told_apart():
    assert retry_cannot_fix(ConfigError("x")) and retry_cannot_fix(DataError("x"))
    assert retry_cannot_fix(RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x10 and 9x3)"))
    assert not retry_cannot_fix(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert not retry_cannot_fix(StorageError("disk full")) and not retry_cannot_fix(OSError("node lost"))


def test_a_later_attempt_after_a_deterministic_failure_fails_at_once(tmp_path):
    marker = failure_marker(tmp_path / "run.ckpt.pt")
    calls = []

    def bad():
        calls.append(1)
        raise ConfigError("training.model='resnet99' is not a model")

    with pytest.raises(ConfigError):
        run_attempt(marker, 1, bad)
    with pytest.raises(NotRetried, match="not retried.*ConfigError: training.model='resnet99'.*fix it and rerun"):
        run_attempt(marker, 2, bad)
    assert len(calls) == 1  # the retry did not run the job
    with pytest.raises(ConfigError):  # a new invocation (attempt 1) runs it again
        run_attempt(marker, 1, bad)
    assert len(calls) == 2
    assert run_attempt(marker, 1, lambda: "ok") == "ok" and not marker.exists()


def test_a_transient_failure_is_retried(tmp_path):
    marker = failure_marker(tmp_path / "run.ckpt.pt")
    with pytest.raises(RuntimeError):
        run_attempt(marker, 1, lambda: (_ for _ in ()).throw(RuntimeError("NCCL timeout")))
    assert not marker.exists()
    assert run_attempt(marker, 2, lambda: 7) == 7


# -- 8. up-front validation: models, devices, YAML syntax ------------------------------------------------


def _scale_file(tmp_path, **training) -> str:
    from fnlcore.app.runs import SCALES_DIR

    doc = load_yaml(SCALES_DIR / "smoke.yaml")
    doc["training"] = {**doc.get("training", {}), **training}
    path = tmp_path / "myscale.yaml"
    import yaml

    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_an_unknown_model_is_a_config_error_naming_the_valid_ones(tmp_path):
    scale = _scale_file(tmp_path, model="resnet99")
    with pytest.raises(ConfigError, match=r"training.model='resnet99' is not a model; valid: auto, .*resnet18_cifar"):
        build_plan(validate_schema({"tables": ["demo"], "scale": scale, "data_grid": []}))
    with pytest.raises(ConfigError, match=r"'cnn' has no pretrained weights.*resnet18"):
        build_plan(validate_schema({"tables": ["demo"], "scale": _scale_file(tmp_path, model="cnn", pretrained=True),
                                    "data_grid": []}))


def test_cuda_on_a_machine_without_it_is_a_config_error_with_the_fix(monkeypatch):
    cfg = {"tables": [], "data_grid": [], "device": "cuda:0"}
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"device: 'cuda:0': no CUDA device.*device: auto.*cpu"):
            build_plan(validate_schema(dict(cfg)))
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert device_problem("cuda:1") is None and device_problem("cuda") is None and device_problem("cpu") is None
    with pytest.raises(ConfigError, match=r"'cuda:2': this machine has 2 CUDA device\(s\), cuda:0 to cuda:1"):
        build_plan(validate_schema({**cfg, "device": "cuda:2"}))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert "no CUDA device on this machine" in device_problem("cuda")
    build_plan(validate_schema(dict(cfg)), jobs_run_here=False)  # a cluster's submit node: the jobs run elsewhere
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: False)
    with pytest.raises(ConfigError, match="CPU-only build"):
        build_plan(validate_schema(dict(cfg)), jobs_run_here=False)


def test_a_yaml_syntax_error_is_one_line_with_file_line_and_column(tmp_path, monkeypatch):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("results_dir: results\ntables: [demo\ndevice: cpu\n")
    with pytest.raises(ConfigError) as err:
        load_plan(cfg)
    msg = str(err.value)
    assert msg.startswith(f"{cfg}:3:7: YAML syntax error: ") and "\n" not in msg and "fix the file" in msg
    from fnlcore.app import papers

    (tmp_path / "papers").mkdir()
    (tmp_path / "papers" / "mine.yaml").write_text("tables:\n  - table: t1\n   rows: []\n")
    monkeypatch.setattr(papers, "PAPERS_DIR", tmp_path / "papers")
    with pytest.raises(ConfigError, match=rf"^tables\[0\]: {tmp_path}/papers/mine.yaml:3:4: YAML syntax error: [^\n]+$"):
        build_plan(validate_schema({"tables": ["mine"], "data_grid": []}))


# -- 11. fnl plan: progress per shape, the load of each calibration -----------------------------------------


@pytest.fixture
def fake_measure(monkeypatch):
    """Step costs without timing anything (and a machine load the test sets)."""
    load = {"now": 0.2}
    monkeypatch.setattr(cost_mod, "measure_step", lambda shape, device, steps=5: cost_mod.StepCost(0.01, 0.0001))
    monkeypatch.setattr(cost_mod.os, "getloadavg", lambda: (load["now"] * (os.cpu_count() or 1), 0.0, 0.0))
    return load


def _plan():
    return build_plan(validate_schema({"tables": ["demo"], "scale": "smoke", "data_grid": []}))


def test_plan_reports_each_shape_as_it_is_measured_and_records_the_load(tmp_path, fake_measure):
    path = tmp_path / "costs.json"
    lines: list[str] = []
    cal = cost_mod.Calibration(path, torch.device("cpu"))
    cost = cost_mod.estimate_plan(_plan(), cal, progress=lines.append)
    shapes = {rc.shape.key() for rc in cost.runs.values()}
    measured = [s for s in lines if "] measured " in s]
    assert len(measured) == len(shapes) == len(cal.measured)
    assert lines[0].startswith(f"measuring {len(shapes)} step shape(s)")
    assert all(f"/{len(shapes)}] measured " in s and "s/step in " in s and "load 0.20 per core" in s for s in measured)
    entries = json.loads(path.read_text())["devices"][cal.description]
    assert all(e["load"] == pytest.approx(0.2) for e in entries.values())
    text = cost_mod.format_estimate(cost, cal, "smoke")
    assert "warning" not in text and " 0.20  " in text


def test_plan_warns_about_a_busy_machine_now_and_about_cached_costs_measured_under_load(tmp_path, fake_measure):
    path = tmp_path / "costs.json"
    fake_measure["now"] = 1.5
    lines: list[str] = []
    cal = cost_mod.Calibration(path, torch.device("cpu"))
    cost_mod.estimate_plan(_plan(), cal, progress=lines.append)
    assert any(s.startswith("warning: this machine is busy") and "--recalibrate" in s for s in lines)
    assert all("(high)" in s for s in lines if "] measured " in s)
    # later, on a quiet machine, the cached costs are reused: the report says they were measured under load
    fake_measure["now"] = 0.0
    again = cost_mod.Calibration(path, torch.device("cpu"))
    later: list[str] = []
    text = cost_mod.format_estimate(cost_mod.estimate_plan(_plan(), again, progress=later.append), again, "smoke")
    assert later == [] and again.measured == []  # nothing measured: read from the cache
    assert "were measured on a busy machine" in text and "1.50 load per core" in text and "fnl plan --recalibrate" in text
    fresh = cost_mod.Calibration(path, torch.device("cpu"), refresh=True)
    text = cost_mod.format_estimate(cost_mod.estimate_plan(_plan(), fresh), fresh, "smoke")
    assert "busy machine" not in text


def test_cached_costs_without_a_load_are_flagged(tmp_path, fake_measure):
    path = tmp_path / "costs.json"
    cal = cost_mod.Calibration(path, torch.device("cpu"))
    cost = cost_mod.estimate_plan(_plan(), cal)
    raw = json.loads(path.read_text())
    for e in raw["devices"][cal.description].values():
        e.pop("load")
    path.write_text(json.dumps(raw))
    old = cost_mod.Calibration(path, torch.device("cpu"))
    text = cost_mod.format_estimate(cost_mod.estimate_plan(_plan(), old), old, "smoke")
    n = len({rc.shape.key() for rc in cost.runs.values()})
    assert f"note: {n} of {n} step costs were cached without the machine's load" in text
