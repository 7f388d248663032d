"""`fnl plan` prices a GPU from that GPU's measurements only (issue 45, items 1 and 2).

* a CPU-only machine prices the shipped H200 (`--gpu h200`): no row from a CPU's cost, the
  unmeasured shapes estimated from the H200's measured ones (fnlcore/app/gpu_cost.py), every
  table's floor, the total line;
* the step-time model (a per dispatched op + b per FLOP, c for the batched step) reproduces the
  measurements it is fitted on, and refuses to fit on fewer than two;
* the engine a paper-scale run trains on: batched on a GPU where the method batches, sequential on
  a CPU, for a method that does not batch, or where the user sets it.
No wall time is asserted.
"""

from __future__ import annotations

import dataclasses
import json
import re
from types import SimpleNamespace

import pytest
import torch

from fnlcore.app import resources as R
from fnlcore.app.cost import Pricing, step_shape
from fnlcore.app.counts import COUNT_BATCH, ShapeCounts, count_shape, shipped_counts
from fnlcore.app.gpu_cost import DeviceModel, batched_measurements, find_gpu, floor_seconds, shape_from_key
from fnlcore.app.measurements import device_memory_mb, measured_on, ship_step_costs, shipped_step_costs_path, step_cost_file
from fnlcore.app.plan import build_plan, validate_schema
from fnlcore.cli import main as fnl
from fnlcore.errors import ConfigError
from fnlcore.fl.simulation import RoundEngine, clients_at_once, effective_engine
from fnlcore.methods import METHODS
from fnlcore.models import build_model

SHIPPED = shipped_step_costs_path()
H200 = "cuda:NVIDIA H200"
TOTAL = re.compile(r"^total: [\d,]+ GPU-hours on cuda:NVIDIA H200 \(floor [\d,]+; each run once\)$")


def _cpu_costs() -> dict[str, float]:
    raw = json.loads(SHIPPED.read_text())
    return {k: float(c["train_s"]) for d, es in raw["devices"].items() if d.startswith("cpu") for k, c in es.items()}


def _h200_model() -> DeviceModel:
    d = find_gpu("h200", [SHIPPED])
    return DeviceModel(d, {k: v[:2] for k, v in measured_on(d, [SHIPPED]).items()}, ShapeCounts(),
                       batched_measurements()[d], device_memory_mb(d))


