"""The one store of step costs and rehearsal tables (fnlcore.app.measurements): its precedence rule,
clause by clause, on files written here (the device first, then the results folder before the shipped
files, ties to the slowest, the other kind only where the rule allows), and its files round-trip."""

from __future__ import annotations

import csv
import json

import pytest

from fnlcore.app import measurements as M
from fnlcore.errors import ConfigError

CPU_A, CPU_B = "cpu:A|1 threads|torch 2", "cpu:B|1 threads|torch 2"
H200_OLD, H200_NEW = "cuda:NVIDIA H200|torch 2.1", "cuda:NVIDIA H200|torch 2.11"


def _costs(path, devices):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": 1, "devices": {d: {k: {"train_s": t, "eval_s": t / 10} for k, t in e.items()}
                                                          for d, e in devices.items()}}))
    return path


def _rehearsal(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=M.CSV_COLUMNS)
        w.writeheader()
        for config, device, rss in rows:
            w.writerow({c: "" for c in M.CSV_COLUMNS} | {"config": config, "device": device, "status": "pass",
                                                          "peak_rss_mb": rss, "checkpoint_mb": 1})


@pytest.fixture
def places(tmp_path):
    """(results folder, shipped folder)."""
    return tmp_path / "results", tmp_path / "shipped"


def test_the_results_folder_beats_the_shipped_files_at_the_same_kind(places):
    results, shipped = places
    _costs(M.own_step_costs(results), {CPU_A: {"s": 1.0}})
    _costs(M.shipped_step_costs_path(shipped), {CPU_B: {"s": 2.0, "t": 3.0}})
    costs, sources = M.step_costs_with_sources(results, gpu=False, shipped_dir=shipped)
    assert costs == {"s": (1.0, 0.1), "t": (3.0, 0.3)}
    assert sources["s"].startswith(M.OWN) and sources["t"] == "shipped (cpu:B|1 threads)"


def test_ties_in_one_file_go_to_the_slowest_device_of_the_kind(places):
    results, shipped = places
    _costs(M.own_step_costs(results), {CPU_A: {"s": 1.0}, CPU_B: {"s": 3.0}})
    costs, sources = M.step_costs_with_sources(results, gpu=False, shipped_dir=shipped)
    assert costs["s"][0] == 3.0 and "cpu:B" in sources["s"]


def test_the_other_kind_only_from_the_results_folder_and_marked(places):
    results, shipped = places
    _costs(M.own_step_costs(results), {CPU_A: {"own": 1.0}})
    _costs(M.shipped_step_costs_path(shipped), {CPU_B: {"shipped": 2.0}})
    costs, sources = M.step_costs_with_sources(results, gpu=True, shipped_dir=shipped)
    assert set(costs) == {"own"} and sources["own"].endswith("a CPU's: an overestimate")
    # fnl plan's shipped fallback of a GPU says the same of a shipped CPU's
    entry, source = M.shipped_step_costs("gpu", shipped)["shipped"]
    assert entry["train_s"] == 2.0 and source.endswith("a CPU's: an overestimate")


def test_the_device_kind_beats_the_place_for_a_rehearsal(places):
    results, shipped = places
    _rehearsal(M.own_rehearsal(results), [("c", "cpu", 100.0)])
    _rehearsal(shipped / "rehearsal_h200.csv", [("c", "cuda:0", 200.0)])
    gpu, gpu_sources = M.rehearsal_with_sources(results, gpu=True, shipped_dir=shipped)
    cpu, cpu_sources = M.rehearsal_with_sources(results, gpu=False, shipped_dir=shipped)
    assert gpu["c"].peak_rss_mb == 200.0 and gpu_sources["c"].startswith("shipped")
    assert cpu["c"].peak_rss_mb == 100.0 and cpu_sources["c"].startswith(M.OWN)


def test_a_gpu_model_under_any_torch_version_the_first_file_first(places):
    results, shipped = places
    own = _costs(M.own_step_costs(results), {H200_NEW: {"s": 0.01}})
    ship = _costs(M.shipped_step_costs_path(shipped), {H200_OLD: {"s": 0.02, "t": 0.03}, CPU_A: {"u": 1.0}})
    found = M.measured_on(H200_NEW, [own, ship])
    assert {k: v[:2] for k, v in found.items()} == {"s": (0.01, 0.001), "t": (0.03, 0.003)}  # never the CPU's
    assert found["s"][2] == str(own) and found["t"][2] == str(ship)


def test_the_files_round_trip_and_a_broken_one_names_the_fix(tmp_path):
    path = tmp_path / "plan" / M.STEP_COSTS_FILE
    M.write_calibration(path, {CPU_A: {"s": {"train_s": 1.0, "eval_s": 0.1}}})
    assert M.read_calibration(path) == {CPU_A: {"s": {"train_s": 1.0, "eval_s": 0.1}}}
    path.write_text("{")
    with pytest.raises(ConfigError, match="delete it to measure again"):
        M.read_calibration(path)
    rows = [{c: "" for c in M.CSV_COLUMNS} | {"config": "c", "status": "pass"}]
    written = M.write_rehearsal_csv(rows, tmp_path / "r")
    assert written == M.rehearsal_csv(tmp_path / "r") and M.read_rehearsal_rows(written)[0]["config"] == "c"
