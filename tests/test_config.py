"""Every bad configuration key or value is rejected before any job runs, naming it."""

import copy

import pytest

from fnlcore.app.plan import build_plan, load_plan, validate_schema
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
    # one round leaves FedNoRo no stage 2, whatever the rescaled warm-up
    scale = tmp_path / "s.yaml"
    scale.write_text("training: {rounds: 1}\n")
    with pytest.raises(ConfigError) as e:
        build_plan(validate_schema({"tables": ["demo"], "scale": str(scale), "data_grid": []}))
    assert "warmup_rounds=1" in str(e.value) and "training.rounds=1" in str(e.value) and "FedNoRo" in str(e.value)


def test_scales_rescale_round_valued_hyper_parameters(tmp_path):
    from fnlcore.app.papers import rescale_rounds, round_fields
    from fnlcore.methods import method_from_dict

    fednoro = method_from_dict({"name": "fednoro", "warmup_rounds": 10, "ramp_end": 49})
    assert set(round_fields(type(fednoro))) >= {"warmup_rounds", "ramp_begin", "ramp_end"}
    assert rescale_rounds(fednoro, 100, 100) is fednoro
    small = rescale_rounds(fednoro, 100, 4)  # 0.4 -> 1 (at least one round); 1.96 -> 2; None stays
    assert (small.warmup_rounds, small.ramp_begin, small.ramp_end) == (1, None, 2)
    big = rescale_rounds(fednoro, 100, 300)
    assert (big.warmup_rounds, big.ramp_end) == (30, 147)
    assert rescale_rounds(fednoro, 100, 10).warmup_rounds == 1
    assert rescale_rounds(method_from_dict({"name": "fednoro", "warmup_rounds": 99}), 100, 4).warmup_rounds == 3
    # through a scale file: the demo's FedNoRo (10 of 30 rounds) at 6 rounds warms up for 2
    scale = tmp_path / "s.yaml"
    scale.write_text("training: {rounds: 6}\n")
    plan = build_plan(validate_schema({"tables": ["demo"], "scale": str(scale), "data_grid": []}))
    warm = {r.method.warmup_rounds for r in plan.runs() if r.method.name == "fednoro"}
    assert warm == {2}


def test_schema_errors_are_one_line_naming_the_key_and_the_choices():
    with pytest.raises(ConfigError) as e:
        validate_schema({"tabels": ["demo"]})
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and "unknown key 'tabels'" in msg and "tables" in msg and "$schema" not in msg
    with pytest.raises(ConfigError, match=r"device: 'gpu' does not match"):
        validate_schema({"device": "gpu"})


def test_nested_values_from_the_command_line_are_parsed():
    cfg = validate_schema({"tables": "[demo/demo]", "data": {"datasets": "{digits: {options: {}}}"}})
    assert cfg["tables"] == ["demo/demo"] and cfg["data"]["datasets"] == {"digits": {"options": {}}}
    with pytest.raises(ConfigError, match="tables"):
        validate_schema({"tables": "[demo"})


def test_scale_and_paper_files_are_schema_checked_with_file_and_key(tmp_path):
    scale = tmp_path / "s.yaml"
    scale.write_text("training: {rounds: 2}\nmethods: {fednoro: {warmup_rounds: 1}}\n")
    with pytest.raises(ConfigError) as e:
        build_plan(validate_schema({"tables": ["demo"], "scale": str(scale), "data_grid": []}))
    assert "s.yaml" in str(e.value) and "unknown key 'methods'" in str(e.value) and "valid keys" in str(e.value)
    from fnlcore import schemas

    doc = {"paper": "x", "tables": [{"id": 1, "rows": [{"label": "A", "methd": {}}], "columns": [{"label": "c"}],
                                      "metrics": [{"name": "m", "source": "acc", "summary": {"kind": "best"}}]}]}
    with pytest.raises(ConfigError) as e:
        schemas.check(doc, "paper", "config/papers/x.yaml")
    assert str(e.value).startswith("config/papers/x.yaml: tables[0].rows[0]: unknown key 'methd'; valid keys: average_of, key, label")


def test_paper_dataset_options_reach_the_dataset_and_the_user_wins(monkeypatch):
    from fnlcore.app import plan as planning  # build_plan's own reference to papers.load_paper

    real = planning.load_paper

    def with_options(paper, scale):
        tables = real(paper, scale)
        for t in tables:
            t.dataset_options = {"digits": {"test_size": 0.3, "split_seed": 1}}  # options digits has
        return tables

    monkeypatch.setattr(planning, "load_paper", with_options)
    cfg = {"tables": ["demo"], "data_grid": [], "data": {"datasets": {"digits": {"options": {"split_seed": 2}}}}}
    plan = build_plan(validate_schema(cfg))
    assert dict(plan.datasets["digits"].options) == {"test_size": 0.3, "split_seed": 2}


def test_scale_partition_overrides_and_fixed_client_counts():
    """Smoke scale: Bernoulli-Dirichlet gets p = 1; FedMLP keeps K = C clients and every sample."""
    from fnlcore.app.papers import Scale, load_paper

    smoke = Scale.load("smoke")
    feddiv2 = next(t for t in load_paper("feddiv", smoke) if t.table == "2")
    assert {(tr.run.partition.p, tr.run.partition.num_clients) for tr in feddiv2.runs} == {(1.0, 4)}
    for t in load_paper("fedmlp", smoke):
        ks = {(tr.run.dataset, tr.run.partition.num_clients, tr.run.partition.subsample) for tr in t.runs}
        assert ks <= {("synthetic_ich_fedmlp", 5, None), ("synthetic_chestxray14", 8, None)}, ks
    paper = next(t for t in load_paper("fedmlp", Scale.load("paper")) if t.table == "1")
    assert {(tr.run.partition.num_clients, tr.run.partition.subsample) for tr in paper.runs} == {(5, 5000)}