@pytest.mark.slow
def test_fnl_plan_gpu_h200_on_a_cpu_prices_every_table_from_the_h200_only(tmp_path, capsys):
    assert fnl(["plan", "--scale", "paper", "--gpu", "h200", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert TOTAL.match(out[-1]), out[-1]
    # every method's round cost on the GPU is a counted one, never a CPU's time ratio
    start = next(i for i, ln in enumerate(out) if ln.startswith("method round costs")) + 1
    block = out[start:out.index("", start)]
    listed = [ln for ln in block if re.match(r"^  [a-z_0-9]+: ", ln)]
    assert len(listed) >= 20 and all("[counted]" in ln for ln in listed), block
    assert not any("[cpu time]" in ln or "[unmeasured]" in ln for ln in block), block
    shape_lines = [ln for ln in out if re.match(r"^\s+\d+\.\d+\s+\d+\.\d+\s+\d+\s+[\d.]+\s+\S+\s+\S+\|", ln)]
    sources = [ln.rsplit("[", 1)[1].rstrip("]") for ln in shape_lines]
    assert len(shape_lines) == 13
    assert all(s == f"shipped ({H200})" or s.startswith(f"estimated from 5 shapes measured on {H200}") for s in sources)
    assert not any("cpu" in s.lower() for s in sources)
    # the step costs themselves: none is a CPU's (the digits MLP's launch-bound GPU step is slower
    # than the CPU's; every ResNet's and VGG's at least ten times faster)
    cpu = _cpu_costs()
    for ln in shape_lines:
        s_per_step, key = float(ln.split()[0]), ln.split()[5]
        assert key not in cpu or s_per_step != pytest.approx(cpu[key], rel=0.01)
        assert key not in cpu or cpu[key] < 0.1 or s_per_step < cpu[key] / 10
    # every table: its runs, how many batch, device hours and its floor, the floor below the estimate
    header = next(i for i, ln in enumerate(out) if ln.startswith("paper "))
    assert "floor h" in out[header] and "batched" in out[header]
    end = next(i for i, ln in enumerate(out) if ln.startswith("all "))
    rows = [ln.split() for ln in out[header + 1:end]]
    assert len(rows) == 28  # the 27 paper tables and the demo
    for paper, table, runs, batched, hours, floor, *_ in rows:
        if paper != "demo":
            assert 0 < float(floor) < float(hours), (paper, table)
    fedncl = [r for r in rows if r[0] == "fedncl" and r[1] == "I"][0]
    assert 0 < int(fedncl[3]) < int(fedncl[2])  # MNIST in memory: the methods that batch, batched


def test_the_step_model_fits_the_h200_and_prices_the_batched_step_by_its_measured_rounds():
    model = _h200_model()
    assert model.a > 0 and model.b > 0 and model.c is not None
    measured = measured_on(find_gpu("h200", [SHIPPED]), [SHIPPED])
    counts = ShapeCounts()
    for key, (t, _e, _src) in measured.items():
        shape = shape_from_key(key)
        assert model.train_s(shape) == t  # a measured shape keeps its measurement
        c = counts.of(shape)
        assert model.a * c["ops"] + model.b * c["flops"] == pytest.approx(t, rel=model.fit_error + 1e-9)
    # each measured batched round's speed-up, reproduced within the spread of the two rows
    for row in model.batched_rows:
        t = model.train_s(row.shape)
        speedup = row.clients * t / model.group_step_s(row.shape, t, row.clients)
        assert speedup == pytest.approx(row.sequential_s / row.batched_s, rel=0.05)
    # an estimated shape is the model's, not a CPU's
    ich = shape_from_key("resnet18|3x512x512|C5|b16|affine_flip|adam|fp32|eb1024")
    c = counts.of(ich)
    assert model.train_s(ich) == pytest.approx(model.a * c["ops"] + model.b * c["flops"])
    assert model.train_s(ich) < _cpu_costs()[ich.key()] / 100


def test_fewer_than_two_measured_shapes_cannot_estimate_and_an_unknown_gpu_is_named():
    with pytest.raises(ConfigError, match="at least 2"):
        DeviceModel("cuda:X|torch 2", {"lenet5|1x28x28|C10|b128|none|sgd|fp32|eb1024": (0.002, 1e-6)}, ShapeCounts())
    with pytest.raises(ConfigError, match=r"--gpu a100.*measured GPUs: cuda:NVIDIA H200"):
        find_gpu("a100", [SHIPPED])
    with pytest.raises(ConfigError, match="not a shape key"):
        shape_from_key("resnet18|3x32")


def test_fnl_plan_gpu_refuses_device_and_recalibrate(tmp_path, capsys):
    assert fnl(["plan", "--scale", "smoke", "--tables", "demo", "--gpu", "h200", "--device", "cpu",
                "--results", str(tmp_path)]) == 2
    assert "--gpu h200" in capsys.readouterr().err
    assert fnl(["plan", "--scale", "smoke", "--tables", "demo", "--gpu", "h200", "--recalibrate",
                "--results", str(tmp_path)]) == 2
    assert fnl(["plan", "--scale", "smoke", "--tables", "demo", "--gpu", "a100", "--results", str(tmp_path)]) == 2
    assert "no step costs measured on a GPU named like 'a100'" in capsys.readouterr().err
    assert fnl(["plan", "--scale", "smoke", "--tables", "demo", "--gpu", " ", "--results", str(tmp_path)]) == 2
    assert "--gpu: name a GPU" in capsys.readouterr().err
    # a smoke plan prices minutes: its total says so, not "0"
    assert fnl(["plan", "--scale", "smoke", "--tables", "demo", "--gpu", "h200", "--results", str(tmp_path)]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert re.match(r"^total: 0\.\d\d GPU-hours on cuda:NVIDIA H200 \(floor 0\.\d\d; each run once\)$", last), last


def test_a_gpu_job_never_takes_a_cpu_step_cost_and_a_digits_table_asks_minutes(tmp_path):
    plan = build_plan(validate_schema({"tables": ["demo"], "scale": "paper", "data_grid": [],
                                       "results_dir": str(tmp_path)}))
    run = plan.runs()[0]
    shape = step_shape(run, plan.datasets[run.dataset].options).key()
    (tmp_path / "plan").mkdir()
    (tmp_path / "plan" / "step_costs.json").write_text(json.dumps(  # the user's own CPU: slow
        {"version": 1, "devices": {"cpu:Mine|1 threads|torch 2": {shape: {"train_s": 50.0, "eval_s": 0.1}}}}))
    gpu = R.TrainResources(plan, gpu=True).by_run[R._run_key(run.fields())]
    assert "cpu" not in gpu.time_source.lower() and gpu.time_source.startswith("estimated from")
    assert gpu.runtime < 60 and gpu.mem_mb < R.DEFAULT_MEM_MB  # minutes and the rehearsal's memory
    cpu = R.TrainResources(plan, gpu=False).by_run[R._run_key(run.fields())]
    assert cpu.time_source.startswith(R.OWN) and cpu.device_seconds > gpu.device_seconds


def test_counts_are_the_steps_own_and_the_shipped_file_holds_every_paper_shape():
    shipped = shipped_counts()
    key = "lenet5|1x28x28|C10|b128|none|sgd|fp32|eb1024"
    again = count_shape(shape_from_key(key))
    assert again["ops"] == shipped[key]["ops"] and again["stackable"]
    assert again["flops"] == pytest.approx(shipped[key]["flops"])
    # FLOPs scale with the batch, ops do not
    half = count_shape(dataclasses.replace(shape_from_key(key), batch_size=64))
    assert half["ops"] == again["ops"] and half["flops"] == pytest.approx(again["flops"] / 2)
    assert COUNT_BATCH >= 2
    plan = build_plan(validate_schema({"tables": ["fedncl", "fednoro"], "scale": "paper", "data_grid": []}))
    opts = {n: d.options for n, d in plan.datasets.items()}
    assert {step_shape(r, opts.get(r.dataset)).key() for r in plan.runs()} <= set(shipped)
    assert floor_seconds(1e15) > 0


def test_clients_at_once_follow_the_switch_else_the_memory():
    assert clients_at_once(4, 10, 1e12, 1e6) == 4
    assert clients_at_once(0, 10, None, None) == 10
    assert clients_at_once(0, 100, 10e9, 1e9) == 6  # 60 % of 10 GB at 1 GB a client
    assert clients_at_once(0, 100, 1e9, 5e9) == 1


# -- the engine a run trains on ---------------------------------------------------------------------


def _engine(method: str, engine: str, device: str) -> RoundEngine:
    """A RoundEngine's decision for a method on a device, without a device: the method's class, its
    settings and a model that stacks (what RoundEngine reads)."""
    cls = METHODS[method]
    m = object.__new__(cls)
    settings = SimpleNamespace(engine=engine, batched_clients=0)
    m.ctx = SimpleNamespace(settings=settings, device=torch.device(device),
                            data=SimpleNamespace(train=SimpleNamespace(in_memory=True)))
    m.global_model = build_model("lenet5", 10, 1, (28, 28))
    return RoundEngine(m)


def test_the_default_engine_is_batched_on_a_gpu_sequential_on_a_cpu_and_sequential_stays_a_switch():
    assert effective_engine("default", "cuda") == "auto" and effective_engine("default", "cpu") == "sequential"
    assert effective_engine("sequential", "cuda") == "sequential" and effective_engine("batched", "cpu") == "batched"
    assert _engine("fedavg", "default", "cuda").batched
    assert not _engine("fedavg", "default", "cpu").batched
    assert not _engine("fedavg", "sequential", "cuda").batched
    assert _engine("dividemix", "default", "cuda").batched  # its warm-up batches; its main stage does not


def test_a_paper_scale_dry_run_resolves_batched_on_a_gpu_where_the_method_batches():
    """Fed-NCL's MNIST table at paper scale: its FedAvg run batches on a GPU (all 20 clients in an
    H200's memory), sequential on a CPU and when `engine: sequential` is set; a method that does not
    batch and an on-disk dataset (FedNoRo's ICH) stay sequential."""
    plan = build_plan(validate_schema({"tables": ["fedncl/I", "fednoro/1"], "scale": "paper", "data_grid": []}))
    assert all(r.training.engine == "default" for r in plan.runs())
    opts = {n: d.options for n, d in plan.datasets.items()}
    gpu = Pricing("cuda", _h200_model(), ShapeCounts(), device_memory_mb(find_gpu("h200", [SHIPPED])) * 2**20)

    def at_once(run, pricing) -> int:
        from fnlcore.app.cost import _data_shape, _step_shape

        ds = _data_shape(run, opts.get(run.dataset))
        return max(sp.at_once for sp in pricing.stages(run, ds, _step_shape(run, ds)))

    fedavg = next(r for r in plan.runs() if r.method.name == "fedavg" and r.dataset == "mnist")
    assert at_once(fedavg, gpu) == fedavg.partition.num_clients
    assert at_once(fedavg, Pricing("cpu", None, ShapeCounts())) == 1
    forced = dataclasses.replace(fedavg, training=dataclasses.replace(fedavg.training, engine="sequential"))
    assert at_once(forced, gpu) == 1
    capped = dataclasses.replace(fedavg, training=dataclasses.replace(fedavg.training, batched_clients=4))
    assert at_once(capped, gpu) == 4
    ich = [r for r in plan.runs() if r.dataset.startswith("ich")]
    assert ich and all(at_once(r, gpu) == 1 for r in ich)  # on-disk images: sequential


def test_a_stage_that_does_not_batch_trains_sequentially_in_the_plan():
    plan = build_plan(validate_schema({"tables": ["fedgr/1"], "scale": "paper", "data_grid": []}))
    opts = {n: d.options for n, d in plan.datasets.items()}
    gpu = Pricing("cuda", _h200_model(), ShapeCounts(), 143771 * 2**20)
    from fnlcore.app.cost import _data_shape, _step_shape

    run = next(r for r in plan.runs() if r.method.name == "dividemix")
    ds = _data_shape(run, opts.get(run.dataset))
    stages = {sp.name: sp.at_once for sp in gpu.stages(run, ds, _step_shape(run, ds))}
    cls = METHODS["dividemix"]
    assert set(stages) <= set(cls.stages)
    for name, n in stages.items():
        assert (n > 1) == cls.stages[name].batchable, (name, n)
    assert any(n > 1 for n in stages.values()) and any(n == 1 for n in stages.values())


def test_a_gpu_without_shipped_costs_fits_its_model_on_what_it_measured(tmp_path):
    """A GPU model the project never measured (`fnl plan --device cuda` on it): its shapes are
    measured there first (here: already in its calibration file), then its model is fitted on
    them; without a measured batched round its batched runs are priced as sequential, and said so."""
    from fnlcore.app.cost import Calibration, estimate_plan, format_estimate

    plan = build_plan(validate_schema({"tables": ["fedncl"], "scale": "paper", "data_grid": [],
                                       "results_dir": str(tmp_path)}))
    opts = {n: d.options for n, d in plan.datasets.items()}
    keys = sorted({step_shape(r, opts.get(r.dataset)).key() for r in plan.runs()})
    assert len(keys) >= 2
    other = "cuda:Other GPU|torch 2"
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"version": 1, "devices": {other: {
        k: {"train_s": 0.001 * (i + 2), "eval_s": 1e-6, "load": 0.0} for i, k in enumerate(keys)}}}))
    cal = Calibration(path, None, description=other)
    cost = estimate_plan(plan, cal, pricing=Pricing("cuda", None, ShapeCounts(), 80e9))
    assert cost.pricing.model is not None and cost.pricing.model.c is None
    assert any(r.at_once > 1 for r in cost.runs.values())
    sequential = estimate_plan(plan, cal, pricing=Pricing("cuda", None, ShapeCounts(), None))
    assert cost.seconds == pytest.approx(sequential.seconds)
    text = format_estimate(cost, cal, "paper")
    assert "no batched round measured on this device" in text
    assert text.splitlines()[-1].startswith("total: ") and "on cuda:Other GPU (floor" in text.splitlines()[-1]


