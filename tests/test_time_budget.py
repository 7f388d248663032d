"""A run longer than a job stops before the job's time limit with a checkpoint, and the next job
continues it: the stop rule, the checkpoint cadence around a stop, exact equality of a run
spread over several jobs with an uninterrupted one, and the exit status of a stopped job.

Time is a fake clock that advances only when a round ends, so every stop is decided by the
rule, never by how fast this machine is."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from fnlcore.app.train import failure_marker
from fnlcore.app.train import RunSpec, run_journal, train_job, train_job_log, train_run
from fnlcore.datasets.base import DatasetInfo, write_prepared
from fnlcore.errors import EXIT_CONTINUE, ConfigError, RunIncomplete, retry_cannot_fix
from fnlcore.fl.settings import TrainSettings
from fnlcore.fl.time_budget import TimeBudget
from fnlcore.io import write_parquet
from fnlcore.methods import METHODS

from .engine_helpers import digits_data
from .test_contracts import _method_run, assert_same_state
from .test_persist import _keeper_run

ROUND_S = 10.0  # what a round takes on the fake clock


class RoundClock:
    """A clock that moves ``ROUND_S`` forward when the engine reports a finished round."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def progress(self, line: str) -> None:
        if line.startswith("round "):
            self.now += ROUND_S


def _budget_run(budget_s: float, ckpt, clock: RoundClock, saves: list[int] | None = None):
    """The persistence test's 5-round run (a checkpoint every 2 rounds, a per-client store) in a job
    of ``budget_s`` fake seconds; ``saves`` records the rounds each checkpoint resumes at."""
    sim, method = _keeper_run(checkpoint_path=ckpt, time_budget=TimeBudget(budget_s, clock))
    sim.progress = clock.progress
    if saves is not None:
        save = sim._save
        sim._save = lambda next_round: (saves.append(next_round), save(next_round))[1]
    return sim, method


def _uninterrupted():
    sim, method = _keeper_run()
    return sim.run().drop(columns="seconds"), method


def _assert_same_run(got: pd.DataFrame, method, expect: pd.DataFrame, full) -> None:
    pd.testing.assert_frame_equal(got.drop(columns="seconds"), expect, check_exact=True)
    assert_same_state(method.state_dict(), full.state_dict())
    assert torch.equal(method.seen, full.seen) and method.rounds_done == full.rounds_done
    for k in full.personal.clients():
        assert all(torch.equal(v, method.personal.get(k)[n]) for n, v in full.personal.get(k).items())


# -- the rule -------------------------------------------------------------------------------------


def test_another_round_fits_while_elapsed_plus_the_longest_round_and_checkpoint_stay_within_the_budget():
    now = [100.0]
    b = TimeBudget(60.0, clock=lambda: now[0])  # counted from 100
    assert b.another_round_fits()  # nothing measured yet
    now[0] = 120.0
    b.round_took(20.0)
    assert b.another_round_fits()  # 20 + 20 <= 60
    now[0] = 130.0
    b.round_took(10.0)  # the longest round is still 20
    assert b.another_round_fits()  # 30 + 20 <= 60
    b.checkpoint_took(11.0)
    assert not b.another_round_fits()  # 30 + 20 + 11 > 60
    assert "30 s of 60 s" in b.describe()


def test_a_budget_is_a_number_of_seconds_and_needs_a_checkpoint_to_continue_from():
    with pytest.raises(ConfigError, match="seconds"):
        TimeBudget(float("nan"))
    with pytest.raises(ConfigError, match="seconds"):
        TimeBudget(-1)
    with pytest.raises(ConfigError, match="checkpoint_path"):
        _keeper_run(time_budget=TimeBudget(60.0))


def test_a_stop_is_not_a_failure_and_is_retried():
    stop = RunIncomplete("stopped", next_round=3, total_rounds=5)
    assert not retry_cannot_fix(stop) and EXIT_CONTINUE == 75


# -- the loop -------------------------------------------------------------------------------------


