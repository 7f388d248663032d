"""``fnl device-check --device cpu --quick``: every section runs and writes its files, on a Python
without Snakemake and jsonschema (as on the GPU nodes it is meant for), and writes nothing outside --out."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from fnlcore.app import benchmark
from fnlcore.app.cost import Calibration
from fnlcore.app.device_check import groups, rehearsal, step_costs, syncs, tiny
from fnlcore.app.gpu_cost import shape_from_key
from fnlcore.app.measurements import CSV_COLUMNS, ship_step_costs, shipped_shapes, step_cost_file
from fnlcore.methods import METHODS

REPO = Path(__file__).resolve().parents[1]

# Loaded at start-up by every Python of the run (the command and its rehearsal children), through
# PYTHONPATH: snakemake and jsonschema cannot be imported, and an attempt is logged.
BLOCKER = '''
import os, sys

class _Blocked:
    """A meta-path finder that refuses snakemake and jsonschema, as if they were not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("snakemake", "jsonschema"):
            with open(os.environ["FNL_BLOCKED_LOG"], "a") as f:
                f.write(name + "\\n")
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the device-check test)", name=name)
        return None

sys.meta_path.insert(0, _Blocked())
'''


def _rows(path: Path) -> tuple[list[str], list[dict]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def test_quick_device_check_runs_every_section_without_snakemake_or_jsonschema(tmp_path):
    site, out, cwd = tmp_path / "site", tmp_path / "out", tmp_path / "cwd"
    site.mkdir()
    cwd.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    log = tmp_path / "blocked.log"
    env = {**os.environ, "FNL_BLOCKED_LOG": str(log), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(site), str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    probe = subprocess.run([sys.executable, "-c", "import jsonschema"], env=env, capture_output=True, text=True,
                           timeout=60)
    assert probe.returncode != 0 and "blocked by the device-check test" in probe.stderr
    log.unlink()

    proc = subprocess.run(
        [sys.executable, "-m", "fnlcore.cli", "device-check", "--device", "cpu", "--quick", "--threads", "1",
         "--out", str(out)], env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert not log.exists(), f"imported: {log.read_text()}"
    assert not any(cwd.iterdir()), "wrote outside --out"

    expected = {
        "env.csv": ("key", "value"), "methods.csv": tiny.METHOD_COLUMNS, "syncs.csv": syncs.SYNC_COLUMNS,
        "timing.csv": benchmark.ROW_COLUMNS, "step_costs.csv": step_costs.STEP_COST_COLUMNS,
        "groups.csv": groups.GROUP_COLUMNS,
        "rehearsal.csv": rehearsal.REHEARSAL_COLUMNS, "rehearsal/rehearsal.csv": CSV_COLUMNS,
    }
    tables = {}
    for name, columns in expected.items():
        header, rows = _rows(out / name)
        assert tuple(header) == tuple(columns), name
        assert rows, f"{name} has no rows"
        tables[name] = rows

    # (a): every registered method, on each engine it has; (c): a row per method and engine that ran
    methods = tables["methods.csv"]
    assert {r["method"] for r in methods} == set(METHODS)
    assert {r["status"] for r in methods} <= {"ok", "n/a"}, [(r["method"], r["error"]) for r in methods
                                                              if r["status"] not in ("ok", "n/a")]
    for name, cls in METHODS.items():
        engines = {r["engine"] for r in methods if r["method"] == name and r["status"] == "ok"}
        assert engines == set(tiny.engines_of(cls)[0]), name
    ran = {(r["method"], r["engine"]) for r in methods if r["status"] == "ok"}
    assert {(r["method"], r["engine"]) for r in tables["syncs.csv"] if r["status"] == "ok"} == ran
    # on a CPU the device run and the reference are one computation: equal to the bit
    assert all(float(r["param_abs_diff_first"]) == 0 == float(r["metric_abs_diff_all"]) for r in methods
               if r["status"] == "ok")

    timing = tables["timing.csv"]
    assert {r["case"] for r in timing} == {c.name for c in benchmark.PAPER_CASES}
    assert {(r["engine"], r["layout"], r["precision"]) for r in timing} == {
        (e, lay, p) for e in benchmark.engines(torch.device("cpu")) for lay in benchmark.LAYOUTS
        for p in benchmark.PRECISIONS}
    assert benchmark.GRAPHS in benchmark.engines(torch.device("cuda"))  # graphs on/off where there are graphs
    assert all(r["status"] == "ok" and float(r["s_per_round"]) > 0 for r in timing)

    # (d): a calibration file `fnl plan --calibration` reads, with where it was measured
    raw = json.loads((out / "step_costs.json").read_text())
    (device,) = raw["devices"]
    assert raw["provenance"][device]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a CPU's calibration is per thread count: the command's
    try:
        calibration = Calibration(out / "step_costs.json", torch.device("cpu"))
    finally:
        torch.set_num_threads(threads)
    measured = [r["shape"] for r in tables["step_costs.csv"] if r["status"] == "ok"]
    assert measured and all(calibration.has(k) for k in measured) and calibration.description == device

    # (f): groups of 1 and 2 runs started at once (quick), each as a train_group job starts its runs
    group_rows = tables["groups.csv"]
    assert [(r["runs"], r["status"]) for r in group_rows] == [("1", "ok"), ("2", "ok")], group_rows
    assert float(group_rows[0]["throughput_vs_1"]) == 1.0 and float(group_rows[0]["overlap_share"]) == 0.0
    assert 0.0 < float(group_rows[1]["overlap_share"]) <= 1.0 and float(group_rows[1]["runs_per_hour"]) > 0

    assert [r["status"] for r in tables["rehearsal.csv"]] == ["pass"]
    summary = (out / "summary.md").read_text()
    for title in ("Environment", "(a)", "(b)", "(c)", "(d)", "(e)", "(f)"):
        assert f"## {title}" in summary, title
    assert "CUDA graphs on/off" in summary  # on a CPU the timing section says why they are skipped
    assert summary.count("\n**done**") == 7, summary[:3000]


def test_shipping_step_costs_adds_the_device_and_its_provenance(tmp_path):
    shipped = tmp_path / "step_costs.json"
    shipped.write_text(json.dumps({"devices": {"cpu:x|1 threads|torch 1": {"k": {"train_s": 1.0, "eval_s": 0.1}}},
                                   "provenance": {"cpu:x|1 threads|torch 1": "here"}, "version": 1}))
    measured = tmp_path / "measured.json"
    entries = {"k": {"train_s": 0.01, "eval_s": 0.001}, "k2": {"train_s": 0.02, "eval_s": 0.002}}
    measured.write_text(json.dumps(step_cost_file(entries, "cuda:GPU|torch 2", "there, today")))
    assert ship_step_costs(measured, shipped) == ["cuda:GPU|torch 2"]
    merged = json.loads(shipped.read_text())
    assert merged["devices"]["cuda:GPU|torch 2"] == entries
    assert merged["devices"]["cpu:x|1 threads|torch 1"]["k"]["train_s"] == 1.0
    assert merged["provenance"] == {"cpu:x|1 threads|torch 1": "here", "cuda:GPU|torch 2": "there, today"}


def test_a_step_shape_key_reads_back_as_its_shape():
    for key in shipped_shapes():
        assert shape_from_key(key).key() == key
