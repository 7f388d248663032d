"""Run groups (fnlcore.app.run_group): several runs trained side by side by one job.

Each grouped run's metrics and model equal the same run trained alone; a group killed mid-way
(SIGKILL to the group's process, as scancel's end or a lost node) and run again trains no
finished run again and resumes the unfinished one from its checkpoint; a failed run fails the
group without losing the finished ones; a time limit gives exit 75."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch

from fnlcore.app.results_lock import lock_holder
from fnlcore.app.run_group import (
    Member,
    form_run_groups,
    group_request,
    member_from_json,
    member_to_json,
    overlap_share,
    publish_staged,
    staged_complete,
    staged_dir,
    train_group,
)
from fnlcore.app.train import RunSpec, train_job
from fnlcore.errors import EXIT_CONTINUE, ConfigError
from fnlcore.fl.settings import TrainSettings
from fnlcore.methods import METHODS

from .test_contracts import assert_same_state
from .test_time_budget import _prepared_digits

ROOT = Path(__file__).resolve().parents[1]


def _member(tmp_path, data_dir, noise, name, method="fedavg", seed=0, rounds=3, checkpoint_every=2):
    settings = TrainSettings(rounds=rounds, local_epochs=1, batch_size=32, checkpoint_every=checkpoint_every,
                             client_fraction=0.5)
    out = tmp_path / "runs" / name
    spec = RunSpec(data_dir, noise, 4, settings, METHODS[method].Params(), seed, str(out / "metrics.parquet"),
                   str(out / "clients.parquet"), str(out / "final.pt"), str(tmp_path / "checkpoints" / f"{name}.pt"),
                   relabels=str(out / "relabels.parquet"), device="cpu")
    return Member(spec, identity=f"{method}-{rounds}", log=str(tmp_path / "logs" / f"{name}.log"), tag=name)


def _alone(member: Member, tmp_path) -> RunSpec:
    """The same run trained by itself, in this process, with the group's one thread a run."""
    d = tmp_path / "alone" / Path(member.spec.metrics).parent.name
    spec = replace(member.spec, metrics=str(d / "metrics.parquet"), clients=str(d / "clients.parquet"),
                   model=str(d / "final.pt"), relabels=str(d / "relabels.parquet"), checkpoint=str(d / "ckpt.pt"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert train_job(spec, progress=lambda s: None) == 0
    finally:
        torch.set_num_threads(threads)
    return spec


def _log_span(path: str) -> tuple[int, int]:
    """Seconds of the day of a log's first and last line (``HH:MM:SS INFO ...``)."""
    times = [ln[:8] for ln in Path(path).read_text().splitlines() if ln[2:3] == ":" and ln[5:6] == ":"]
    h, m, sec = (int(x) for x in times[0].split(":"))
    start = h * 3600 + m * 60 + sec
    h, m, sec = (int(x) for x in times[-1].split(":"))
    end = h * 3600 + m * 60 + sec
    return start, end if end >= start else end + 86400  # across midnight


def _assert_same_run(got: RunSpec, expect: RunSpec) -> None:
    for key in ("metrics", "clients", "relabels"):
        a, b = pd.read_parquet(getattr(got, key)), pd.read_parquet(getattr(expect, key))
        drop = [c for c in ("seconds",) if c in a.columns]  # wall time of each round
        pd.testing.assert_frame_equal(a.drop(columns=drop), b.drop(columns=drop), check_exact=True)
    a, b = (torch.load(p.model, weights_only=True)["state_dict"] for p in (got, expect))
    assert_same_state(a, b)


def test_each_grouped_run_equals_the_same_run_trained_alone(tmp_path):
    data_dir, noise = _prepared_digits(tmp_path)
    members = [_member(tmp_path, data_dir, noise, "a", "fedavg", 0),
               _member(tmp_path, data_dir, noise, "b", "fedavg", 1),
               _member(tmp_path, data_dir, noise, "c", "fedprox", 0)]
    record = tmp_path / "groups" / "g.json"
    lines: list[str] = []
    assert train_group(members, record, log=lines.append) == 0
    runs = json.loads(record.read_text())["runs"]
    assert [r["status"] for r in runs] == ["trained"] * 3
    # side by side, from the runs' own logs (first and last line): every run had begun before any ended
    spans = [_log_span(m.log) for m in members]
    assert max(s for s, _ in spans) < min(e for _, e in spans), spans
    for m in members:
        assert not Path(m.spec.metrics).exists()  # the group stages; the run's own job publishes
        assert publish_staged(m.spec, m.identity)
        _assert_same_run(m.spec, _alone(m, tmp_path))
        assert not Path(m.spec.checkpoint).exists()  # a finished run keeps no checkpoint
    # published by linking: one copy on disk
    assert os.path.samefile(members[0].spec.metrics, staged_dir(members[0].spec.checkpoint) / "metrics.parquet")


def _group_process(tmp_path, members, record) -> subprocess.Popen:
    job = tmp_path / "group.json"  # plain data, as a group job hands a run to its child (nothing read runs code)
    job.write_text(json.dumps([member_to_json(m) for m in members]))
    code = ("import json, sys; from fnlcore.app.run_group import member_from_json, train_group; "
            f"sys.exit(train_group([member_from_json(d) for d in json.load(open({str(job)!r}))], {str(record)!r}))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", code], env=env)


def _wait_for(cond, proc, what: str, limit_s: float = 300) -> None:
    end = time.monotonic() + limit_s
    while not cond():
        assert proc.poll() is None, f"the group ended (exit {proc.returncode}) before {what}"
        assert time.monotonic() < end, f"no {what} after {limit_s} s"
        time.sleep(0.1)


def test_a_group_killed_mid_way_and_rerun_trains_no_finished_run_and_resumes_the_others(tmp_path):
    data_dir, noise = _prepared_digits(tmp_path)
    short = _member(tmp_path, data_dir, noise, "short", rounds=1)
    long = _member(tmp_path, data_dir, noise, "long", rounds=400, checkpoint_every=1)
    record = tmp_path / "groups" / "g.json"
    proc = _group_process(tmp_path, [short, long], record)
    try:
        _wait_for(lambda: staged_complete(short.spec, short.identity) and Path(long.spec.checkpoint).exists(),
                  proc, "finished short run and checkpoint of the long one")
        os.kill(proc.pid, signal.SIGKILL)  # the group's process only: its children must follow it
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    end = time.monotonic() + 60
    while lock_holder(long.spec.checkpoint + ".lock") is not None:  # the long run's child died with its group
        assert time.monotonic() < end, "the long run's child outlived its killed group"
        time.sleep(0.1)
    assert not record.exists() and not staged_complete(long.spec, long.identity)
    staged = sorted(staged_dir(short.spec.checkpoint).iterdir())
    before = {p: p.stat().st_mtime_ns for p in staged}
    short_log = Path(short.log).read_text()

    lines: list[str] = []
    # the rerun with a time budget of 0: the long run advances one round from its checkpoint and stops (exit 75)
    assert train_group([short, long], record, attempt=2, time_budget_s=0.0, log=lines.append) == EXIT_CONTINUE
    assert f"{Path(short.spec.metrics).parent}: already trained, not trained again" in lines
    assert {p: p.stat().st_mtime_ns for p in staged} == before
    assert Path(short.log).read_text() == short_log  # no line: its run was not started
    assert "resumed from" in Path(long.log).read_text()
    assert not record.exists()  # not every run is done


def test_a_failed_run_fails_the_group_and_the_finished_runs_are_kept(tmp_path):
    data_dir, noise = _prepared_digits(tmp_path)
    good = _member(tmp_path, data_dir, noise, "good", rounds=1)
    bad = _member(tmp_path, str(tmp_path / "no-such-dataset"), noise, "bad", rounds=1)
    lines: list[str] = []
    assert train_group([good, bad], tmp_path / "g.json", log=lines.append) == 1
    assert staged_complete(good.spec, good.identity) and not staged_complete(bad.spec, bad.identity)
    assert any("1 of 2 runs failed" in ln and "bad" in ln for ln in lines)
    assert not (tmp_path / "g.json").exists()


def test_staged_outputs_of_other_settings_are_not_published(tmp_path):
    data_dir, noise = _prepared_digits(tmp_path)
    m = _member(tmp_path, data_dir, noise, "a", rounds=1)
    assert not publish_staged(m.spec, m.identity)  # nothing staged
    assert train_group([m], tmp_path / "g.json") == 0
    assert not publish_staged(m.spec, "other settings") and not Path(m.spec.metrics).exists()
    assert publish_staged(m.spec, m.identity) and Path(m.spec.metrics).is_file()


class _Planned:
    """What form_run_groups reads of a planned run (fnlcore.app.runs.RunSpec): its path's fields."""

    def __init__(self, dataset, train, seed):
        self.f = {"dataset": dataset, "partition": "iid-c3", "pseed": 0, "noise": "clean", "nseed": 0,
                  "train": train, "method": "fedavg", "seed": seed}

    def fields(self):
        return dict(self.f)

    def files(self, results):
        return {"metrics": f"{results}/runs/" + "/".join(str(v) for v in self.f.values()) + "/metrics.parquet"}


def _planned(dataset, train, seed):
    return _Planned(dataset, train, seed)


def test_runs_are_grouped_by_dataset_and_training_settings_in_plan_order():
    runs = [_planned("digits", "t1", s) for s in range(5)] + [_planned("digits", "t2", 0), _planned("mnist", "t1", 0)]
    groups = form_run_groups(runs, 2, "results")
    assert [[(r.f["dataset"], r.f["train"], r.f["seed"]) for r in g.runs] for g in groups] == [
        [("digits", "t1", 0), ("digits", "t1", 1)], [("digits", "t1", 2), ("digits", "t1", 3)],
        [("digits", "t1", 4)], [("digits", "t2", 0)], [("mnist", "t1", 0)]]
    assert len({g.gid for g in groups}) == len(groups)
    assert form_run_groups(runs, 1, "results") == []
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ConfigError, match="run_groups"):
            form_run_groups(runs, bad, "results")