def test_a_run_stopped_before_its_budget_and_resumed_equals_an_uninterrupted_run(tmp_path):
    expect, full = _uninterrupted()
    ckpt, clock, saves = tmp_path / "run.ckpt.pt", RoundClock(), []
    # 35 s: after rounds 0 and 1 another 10 s round fits; after round 2 (30 s used) it does not
    sim, _ = _budget_run(35.0, ckpt, clock, saves)
    with pytest.raises(RunIncomplete, match="after round 2 of 0..4") as stopped:
        sim.run()
    assert (stopped.value.next_round, stopped.value.total_rounds) == (3, 5) and ckpt.exists()
    # the cadence (every 2 rounds) checkpointed after round 1; the stop after round 2, which it had not
    assert saves == [2, 3]

    sim, method = _budget_run(35.0, ckpt, clock, saves)  # the next job: a new budget
    got = sim.run()
    assert saves == [2, 3, 4, 5]  # the resumed run keeps the cadence of an uninterrupted one: 2, 4 and the end
    _assert_same_run(got, method, expect, full)


def test_a_stop_right_after_a_checkpoint_writes_no_second_one(tmp_path):
    ckpt, saves = tmp_path / "run.ckpt.pt", []
    sim, _ = _budget_run(25.0, ckpt, RoundClock(), saves)  # after round 1 (20 s used) 10 s more do not fit
    with pytest.raises(RunIncomplete) as stopped:
        sim.run()
    assert stopped.value.next_round == 2 and saves == [2]


@pytest.mark.parametrize("read_s,stops_at", [(0.0, 4), (8.0, 3)])
def test_the_checkpoint_write_counts_against_the_budget(tmp_path, monkeypatch, read_s, stops_at):
    """Until a job writes a checkpoint, one takes as long as reading the one it resumed from:
    8 s of it leave room for one round less in a job of 25 s."""
    ckpt, clock = tmp_path / "run.ckpt.pt", RoundClock()
    with pytest.raises(RunIncomplete):
        _budget_run(25.0, ckpt, clock)[0].run()  # rounds 0 and 1, a checkpoint at 2
    load = torch.load

    def slow_read(path, *a, **kw):
        if str(path) == str(ckpt):
            clock.now += read_s
        return load(path, *a, **kw)

    monkeypatch.setattr(torch, "load", slow_read)
    with pytest.raises(RunIncomplete) as stopped:
        # read_s 0: after round 2, 10 s used + a 10 s round fit in 25 s, after round 3 (20 s used) not;
        # read_s 8: after round 2, 18 s used + 10 s + a checkpoint of 8 s do not
        _budget_run(25.0, ckpt, clock)[0].run()
    assert stopped.value.next_round == stops_at


def test_every_job_advances_by_at_least_one_round_and_no_budget_never_stops(tmp_path):
    expect, full = _uninterrupted()
    ckpt, clock, jobs = tmp_path / "run.ckpt.pt", RoundClock(), 0
    while True:
        jobs += 1
        sim, method = _budget_run(0.0, ckpt, clock)  # no time at all: one round, then stop
        try:
            got = sim.run()
            break
        except RunIncomplete as stop:
            assert stop.next_round == jobs
    assert jobs == 5
    _assert_same_run(got, method, expect, full)
    sim, _ = _budget_run(50.0, tmp_path / "other.ckpt.pt", RoundClock())  # holds the 5 rounds: one job
    assert len(sim.run()) == 5


@pytest.mark.slow
def test_a_method_with_per_client_state_over_one_round_jobs_equals_an_uninterrupted_run(tmp_path):
    name = "fedgr"  # one EMA model per client, in a store on disk
    full_sim, full_method, _ = _method_run(name)
    full = full_sim.run()
    ckpt, clock, jobs = tmp_path / "run.ckpt.pt", RoundClock(), 0
    while True:
        jobs += 1
        sim, method, _ = _method_run(name, checkpoint_path=ckpt, time_budget=TimeBudget(0.0, clock))
        sim.progress = clock.progress
        try:
            out = sim.run()
            break
        except RunIncomplete as stop:
            assert stop.next_round == jobs
    assert jobs == full_method.num_rounds()
    cols = [c for c in full.columns if c != "seconds"]
    pd.testing.assert_frame_equal(out[cols], full[cols], check_exact=True)
    assert_same_state(method.state_dict(), full_method.state_dict())
    assert torch.equal(sim.ctx.data.given, full_sim.ctx.data.given)


# -- the job --------------------------------------------------------------------------------------


