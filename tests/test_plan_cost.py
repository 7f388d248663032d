"""`fnl plan`'s cost model (fnlcore/app/cost.py): the work it counts per run, the calibration cache, the CLI.

The counts are checked against hand arithmetic; measured seconds are only checked to be
positive and cached (tests never assert on wall time).
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from fnlcore.app import method_costs
from fnlcore.app.cost import Calibration, StepShape, estimate_plan, format_estimate, run_work, step_shape
from fnlcore.app.plan import build_plan, validate_schema
from fnlcore.app.runs import RunSpec
from fnlcore.cli import main as fnl
from fnlcore.datasets import DATASETS, expected_shape
from fnlcore.errors import ConfigError
from fnlcore.fl.settings import TrainSettings
from fnlcore.methods import METHODS, method_from_dict
from fnlcore.noise import noise_spec_from_dict
from fnlcore.partition import partition_spec_from_dict


def _run(method: dict, partition: dict | None = None, dataset: str = "digits", **training) -> RunSpec:
    settings = {"model": "mlp", "rounds": 3, "local_epochs": 2, "batch_size": 16, **training}
    return RunSpec(
        dataset=dataset,
        partition=partition_spec_from_dict(partition or {"name": "iid", "num_clients": 4}),
        partition_seed=0,
        noise=noise_spec_from_dict({"name": "clean"}),
        noise_seed=0,
        training=TrainSettings(**settings),
        method=method_from_dict(method),
        seed=0,
    )


def _cpu(name: str, stretch: str = "main", **params) -> float:
    """The CPU round cost the plan applies (benchmarks/method_costs.json)."""
    return method_costs.MethodCosts().factor(name, method_from_dict({"name": name, **params}), stretch, "cpu").value


def test_fedavg_work_is_rounds_times_clients_times_local_steps():
    steps, eval_samples, measured = run_work(_run({"name": "fedavg"}))
    per_client = math.ceil(1347 / 4 / 16)  # digits: 1,347 train / 450 test
    assert steps == 3 * 4 * 2 * per_client
    assert eval_samples == 3 * 450
    assert measured  # FedAvg is the unit of the ratios


def test_client_fraction_drop_last_and_method_factor():
    base, _, _ = run_work(_run({"name": "fedavg"}, {"name": "iid", "num_clients": 10}, client_fraction=0.3))
    assert base == 3 * 3 * 2 * math.ceil(1347 / 10 / 16)
    dropped, _, _ = run_work(_run({"name": "fedavg"}, {"name": "iid", "num_clients": 10}, client_fraction=0.3, drop_last=True))
    assert dropped == 3 * 3 * 2 * math.floor(1347 / 10 / 16)
    prox, _, measured = run_work(_run({"name": "fedprox", "mu": 0.01}, {"name": "iid", "num_clients": 10}, client_fraction=0.3))
    assert measured and prox == pytest.approx(base * _cpu("fedprox")) and _cpu("fedprox") == 1.5


def test_fedcorr_and_feddiv_one_client_rounds_come_on_top_and_are_not_evaluated():
    per_client = math.ceil(1347 / 5 / 16)
    run = _run({"name": "fedcorr", "iterations1": 2, "rounds1": 1}, {"name": "iid", "num_clients": 5}, client_fraction=0.4)
    steps, eval_samples, _ = run_work(run)
    pre = 2 * 5 * 1 * 2 * per_client * _cpu("fedcorr", "preprocess")  # 2 passes of 5 one-client rounds
    main = 3 * 2 * 2 * per_client * _cpu("fedcorr")
    assert steps == pytest.approx(pre + main)
    assert eval_samples == 3 * 450  # pre-processing rounds score nothing
    stages = METHODS["feddiv"].schedule(method_from_dict({"name": "feddiv", "warmup_iterations": 3}), run.training, 5)
    assert [(s.name, s.rounds, s.clients, s.evaluated) for s in stages] == [("warmup", 15, 1, False), ("main", 3, 2, True)]


@pytest.mark.parametrize("name", ["fednoro", "dividemix"])
def test_warm_up_stages_split_the_rounds(name):
    run = _run({"name": name, "warmup_rounds": 2}, rounds=5)
    stages = METHODS[name].schedule(run.method, run.training, 4)
    assert [s.rounds for s in stages] == [2, 3] and stages[0].name == "warmup"
    warm, rest = (_cpu(name, s.name) for s in stages)
    assert warm == 1.0 and rest > 1.0
    steps, _, measured = run_work(run)
    per_round = 4 * 2 * math.ceil(1347 / 4 / 16)
    assert measured and steps == pytest.approx(per_round * (2 * warm + 3 * rest))


def test_unmeasured_method_counts_one_and_is_flagged(monkeypatch, tmp_path):
    fedavg, _, _ = run_work(_run({"name": "fedavg"}))
    raw = json.loads(method_costs.SHIPPED_METHOD_COSTS.read_text())
    del raw["methods"]["fedprox"]
    (tmp_path / "costs.json").write_text(json.dumps(raw))
    monkeypatch.setattr(method_costs, "SHIPPED_METHOD_COSTS", tmp_path / "costs.json")
    other, _, measured = run_work(_run({"name": "fedprox", "mu": 0.01}))
    assert not measured and other == pytest.approx(fedavg)


def test_partition_subsample_and_synthetic_options_set_the_sample_counts():
    sub = partition_spec_from_dict({"name": "fedmlp_equal", "num_clients": 5, "subsample": 5000})
    assert sub.expected_samples(129_535) == 25_000
    assert sub.expected_samples(400) == 400
    assert partition_spec_from_dict({"name": "fedmlp_equal", "num_clients": 5, "subsample": None}).expected_samples(400) == 400
    shape = expected_shape(DATASETS["synthetic_cifar10"], {"n_train": 120, "n_test": 60, "image_size": [16, 16]})
    assert (shape.n_train, shape.n_test, shape.image_size, shape.channels) == (120, 60, (16, 16), 3)
    assert expected_shape(DATASETS["cifar100"]).num_classes == 100
    with pytest.raises(ConfigError, match="unknown option"):
        expected_shape(DATASETS["digits"], {"test_fraction": 0.2})


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_every_dataset_knows_its_shape_before_it_is_prepared(name):
    info = DATASETS[name]
    shape = expected_shape(info)
    assert shape.n_train > 0 and shape.n_test > 0
    assert (shape.channels, shape.num_classes, shape.multi_label) == (info.channels, info.num_classes, info.multi_label)
    assert shape.image_size == tuple(info.image_size)


def test_a_dataset_without_sizes_is_named():
    info = dataclasses.replace(DATASETS["cifar10"], name="nosizes", split_sizes=None)
    with pytest.raises(ConfigError, match="'nosizes' declares no split_sizes"):
        expected_shape(info)


def test_step_shape_resolves_auto_settings():
    run = _run({"name": "fedavg"}, dataset="cifar10", model="auto", augmentation="auto", batch_size=10)
    shape = step_shape(run)
    assert (shape.model, shape.augmentation, shape.image_size, shape.batch_size) == ("cnn", "crop_flip", (32, 32), 10)


def _tiny_shape(**kw) -> StepShape:
    d = dict(model="mlp", channels=1, image_size=(8, 8), num_classes=10, multi_label=False, batch_size=8,
             augmentation="none", optimizer="sgd", precision="fp32", channels_last=False, eval_batch_size=32)
    return StepShape(**{**d, **kw})


def test_calibration_measures_once_caches_per_device_and_rejects_bad_files(tmp_path):
    path = tmp_path / "costs.json"
    cal = Calibration(path, torch.device("cpu"), steps=2)
    c = cal.cost(_tiny_shape())
    assert c.train_s > 0 and c.eval_s > 0 and cal.measured == [_tiny_shape().key()]
    ml = cal.cost(_tiny_shape(multi_label=True, optimizer="adam", augmentation="crop_flip", channels=3))
    assert ml.train_s > 0
    again = Calibration(path, torch.device("cpu"))
    assert again.cost(_tiny_shape()) == c and again.measured == []  # read, not measured
    raw = json.loads(path.read_text())
    assert list(raw["devices"]) == [cal.description] and len(raw["devices"][cal.description]) == 2
    fresh = Calibration(path, torch.device("cpu"), refresh=True, steps=2)
    fresh.cost(_tiny_shape())
    assert fresh.measured == [_tiny_shape().key()]
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not a calibration file"):
        Calibration(path, torch.device("cpu"))
    path.write_text(json.dumps({"version": 99, "devices": {}}))
    with pytest.raises(ConfigError, match="delete it"):
        Calibration(path, torch.device("cpu"))


def test_plan_counts_shared_runs_once(tmp_path):
    plan = build_plan(validate_schema({"tables": ["demo"], "scale": "smoke", "data_grid": []}))
    cost = estimate_plan(plan, Calibration(tmp_path / "c.json", torch.device("cpu"), steps=2))
    (table,) = cost.tables
    assert table.runs == len(cost.runs) == len(plan.runs())
    assert cost.seconds == pytest.approx(table.seconds) and table.longest_s <= table.seconds
    assert all(rc.seconds > 0 for rc in cost.runs.values())
    text = format_estimate(cost, Calibration(tmp_path / "c.json", torch.device("cpu")), "smoke")
    assert "demo     demo" in text and f"{len(cost.runs)}" in text


def test_cli_plan_prints_tables_and_names_bad_input(tmp_path, capsys):
    cal = str(tmp_path / "c.json")
    assert fnl(["plan", "--scale", "smoke", "--tables", "demo", "--calibration", cal]) == 0
    out = capsys.readouterr().out
    assert "demo     demo" in out and "device-h" in out and "(a run shared by tables counts once)" in out
    assert fnl(["plan", "--scale", "smoke", "--tables", "nopaper", "--calibration", cal]) == 2
    assert "nopaper" in capsys.readouterr().err
    assert fnl(["plan", "--scale", "smoke", "--threads", "0", "--calibration", cal]) == 2
    assert "--threads" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert fnl(["plan", "--scale", "smoke", "--tables", "demo", "--device", "cuda", "--calibration", cal]) == 2
        assert "no CUDA device" in capsys.readouterr().err
