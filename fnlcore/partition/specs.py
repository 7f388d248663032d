"""Typed, validated parameters of every partitioner (one frozen dataclass each).

A spec is what a config entry ``{"name": ..., **params}`` becomes. It checks its
values on construction (ConfigError naming the key), makes a slug that is a pure
function of its parameters (the partition artifact's folder name) and runs the
partitioner on a label array with a seed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ..assignment import ClientAssignment
from ..errors import ConfigError
from ..registry import Registry
from ..slugs import fmt_float
from ._checks import check_float, check_int, num_samples_of
from .fedcorr import bernoulli_dirichlet, iid_fedcorr, iid_per_class_equal
from .fedmlp import fedmlp_equal
from .fedncl import quantity_skew_lognormal
from .niidbench import IID_REMAINDERS, dirichlet_niidbench, iid_niidbench


#: config name -> partitioner spec class; every subclass with a ``name`` registers itself,
#: and every module of fnlcore.partition is imported on first use (a new partitioner is one file).
PARTITIONERS: Registry[type] = Registry("partition", "fnlcore.partition")


@dataclass(frozen=True)
class PartitionSpec:
    """Base class of the partitioner parameter dataclasses.

    ClassVars: ``name`` (config name), ``paper`` (where it comes from),
    ``uses_labels`` (needs 1-D class indices; the others also take (n, C)
    multi-label matrices and only use n), ``switches`` (code≠paper switches:
    field -> explanation, for the docs).
    """

    name: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    uses_labels: ClassVar[bool] = False
    switches: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kw) -> None:
        super().__init_subclass__(**kw)
        if cls.__dict__.get("name"):
            PARTITIONERS.register(cls)

    def __post_init__(self) -> None:
        self._validate()

    def _validate(self) -> None:
        self._int("num_clients", minimum=1)

    # -- helpers for subclasses --------------------------------------------------

    @property
    def _where(self) -> str:
        return f"partition {self.name!r}"

    def _int(self, key: str, minimum: int | None = None, optional: bool = False) -> None:
        value = getattr(self, key)
        if optional and value is None:
            return
        object.__setattr__(self, key, check_int(self._where, key, value, minimum=minimum))

    def _float(self, key: str, low: float | None, high: float | None = None, low_open: bool = False) -> None:
        value = check_float(self._where, key, getattr(self, key), low, high, low_open=low_open)
        object.__setattr__(self, key, value)

    def _choice(self, key: str, options: tuple[str, ...]) -> None:
        value = getattr(self, key)
        if value not in options:
            raise ConfigError(f"{self._where}: {key}={value!r} must be one of {list(options)}")

    # -- interface ----------------------------------------------------------------

    def params(self) -> dict[str, Any]:
        """Field values as plain Python."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def to_dict(self) -> dict[str, Any]:
        """The config entry that rebuilds this spec: ``{"name": ..., **params}``."""
        return {"name": self.name, **self.params()}

    def slug(self) -> str:
        """Readable, filesystem-safe folder name; a pure function of the parameters."""
        raise NotImplementedError

    def run(self, labels: np.ndarray, seed: int) -> ClientAssignment:
        """Partition the training split whose labels are ``labels`` (row order) with ``seed``."""
        raise NotImplementedError


def _doc(text: str) -> dict[str, str]:
    return {"doc": text}


_K_DOC = _doc("number of clients K")
_C_DOC = _doc("number of classes C (default: max(labels) + 1); sets the width of the draws")


@dataclass(frozen=True)
class IIDPartition(PartitionSpec):
    """FedCorr ``iid_sampling``: equal totals, sequential draws from the remaining pool.

    Ignores the labels (only n is used) except with ``balance='per_class'``.
    """

    name: ClassVar[str] = "iid"
    paper: ClassVar[str] = "FedCorr iid_sampling (FedNoRo, FedDiv, FedMLP, Fed-NCL cifar_iid/mnist_iid)"
    switches: ClassVar[dict[str, str]] = {
        "balance": "'total' (code: equal client totals) | 'per_class' (FedDiv paper text: equal count of every class)",
    }

    num_clients: int = field(metadata=_K_DOC)
    client_order: str = field(
        default="set",
        metadata=_doc("order of a client's samples: 'set' (FedCorr/FedNoRo/FedDiv/FedMLP) or 'draw' (Fed-NCL)"),
    )
    balance: str = field(default="total", metadata=_doc("'total' (code) or 'per_class' (FedDiv paper text)"))

    def _validate(self) -> None:
        super()._validate()
        self._choice("client_order", ("set", "draw"))
        self._choice("balance", ("total", "per_class"))
        if self.balance == "per_class" and self.client_order != "set":
            raise ConfigError(
                f"{self._where}: client_order={self.client_order!r} applies to balance='total' only; "
                "leave it at 'set' with balance='per_class'"
            )

    def slug(self) -> str:
        suffix = ("-draworder" if self.client_order == "draw" else "") + (
            "-perclass" if self.balance == "per_class" else ""
        )
        return f"iid-K{self.num_clients}{suffix}"

    def run(self, labels: np.ndarray, seed: int) -> ClientAssignment:
        if self.balance == "per_class":
            return iid_per_class_equal(labels, self.num_clients, seed)
        return iid_fedcorr(num_samples_of(self._where, labels), self.num_clients, seed, self.client_order)


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

    num_clients: int = field(metadata=_K_DOC)
    p: float = field(default=0.7, metadata=_doc("probability that a client holds a class, in (0, 1]"))
    alpha: float = field(default=10.0, metadata=_doc("Dirichlet concentration over a class's owners, > 0"))
    num_classes: int | None = field(default=None, metadata=_C_DOC)

    def _validate(self) -> None:
        super()._validate()
        self._float("p", 0.0, 1.0, low_open=True)
        self._float("alpha", 0.0, None, low_open=True)
        self._int("num_classes", minimum=1, optional=True)

    def slug(self) -> str:
        base = f"bd-p{fmt_float(self.p)}-a{fmt_float(self.alpha)}-K{self.num_clients}"
        return base + (f"-C{self.num_classes}" if self.num_classes is not None else "")

    def run(self, labels: np.ndarray, seed: int) -> ClientAssignment:
        return bernoulli_dirichlet(labels, self.num_clients, self.p, self.alpha, seed, self.num_classes)