def test_the_run_sizes_clients_at_once_as_the_plan_does():
    """The batched engine's clients at once on a GPU (RoundEngine.chunk -> clients_in_memory, counted on
    the run's model) equal the plan's (the shape's shipped counts), for a model without BatchNorm;
    the count leaves the model's mode as it was."""
    from fnlcore.fl.simulation import MEMORY_SHARE, client_bytes, clients_in_memory
    from fnlcore.fl.pipeline import InputPipeline

    shape = shape_from_key("lenet5|1x28x28|C10|b128|none|sgd|fp32|eb1024")
    counts = shipped_counts()[shape.key()]
    per_client = client_bytes(counts["param_bytes"], counts["activation_bytes"], 128, "sgd", 1)
    memory = 7.5 * per_client / MEMORY_SHARE
    assert clients_at_once(0, 100, memory, per_client) == 7
    model = build_model("lenet5", 10, 1, (28, 28))
    model.train()
    sample = InputPipeline((0.5,), (0.5,), "none").eval(torch.zeros((2, 1, 28, 28), dtype=torch.uint8))
    assert clients_in_memory(model, sample, 128, "sgd", 1, memory) == 7
    assert model.training


def test_a_device_checks_batched_rounds_and_memory_ship_with_its_step_costs(tmp_path):
    """`fnl device-check` times both engines at the papers' shapes; its step-cost file carries those
    rounds and the device's memory, and `--ship-step-costs` adds them, so `fnl plan` prices that
    GPU's batched engine from its own measurements."""
    import csv
    import shutil

    from fnlcore.app.benchmark import ROW_COLUMNS
    from fnlcore.app.device_check.step_costs import batched_rows

    with open(tmp_path / "timing.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=ROW_COLUMNS)
        w.writeheader()
        for engine, s, ran in (("sequential", 0.5, False), ("batched", 0.1, True)):
            w.writerow({c: "" for c in ROW_COLUMNS} | {
                "case": "fedncl_lenet5", "engine": engine, "layout": "nchw", "precision": "fp32", "model": "lenet5",
                "clients": 20, "batch": 128, "s_per_round": s, "batched_ran": ran, "status": "ok"})
        w.writerow({c: "" for c in ROW_COLUMNS} | {  # another layout: not a row of the model
            "case": "fedncl_lenet5", "engine": "batched", "layout": "channels_last", "precision": "fp32",
            "model": "lenet5", "s_per_round": 0.01, "batched_ran": True, "status": "ok"})
    rows = batched_rows(tmp_path / "timing.csv")
    assert len(rows) == 1 and rows[0]["clients"] == 20 and rows[0]["sequential_s"] / rows[0]["batched_s"] == 5
    other = "cuda:Other GPU|torch 2"
    keys = ["lenet5|1x28x28|C10|b128|none|sgd|fp32|eb1024", "resnet18_cifar|3x32x32|C10|b32|crop_flip|sgd|fp32|eb1024"]
    src = tmp_path / "step_costs.json"
    src.write_text(json.dumps(step_cost_file({k: {"train_s": 0.002 * (i + 1), "eval_s": 1e-6} for i, k in enumerate(keys)},
                                             other, "measured by a test", rows, 80000)))
    dest = tmp_path / "shipped.json"
    shutil.copy(SHIPPED, dest)
    assert ship_step_costs(src, dest) == [other]
    assert device_memory_mb(other, dest) == 80000 and len(batched_measurements(dest)[other]) == 1
    assert len(batched_measurements(dest)[find_gpu("h200", [dest])]) == 2  # the shipped device's kept
    model = DeviceModel(other, {k: v[:2] for k, v in measured_on(other, [dest]).items()}, ShapeCounts(),
                        batched_measurements(dest)[other])
    assert model.c is not None and model.c > 0
