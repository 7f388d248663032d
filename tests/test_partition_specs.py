"""Partition specs and registry: config dicts -> validated specs, slugs, run, docs table."""

from __future__ import annotations

import re

import numpy as np
import pytest

from fnlcore.errors import ConfigError
from fnlcore.partition import (
    PARTITIONERS,
    BernoulliDirichletPartition,
    DirichletNiidBenchPartition,
    FedMLPEqualPartition,
    IIDNiidBenchPartition,
    IIDPartition,
    PartitionSpec,
    QuantitySkewPartition,
    bernoulli_dirichlet,
    describe_partitioners,
    dirichlet_niidbench,
    fedmlp_equal,
    iid_fedcorr,
    iid_niidbench,
    partition_spec_from_dict,
    partitioners_markdown,
    quantity_skew_lognormal,
)

from .pins import load_pins, missing_message

SAFE = re.compile(r"^[A-Za-z0-9_.-]+$")

EXAMPLES = [
    ({"name": "iid", "num_clients": 100}, "iid-K100"),
    ({"name": "iid", "num_clients": 20, "client_order": "draw"}, "iid-K20-draworder"),
    ({"name": "iid", "num_clients": 100, "balance": "per_class"}, "iid-K100-perclass"),
    ({"name": "bernoulli_dirichlet", "num_clients": 20, "p": 0.9, "alpha": 2.0}, "bd-p0.9-a2.0-K20"),
    ({"name": "bernoulli_dirichlet", "num_clients": 500}, "bd-p0.7-a10.0-K500"),
    ({"name": "bernoulli_dirichlet", "num_clients": 20, "p": 1, "alpha": 2, "num_classes": 14}, "bd-p1.0-a2.0-K20-C14"),
    ({"name": "iid_niidbench", "num_clients": 100}, "iidperm-K100"),
    ({"name": "dirichlet_niidbench", "num_clients": 100, "alpha": 0.3}, "dir-a0.3-K100-min10"),
    ({"name": "dirichlet_niidbench", "num_clients": 100, "max_attempts": 5}, "dir-a0.3-K100-min10"),
    ({"name": "quantity_skew", "num_clients": 20, "sigma": 0.3}, "qskew-s0.3-K20"),
    ({"name": "fedmlp_equal", "num_clients": 5}, "fedmlp-K5-sub5000"),
    ({"name": "fedmlp_equal", "num_clients": 8, "subsample": None}, "fedmlp-K8-all"),
]


def test_registry_has_the_recorded_names():
    recorded = set(load_pins()["registries"]["partition"])
    assert set(PARTITIONERS.builtin()) == recorded, missing_message(
        "partition", set(PARTITIONERS.builtin()) ^ recorded, "differ from the recorded list"
    )
    for name, cls in PARTITIONERS.items():
        assert issubclass(cls, PartitionSpec) and cls.name == name and cls.paper


@pytest.mark.parametrize("entry, slug", EXAMPLES)
def test_slugs_are_readable_and_safe(entry, slug):
    spec = partition_spec_from_dict(entry)
    assert spec.slug() == slug
    assert SAFE.match(spec.slug())
    assert partition_spec_from_dict(spec.to_dict()) == spec  # round trip


def test_slug_formats_floats_canonically():
    a = BernoulliDirichletPartition(num_clients=20, p=0.90, alpha=2)
    b = BernoulliDirichletPartition(num_clients=20, p=0.9, alpha=2.0)
    assert a.slug() == b.slug() == "bd-p0.9-a2.0-K20"
    assert a == b
    assert QuantitySkewPartition(num_clients=20, sigma=1e-4).slug() == "qskew-s0.0001-K20"


def test_different_parameters_give_different_slugs():
    slugs = [partition_spec_from_dict(e).slug() for e, _ in EXAMPLES if "max_attempts" not in e]
    assert len(slugs) == len(set(slugs))


def test_specs_run_the_functions():
    rs = np.random.RandomState(0)
    y = rs.randint(0, 4, 600)
    seed = 17
    pairs = [
        (IIDPartition(num_clients=6), iid_fedcorr(600, 6, seed)),
        (IIDPartition(num_clients=6, client_order="draw"), iid_fedcorr(600, 6, seed, "draw")),
        (BernoulliDirichletPartition(num_clients=6, p=0.8, alpha=1.0), bernoulli_dirichlet(y, 6, 0.8, 1.0, seed)),
        (IIDNiidBenchPartition(num_clients=6), iid_niidbench(600, 6, seed)),
        (DirichletNiidBenchPartition(num_clients=6, alpha=0.5), dirichlet_niidbench(y, 6, 0.5, seed)),
        (QuantitySkewPartition(num_clients=6, sigma=0.5), quantity_skew_lognormal(600, 6, 0.5, seed)),
        (FedMLPEqualPartition(num_clients=6, subsample=50), fedmlp_equal(600, 6, seed, 50)),
    ]
    for spec, expected in pairs:
        assert spec.run(y, seed).equals(expected), spec