@dataclass(frozen=True)
class IIDNiidBenchPartition(PartitionSpec):
    """NIID-Bench / FedLab balanced IID: one permutation cut into equal parts.

    ``remainder`` names what happens to the n mod K left-over samples; the
    default is FedLab's, the code FedGR calls (fedgr.md §2: "K equal parts of floor(n/K)").
    """

    name: ClassVar[str] = "iid_niidbench"
    paper: ClassVar[str] = "NIID-Bench / FedLab balance_partition + homo_partition (FedGR IID)"
    switches: ClassVar[dict[str, str]] = {
        "remainder": "'drop' (FedLab balance_split, called by FedGR's code: the n mod K left-over samples belong "
        "to no client) | 'array_split' (NIID-Bench partition_data 'homo': the first n mod K clients get one more)",
    }

    num_clients: int = field(metadata=_K_DOC)
    remainder: str = field(
        default="drop",
        metadata=_doc("n mod K left-over samples: 'drop' (FedLab, FedGR) or 'array_split' (NIID-Bench)"),
    )

    def _validate(self) -> None:
        super()._validate()
        self._choice("remainder", IID_REMAINDERS)

    def slug(self) -> str:
        return f"iidperm-K{self.num_clients}" + ("-arraysplit" if self.remainder == "array_split" else "")

    def run(self, labels: np.ndarray, seed: int) -> ClientAssignment:
        return iid_niidbench(num_samples_of(self._where, labels), self.num_clients, seed, self.remainder)


@dataclass(frozen=True)
class DirichletNiidBenchPartition(PartitionSpec):
    """NIID-Bench / FedLab ``hetero_dir_partition`` (Dirichlet over all clients per class)."""

    name: ClassVar[str] = "dirichlet_niidbench"
    paper: ClassVar[str] = "NIID-Bench / FedLab hetero_dir_partition (FedGR Dir(0.3))"
    uses_labels: ClassVar[bool] = True

    num_clients: int = field(metadata=_K_DOC)
    alpha: float = field(default=0.3, metadata=_doc("Dirichlet concentration, > 0"))
    min_require_size: int = field(default=10, metadata=_doc("re-partition until every client has this many samples"))
    num_classes: int | None = field(default=None, metadata=_C_DOC)
    max_attempts: int = field(default=1000, metadata=_doc("re-partitions tried before failing (not in the slug)"))

    def _validate(self) -> None:
        super()._validate()
        self._float("alpha", 0.0, None, low_open=True)
        self._int("min_require_size", minimum=0)
        self._int("num_classes", minimum=1, optional=True)
        self._int("max_attempts", minimum=1)

    def slug(self) -> str:
        base = f"dir-a{fmt_float(self.alpha)}-K{self.num_clients}-min{self.min_require_size}"
        return base + (f"-C{self.num_classes}" if self.num_classes is not None else "")

    def run(self, labels: np.ndarray, seed: int) -> ClientAssignment:
        return dirichlet_niidbench(
            labels, self.num_clients, self.alpha, seed, self.min_require_size, self.num_classes, self.max_attempts
        )


@dataclass(frozen=True)
class QuantitySkewPartition(PartitionSpec):
    """Fed-NCL ``unbalance_iid``: log-normal client sizes, IID samples."""

    name: ClassVar[str] = "quantity_skew"
    paper: ClassVar[str] = "Fed-NCL unbalance_iid (Table II, Table IV S3/S4)"

    num_clients: int = field(metadata=_K_DOC)
    sigma: float = field(default=0.3, metadata=_doc("log-normal sigma of the client sizes, >= 0"))

    def _validate(self) -> None:
        super()._validate()
        self._float("sigma", 0.0, None)

    def slug(self) -> str:
        return f"qskew-s{fmt_float(self.sigma)}-K{self.num_clients}"

    def run(self, labels: np.ndarray, seed: int) -> ClientAssignment:
        return quantity_skew_lognormal(num_samples_of(self._where, labels), self.num_clients, self.sigma, seed)


@dataclass(frozen=True)
class FedMLPEqualPartition(PartitionSpec):
    """FedMLP's split: FedCorr ``iid_sampling`` then ``random.sample`` per client."""

    name: ClassVar[str] = "fedmlp_equal"
    paper: ClassVar[str] = "FedMLP (ICH: K=5, subsample 5000; ChestXray14: K=8, no subsample)"

    num_clients: int = field(metadata=_K_DOC)
    subsample: int | None = field(default=5000, metadata=_doc("samples kept per client, null keeps all"))

    def _validate(self) -> None:
        super()._validate()
        self._int("subsample", minimum=1, optional=True)

    def slug(self) -> str:
        return f"fedmlp-K{self.num_clients}-" + ("all" if self.subsample is None else f"sub{self.subsample}")

    def run(self, labels: np.ndarray, seed: int) -> ClientAssignment:
        return fedmlp_equal(num_samples_of(self._where, labels), self.num_clients, seed, self.subsample)


__all__ = [
    "PartitionSpec",
    "IIDPartition",
    "BernoulliDirichletPartition",
    "IIDNiidBenchPartition",
    "DirichletNiidBenchPartition",
    "QuantitySkewPartition",
    "FedMLPEqualPartition",
]
