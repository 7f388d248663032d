"""Every bad configuration key or value is rejected before any job runs, naming it."""

import copy

import pytest

from fnlcore.config import build_plan, load_plan, validate_schema
from fnlcore.errors import ConfigError

GOOD = {
    "data_grid": [
        {
            "dataset": "digits",
            "partitions": [{"name": "bernoulli_dirichlet", "num_clients": 10, "p": 0.9, "alpha": 2.0}],
            "partition_seeds": [100],
            "noises": [{"name": "fedcorr", "rho": 0.6, "tau": 0.5}],
            "noise_seeds": [0, 1],
        }
    ]
}


def _plan(cfg):
    return build_plan(validate_schema(copy.deepcopy(cfg)))


def _bad(mutate):
    cfg = copy.deepcopy(GOOD)
    mutate(cfg)
    with pytest.raises(ConfigError) as e:
        _plan(cfg)
    return str(e.value)


def test_good_config_expands_grid():
    plan = _plan(GOOD)
    assert len(plan.label_sets) == 2
    assert set(plan.partitions) == {"bd-p0.9-a2.0-K10"}
    t = plan.targets()
    assert any(p.endswith("partitions/digits/bd-p0.9-a2.0-K10/pseed100.parquet") for p in t)
    assert any("/noise/digits/bd-p0.9-a2.0-K10/pseed100/" in p and p.endswith("nseed1.parquet") for p in t)


def test_default_config_is_valid(repo_root):
    plan = load_plan(repo_root / "config" / "config.yaml")
    assert plan.label_sets and plan.datasets["digits"].raw_dir.endswith("digits")


def test_schema_fills_defaults():
    cfg = validate_schema({"data_grid": [{"dataset": "digits", "partitions": [{"name": "iid", "num_clients": 3}]}]})
    assert cfg["results_dir"] == "results"
    assert cfg["data_grid"][0]["noise_seeds"] == [0]


@pytest.mark.parametrize(
    "mutate,needles",
    [
        (lambda c: c.update(data_gird=[]), ["data_gird"]),
        (lambda c: c.update(device="gpu0"), ["device", "gpu0"]),
        (lambda c: c["data_grid"][0].update(partition_seed=[1]), ["partition_seed"]),
        (lambda c: c["data_grid"][0].update(noise_seeds=[-1]), ["noise_seeds", "-1"]),
        (lambda c: c["data_grid"][0].update(dataset="cifar11"), ["data_grid[0].dataset", "cifar11", "cifar10"]),
        (lambda c: c["data_grid"][0]["partitions"][0].update(alpah=1.0), ["data_grid[0].partitions[0]", "alpah", "alpha"]),
        (lambda c: c["data_grid"][0]["partitions"][0].update(p=1.5), ["data_grid[0].partitions[0]", "p"]),
        (lambda c: c["data_grid"][0]["partitions"][0].update(alpha=0), ["alpha"]),
        (lambda c: c["data_grid"][0]["partitions"][0].update(num_clients=0), ["num_clients"]),
        (lambda c: c["data_grid"][0]["partitions"][0].update(name="dirichlet"), ["dirichlet", "bernoulli_dirichlet"]),
        (lambda c: c["data_grid"][0]["noises"][0].update(rho=1.2), ["data_grid[0].noises[0]", "rho"]),
        (lambda c: c["data_grid"][0]["noises"][0].update(label_space="some"), ["label_space"]),
        (lambda c: c["data_grid"][0]["noises"].append({"name": "fednoro_hidn", "rho": 0.4, "eta_l": 0.7, "eta_u": 0.5}), ["noises[1]", "eta"]),
        (lambda c: c["data_grid"][0]["noises"].append({"name": "fedmlp_partial", "missing": 2}), ["noises[1]", "multi-label"]),
        (lambda c: c["data_grid"][0]["noises"].append({"name": "symmetrik"}), ["symmetrik", "symmetric"]),
        (lambda c: c.update(data={"datasets": {"digitz": {}}}), ["digitz"]),
        (lambda c: c.update(data={"datasets": {"digits": {"mirror": ["x"]}}}), ["mirror"]),
    ],
)
def test_bad_values_are_named(mutate, needles):
    msg = _bad(mutate)
    for n in needles:
        assert n in msg, (n, msg)


def test_method_settings_incompatible_with_training_fail_at_config_time(tmp_path):
    scale = tmp_path / "s.yaml"
    scale.write_text("training: {rounds: 2}\n")
    with pytest.raises(ConfigError) as e:
        build_plan(validate_schema({"tables": ["demo"], "scale": str(scale), "data_grid": []}))
    assert "warmup_rounds=10" in str(e.value) and "training.rounds=2" in str(e.value) and "FedNoRo" in str(e.value)
