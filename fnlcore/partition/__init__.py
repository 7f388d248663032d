"""Partitioners: which client holds which training sample, in which order.

Public API
----------
Functions (each returns a :class:`fnlcore.assignment.ClientAssignment`):
    iid_fedcorr(num_samples, num_clients, seed, client_order="set")
    bernoulli_dirichlet(labels, num_clients, p, alpha, seed, num_classes=None)
    iid_niidbench(num_samples, num_clients, seed, remainder="drop")
    dirichlet_niidbench(labels, num_clients, alpha, seed, min_require_size=10, num_classes=None, max_attempts=1000)
    quantity_skew_lognormal(num_samples, num_clients, sigma, seed)
    fedmlp_equal(num_samples, num_clients, seed, subsample=5000)
    iid_per_class_equal(labels, num_clients, seed)       (FedDiv paper-text IID)
Specs and registry (what a config entry ``{"name": ..., **params}`` becomes):
    PartitionSpec, IIDPartition, BernoulliDirichletPartition, IIDNiidBenchPartition,
    DirichletNiidBenchPartition, QuantitySkewPartition, FedMLPEqualPartition,
    PARTITIONERS, partition_spec_from_dict, describe_partitioners, partitioners_markdown
Artifacts: write_partition_artifacts, read_partition, partition_figure (module ``artifacts``).

Seed convention (fnlcore.rng): called with seed s, a partitioner returns what
the official function returns right after ``np.random.seed(s)`` (and
``random.seed(s)`` for FedMLP's subsample), client order included, from
private RNG objects.
"""

from .artifacts import class_count_frame, partition_figure, read_partition, write_partition_artifacts
from .fedcorr import bernoulli_dirichlet, iid_fedcorr, iid_per_class_equal
from .fedmlp import fedmlp_equal
from .fedncl import lognormal_sizes, quantity_skew_lognormal
from .niidbench import dirichlet_niidbench, iid_niidbench
from .registry import PARTITIONERS, describe_partitioners, partition_spec_from_dict, partitioners_markdown
from .specs import (
    BernoulliDirichletPartition,
    DirichletNiidBenchPartition,
    FedMLPEqualPartition,
    IIDNiidBenchPartition,
    IIDPartition,
    PartitionSpec,
    QuantitySkewPartition,
)

__all__ = [
    "PARTITIONERS",
    "BernoulliDirichletPartition",
    "DirichletNiidBenchPartition",
    "FedMLPEqualPartition",
    "IIDNiidBenchPartition",
    "IIDPartition",
    "PartitionSpec",
    "QuantitySkewPartition",
    "bernoulli_dirichlet",
    "class_count_frame",
    "describe_partitioners",
    "dirichlet_niidbench",
    "fedmlp_equal",
    "iid_fedcorr",
    "iid_niidbench",
    "iid_per_class_equal",
    "lognormal_sizes",
    "partition_figure",
    "partition_spec_from_dict",
    "partitioners_markdown",
    "quantity_skew_lognormal",
    "read_partition",
    "write_partition_artifacts",
]
