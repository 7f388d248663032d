"""The Snakemake workflow end to end: data DAG, determinism, a table, config errors, kill and resume.

Every test runs the real Snakefile on a config of tests/configs/ in a scratch
folder (tests/workflow_support.py). Each Snakemake job is a fresh Python
process importing torch and fnlcore: 3-6 CPU seconds before any work (a
torch job also pays ~2.5 s for the torch._dynamo import that the first
torch.optim constructor triggers). So the workflows are small and shared
through fixtures (about 190 CPU seconds for the whole file):

* ``data_side`` (data_side.yaml): digits, 2 partitions x 3 noise models, no
  tables: 16 jobs (6 of them annotators);
* ``demo_table`` (demo_table.yaml + scale_quick.yaml): the demo table, 12
  runs of 3 rounds (as config/papers/demo.yaml has it; the tests count its rows): 20 jobs. Its Bernoulli-Dirichlet partition and noise
  settings equal those of data_side, so comparing the two runs' files checks
  that the same seeds give the same bytes. Both run at the same time, once per
  session (tests/conftest.py), and the report test below builds the report of the same demo run;
* two bad configurations (one per error path) run at the same time too (each stops
  while parsing); every bad configuration is also checked in-process;
* kill and resume: one 16-round run killed after round 4 and resumed, beside
  an uninterrupted copy started at the same time in another folder.

After a SIGKILL, Snakemake leaves its directory lock behind: resuming is
``snakemake --unlock`` then the same command again. ``--rerun-incomplete`` is
not needed: a train job writes its declared outputs (atomically) only at the
very end, so a killed job leaves none of them; what survives is the
undeclared checkpoint, from which the rerun job resumes.
"""

from __future__ import annotations

import base64
import itertools
import math
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from fnlcore import paths
from fnlcore.fl.persist import load_safely