def test_a_group_asks_for_its_runs_summed_needs_capped_by_the_site():
    runs = [(2000, 100, 30), (3000, 200, 50)]
    assert group_request(runs, None, 1440) == {"mem_mb": 5000, "disk_mb": 300, "runtime": 80}
    assert group_request(runs, 4000, 60) == {"mem_mb": 4000, "disk_mb": 300, "runtime": 60}


def test_fnl_cell_trains_its_runs_ungrouped_whatever_the_users_run_groups():
    """A run group would train other cells' runs too: the cell's --config (which wins over a configfile's) sets 1."""
    from fnlcore import cli

    class PT:
        paper, table = "demo", "demo"

    cmd = cli.cell_command(PT, "paper", "results", ["a/metrics.parquet"], ["--configfile", "my.yaml"])
    config = cmd[cmd.index("--config"):cmd.index("--cores")]
    assert "run_groups=1" in config
    assert cmd.index("run_groups=1") < cmd.index("--configfile")


def test_a_member_goes_to_its_child_as_plain_json_and_comes_back_equal(tmp_path):
    """The group's process hands each child its run as JSON (nothing read can run code), and the
    child rebuilds the very same run: settings and method parameters included."""
    m = _member(tmp_path, "data", "noise.parquet", "a", method="fedprox", rounds=2)
    m = replace(m, spec=replace(m.spec, settings=replace(m.spec.settings, lr_schedule="step", lr_milestones=(1, 2))))
    text = json.dumps(member_to_json(m))
    assert member_from_json(json.loads(text)) == m


def test_the_share_of_a_groups_time_with_two_or_more_runs_at_once():
    assert overlap_share([(0.0, 10.0)]) == 0.0  # one run: never two at once
    assert overlap_share([(0.0, 10.0), (0.0, 10.0)]) == 1.0
    assert overlap_share([(0.0, 4.0), (6.0, 10.0)]) == 0.0  # one after the other
    assert overlap_share([(0.0, 6.0), (4.0, 10.0)]) == 0.2  # 2 s of 10 together
    assert overlap_share([(0.0, 10.0), (2.0, 4.0), (3.0, 8.0), (None, None)]) == 0.6  # 2..8; the unstarted run left out
