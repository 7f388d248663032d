"""Run groups through the workflow (config key ``run_groups``; docs/cluster.md "Run groups").

Four runs of the demo table (its clean column, 16 rounds, a checkpoint every round) are one
group. Snakemake and its jobs are killed (SIGKILL to the process group) once some of the group's
runs have finished and others not; the same command then completes: no finished run is trained
again (its staged outputs keep their files and bytes, its log has one training), every unfinished one
resumes from its checkpoint, and every run's metrics equal the same run trained by itself
(``run_groups: 1``, another folder). Turning grouping off then trains nothing: the runs' own jobs
publish what the group staged."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pandas as pd
import pytest

from fnlcore.app.plan import load_plan
from fnlcore.app.run_group import form_run_groups, staged_dir

from .workflow_support import (
    expected_plan,
    job_counts,
    kill_group,
    load_test_config,
    output_of,
    run_snakemake,
    start_snakemake,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.slow


def _group(configfile: Path):
    plan = expected_plan(configfile)
    groups = form_run_groups(plan.runs(), plan.run_groups, plan.results_dir)
    (clean,) = [g for g in groups if all(r.noise.slug() == "clean" for r in g.runs)]
    assert len(clean.runs) == 4
    return plan, clean


def test_a_killed_group_job_resumes_its_unfinished_runs_only_and_grouped_runs_equal_runs_alone(tmp_path):
    grouped, alone = tmp_path / "grouped", tmp_path / "alone"
    cfg = write_config(grouped, {**load_test_config("kill_resume"), "run_groups": 4})
    plan, group = _group(cfg)
    targets = [r.files(plan.results_dir)["metrics"] for r in group.runs]
    ckpts = [grouped / r.checkpoint(plan.results_dir) for r in group.runs]

    def finished():  # runs whose staging is complete (its identity mark is written last)
        return [run for run, ckpt in zip(group.runs, ckpts) if (staged_dir(ckpt) / "identity.json").is_file()]

    record = grouped / group.record(plan.results_dir)
    proc = start_snakemake(grouped, cfg, "--", *targets, output=tmp_path / "first.log")
    try:
        wait_until(lambda: 0 < len(finished()) < 4 and not record.exists(), proc,
                   context=lambda: (tmp_path / "first.log").read_text()[-3000:])
    finally:
        kill_group(proc)
    done = {r.files(plan.results_dir)["metrics"] for r in finished()}
    assert 0 < len(done) < 4 and not record.exists()
    # Training writes every output under a temporary name and renames it: a new inode. Not mtimes:
    # Snakemake touches published outputs older than their inputs, and a link shares the inode.
    def state(p: Path):
        return p.stat().st_ino, hashlib.sha256(p.read_bytes()).hexdigest()

    staged_times = {p: state(p) for r, c in zip(group.runs, ckpts)
                    if r.files(plan.results_dir)["metrics"] in done for p in staged_dir(c).iterdir()}

    assert run_snakemake(grouped, cfg, "--unlock").returncode == 0  # README: unlock, then the same command
    res = run_snakemake(grouped, cfg, "--", *targets)
    assert res.returncode == 0, output_of(res)[-4000:]
    assert record.exists()
    assert {p: state(p) for p in staged_times} == staged_times  # no finished run written again
    for run, ckpt in zip(group.runs, ckpts):
        metrics = run.files(plan.results_dir)["metrics"]
        log = (grouped / metrics.replace("/runs/", "/logs/runs/", 1)).parent.with_suffix(".log").read_text()
        assert log.count("engine: ") == (1 if metrics in done else 2), log  # trained once, or once per job
        assert ("resumed from" in log) == (metrics not in done), log
        assert os.path.samefile(grouped / metrics, staged_dir(ckpt) / "metrics.parquet")

    # grouping turned off (as `fnl cell` runs): the runs' train jobs rerun (their input changed) and
    # publish the staged outputs; nothing is trained
    logs = {m: (grouped / m.replace("/runs/", "/logs/runs/", 1)).parent.with_suffix(".log") for m in targets}
    before = {m: log.read_text() for m, log in logs.items()}
    res = run_snakemake(grouped, cfg, "--config", "run_groups=1", "--", *targets)
    assert res.returncode == 0, output_of(res)[-4000:]
    assert job_counts(output_of(res)) == {"train": 4}
    assert {m: log.read_text() for m, log in logs.items()} == before
    for run, ckpt in zip(group.runs, ckpts):
        assert os.path.samefile(grouped / run.files(plan.results_dir)["metrics"], staged_dir(ckpt) / "metrics.parquet")

    cfg_alone = write_config(alone, {**load_test_config("kill_resume"), "run_groups": 1})
    res = run_snakemake(alone, cfg_alone, "--", *targets)
    assert res.returncode == 0, output_of(res)[-4000:]
    for metrics in targets:
        a, b = pd.read_parquet(grouped / metrics), pd.read_parquet(alone / metrics)
        pd.testing.assert_frame_equal(a.drop(columns="seconds"), b.drop(columns="seconds"), check_exact=True)


def _dry_run(workdir: Path, *args: str):
    cfg = write_config(workdir, load_test_config("kill_resume"))
    return run_snakemake(workdir, cfg, "-n", "--set-threads", "train=1", "--set-resources", "train:mem_mb=2000", *args)


def test_a_group_job_asks_for_one_gpu_and_its_runs_summed_memory_and_the_runs_jobs_for_none(tmp_path):
    res = _dry_run(tmp_path, "--config", "run_groups=4")
    out = output_of(res)
    assert res.returncode == 0, out[-4000:]
    # the demo's runs (12 today) share one dataset and training settings: groups of 4, the last maybe smaller
    n = len(load_plan(tmp_path / "config.yaml").runs())
    assert job_counts(out)["train_group"] == -(-n // 4) and job_counts(out)["train"] == n

    def resources(rule):
        import re

        found = re.findall(rf"^rule {rule}:\n(?:    .*\n)*?    resources: (.*)$", out, re.M)
        return [dict(item.split("=", 1) for item in line.split(", ")) for line in found]

    assert all(r["mem_mb"] == "8000" and r["gpu"] == "1" for r in resources("train_group"))
    assert all(r["gpu"] == "0" for r in resources("train"))


def test_run_groups_and_snakemakes_groups_of_train_are_refused_together(tmp_path):
    res = _dry_run(tmp_path, "--config", "run_groups=2", "--groups", "train=pack", "--group-components", "pack=2")
    assert res.returncode != 0
    assert "run_groups and --groups train=... both pack training runs" in output_of(res)