from .conftest import REPO_ROOT
from .workflow_support import (
    config_error,
    deep_update,
    effective_config,
    expected_plan,
    job_counts,
    kill_group,
    load_test_config,
    nothing_to_do,
    output_of,
    run_snakemake,
    start_snakemake,
    wait_until,
    write_config,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _label_sets(plan) -> list[tuple]:
    """(dataset, partition spec, partition seed, noise spec, noise seed) of the data grid and of the tables' runs."""
    cells = [(s.dataset, s.partition, s.partition_seed, s.noise, s.noise_seed) for s in plan.label_sets]
    cells += [(r.dataset, r.partition, r.partition_seed, r.noise, r.noise_seed) for r in plan.runs()]
    unique = {(d, p.slug(), ps, n.slug(), ns): (d, p, ps, n, ns) for d, p, ps, n, ns in cells}
    return list(unique.values())


def _annotator_files(plan) -> set[str]:
    """Annotator outputs the noise jobs need: one network per nominally noisy client of each H-IDN set."""
    out = set()
    for dataset, partition, pseed, noise, nseed in _label_sets(plan):
        if not getattr(noise, "needs_soft_labels", False):
            continue
        for k in noise.noisy_clients(partition.num_clients, nseed):
            files = paths.annotator_files(plan.results_dir, dataset, partition.slug(), pseed, noise.annotator_slug(), k)
            out.update(files.values())
    return out


def _parquet_files(plan) -> set[str]:
    """Partition and noise parquet files of every label set of a plan (its tables' included)."""
    out = set()
    for dataset, partition, pseed, noise, nseed in _label_sets(plan):
        out.add(paths.partition_files(plan.results_dir, dataset, partition.slug(), pseed)["parquet"])
        out.add(paths.noise_files(plan.results_dir, dataset, partition.slug(), pseed, noise.slug(), nseed)["parquet"])
    return out


# -- 1. the data side of the workflow --------------------------------------------------------------


@pytest.mark.slow  # needs the `workflows` fixture: 36 jobs in two workflows (see the module docstring)
def test_data_side_builds_every_target_and_annotators_only_for_noisy_clients(data_side):
    data_side.check_ok()
    plan = data_side.plan()
    targets = plan.targets()
    # 2 partitions x (3 partition files + 3 noise models x 4 noise files)
    assert len(targets) == 2 * (3 + 3 * 4)
    missing = [t for t in targets if not (data_side.workdir / t).is_file()]
    assert not missing
    assert all((data_side.workdir / t).stat().st_size > 0 for t in targets)

    annotators = _annotator_files(plan)
    on_disk = {
        p.relative_to(data_side.workdir).as_posix()
        for p in (data_side.workdir / plan.results_dir).rglob("annotators/*/client*")
    }
    assert on_disk == annotators
    hidn = [s for s in plan.label_sets if s.noise.name == "fednoro_hidn"]
    assert len(hidn) == 2
    for s in hidn:
        noisy = s.noise.noisy_clients(s.partition.num_clients, s.noise_seed)
        assert 0 < len(noisy) < s.partition.num_clients  # some clients clean: "only" means something
        # the noise job made exactly these clients noisy
        summary = pd.read_csv(data_side.workdir / plan.noise_files(s)["summary"])
        assert summary.loc[summary.noisy, "client"].tolist() == noisy

    # Exact counts: also proves the test config's lists replaced config/config.yaml's
    # (its data_grid has 3 ten-client partitions and 4 noises; its tables the demo).
    assert job_counts(data_side.output) == {
        "prepare_in_memory_dataset": 1,
        "partition": 2,
        "annotator": len(annotators) // 2,  # two files per annotator job
        "noise": 6,
        "all": 1,
    }


@pytest.mark.slow  # the rerun itself only builds the DAG (~5 s); plus the `workflows` fixture
def test_second_run_of_the_data_side_is_a_noop(data_side):
    data_side.check_ok()
    files = [p for p in (data_side.workdir / "results").rglob("*") if p.is_file()]
    before = {p: p.stat().st_mtime_ns for p in files}
    again = run_snakemake(data_side.workdir, data_side.configfile)
    assert nothing_to_do(again), output_of(again)[-3000:]
    assert {p: p.stat().st_mtime_ns for p in files} == before


# -- 2. same seeds, same bytes ------------------------------------------------------------------------


@pytest.mark.slow  # no run of its own: compares the two runs of the `workflows` fixture
def test_same_seeds_give_byte_identical_parquet_in_two_runs(data_side, demo_table):
    data_side.check_ok()
    demo_table.check_ok()
    shared = _parquet_files(data_side.plan()) & _parquet_files(demo_table.plan())
    # the Bernoulli-Dirichlet partition (seed 100) and its clean, FedCorr and H-IDN label sets (seed 0)
    assert len(shared) == 4
    assert sum("/partitions/" in f for f in shared) == 1
    assert any("/hidn-" in f for f in shared)  # built from annotators trained in each run
    for f in sorted(shared):
        a, b = (data_side.workdir / f).read_bytes(), (demo_table.workdir / f).read_bytes()
        assert a == b, f


# -- 3. a table end to end -----------------------------------------------------------------------------


@pytest.mark.slow  # needs the `workflows` fixture
def test_demo_table_end_to_end(demo_table):
    demo_table.check_ok()
    plan = demo_table.plan()
    (table,) = plan.tables
    runs = plan.runs()
    # every row x every noise column x every seed of the demo's paper file, whatever rows it has
    rows = [r.label for r in table.spec.rows]
    columns = [c.label for c in table.spec.columns]
    seeds = sorted({tr.run.seed for tr in table.runs})
    assert len(rows) >= 4 and len(columns) == 3 and seeds == [0]
    assert {(tr.row, tr.column, tr.run.seed) for tr in table.runs} == set(itertools.product(rows, columns, seeds))
    assert len(runs) == len(rows) * len(columns) * len(seeds)  # no two cells of the demo share a run
    counts = job_counts(demo_table.output)
    assert counts["train"] == len(runs) and counts["table"] == 1
    assert counts["annotator"] == len({f for f in _annotator_files(plan) if f.endswith(".pt")}) > 0
    for r in runs:
        metrics = pd.read_parquet(demo_table.workdir / r.files(plan.results_dir)["metrics"])
        assert metrics["round"].tolist() == list(range(3))

    out = {k: demo_table.workdir / v for k, v in table.outputs(plan.results_dir).items()}
    assert out["csv"].name == "demo.csv" and out["csv"].parent.name == "demo"
    for f in out.values():
        assert f.is_file() and f.stat().st_size > 0, f
    assert out["curves"].read_bytes()[:8] == PNG_MAGIC

    long = pd.read_csv(out["csv"])
    assert {"FedAvg", "FedProx", "FedLA", "FedNoRo"} <= set(rows)
    metrics = ["bacc_best_round", "bacc_mean_last10_rounds"]
    assert len(long) == len(rows) * len(columns) * len(metrics)
    assert set(zip(long.row, long.column, long.metric)) == set(itertools.product(rows, columns, metrics))
    assert long.reproduced_mean.map(math.isfinite).all()
    assert long.reproduced_mean.between(0, 100).all()
    assert (long.n_seeds == 1).all()

    md = out["md"].read_text()
    assert "**Observations**" in md
    observations = [line for line in md.splitlines() if line.startswith("- ") and "FedNoRo" in line]
    compared = table.compare[0]["columns"]
    assert len(observations) == len(compared) == 2
    for col, line in zip(compared, observations):
        assert line.startswith(f"- {col}: FedNoRo ") and "FedAvg on Last (" in line, line
    assert "not computed yet" not in md
    assert "fnl-observations" in out["html"].read_text()


# -- 4. bad configurations are rejected before any job runs -----------------------------------------


def _set(path, value):
    """A mutation setting cfg[path[0]][path[1]]... = value."""

    def mutate(cfg, workdir):
        node = cfg
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return mutate


def _scale_file(text):
    """A mutation pointing ``scale`` at a scale file with the given YAML text."""

    def mutate(cfg, workdir):
        f = workdir / "bad_scale.yaml"
        f.write_text(text)
        cfg["scale"] = str(f)

    return mutate


# id -> (base config, mutation, strings the error must contain)
BAD_CONFIGS = {
    "unknown_top_level_key": ("data_side", _set(["data_gird"], []), ["unknown key 'data_gird'", "valid keys: data, data_grid"]),
    "unknown_partition_key": (
        "data_side",
        _set(["data_grid", 0, "partitions", 1, "alpah"], 2.0),
        ["data_grid[0].partitions[1]", "alpah", "alpha"],
    ),
    "bad_noise_value": (
        "data_side", _set(["data_grid", 0, "noises", 1, "rho"], 1.5), ["data_grid[0].noises[1]", "rho"]
    ),
    "unknown_dataset": ("data_side", _set(["data_grid", 0, "dataset"], "digitz"), ["data_grid[0].dataset", "digitz"]),
    "unknown_table": ("demo_table", _set(["tables"], ["fednoro/9"]), ["tables[0]", "fednoro/9"]),
    "unknown_scale": ("demo_table", _set(["scale"], "huge"), ["scale", "huge", "smoke"]),
    "unknown_scale_key": ("demo_table", _scale_file("trainig: {rounds: 2}\n"), ["bad_scale.yaml", "trainig"]),
}


# Snakemake reports a bad config on two paths: its own JSON-Schema ``validate`` and fnlcore's
# ConfigError printed by rules/common.smk. One case of each runs through Snakemake; every case
# (the same two paths, as fnlcore.app.plan.validate_schema and build_plan) is checked in-process.
SNAKEMAKE_CASES = ("unknown_top_level_key", "unknown_partition_key")


def _bad_config(tmp_path_factory, name):
    """The case's good base config (checked to plan), then mutated: (workdir, config file)."""
    base, mutate, _ = BAD_CONFIGS[name]
    workdir = tmp_path_factory.mktemp(name)
    cfg = load_test_config(base)
    expected_plan(write_config(workdir, cfg))  # the good config first, which fnlcore accepts
    mutate(cfg, workdir)
    return workdir, write_config(workdir, cfg)


@pytest.fixture(scope="module")
def bad_config_runs(tmp_path_factory):
    """Snakemake on the SNAKEMAKE_CASES at once (each stops while parsing): id -> (workdir, rc, output)."""
    started = {}
    try:
        for name in SNAKEMAKE_CASES:
            workdir, cfg_path = _bad_config(tmp_path_factory, name)
            started[name] = (workdir, start_snakemake(workdir, cfg_path, output=workdir / "snakemake.out"))
        out = {}
        for name, (workdir, proc) in started.items():
            proc.wait(timeout=300)
            out[name] = (workdir, proc.returncode, (workdir / "snakemake.out").read_text())
        return out
    finally:
        for _, proc in started.values():
            kill_group(proc)


@pytest.mark.slow  # the fixture: 2 Snakemake processes at once, ~4 CPU s each
@pytest.mark.parametrize("case", SNAKEMAKE_CASES)
def test_bad_configuration_is_rejected_before_any_job(case, bad_config_runs):
    workdir, rc, output = bad_config_runs[case]
    assert rc != 0, output[-3000:]
    message = config_error(output)
    assert message, output[-3000:]
    for needle in BAD_CONFIGS[case][2]:
        assert needle in message, (needle, message)
    assert len(message.splitlines()) <= 2 and "$schema" not in output  # one line, never the schema
    assert "Building DAG of jobs" not in output
    assert not (workdir / "results").exists()


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_bad_configuration_error_names_the_key(case, tmp_path_factory):
    from fnlcore.errors import ConfigError

    _, cfg_path = _bad_config(tmp_path_factory, case)
    with pytest.raises(ConfigError) as err:
        expected_plan(cfg_path)
    for needle in BAD_CONFIGS[case][2]:
        assert needle in str(err.value), (needle, str(err.value))


# -- 5. kill and resume ---------------------------------------------------------------------------------


# Killed once the checkpoint records 4 finished rounds, after FedNoRo's 2 warm-up rounds:
# the stage-2 state (the detected noisy clients) must survive the kill.
KILL_AFTER_ROUND = 4


def _kill_run(plan):
    (run,) = [r for r in plan.runs() if r.method.name == "fednoro" and r.noise.name == "fedcorr"]
    return run


def _checkpointed_rounds(path: Path) -> int:
    """Rounds a run's checkpoint holds (0 while there is none; it is replaced atomically)."""
    if not path.exists():
        return 0
    try:
        return int(load_safely(path)["next_round"])
    except FileNotFoundError:  # removed between the two calls: the run finished
        return 0


@pytest.mark.slow  # 50-65 s on 2 busy cores: two workflows of 4 jobs at once, one killed and resumed
def test_killed_run_resumes_from_its_checkpoint_and_matches_an_uninterrupted_run(tmp_path):
    killed_dir, reference_dir = tmp_path / "killed", tmp_path / "reference"
    config = load_test_config("kill_resume")
    killed_cfg = write_config(killed_dir, config)
    reference_cfg = write_config(reference_dir, config)
    plan = expected_plan(killed_cfg)
    run = _kill_run(plan)
    assert run.training.checkpoint_every == 1 and run.training.rounds == 16
    files = run.files(plan.results_dir)
    target = files["metrics"]
    checkpoint = killed_dir / run.checkpoint(plan.results_dir)

    # One thread per train job: the two workflows share 2 cores without oversubscription, and all
    # three train jobs use the same thread count (a CPU reduction's order may depend on it).
    one_thread = ("--set-threads", "train=1")
    reference = start_snakemake(
        reference_dir, reference_cfg, *one_thread, "--", target, output=reference_dir / "snakemake.out"
    )
    killed = start_snakemake(killed_dir, killed_cfg, *one_thread, "--", target, output=killed_dir / "snakemake.out")
    try:
        wait_until(
            lambda: _checkpointed_rounds(checkpoint) >= KILL_AFTER_ROUND,
            killed,
            context=lambda: (killed_dir / "snakemake.out").read_text()[-5000:],
        )
        kill_group(killed)
        assert killed.returncode != 0
        assert checkpoint.is_file()
        assert not (killed_dir / target).exists()  # no declared output of a killed job

        # Resume: the lock of the killed Snakemake must go first; then the same command.
        unlock = run_snakemake(killed_dir, killed_cfg, "--unlock")
        assert unlock.returncode == 0, output_of(unlock)[-3000:]
        resumed = run_snakemake(killed_dir, killed_cfg, *one_thread, "--", target)
        assert resumed.returncode == 0, output_of(resumed)[-5000:]
        assert job_counts(output_of(resumed)) == {"train": 1}  # the data side was complete

        assert reference.wait(timeout=600) == 0, (reference_dir / "snakemake.out").read_text()[-5000:]
    finally:
        kill_group(killed)
        kill_group(reference)

    # Snakemake deleted the log before the rerun job; the rerun's log starts with the killed job's lines
    (log,) = (killed_dir / plan.results_dir / "logs" / "runs").rglob("*.log")
    text = log.read_text()
    m = re.search(r"resumed from (\S+) at round (\d+)", text)
    assert m, text
    assert m.group(1) == run.checkpoint(plan.results_dir)
    start = int(m.group(2))
    assert KILL_AFTER_ROUND <= start < 16
    killed_part, rerun_part = text[:m.start()], text[m.end():]
    before = [int(x) for x in re.findall(r"round (\d+)/15", killed_part)]  # rounds count from 0
    assert before[:start] == list(range(start)), text  # the killed job's rounds, up to its checkpoint at least
    done = [int(x) for x in re.findall(r"round (\d+)/15", rerun_part)]
    assert done == list(range(start, 16))  # no round trained twice in the rerun
    assert not checkpoint.exists()  # removed once the outputs are complete

    got = pd.read_parquet(killed_dir / files["metrics"])
    want = pd.read_parquet(reference_dir / files["metrics"])
    assert got["round"].tolist() == list(range(16))
    assert "stage2" in got["stage"].tolist()
    pd.testing.assert_frame_equal(got.drop(columns="seconds"), want.drop(columns="seconds"), check_exact=True)
    got_clients, want_clients = (pd.read_parquet(d / files["clients"]) for d in (killed_dir, reference_dir))
    pd.testing.assert_frame_equal(got_clients, want_clients, check_exact=True)
    got_model = torch.load(killed_dir / files["model"], map_location="cpu", weights_only=True)["state_dict"]
    want_model = torch.load(reference_dir / files["model"], map_location="cpu", weights_only=True)["state_dict"]
    assert got_model.keys() == want_model.keys()
    assert all(torch.equal(got_model[k], want_model[k]) for k in got_model)


# -- the helpers and test configs themselves ------------------------------------------------------------

SNAKEMAKE_OUTPUT = """Building DAG of jobs...
Using shell: /usr/bin/bash
Job stats:
job          count
---------  -------
all              1
partition        2
total            3

Select jobs to execute...
"""


def test_job_counts_and_nothing_to_do_read_snakemake_output():
    assert job_counts(SNAKEMAKE_OUTPUT) == {"all": 1, "partition": 2}
    nothing = "Building DAG of jobs...\nNothing to be done (all requested files are present and up to date).\n"
    assert job_counts(nothing) == {}
    assert nothing_to_do(subprocess.CompletedProcess([], 0, "", nothing))
    assert not nothing_to_do(subprocess.CompletedProcess([], 1, "", nothing))
    assert not nothing_to_do(subprocess.CompletedProcess([], 0, "", SNAKEMAKE_OUTPUT))


def test_config_error_reads_both_kinds_of_message():
    ours = "Config file x is extended...\n\nConfiguration error: scale: scale 'huge': no file\nhuge.yaml\n\n"
    assert config_error(ours) == "scale: scale 'huge': no file\nhuge.yaml"
    schema = "WorkflowError:\nValidationError: Additional properties are not allowed ('x' was unexpected)\n\n{'x': 1}"
    assert config_error(schema) == "Additional properties are not allowed ('x' was unexpected)"
    assert config_error("Building DAG of jobs...\n") is None


def test_deep_update_merges_mappings_and_replaces_lists():
    base = {"tables": ["demo"], "data": {"raw_dir": "r", "datasets": {}}, "scale": "paper"}
    out = deep_update(base, {"tables": [], "data": {"datasets": {"digits": {}}}})
    assert out == {"tables": [], "data": {"raw_dir": "r", "datasets": {"digits": {}}}, "scale": "paper"}
    assert base["tables"] == ["demo"]


@pytest.mark.parametrize("name", ["data_side", "demo_table", "kill_resume"])
def test_test_configs_are_valid_and_state_every_list(name, tmp_path):
    own = load_test_config(name)
    assert {"results_dir", "tables", "data_grid"} <= set(own)  # else config/config.yaml's would leak in
    cfg = write_config(tmp_path, own)
    merged = effective_config(cfg)
    assert merged["tables"] == own["tables"] and merged["data_grid"] == own["data_grid"]
    plan = expected_plan(cfg)
    assert plan.targets()
    if own.get("scale", "paper").endswith(".yaml"):
        assert (tmp_path / own["scale"]).is_file()  # the scale file was copied beside the config


# -- snakemake --report on the demo run ---------------------------------------------------------
@pytest.mark.slow  # the report itself takes ~10 s; the demo run is the session's `demo_table` (tests/conftest.py)
def test_report_contains_tables_and_figures(demo_table, tmp_path):
    demo_table.check_ok()
    base = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO_ROOT / "Snakefile"),
            "--directory", str(demo_table.workdir), "--configfile", str(demo_table.configfile)]
    report = tmp_path / "report.html"  # outside the shared run's folder
    rep = subprocess.run(base + ["--report", str(report)], capture_output=True, text=True, timeout=600)
    assert rep.returncode == 0, rep.stderr[-3000:]
    html = report.read_text()
    for needle in ("Tables", "Partitions", "Noise", "filename=demo.curves.png", "filename=pseed100.png"):
        assert needle in html, needle
    blob = re.search(r'"data:text/html;charset=utf8;filename=demo\.html;base64,([A-Za-z0-9+/=]+)"', html)
    assert blob, "the demo table is not embedded"
    table = base64.b64decode(blob.group(1)).decode()
    assert "FedNoRo" in table and "FedAvg" in table and "Observations" in table