def _prepared_digits(tmp_path, num_clients: int = 4) -> tuple[str, str]:
    """The engine tests' digits as a prepared in-memory dataset and a noisy-label artifact."""
    xtr, ytr, given, xte, yte, assignment = digits_data(num_clients)
    info = DatasetInfo(
        name="digits_stand_in", num_classes=10, class_names=tuple(str(i) for i in range(10)), multi_label=False,
        channels=1, image_size=(8, 8), in_memory=True, source="test", papers=(), prepare=lambda ctx: None,
    )
    index = pd.DataFrame({
        "sample_id": np.r_[np.arange(len(ytr)), np.arange(len(yte))],
        "split": ["train"] * len(ytr) + ["test"] * len(yte),
        "label": np.r_[ytr, yte],
    })
    data_dir = tmp_path / "prepared"
    write_prepared(data_dir, info, index, arrays={"x_train": xtr, "x_test": xte})
    frame = assignment.to_frame()
    frame["label_true"] = ytr[frame["sample_id"]]
    frame["label_given"] = given[frame["sample_id"]]
    frame["is_noisy"] = frame["label_true"] != frame["label_given"]
    noise = tmp_path / "noise.parquet"
    write_parquet(frame, noise)
    return str(data_dir), str(noise)


def _job_args(tmp_path, data_dir, noise, out: str):
    settings = TrainSettings(rounds=3, local_epochs=1, batch_size=32, checkpoint_every=2, client_fraction=0.5)
    paths = {k: str(tmp_path / out / f"{k}.{ext}") for k, ext in
             (("metrics", "parquet"), ("clients", "parquet"), ("model", "pt"), ("checkpoint", "ckpt.pt"))}
    spec = RunSpec(data_dir, noise, 4, settings, METHODS["fedavg"].Params(), 0, paths["metrics"], paths["clients"],
                   paths["model"], paths["checkpoint"], device="cpu")
    return spec, paths


def test_a_job_out_of_time_exits_75_without_outputs_and_the_next_attempts_finish_the_run(tmp_path):
    data_dir, noise = _prepared_digits(tmp_path)
    args, expect_paths = _job_args(tmp_path, data_dir, noise, "whole")
    train_run(args, progress=lambda s: None)

    args, paths = _job_args(tmp_path, data_dir, noise, "jobs")
    log: list[str] = []
    statuses = []
    job_log_path, journal = tmp_path / "jobs.log", run_journal(paths["checkpoint"])
    for attempt in (1, 2, 3):  # as the workflow's script calls it: Snakemake deletes the log before each attempt
        job_log_path.unlink(missing_ok=True)
        with train_job_log(job_log_path, paths["checkpoint"], attempt) as lg:
            lg.info("attempt %d", attempt)
            statuses.append(train_job(args, progress=lambda line: (log.append(line), lg.info(line)),
                                      attempt=attempt, time_budget_s=0.0))
    assert statuses == [EXIT_CONTINUE, EXIT_CONTINUE, 0]  # one round a job, then the outputs
    stops = [line for line in log if line.startswith("stopped after round")]
    assert len(stops) == 2
    assert not failure_marker(paths["checkpoint"]).exists()  # a stop is not a failure a retry cannot fix
    # the last job's log holds the whole run: every job's lines, in order; the journal went with the checkpoint
    lines = [ln.split(" INFO ", 1)[1] for ln in job_log_path.read_text().splitlines()]
    assert [ln for ln in lines if ln.startswith("attempt ")] == ["attempt 1", "attempt 2", "attempt 3"]
    assert [ln for ln in lines if ln.startswith(("attempt ", "stopped after round"))] == [
        "attempt 1", stops[0], "attempt 2", stops[1], "attempt 3"]
    assert [ln for ln in lines if not ln.startswith("attempt ")] == log
    assert not journal.exists()

    got, expect = pd.read_parquet(paths["metrics"]), pd.read_parquet(expect_paths["metrics"])
    pd.testing.assert_frame_equal(got.drop(columns="seconds"), expect.drop(columns="seconds"), check_exact=True)
    a, b = (torch.load(p["model"], weights_only=True)["state_dict"] for p in (paths, expect_paths))
    assert_same_state(a, b)


def test_a_stopped_job_writes_no_output(tmp_path):
    data_dir, noise = _prepared_digits(tmp_path)
    args, paths = _job_args(tmp_path, data_dir, noise, "stopped")
    with pytest.raises(RunIncomplete):
        train_run(args, progress=lambda s: None, time_budget_s=0.0)
    assert [k for k in ("metrics", "clients", "model") if Path(paths[k]).exists()] == []
    assert Path(paths["checkpoint"]).exists()
