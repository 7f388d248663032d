"""Train jobs' resources from measurements (fnlcore/app/resources.py): the arithmetic of the
prediction, the measurement files it reads, the site cap, `fnl plan`'s columns, and a
paper-scale dry run under the Slurm profile whose train jobs ask for different memory and time."""

from __future__ import annotations

import csv
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fnlcore.app import measurements as M
from fnlcore.app import resources as R
from fnlcore.app.cost import step_shape
from fnlcore.app.measurements import CSV_COLUMNS
from fnlcore.app.plan import build_plan, validate_schema
from fnlcore.app.rehearse import training_config
from fnlcore.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
TABLES = ["fedncl/I", "fedgr/3"]  # LeNet-5 on MNIST / FMNIST (and VGG-16 on CIFAR-10); ResNet-50 on Clothing1M
GPU = "cuda:NVIDIA Test GPU|torch 2"
# Plausible GPU figures: a LeNet-5 step is milliseconds, a ResNet-50 step at 224 pixels a tenth of a second.
STEP_S = {"lenet5": (0.002, 1e-6), "vgg16": (0.01, 1e-5), "resnet50": (0.1, 5e-4)}
RSS_MB = {"lenet5": 1500.0, "vgg16": 2500.0, "resnet50": 6000.0}
CHECKPOINT_MB = {"lenet5": 1.0, "vgg16": 120.0, "resnet50": 4000.0}


def _plan(tables=TABLES, results="results"):
    return build_plan(validate_schema({"tables": tables, "scale": "paper", "data_grid": [], "results_dir": results}))


def _options(plan, run):
    ds = plan.datasets.get(run.dataset)
    return ds.options if ds is not None else None


