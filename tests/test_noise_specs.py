"""Noise specs: registry, config dicts, slugs, validation errors, markdown table."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fnlcore.assignment import ClientAssignment
from fnlcore.errors import ConfigError, DataError
from fnlcore.noise import NOISE_MODELS, FedNoRoHIDN, noise_models_markdown, noise_spec_from_dict

from .pins import load_pins, missing_message

SLUGS = [
    ({"name": "clean"}, "clean"),
    ({"name": "fedcorr", "rho": 0.4, "tau": 0.5}, "fedcorr-rho0.4-tau0.5"),
    ({"name": "fedcorr", "rho": 1, "tau": 0, "label_space": "all"}, "fedcorr-rho1.0-tau0.0-all"),
    ({"name": "fednoro_hidn", "rho": 0.4, "eta_l": 0.3, "eta_u": 0.5}, "hidn-rho0.4-eta0.3-0.5"),
    ({"name": "fedncl_bernoulli", "p": 0.7}, "nclbern-p0.7"),
    ({"name": "fedncl_bernoulli", "p": 0.7, "include_true": False}, "nclbern-p0.7-excl"),
    ({"name": "fedncl_bernoulli", "p": 0.7, "stream": "numpy"}, "nclbern-p0.7-npstream"),
    ({"name": "fedncl_gaussian", "mu": 0.4, "sigma": 0.45}, "nclgauss-mu0.4-sd0.45"),
    ({"name": "fedncl_gaussian", "mu": 0.4, "sigma": 0.45, "truncation": "truncnorm"}, "nclgauss-mu0.4-sd0.45-truncnorm"),
    ({"name": "fedgr", "noise_type": "sym", "phi": 0.6, "rho_min": 0.5, "rho_max": 1}, "fedgr-sym-phi0.6-r0.5-1.0"),
    (
        {"name": "fedgr", "noise_type": "asym", "phi": 1, "rho_min": 0.2, "rho_max": 0.4, "asym_map": "cyclic"},
        "fedgr-asym-phi1.0-r0.2-0.4-cyclic",
    ),
    ({"name": "fedgr", "noise_type": "mixed", "phi": 1, "rho_min": 0.2, "rho_max": 0.4}, "fedgr-mixed-phi1.0-r0.2-0.4-auto"),
    ({"name": "symmetric", "rate": 0.4}, "sym-r0.4"),
    ({"name": "symmetric", "rate": 0.4, "include_true": True}, "sym-r0.4-incl"),
    ({"name": "asymmetric", "rate": 0.4}, "asym-r0.4-classic"),
    ({"name": "asymmetric", "rate": 0.4, "asym_map": "classic"}, "asym-r0.4-classic"),
    ({"name": "fedmlp_partial", "missing": 3}, "mlp-miss3"),
    ({"name": "fedmlp_partial", "missing": 3, "class_seed": 7}, "mlp-miss3-cs7"),
]


@pytest.mark.parametrize("d,slug", SLUGS)
def test_slugs(d, slug):
    spec = noise_spec_from_dict(d)
    assert spec.slug() == slug
    assert noise_spec_from_dict(spec.to_dict()) == spec  # round trip
    assert noise_spec_from_dict(spec.to_dict()).slug() == slug


def test_slugs_are_distinct_for_distinct_settings():
    specs = [noise_spec_from_dict(d) for d, _ in SLUGS]
    specs += [
        noise_spec_from_dict({"name": "asymmetric", "rate": 0.4, "asym_map": [1, 0, 2]}),
        noise_spec_from_dict({"name": "asymmetric", "rate": 0.4, "asym_map": [2, 0, 1]}),
        noise_spec_from_dict({"name": "fedgr", "noise_type": "sym", "phi": 0.6, "rho_min": 0.5, "rho_max": 1,
                              "asym_map": "cyclic"}),
        FedNoRoHIDN(0.4, 0.3, 0.5, annotator_epochs=10),
        FedNoRoHIDN(0.4, 0.3, 0.5, soft_labels="official_csv"),
        FedNoRoHIDN(0.4, 0.3, 0.5, annotator_weight_decay=0.0),
    ]
    by_slug = {}
    for s in specs:
        assert by_slug.setdefault(s.slug(), s) == s, s.slug()
    for s in specs:
        assert all(ch.isalnum() or ch in "-._" for ch in s.slug())


def test_hidn_annotator_slug_and_hash():
    base = FedNoRoHIDN(0.4, 0.3, 0.5)
    assert base.annotator_slug() == "ann-auto-e5-lr0.0003-bs16-s0"
    other = FedNoRoHIDN(0.6, 0.5, 0.7)
    assert other.annotator_slug() == base.annotator_slug()  # shared across rho / eta
    e10 = FedNoRoHIDN(0.4, 0.3, 0.5, annotator_epochs=10, annotator_model="resnet18")
    assert e10.annotator_slug() == "ann-resnet18-e10-lr0.0003-bs16-s0"
    assert e10.slug().startswith("hidn-rho0.4-eta0.3-0.5-h") and len(e10.slug().split("-h")[-1]) == 6
    assert FedNoRoHIDN(0.4, 0.3, 0.5, annotator_weight_decay=1e-3).annotator_slug().endswith("-wd0.001")
    assert FedNoRoHIDN.needs_soft_labels and not NOISE_MODELS["fedcorr"].needs_soft_labels


@pytest.mark.parametrize(
    "d,key",
    [
        ({"name": "fedcorr", "rho": 1.5, "tau": 0.5}, "rho"),
        ({"name": "fedcorr", "rho": 0.5, "tau": -0.1}, "tau"),
        ({"name": "fedcorr", "rho": "high", "tau": 0.5}, "rho"),
        ({"name": "fedcorr", "rho": 0.5, "tau": 0.5, "label_space": "ten"}, "label_space"),
        ({"name": "fednoro_hidn", "rho": 0.4, "eta_l": 0.7, "eta_u": 0.5}, "eta_l"),
        ({"name": "fednoro_hidn", "rho": 0.4, "eta_l": 0.3, "eta_u": 1.5}, "eta_u"),
        ({"name": "fednoro_hidn", "rho": 0.4, "eta_l": 0.3, "eta_u": 0.5, "annotator_epochs": 0}, "annotator_epochs"),
        ({"name": "fednoro_hidn", "rho": 0.4, "eta_l": 0.3, "eta_u": 0.5, "annotator_model": "a/b"}, "annotator_model"),
        ({"name": "fednoro_hidn", "rho": 0.4, "eta_l": 0.3, "eta_u": 0.5, "soft_labels": "csv"}, "soft_labels"),
        ({"name": "fedncl_bernoulli", "p": -0.2}, "p"),
        ({"name": "fedncl_bernoulli", "p": 0.5, "include_true": "yes"}, "include_true"),
        ({"name": "fedncl_gaussian", "mu": 0.4, "sigma": -1}, "sigma"),
        ({"name": "fedncl_gaussian", "mu": 0.4, "sigma": 0.4, "truncation": "cut"}, "truncation"),
        ({"name": "fedgr", "noise_type": "pair", "phi": 0.5, "rho_min": 0.1, "rho_max": 0.2}, "noise_type"),
        ({"name": "fedgr", "noise_type": "sym", "phi": 0.5, "rho_min": 0.3, "rho_max": 0.2}, "rho_min"),
        ({"name": "fedgr", "noise_type": "asym", "phi": 0.5, "rho_min": 0.1, "rho_max": 0.2, "asym_map": "x"}, "asym_map"),
        ({"name": "symmetric", "rate": float("nan")}, "rate"),
        ({"name": "asymmetric", "rate": 0.2, "asym_map": [0, -1]}, "asym_map"),
        ({"name": "fedmlp_partial", "missing": 0}, "missing"),
        ({"name": "fedmlp_partial", "missing": 2.0}, "missing"),
    ],
)
def test_bad_values_name_the_key(d, key):
    with pytest.raises(ConfigError) as e:
        noise_spec_from_dict(d)
    assert key in str(e.value)


@pytest.mark.parametrize(
    "d,c,k,key",
    [
        ({"name": "asymmetric", "rate": 0.2, "asym_map": [1, 0]}, 3, None, "asym_map"),
        ({"name": "asymmetric", "rate": 0.2}, 100, None, "asym_map"),
        ({"name": "fedmlp_partial", "missing": 5}, 5, None, "missing"),
        ({"name": "fedmlp_partial", "missing": 4}, 5, 6, "missing"),
        ({"name": "fedcorr", "rho": 0.2, "tau": 0.2}, 5, None, "label_space"),
        (
            {"name": "fedgr", "noise_type": "asym", "phi": 1, "rho_min": 0.1, "rho_max": 0.2, "asym_map": "group"},
            12,
            10,
            "next_in_group",
        ),
    ],
)
def test_dataset_dependent_checks(d, c, k, key):
    noise_spec_from_dict(d)  # fine without the dataset
    with pytest.raises(ConfigError, match=key):
        noise_spec_from_dict(d, num_classes=c, num_clients=k)


def test_unknown_name_and_keys_list_the_valid_ones():
    with pytest.raises(ConfigError, match="valid names:.*fedcorr"):
        noise_spec_from_dict({"name": "fedcor"})
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['rh'\]; valid keys: \['rho', 'tau', 'label_space'\]"):
        noise_spec_from_dict({"name": "fedcorr", "rh": 0.4, "tau": 0.5})
    with pytest.raises(ConfigError, match=r"missing required key\(s\) \['tau'\]"):
        noise_spec_from_dict({"name": "fedcorr", "rho": 0.4})
    with pytest.raises(ConfigError, match="'name'"):
        noise_spec_from_dict({"rho": 0.4})


def test_registry_is_complete_and_typed():
    recorded = set(load_pins()["registries"]["noise"])
    assert set(NOISE_MODELS.builtin()) == recorded, missing_message(
        "noise", set(NOISE_MODELS.builtin()) ^ recorded, "differ from the recorded list"
    )
    for name, cls in NOISE_MODELS.items():
        assert cls.name == name and cls.paper
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
    assert NOISE_MODELS["fedmlp_partial"].multi_label and not NOISE_MODELS["fedcorr"].multi_label


def test_markdown_table_lists_every_model_and_switch():
    md = noise_models_markdown()
    rows = [line for line in md.splitlines() if line.startswith("| `")]
    assert len(rows) == len(NOISE_MODELS.builtin())
    assert all(line.count(" | ") == 3 for line in rows)  # escaped pipes keep 4 cells
    assert "`label_space='first10'`" in md and "`truncation`" in md and "`rho` (required)" in md


def test_noisy_clients_agrees_with_run_for_every_model():
    rs = np.random.RandomState(0)
    n, k, c = 2000, 25, 10
    y = rs.randint(0, c, n).astype(np.int64)
    perm = rs.permutation(n)
    a = ClientAssignment.from_lists(n, [perm[i::k] for i in range(k)])
    soft = rs.dirichlet(np.ones(c), size=n)
    for d, _ in SLUGS:
        spec = noise_spec_from_dict(d)
        if spec.multi_label:
            continue
        for seed in (0, 42):
            res = spec.run(y, a, c, seed, soft if spec.needs_soft_labels else None)
            assert spec.noisy_clients(k, seed) == res.noisy_clients(), spec.slug()
            res2 = spec.run(y, a, c, seed, soft if spec.needs_soft_labels else None)
            np.testing.assert_array_equal(res.given, res2.given)  # deterministic


def test_run_input_errors():
    a = ClientAssignment.from_lists(4, [range(4)])
    spec = noise_spec_from_dict({"name": "symmetric", "rate": 0.5})
    with pytest.raises(DataError, match="labels must lie"):
        spec.run(np.array([0, 1, 2, 7]), a, 3, 0)
    with pytest.raises(DataError, match="assignment covers 4 samples but labels has 3"):
        spec.run(np.array([0, 1, 2]), a, 3, 0)
    with pytest.raises(DataError, match="integer dtype"):
        spec.run(np.array([0.0, 1.0, 2.0, 0.0]), a, 3, 0)
    with pytest.raises(DataError, match="soft_labels"):
        spec.run(np.array([0, 1, 2, 0]), a, 3, 0, soft_labels=np.ones((4, 3)))
    with pytest.raises(ConfigError, match="seed"):
        spec.run(np.array([0, 1, 2, 0]), a, 3, -1)