def test_label_free_specs_accept_multilabel_matrices():
    multi = (np.random.RandomState(1).rand(300, 5) < 0.3).astype(np.int64)
    for spec in (
        IIDPartition(num_clients=3),
        IIDNiidBenchPartition(num_clients=3),
        QuantitySkewPartition(num_clients=3),
        FedMLPEqualPartition(num_clients=3, subsample=10),
    ):
        a = spec.run(multi, 0)
        assert a.num_samples == 300 and a.num_clients == 3
    with pytest.raises(ConfigError, match="labels must be a 1-D vector"):
        BernoulliDirichletPartition(num_clients=3).run(multi, 0)
    with pytest.raises(ConfigError, match="labels must be a 1-D vector"):
        DirichletNiidBenchPartition(num_clients=3).run(multi, 0)


def test_per_class_iid_spec_uses_labels():
    y = np.repeat([0, 1], [8, 4])
    a = IIDPartition(num_clients=4, balance="per_class").run(y, 0)
    assert a.class_counts(y, 2).tolist() == [[2, 1]] * 4


@pytest.mark.parametrize(
    "entry, needle",
    [
        ({"num_clients": 3}, "needs a 'name' key; valid names: ['bernoulli_dirichlet'"),
        ({"name": "dirichlet", "num_clients": 3}, "unknown partition name 'dirichlet'; valid names: ["),
        ({"name": "iid", "num_clients": 3, "alpha": 1.0}, "partition 'iid': unknown key(s) ['alpha']; valid keys: "
                                                           "['num_clients', 'client_order', 'balance']"),
        ({"name": "iid"}, "partition 'iid': missing required key(s) ['num_clients']"),
        ({"name": "bernoulli_dirichlet", "num_clients": 20, "p": 1.5}, "partition 'bernoulli_dirichlet': p=1.5 must be in (0, 1]"),
        ({"name": "bernoulli_dirichlet", "num_clients": 20, "p": "high"}, "p='high' must be a number"),
        ({"name": "bernoulli_dirichlet", "num_clients": 20, "alpha": -2}, "partition 'bernoulli_dirichlet': alpha=-2 must be > 0"),
        ({"name": "bernoulli_dirichlet", "num_clients": 20, "num_classes": 0}, "num_classes=0 must be >= 1"),
        ({"name": "iid", "num_clients": 2.5}, "partition 'iid': num_clients=2.5 must be an integer"),
        ({"name": "iid", "num_clients": True}, "num_clients=True must be an integer"),
        ({"name": "iid", "num_clients": 0}, "num_clients=0 must be >= 1"),
        ({"name": "iid", "num_clients": 5, "client_order": "random"}, "client_order='random' must be one of"),
        ({"name": "iid", "num_clients": 5, "balance": "per_class", "client_order": "draw"}, "applies to balance='total'"),
        ({"name": "dirichlet_niidbench", "num_clients": 5, "min_require_size": -1}, "min_require_size=-1 must be >= 0"),
        ({"name": "dirichlet_niidbench", "num_clients": 5, "max_attempts": 0}, "max_attempts=0 must be >= 1"),
        ({"name": "quantity_skew", "num_clients": 5, "sigma": -1.0}, "sigma=-1.0 must be >= 0"),
        ({"name": "fedmlp_equal", "num_clients": 5, "subsample": 0}, "subsample=0 must be >= 1"),
        ("iid", "must be a mapping"),
    ],
)
def test_bad_config_entries_name_the_key(entry, needle):
    with pytest.raises(ConfigError) as info:
        partition_spec_from_dict(entry)
    assert needle in str(info.value)


def test_run_checks_data_dependent_limits():
    with pytest.raises(ConfigError, match="num_clients=50 is more than the 10 samples"):
        IIDPartition(num_clients=50).run(np.zeros(10, dtype=int), 0)


def test_docs_table_lists_every_partitioner():
    table = partitioners_markdown()
    for name, cls in PARTITIONERS.builtin().items():
        assert f"`{name}`" in table and cls.paper in table
    assert "`p=0.7`" in table and "`num_clients` (required)" in table
    records = describe_partitioners()
    assert [r["name"] for r in records] == list(PARTITIONERS)
    bd = next(r for r in records if r["name"] == "bernoulli_dirichlet")
    assert [p["name"] for p in bd["params"]] == ["num_clients", "p", "alpha", "num_classes"]
    assert all(p["doc"] for r in records for p in r["params"])
