"""The measurements the project ships (benchmarks/rehearsal_*.csv, benchmarks/step_costs.json) size a
fresh clone's train jobs and `fnl plan`; a user's own measurements under RESULTS/plan/ win."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from fnlcore.app import cost as cost_mod
from fnlcore.app import measurements as M
from fnlcore.app import resources as R
from fnlcore.app.cost import step_shape
from fnlcore.app.measurements import CSV_COLUMNS
from fnlcore.app.plan import build_plan, validate_schema
from fnlcore.app.rehearse import training_config
from fnlcore.cli import main as fnl

SHIPPED = Path(__file__).resolve().parents[1] / "benchmarks"
SHIPPED_REHEARSAL = SHIPPED / "rehearsal_cpu.csv"


def _plan(tables, results):
    return build_plan(validate_schema({"tables": tables, "scale": "paper", "data_grid": [], "results_dir": str(results)}))


def _options(plan, run):
    ds = plan.datasets.get(run.dataset)
    return ds.options if ds is not None else None


def _shipped_peaks() -> dict[str, float]:
    with open(SHIPPED_REHEARSAL, newline="") as f:
        return {r["config"]: float(r["peak_rss_mb"]) for r in csv.DictReader(f) if r["status"] in ("pass", "no_weights")}


def _ich512(plan):
    runs = [r for r in plan.runs() if r.dataset.startswith("ich")
            and step_shape(r, _options(plan, r)).image_size == (512, 512)]
    assert runs, "FedNoRo table 1 has 512 x 512 ICH runs"
    return runs


def test_the_project_ships_a_rehearsal_and_step_costs_with_their_provenance():
    assert SHIPPED_REHEARSAL.exists()
    assert M.SHIPPED_DIR == SHIPPED
    raw = json.loads((SHIPPED / "step_costs.json").read_text())
    assert raw["version"] == M.CALIBRATION_VERSION
    kinds = {M._kind(d) for d in raw["devices"]}
    assert kinds == {"cpu", "gpu"}
    assert set(raw["provenance"]) == set(raw["devices"])  # where and when each device's were measured
    # every step shape of the paper scale has a shipped CPU cost
    from fnlcore.app.runs import PAPERS_DIR

    plan = _plan([p.stem for p in sorted(PAPERS_DIR.glob("*.yaml"))], "results")
    shapes = {step_shape(r, _options(plan, r)).key() for r in plan.runs()}
    cpu = M.shipped_step_costs("cpu")
    assert shapes <= set(cpu)


def test_a_fresh_clone_asks_the_shipped_rehearsals_memory_per_configuration(tmp_path):
    plan = _plan(["fedgr/3", "fednoro/1"], tmp_path)  # nothing under tmp_path: a fresh clone
    tr = R.TrainResources(plan, gpu=True)
    peaks = _shipped_peaks()
    fednoro = []
    for run in _ich512(plan):
        res = tr.by_run[R._run_key(run.fields())]
        peak = peaks[training_config(run, _options(plan, run)).key]
        # a GPU job rehearsed on a CPU: the measured peak, a CUDA context, the headroom
        assert res.mem_mb >= math.ceil((peak + R.CUDA_CONTEXT_MB) * R.MEM_HEADROOM + R.MEM_MARGIN_MB)
        assert res.mem_source.startswith("shipped") and "rehearsal_cpu.csv" in res.mem_source
        # no GPU has timed a 512 x 512 step yet: estimated from the H200's measured shapes (a shipped
        # CPU's would make a GPU job's round longer than a job, and the workflow refuse the run)
        assert res.time_source.startswith("estimated from") and "cuda:NVIDIA H200" in res.time_source
        assert not res.round_too_long and res.runtime < R.DEFAULT_CAP.max_runtime or res.jobs > 1
        if run.method.name == "fednoro":
            fednoro.append(res.mem_mb)
    assert fednoro and min(fednoro) > R.DEFAULT_MEM_MB  # FedNoRo's peak at 512 x 512 is over the old default
    everything = list(tr.by_run.values())
    assert len({r.mem_mb for r in everything}) > 1
    assert not any(r.round_too_long for r in everything)
    assert all(r.mem_source.startswith("shipped") for r in everything)
    clothing = [r for run in plan.runs() if run.dataset.startswith("clothing1m")
                for r in [tr.by_run[R._run_key(run.fields())]]]
    assert clothing and all(r.time_source.startswith("shipped (cuda:NVIDIA H200") for r in clothing)
    # sized per run; a run longer than a job (DivideMix's counted co-divide rounds) continues in more jobs
    assert len({r.runtime for r in clothing}) > 1
    assert all(r.runtime <= R.DEFAULT_CAP.max_runtime and (r.runtime < R.DEFAULT_CAP.max_runtime or r.jobs > 1)
               for r in clothing)


def test_the_shipped_gpu_step_costs_size_a_gpu_job_and_the_cpu_ones_a_cpu_job(tmp_path):
    plan = _plan(["fedncl/I"], tmp_path)  # LeNet-5: measured on the H200 and on the CPU
    gpu = R.TrainResources(plan, gpu=True).by_run
    cpu = R.TrainResources(plan, gpu=False).by_run
    key = R._run_key(next(iter(plan.runs())).fields())
    assert "cuda:NVIDIA H200" in gpu[key].time_source and gpu[key].time_source.startswith("shipped")
    assert cpu[key].time_source.startswith("shipped (cpu:")
    assert gpu[key].device_seconds < cpu[key].device_seconds


def test_the_users_own_rehearsal_row_and_step_cost_win(tmp_path):
    plan = _plan(["fednoro/1"], tmp_path)
    run = _ich512(plan)[0]
    cfg = training_config(run, _options(plan, run))
    shape = step_shape(run, _options(plan, run)).key()
    (tmp_path / "plan").mkdir()
    with open(tmp_path / "plan" / "rehearsal.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        w.writerow({c: "" for c in CSV_COLUMNS} | {
            "config": cfg.key, "model": cfg.model, "method": cfg.method, "device": "cuda:Mine|torch 2",
            "status": "pass", "peak_rss_mb": 3000, "peak_device_mb": 5000, "checkpoint_mb": 50,
            "written_per_checkpoint_mb": 50})
    mine = "cuda:Mine|torch 2"
    (tmp_path / "plan" / "step_costs.json").write_text(json.dumps(
        {"version": 1, "devices": {mine: {shape: {"train_s": 0.5, "eval_s": 0.001}}}}))
    tr = R.TrainResources(plan, gpu=True)
    res = tr.by_run[R._run_key(run.fields())]
    assert res.mem_mb == math.ceil(3000 * R.MEM_HEADROOM + R.MEM_MARGIN_MB)
    assert res.mem_source.startswith(R.OWN) and res.time_source.startswith(R.OWN)
    # priced as a GPU job prices a run (its engine, the methods' counted round costs) from the user's step cost
    pricing = tr._gpu_costs({name: ds.options for name, ds in plan.datasets.items()})[2]
    seconds, _ = R._round_seconds(run, _options(plan, run), 0.5, 0.001, pricing)
    assert res.device_seconds == pytest.approx(seconds)
    # the other configurations still take the shipped rehearsal
    others = [r for k, r in tr.by_run.items() if k != R._run_key(run.fields())
              and training_config(next(x for x in plan.runs() if R._run_key(x.fields()) == k),
                                  _options(plan, run)).key != cfg.key]
    assert others and all(r.mem_source.startswith("shipped") for r in others)
    cols = R.resource_columns(plan, gpu=True)
    assert any(n.startswith("memory and disk from:") and R.OWN in n and "shipped" in n for n in cols.notes)


def _no_measuring(*_a, **_k):
    raise AssertionError("fnl plan measured a step shape although shipped step costs cover it")


def test_fnl_plan_from_the_shipped_step_costs_measures_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cost_mod, "measure_step", _no_measuring)
    assert fnl(["plan", "--scale", "paper", "--tables", "fedgr", "fednoro", "--device", "cpu",
                "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[shipped (cpu:" in out  # each shape line says where its cost came from
    assert "memory and disk from:" in out and "rehearsal_cpu.csv" in out
    assert "job time from:" in out
    assert "--recalibrate" in out
    assert not (tmp_path / "plan" / "step_costs.json").exists()


def test_fnl_plan_recalibrate_measures_here_with_progress_and_an_estimate(tmp_path, monkeypatch, capsys):
    calls = []

    def fake(shape, device, steps=5, warmup=2):
        calls.append(shape.key())
        return cost_mod.StepCost(0.01, 0.0001)

    monkeypatch.setattr(cost_mod, "measure_step", fake)
    assert fnl(["plan", "--scale", "paper", "--tables", "fedncl", "--device", "cpu", "--recalibrate",
                "--results", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert calls  # every shape of the plan measured here, none taken from the shipped costs
    assert f"measuring {len(calls)} step shape(s)" in captured.err and "about " in captured.err
    assert f"[1/{len(calls)}] measured" in captured.err
    assert "[measured now]" in captured.out and "[shipped" not in captured.out
    saved = json.loads((tmp_path / "plan" / "step_costs.json").read_text())
    assert set(calls) <= set(next(iter(saved["devices"].values())))
