"""Typed, validated parameters of every partitioner (one frozen dataclass each).

A spec is what a config entry ``{"name": ..., **params}`` becomes. It checks its
values on construction from the :func:`~fnlcore.spec.param` declarations (ConfigError
naming the key), makes its slug (the partition artifact's folder name) with the one
scheme of :class:`fnlcore.spec.Spec`, and runs the partitioner on a label array with a seed.
A new partitioner is one file in this package with a subclass of :class:`PartitionSpec`
decorated with ``@PARTITIONERS.register``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..assignment import ClientAssignment
from ..registry import Registry
from ..spec import Spec, param
from ._checks import num_samples_of
from .fedcorr import bernoulli_dirichlet, iid_fedcorr, iid_per_class_equal
from .fedmlp import fedmlp_equal
from .fedncl import quantity_skew_lognormal
from .niidbench import IID_REMAINDERS, dirichlet_niidbench, iid_niidbench


#: config name -> partitioner spec class; ``@PARTITIONERS.register`` on a subclass adds it,
#: and every module of fnlcore.partition is imported on first use (a new partitioner is one file).
PARTITIONERS: Registry[type] = Registry("partition", "fnlcore.partition")


@dataclass(frozen=True)
class PartitionSpec(Spec):
    """Base class of the partitioner parameter dataclasses; ``@PARTITIONERS.register`` adds a subclass.

    ClassVars: ``name`` (config name), ``paper`` (where it comes from),
    ``uses_labels`` (needs 1-D class indices; the others also take (n, C)
    multi-label matrices and only use n; :meth:`needs_labels` says it per setting), ``slug_head``/``slug_fields``
    (the slug); a code≠paper switch is declared on its field, ``param(..., switch=...)`` (fnlcore.spec).
    """

    kind: ClassVar[str] = "partition"
    uses_labels: ClassVar[bool] = False
    # False where the client count is part of the setting, not a size (FedMLP: K = C, client k
    # annotates class k in the one-class setting): a scale's num_clients then leaves it alone.
    scales_clients: ClassVar[bool] = True

    @property
    def _where(self) -> str:
        return self.where

    def run(self, labels: np.ndarray, seed: int) -> ClientAssignment:
        """Partition the training split whose labels are ``labels`` (row order) with ``seed``."""
        raise NotImplementedError

    def needs_labels(self) -> bool:
        """These settings read the class indices (1-D labels): ``uses_labels`` unless a switch says otherwise."""
        return self.uses_labels

    def expected_samples(self, n_train: int) -> int:
        """Samples the clients hold in all, for a training split of ``n_train`` (the cost model)."""
        return n_train


def num_clients_param() -> Any:
    """The ``num_clients`` field every partitioner has (required, >= 1)."""
    return param(ge=1, doc="number of clients K")


def num_classes_param() -> Any:
    return param(None, ge=1, doc="number of classes C (default: max(labels) + 1); sets the width of the draws")


@PARTITIONERS.register
@dataclass(frozen=True)
class IIDPartition(PartitionSpec):
    """FedCorr ``iid_sampling``: equal totals, sequential draws from the remaining pool.

    Ignores the labels (only n is used) except with ``balance='per_class'``.
    """

    name: ClassVar[str] = "iid"
    paper: ClassVar[str] = "FedCorr iid_sampling (FedNoRo, FedDiv, FedMLP, Fed-NCL cifar_iid/mnist_iid)"

    slug_fields: ClassVar[tuple] = (
        ("num_clients", "K"), ("client_order", {"draw": "draworder"}), ("balance", {"per_class": "perclass"}),
    )

    num_clients: int = num_clients_param()
    client_order: str = param(
        "set", choices=("set", "draw"),
        doc="order of a client's samples: 'set' (FedCorr/FedNoRo/FedDiv/FedMLP) or 'draw' (Fed-NCL)",
    )
    balance: str = param("total", choices=("total", "per_class"), doc="'total' (code) or 'per_class' (FedDiv paper text)",
                         switch="'total' (code: equal client totals) | 'per_class' (FedDiv paper text: equal count of "
                                "every class)")

    def validate(self) -> None:
        if self.balance == "per_class" and self.client_order != "set":
            raise self.error("client_order", "applies to balance='total' only; leave it at 'set' with balance='per_class'")

    def needs_labels(self) -> bool:
        return self.balance == "per_class"  # equal counts of every class

    def run(self, labels: np.ndarray, seed: int) -> ClientAssignment:
        if self.balance == "per_class":
            return iid_per_class_equal(labels, self.num_clients, seed)
        return iid_fedcorr(num_samples_of(self._where, labels), self.num_clients, seed, self.client_order)


@PARTITIONERS.register
@dataclass(frozen=True)
class BernoulliDirichletPartition(PartitionSpec):
    """FedCorr ``non_iid_dirichlet_sampling``: Bernoulli(p) class presence, Dirichlet(alpha) shares.

    The official callers seed it themselves: FedCorr/FedDiv with the run seed,
    FedNoRo with 100 and Fed-NCL with 42 whatever the run seed; pass those as
    the partition seed to reproduce their partitions.
    """

    name: ClassVar[str] = "bernoulli_dirichlet"
    paper: ClassVar[str] = "FedCorr non_iid_dirichlet_sampling (FedNoRo with seed 100, FedDiv, Fed-NCL non-IID)"
    uses_labels: ClassVar[bool] = True

    slug_head: ClassVar[str] = "bd"
    slug_fields: ClassVar[tuple] = (("p", "p"), ("alpha", "a"), ("num_clients", "K"), ("num_classes", "C"))

    num_clients: int = num_clients_param()
    p: float = param(0.7, gt=0, le=1, doc="probability that a client holds a class, in (0, 1]")
    alpha: float = param(10.0, gt=0, doc="Dirichlet concentration over a class's owners, > 0")
    num_classes: int | None = num_classes_param()

    def run(self, labels: np.ndarray, seed: int) -> ClientAssignment:
        return bernoulli_dirichlet(labels, self.num_clients, self.p, self.alpha, seed, self.num_classes)


@PARTITIONERS.register
@dataclass(frozen=True)
class IIDNiidBenchPartition(PartitionSpec):
    """NIID-Bench / FedLab balanced IID: one permutation cut into equal parts.

    ``remainder`` names what happens to the n mod K left-over samples; the
    default is FedLab's, the code FedGR calls (fedgr.md §2: "K equal parts of floor(n/K)").
    """

    name: ClassVar[str] = "iid_niidbench"
    paper: ClassVar[str] = "NIID-Bench / FedLab balance_partition + homo_partition (FedGR IID)"

    slug_head: ClassVar[str] = "iidperm"
    slug_fields: ClassVar[tuple] = (("num_clients", "K"), ("remainder", {"array_split": "arraysplit"}))

    num_clients: int = num_clients_param()
    remainder: str = param(
        "drop", choices=IID_REMAINDERS,
        doc="n mod K left-over samples: 'drop' (FedLab, FedGR) or 'array_split' (NIID-Bench)",
        switch="'drop' (FedLab balance_split, called by FedGR's code: the n mod K left-over samples belong to no "
               "client) | 'array_split' (NIID-Bench partition_data 'homo': the first n mod K clients get one more)",
    )

    def run(self, labels: np.ndarray, seed: int) -> ClientAssignment:
        return iid_niidbench(num_samples_of(self._where, labels), self.num_clients, seed, self.remainder)


@PARTITIONERS.register
@dataclass(frozen=True)
class DirichletNiidBenchPartition(PartitionSpec):
    """NIID-Bench / FedLab ``hetero_dir_partition`` (Dirichlet over all clients per class)."""

    name: ClassVar[str] = "dirichlet_niidbench"
    paper: ClassVar[str] = "NIID-Bench / FedLab hetero_dir_partition (FedGR Dir(0.3))"
    uses_labels: ClassVar[bool] = True

    slug_head: ClassVar[str] = "dir"
    slug_fields: ClassVar[tuple] = (
        ("alpha", "a"), ("num_clients", "K"), ("min_require_size", "min"), ("num_classes", "C"),
    )

    num_clients: int = num_clients_param()
    alpha: float = param(0.3, gt=0, doc="Dirichlet concentration, > 0")
    min_require_size: int = param(10, ge=0, doc="re-partition until every client has this many samples")
    num_classes: int | None = num_classes_param()
    max_attempts: int = param(1000, ge=1, slug=False, doc="re-partitions tried before failing (not in the slug)")

    def run(self, labels: np.ndarray, seed: int) -> ClientAssignment:
        return dirichlet_niidbench(
            labels, self.num_clients, self.alpha, seed, self.min_require_size, self.num_classes, self.max_attempts
        )


@PARTITIONERS.register
@dataclass(frozen=True)
class QuantitySkewPartition(PartitionSpec):
    """Fed-NCL ``unbalance_iid``: log-normal client sizes, IID samples."""

    name: ClassVar[str] = "quantity_skew"
    paper: ClassVar[str] = "Fed-NCL unbalance_iid (Table II, Table IV S3/S4)"

    slug_head: ClassVar[str] = "qskew"
    slug_fields: ClassVar[tuple] = (("sigma", "s"), ("num_clients", "K"))

    num_clients: int = num_clients_param()
    sigma: float = param(0.3, ge=0, doc="log-normal sigma of the client sizes, >= 0")

    def run(self, labels: np.ndarray, seed: int) -> ClientAssignment:
        return quantity_skew_lognormal(num_samples_of(self._where, labels), self.num_clients, self.sigma, seed)


@PARTITIONERS.register
@dataclass(frozen=True)
class FedMLPEqualPartition(PartitionSpec):
    """FedMLP's split: FedCorr ``iid_sampling`` then ``random.sample`` per client."""

    name: ClassVar[str] = "fedmlp_equal"
    scales_clients: ClassVar[bool] = False  # K = C (fedmlp.md §3)
    paper: ClassVar[str] = "FedMLP (ICH: K=5, subsample 5000; ChestXray14: K=8, no subsample)"

    slug_head: ClassVar[str] = "fedmlp"
    slug_fields: ClassVar[tuple] = (
        ("num_clients", "K"), ("subsample", lambda s: "all" if s.subsample is None else f"sub{s.subsample}"),
    )

    num_clients: int = num_clients_param()
    subsample: int | None = param(5000, ge=1, doc="samples kept per client, null keeps all")

    def run(self, labels: np.ndarray, seed: int) -> ClientAssignment:
        return fedmlp_equal(num_samples_of(self._where, labels), self.num_clients, seed, self.subsample)

    def expected_samples(self, n_train: int) -> int:
        return n_train if self.subsample is None else min(n_train, self.num_clients * self.subsample)


__all__ = [
    "PARTITIONERS",
    "PartitionSpec",
    "IIDPartition",
    "BernoulliDirichletPartition",
    "IIDNiidBenchPartition",
    "DirichletNiidBenchPartition",
    "QuantitySkewPartition",
    "FedMLPEqualPartition",
]