def _measurements(plan, folder: Path, rehearse_only=None) -> None:
    """A step-cost file (one GPU) and a rehearsal table for every configuration of ``plan``."""
    folder.mkdir(parents=True, exist_ok=True)
    shapes, rows = {}, {}
    for run in plan.runs():
        opts = _options(plan, run)
        shape = step_shape(run, opts)
        train_s, eval_s = STEP_S[shape.model]
        shapes[shape.key()] = {"train_s": train_s, "eval_s": eval_s}
        cfg = training_config(run, opts)
        if rehearse_only is not None and cfg.model not in rehearse_only:
            continue
        rows[cfg.key] = {c: "" for c in CSV_COLUMNS} | {
            "config": cfg.key, "model": cfg.model, "method": cfg.method, "device": GPU, "status": "pass",
            "peak_rss_mb": RSS_MB[cfg.model], "peak_device_mb": RSS_MB[cfg.model] / 2,
            "checkpoint_mb": CHECKPOINT_MB[cfg.model], "written_per_checkpoint_mb": CHECKPOINT_MB[cfg.model] / 2,
        }
    (folder / "step_costs.json").write_text(json.dumps({"version": 1, "devices": {GPU: shapes}}))
    with open(folder / "rehearsal.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        w.writerows(rows.values())


# -- arithmetic -------------------------------------------------------------------------------


def test_a_run_within_the_cap_is_one_job_of_its_predicted_length():
    runtime, jobs = R.job_lengths(3600.0, 30.0, 1440)
    assert (runtime, jobs) == (math.ceil(3600 * 1.5 / 60 + R.STARTUP_MIN), 1)
    # its own time budget does not stop it: the margin is part of the start-up the runtime adds
    assert R.time_budget_s(runtime) >= 3600 * 1.5


def test_a_run_beyond_the_cap_takes_as_many_jobs_as_it_needs_each_losing_one_round():
    # 100 h of device time; rounds of 6 min (9 min with the headroom); 24 h jobs
    runtime, jobs = R.job_lengths(100 * 3600.0, 360.0, 1440)
    minutes = 100 * 60 * 1.5 + R.STARTUP_MIN
    assert runtime == 1440
    assert jobs == math.ceil((minutes - R.STARTUP_MIN) / (1440 - R.STARTUP_MIN - 9)) == 7
    # a site with 4 h jobs: many more jobs, no upper limit; a job stopping before its limit loses one
    # round, not a checkpoint interval (5 rounds, 45 min: that would take 49 jobs of 4 h here)
    assert R.job_lengths(100 * 3600.0, 360.0, 240) == (240, math.ceil(9000 / (240 - 10 - 9))) == (240, 41)


def test_a_round_longer_than_a_job_is_an_error_naming_the_fix():
    with pytest.raises(ConfigError, match="max_runtime"):
        R.job_lengths(100 * 3600.0, 160 * 60.0, 240)


def test_a_jobs_time_budget_is_its_runtime_less_the_stop_margin():
    assert R.time_budget_s(240) == (240 - R.STOP_MARGIN_MIN) * 60
    assert R.time_budget_s(R.STOP_MARGIN_MIN - 1) == 0.0  # still one round: the run advances
    assert R.STOP_MARGIN_MIN < R.STARTUP_MIN


def test_site_cap_from_set_resources_and_bad_values():
    assert R.site_cap({}) == R.DEFAULT_CAP
    assert R.site_cap({"train": {"max_mem_mb": "64000", "max_runtime": 240}}) == R.SiteCap(64000, 240)
    with pytest.raises(ConfigError, match="max_runtime"):
        R.site_cap({"train": {"max_runtime": "two days"}})


def test_a_fixed_runtime_for_every_train_job_counts_the_jobs_and_retries_in_it():
    """`--set-resources train:runtime=...` replaces each run's prediction, so a run needs jobs of that length."""
    assert R.site_cap({"train": {"runtime": 120}}) == R.SiteCap(None, 120)
    assert R.site_cap({"train": {"runtime": "2h", "max_runtime": 600}}).max_runtime == 120
    assert R.site_cap({"train": {"runtime": "90m"}}).max_runtime == 90
    assert R.site_cap({"train": {"runtime": 2000, "max_runtime": 600}}).max_runtime == 600
    for bad in ("soon", 0, "-5"):
        with pytest.raises(ConfigError, match="train:runtime"):
            R.site_cap({"train": {"runtime": bad}})
    plan = _plan(["fedgr/3"])
    costs = {step_shape(r, _options(plan, r)).key(): (0.1, 5e-4) for r in plan.runs()}

    def retries(cap):
        tr = R.TrainResources(plan, cap)
        tr._by_run = {i: R.predict(r, costs, {}, cap, _options(plan, r)) for i, r in enumerate(plan.runs())}
        return tr.retries

    assert retries(R.site_cap({"train": {"runtime": 120}})) > retries(R.DEFAULT_CAP)


# -- measurement files ------------------------------------------------------------------------


def _rows(path: Path, rows) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({c: "" for c in CSV_COLUMNS} | r)
    return path


def test_rehearsal_takes_passing_rows_and_a_gpu_job_prefers_gpu_rows(tmp_path):
    path = _rows(tmp_path / "rehearsal.csv", [
        {"config": "a", "device": "cpu", "status": "pass", "peak_rss_mb": 3000, "checkpoint_mb": 10},
        {"config": "a", "device": "cuda:X", "status": "pass", "peak_rss_mb": 2000, "peak_device_mb": 900,
         "checkpoint_mb": 10},
        {"config": "b", "device": "cpu", "status": "fail", "peak_rss_mb": 99999},
    ])
    gpu = M.load_rehearsal(path, gpu=True)
    assert set(gpu) == {"a"}
    assert gpu["a"].peak_rss_mb == 2000 and gpu["a"].peak_device_mb == 900 and gpu["a"].on_gpu
    cpu = M.load_rehearsal(path, gpu=False)["a"]
    assert cpu.peak_rss_mb == 3000 and not cpu.on_gpu
    assert M.load_rehearsal(tmp_path / "absent.csv", gpu=True) == {}


def test_a_row_measured_without_pretrained_weights_counts_and_says_so(tmp_path):
    """no_weights: the run was measured with random initialisation, the same tensors as the weights'."""
    plan = _plan()
    clothing = next(r for r in plan.runs() if training_config(r, _options(plan, r)).model == "resnet50")
    key = training_config(clothing, _options(plan, clothing)).key
    path = _rows(tmp_path / "rehearsal.csv", [
        {"config": key, "device": "cpu", "status": "no_weights", "peak_rss_mb": 6000, "checkpoint_mb": 100,
         "written_per_checkpoint_mb": 50, "error": "pretrained weights: cannot download"},
        {"config": "other", "device": "cpu", "status": "pass", "peak_rss_mb": 700},
    ])
    measured = M.load_rehearsal(path, gpu=False)
    assert measured[key].random_init and not measured["other"].random_init
    res = R.predict(clothing, {}, measured, dataset_options=_options(plan, clothing), gpu=False)
    assert res.rehearsed and res.mem_mb == math.ceil(6000 * R.MEM_HEADROOM + R.MEM_MARGIN_MB)
    assert res.disk_mb == math.ceil(2 * 100 + 50 + R.DISK_MARGIN_MB)
    assert "random initialisation" in res.note


def test_step_costs_of_a_gpu_job_come_from_the_slowest_gpu_else_from_the_cpu(tmp_path):
    path = tmp_path / "step_costs.json"
    path.write_text(json.dumps({"version": 1, "devices": {
        "cpu:x|1 threads": {"s": {"train_s": 1.0, "eval_s": 0.1}},
        "cuda:A": {"s": {"train_s": 0.02, "eval_s": 0.001}},
        "cuda:B": {"s": {"train_s": 0.03, "eval_s": 0.0005}},
    }}))
    assert M.load_step_costs(path, gpu=True) == {"s": (0.03, 0.001)}
    assert M.load_step_costs(path, gpu=False) == {"s": (1.0, 0.1)}
    path.write_text("not json")
    with pytest.raises(ConfigError, match="fnl plan"):
        M.load_step_costs(path, gpu=True)


# -- prediction -------------------------------------------------------------------------------


def test_prediction_from_measurements_and_the_defaults_without_them(tmp_path):
    plan = _plan()
    _measurements(plan, tmp_path, rehearse_only={"lenet5"})
    costs = M.load_step_costs(tmp_path / "step_costs.json", gpu=True)
    rehearsal = M.load_rehearsal(tmp_path / "rehearsal.csv", gpu=True)
    by_model = {}
    for run in plan.runs():
        by_model.setdefault(training_config(run, _options(plan, run)).model, run)

    lenet = R.predict(by_model["lenet5"], costs, rehearsal, dataset_options=_options(plan, by_model["lenet5"]))
    assert lenet.rehearsed and lenet.mem_mb == math.ceil(1500 * R.MEM_HEADROOM + R.MEM_MARGIN_MB)
    assert lenet.disk_mb == math.ceil(2 * 1.0 + 0.5 + R.DISK_MARGIN_MB)
    assert lenet.gpu_mem_mb == math.ceil(750 * R.MEM_HEADROOM)
    assert lenet.runtime == math.ceil(lenet.device_seconds * R.RUNTIME_HEADROOM / 60 + R.STARTUP_MIN)
    assert lenet.jobs == 1

    clothing = by_model["resnet50"]
    big = R.predict(clothing, costs, rehearsal, dataset_options=_options(plan, clothing))
    assert not big.rehearsed and (big.mem_mb, big.disk_mb) == (R.DEFAULT_MEM_MB, R.DEFAULT_DISK_MB)
    assert "not rehearsed" in big.note
    assert big.device_seconds > lenet.device_seconds

    # no step cost at all: the site's whole job length and the default number of jobs
    blind = R.predict(clothing, {}, {}, R.SiteCap(max_runtime=600), _options(plan, clothing))
    assert (blind.runtime, blind.jobs, blind.device_seconds) == (600, R.DEFAULT_JOBS, None)

    # over the memory cap: the cap is asked for and the run is flagged
    capped = R.predict(by_model["lenet5"], costs, rehearsal, R.SiteCap(max_mem_mb=1000), _options(plan, by_model["lenet5"]))
    assert capped.mem_mb == 1000 and capped.over_cap and "site cap" in capped.note


def test_a_round_longer_than_a_job_marks_the_plan_and_stops_only_that_run(tmp_path):
    """On a CPU's step costs a Clothing1M round outlasts a 4-hour job: `fnl plan` still prints (the
    table marked), and the workflow refuses that run, naming it and the fix, not every run."""
    plan = _plan(results=str(tmp_path))
    _measurements(plan, tmp_path / "plan")
    costs = json.loads((tmp_path / "plan" / "step_costs.json").read_text())
    for key, c in costs["devices"][GPU].items():
        if key.startswith("resnet50"):
            c["train_s"] = 30.0  # a CPU's ResNet-50 step: a round of hours
    (tmp_path / "plan" / "step_costs.json").write_text(json.dumps(costs))
    cap = R.SiteCap(max_runtime=240)
    cols = R.resource_columns(plan, cap=cap)
    assert cols.columns[("fedgr", "3")].endswith("!") and not cols.columns[("fedncl", "I")].endswith("!")
    assert any(n.startswith("! ") and "max_runtime" in n for n in cols.notes)

    tr = R.TrainResources(plan, cap)
    long_runs = [r for r in plan.runs() if tr.by_run[R._run_key(r.fields())].round_too_long]
    short_runs = [r for r in plan.runs() if not tr.by_run[R._run_key(r.fields())].round_too_long]
    assert long_runs and short_runs
    assert all(training_config(r, _options(plan, r)).model == "resnet50" for r in long_runs)

    class W(dict):  # Snakemake's wildcards
        pass

    with pytest.raises(ConfigError, match="training run clothing1m/.*max_runtime.*--device cuda"):
        tr.mem_mb(W(long_runs[0].fields()))
    assert tr.mem_mb(W(short_runs[0].fields())) > 0
    assert tr.retries >= R.RETRY_MARGIN


def test_runtime_counts_the_device_seconds_of_fnl_plans_cost_model():
    from fnlcore.app.cost import run_work

    plan = _plan()
    for run in {training_config(r, _options(plan, r)).key: r for r in plan.runs()}.values():
        steps, eval_samples, _ = run_work(run, _options(plan, run))
        total, longest = R._round_seconds(run, _options(plan, run), 0.5, 0.001)
        assert total == pytest.approx(steps * 0.5 + eval_samples * 0.001)
        assert 0 < longest <= total


def test_retries_cover_the_longest_run_of_the_plan(tmp_path):
    plan = _plan(results=str(tmp_path))
    _measurements(plan, tmp_path / "plan")
    tr = R.TrainResources(plan, R.SiteCap(max_runtime=240))
    jobs = max(r.jobs for r in tr.by_run.values())
    assert jobs > 3  # more job lengths than the former fixed `retries: 2` allowed
    assert tr.retries == jobs - 1 + R.RETRY_MARGIN
    assert all(r.runtime <= 240 for r in tr.by_run.values())


# -- fnl plan ---------------------------------------------------------------------------------


def test_fnl_plan_prints_memory_disk_and_job_lengths_beside_device_hours(tmp_path):
    plan = _plan(results=str(tmp_path))
    _measurements(plan, tmp_path / "plan", rehearse_only={"lenet5", "vgg16"})
    cols = R.resource_columns(plan)
    lenet_table = cols.columns[("fedncl", "I")]
    clothing_table = cols.columns[("fedgr", "3")]
    assert not lenet_table.endswith("*") and clothing_table.endswith("*")  # Clothing1M not rehearsed
    assert any("not rehearsed" in n for n in cols.notes)

    from fnlcore.app.cost import format_estimate

    class Cal:  # what format_estimate reads of a calibration
        description, path, measured, entries = GPU, tmp_path / "plan" / "step_costs.json", [], {}

    from fnlcore.app.cost import CostEstimate, TableCost

    cost = CostEstimate([TableCost("fedncl", "I", 72, 3600.0, 60.0)], {}, {})
    text = format_estimate(cost, Cal, "paper", cols)
    header = next(line for line in text.splitlines() if line.startswith("paper"))
    assert header.split()[-4:] == ["GB", "job", "h", "jobs"] and "mem GB" in header
    row = next(line for line in text.splitlines() if line.startswith("fedncl"))
    assert row.endswith(lenet_table)


# -- the workflow -----------------------------------------------------------------------------

TRAIN_JOB = re.compile(r"rule train:\n(?:    .*\n)*?    wildcards: (?P<w>.*)\n    resources: (?P<r>.*)\n")


def _dry_run(tmp_path: Path, *extra: str) -> dict[str, set[tuple[int, int]]]:
    """A paper-scale dry run under the Slurm profile: model -> {(mem_mb, runtime)} of its train jobs."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    if not (work / "slurm").exists():
        (work / "slurm").symlink_to(REPO / "slurm", target_is_directory=True)
    res = subprocess.run(
        [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--profile", "slurm", "-n",
         "--config", "scale=paper", f"tables={json.dumps(TABLES)}", "data_grid=[]",
         f"results_dir={tmp_path / 'results'}", *extra],
        cwd=work, capture_output=True, text=True, timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out: dict[str, set[tuple[int, int]]] = {}
    for m in TRAIN_JOB.finditer(res.stdout):
        train = re.search(r"train=([^,]+)", m["w"]).group(1)
        mem = int(re.search(r"\bmem_mb=(\d+)", m["r"]).group(1))
        runtime = int(re.search(r"\bruntime=(\d+)", m["r"]).group(1))
        out.setdefault(train.split("-")[0], set()).add((mem, runtime))
    return out


@pytest.mark.slow
def test_paper_scale_dry_run_asks_for_each_runs_own_memory_and_time(tmp_path):
    """Fed-NCL's LeNet-5 and FedGR's Clothing1M ResNet-50 train jobs ask for what the plan predicts;
    a command-line cap lowers the time of the long runs."""
    plan = _plan(results=str(tmp_path / "results"))
    _measurements(plan, tmp_path / "results" / "plan")
    expected = R.TrainResources(plan, R.site_cap({"train": {"max_mem_mb": 256000, "max_runtime": 1440}}))
    jobs = _dry_run(tmp_path)
    assert {"lenet5", "resnet50"} <= set(jobs)
    lenet, resnet = jobs["lenet5"], jobs["resnet50"]
    assert max(m for m, _ in lenet) < min(m for m, _ in resnet)
    assert max(t for _, t in lenet) < min(t for _, t in resnet)
    assert {(r.mem_mb, r.runtime) for r in expected.by_run.values()} == set().union(*jobs.values())
    assert max(t for _, t in resnet) == 1440  # longer than a job: asks for the cap and continues

    capped = _dry_run(tmp_path, "--set-resources", "train:max_runtime=240")
    assert max(t for _, t in capped["resnet50"]) == 240
    assert capped["lenet5"] == lenet
