"""Typed, validated parameters of every noise model (one frozen dataclass each).

A spec is what a config entry ``{"name": ..., **params}`` becomes. It checks
its values on construction (ConfigError naming the key), makes a slug that is a
pure function of its parameters, runs the model, and (where cheap) tells which
clients will be noisy without touching any labels.

Slugs: readable primary parameters with canonical float formatting, readable
suffixes for code≠paper switches, and ``-h<6 hex>`` (a hash of the remaining
non-default fields) so that different settings never share a slug.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..assignment import ClientAssignment
from ..errors import ConfigError, DataError
from ..registry import Registry
from ..rng import legacy_rng
from . import generators, schedules
from .checks import check_num_classes
from .hidn import fednoro_noisy_clients, hidn_noise
from .maps import canonical_map, map_slug, resolve_map
from .partial import FEDMLP_CLASS_SEED, fedmlp_active_classes, fedmlp_partial_noise
from .result import NoiseResult
from ..slugs import fmt_float, short_hash

_SAFE_TOKEN = re.compile(r"^[A-Za-z0-9_.]+$")


#: config name -> noise-model spec class; every subclass with a ``name`` registers itself,
#: and every module of fnlcore.noise is imported on first use (a new noise model is one file).
NOISE_MODELS: Registry[type] = Registry("noise model", "fnlcore.noise")


@dataclass(frozen=True)
class NoiseSpec:
    """Base class of the noise-model parameter dataclasses.

    ClassVars: ``name`` (config name), ``paper``, ``needs_soft_labels`` (H-IDN),
    ``multi_label`` (works on (n, C) 0/1 labels), ``switches`` (code≠paper
    switches: field -> explanation, for the README table).
    """

    name: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    needs_soft_labels: ClassVar[bool] = False
    multi_label: ClassVar[bool] = False
    switches: ClassVar[dict[str, str]] = {}
    # Fields shown readably in the slug; every other non-default field goes into the hash.
    _slug_fields: ClassVar[tuple[str, ...]] = ()

    # -- validation helpers (run from __post_init__) --------------------------

    def __init_subclass__(cls, **kw) -> None:
        super().__init_subclass__(**kw)
        if cls.__dict__.get("name"):
            NOISE_MODELS.register(cls)

    def _err(self, key: str, problem: str) -> ConfigError:
        return ConfigError(f"noise model {self.name!r}: {key} {problem}")

    def _number(self, key: str, lo: float | None = None, hi: float | None = None, what: str = "") -> float:
        v = getattr(self, key)
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise self._err(key, f"must be a number, got {v!r}")
        v = float(v)
        if not math.isfinite(v):
            raise self._err(key, f"must be finite, got {v}")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            rng = f"[{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"
            raise self._err(key, f"= {v} is outside {rng}{'; ' + what if what else ''}")
        object.__setattr__(self, key, v)
        return v

    def _integer(self, key: str, lo: int | None = None, what: str = "") -> int:
        v = getattr(self, key)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise self._err(key, f"must be an integer, got {v!r}")
        if lo is not None and v < lo:
            raise self._err(key, f"= {v} must be >= {lo}{'; ' + what if what else ''}")
        object.__setattr__(self, key, int(v))
        return int(v)

    def _choice(self, key: str, options: tuple[str, ...]) -> str:
        v = getattr(self, key)
        if v not in options:
            raise self._err(key, f"= {v!r} is not one of {list(options)}")
        return v

    def _flag(self, key: str) -> bool:
        v = getattr(self, key)
        if not isinstance(v, (bool, np.bool_)):
            raise self._err(key, f"must be true or false, got {v!r}")
        object.__setattr__(self, key, bool(v))
        return bool(v)

    # -- interface --------------------------------------------------------------

    def params(self) -> dict[str, Any]:
        """Field values as plain JSON-able Python (tuples become lists)."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = list(v) if isinstance(v, tuple) else v
        return out

    def to_dict(self) -> dict[str, Any]:
        """The config entry that rebuilds this spec: ``{"name": ..., **params}``."""
        return {"name": self.name, **self.params()}

    def _hash_suffix(self, also_shown: tuple[str, ...] = ()) -> str:
        """``-h<hash>`` of the non-default fields not shown readably, or ''."""
        extra = {}
        for f in dataclasses.fields(self):
            if f.name in self._slug_fields or f.name in also_shown or f.default is dataclasses.MISSING:
                continue
            v = getattr(self, f.name)
            if v != f.default:
                extra[f.name] = list(v) if isinstance(v, tuple) else v
        return "-" + short_hash(extra) if extra else ""

    def slug(self) -> str:
        """Readable, filesystem-safe, a pure function of the parameters."""
        raise NotImplementedError

    def check_dataset(self, num_classes: int, num_clients: int | None = None) -> None:
        """Raise ConfigError if these settings cannot run on C classes / K clients."""
        check_num_classes(num_classes)

    def run(
        self,
        labels: np.ndarray,
        assignment: ClientAssignment,
        num_classes: int,
        seed: int,
        soft_labels: np.ndarray | None = None,
    ) -> NoiseResult:
        """Apply the model; ``seed`` is the noise seed (see fnlcore.rng for the convention)."""
        raise NotImplementedError

    def noisy_clients(self, num_clients: int, seed: int) -> list[int] | None:
        """Ascending ids of the nominally noisy clients, without labels; None where not cheap."""
        return None


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"noise seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def _no_soft(spec: NoiseSpec, soft_labels: Any) -> None:
    if soft_labels is not None:
        raise DataError(f"noise model {spec.name!r} does not use soft_labels; pass soft_labels=None")


# -----------------------------------------------------------------------------


@dataclass(frozen=True)
class CleanNoise(NoiseSpec):
    """No noise: the given labels are the true labels (single- or multi-label)."""

    name: ClassVar[str] = "clean"
    paper: ClassVar[str] = "all (rho = 0 baselines)"

    def slug(self) -> str:
        return "clean"

    def run(self, labels, assignment, num_classes, seed, soft_labels=None) -> NoiseResult:
        _check_seed(seed)
        _no_soft(self, soft_labels)
        return generators.clean_noise(labels, assignment, num_classes)

    def noisy_clients(self, num_clients: int, seed: int) -> list[int]:
        return []


@dataclass(frozen=True)
class FedCorrNoise(NoiseSpec):
    """FedCorr / FedDiv: each client noisy with prob. rho, level ~ U(tau, 1), per-sample Bernoulli flips.

    rho: probability that a client is noisy (number of noisy clients is random).
    tau: lower bound of the per-client noise level.
    label_space: 'first10' (code; new labels 0..9 on every dataset) | 'all' (paper; 0..C-1).
    """

    name: ClassVar[str] = "fedcorr"
    paper: ClassVar[str] = "FedCorr (CVPR'22) util.add_noise; FedDiv (AAAI'24) Eq. 16"
    switches: ClassVar[dict[str, str]] = {
        "label_space": "'first10' (code: new label randint(0, 10) on every dataset, the CIFAR-100 bug) "
        "| 'all' (paper text: uniform over all C classes)"
    }
    _slug_fields: ClassVar[tuple[str, ...]] = ("rho", "tau", "label_space")

    rho: float
    tau: float
    label_space: str = "first10"

    def __post_init__(self) -> None:
        self._number("rho", 0.0, 1.0, "it is the probability that a client is noisy")
        self._number("tau", 0.0, 1.0, "it is the lower bound of the per-client noise level")
        self._choice("label_space", ("first10", "all"))

    def slug(self) -> str:
        s = f"fedcorr-rho{fmt_float(self.rho)}-tau{fmt_float(self.tau)}"
        return s + ("-all" if self.label_space == "all" else "") + self._hash_suffix()

    def check_dataset(self, num_classes: int, num_clients: int | None = None) -> None:
        generators.label_space_size(self.label_space, check_num_classes(num_classes))

    def run(self, labels, assignment, num_classes, seed, soft_labels=None) -> NoiseResult:
        _no_soft(self, soft_labels)
        self.check_dataset(num_classes)
        return generators.fedcorr_noise(
            labels, assignment, self.rho, self.tau, _check_seed(seed), num_classes, self.label_space
        )

    def noisy_clients(self, num_clients: int, seed: int) -> list[int]:
        level = schedules.fedcorr_levels(legacy_rng(_check_seed(seed)), num_clients, self.rho, self.tau)
        return [int(k) for k in np.flatnonzero(level > 0)]


@dataclass(frozen=True)
class FedNoRoHIDN(NoiseSpec):
    """FedNoRo H-IDN: exactly int(rho*K) noisy clients, eta_k ~ U(eta_l, eta_u), instance-dependent flips.

    rho: fraction of noisy clients; eta_l, eta_u: bounds of the per-client noise rate.
    soft_labels: 'annotator' (paper Alg. 1) | 'official_csv' (code: one published table).
    annotator_*: settings of the per-client annotator networks (used by the workflow,
    not by this module); they change the slug through the hash.
    """

    name: ClassVar[str] = "fednoro_hidn"
    paper: ClassVar[str] = "FedNoRo (IJCAI'23) utils.add_noise n_type='instance'"
    needs_soft_labels: ClassVar[bool] = True
    switches: ClassVar[dict[str, str]] = {
        "soft_labels": "'annotator' (paper Alg. 1: an annotator network per noisy client) "
        "| 'official_csv' (code: one precomputed soft-label table, ICH only)"
    }
    _slug_fields: ClassVar[tuple[str, ...]] = ("rho", "eta_l", "eta_u")

    rho: float
    eta_l: float
    eta_u: float
    soft_labels: str = "annotator"
    annotator_model: str = "auto"
    annotator_epochs: int = 5
    annotator_lr: float = 3e-4
    annotator_weight_decay: float = 5e-4
    annotator_batch_size: int = 16
    annotator_seed: int = 0

    def __post_init__(self) -> None:
        self._number("rho", 0.0, 1.0, "it is the fraction of noisy clients")
        self._number("eta_l", 0.0, 1.0, "it is the lower bound of the per-client noise rate")
        self._number("eta_u", 0.0, 1.0, "it is the upper bound of the per-client noise rate")
        if self.eta_l > self.eta_u:
            raise self._err("eta_l", f"= {self.eta_l} is larger than eta_u = {self.eta_u}; swap them")
        self._choice("soft_labels", ("annotator", "official_csv"))
        if not isinstance(self.annotator_model, str) or not _SAFE_TOKEN.match(self.annotator_model):
            raise self._err(
                "annotator_model", f"= {self.annotator_model!r} must be a name of letters, digits, '_' or '.'"
            )
        self._integer("annotator_epochs", 1)
        self._number("annotator_lr", 0.0, None)
        if self.annotator_lr == 0:
            raise self._err("annotator_lr", "must be > 0")
        self._number("annotator_weight_decay", 0.0, None)
        self._integer("annotator_batch_size", 1)
        self._integer("annotator_seed", 0)

    def annotator_slug(self) -> str:
        """Names the annotator networks; a pure function of the annotator_* fields only.

        So annotators are shared across rho / eta / noise seeds. Weight decay
        appears only when it differs from the default 5e-4.
        """
        s = (
            f"ann-{self.annotator_model}-e{self.annotator_epochs}-lr{fmt_float(self.annotator_lr)}"
            f"-bs{self.annotator_batch_size}-s{self.annotator_seed}"
        )
        if self.annotator_weight_decay != type(self).__dataclass_fields__["annotator_weight_decay"].default:
            s += f"-wd{fmt_float(self.annotator_weight_decay)}"
        return s

    def slug(self) -> str:
        return (
            f"hidn-rho{fmt_float(self.rho)}-eta{fmt_float(self.eta_l)}-{fmt_float(self.eta_u)}"
            + self._hash_suffix()
        )

    def check_dataset(self, num_classes: int, num_clients: int | None = None) -> None:
        check_num_classes(num_classes, minimum=2)

    def run(self, labels, assignment, num_classes, seed, soft_labels=None) -> NoiseResult:
        self.check_dataset(num_classes)
        if soft_labels is None:
            raise DataError(
                "noise model 'fednoro_hidn' needs soft_labels, an (n, C) array of class probabilities "
                "(from the annotator networks or the official soft-label CSV)"
            )
        return hidn_noise(
            labels, assignment, self.rho, self.eta_l, self.eta_u, soft_labels, _check_seed(seed), num_classes
        )

    def noisy_clients(self, num_clients: int, seed: int) -> list[int]:
        return fednoro_noisy_clients(num_clients, self.rho, _check_seed(seed))


@dataclass(frozen=True)
class FedNCLBernoulli(NoiseSpec):
    """Fed-NCL Bernoulli: each client clean with probability p, else all its labels redrawn.

    p: probability that a client is clean (the paper's S1..: p = 0.6/0.7/0.8).
    include_true: True (code: redraw uniform over all C classes) | False (paper: all corrupted).
    """

    name: ClassVar[str] = "fedncl_bernoulli"
    paper: ClassVar[str] = "Fed-NCL (Tam et al.) Sec. III case 1, Bernoulli"
    switches: ClassVar[dict[str, str]] = {
        "include_true": "true (code: random.randint(0, K-1), ~1/C of the labels stay correct) "
        "| false (paper: every label of a noisy client is corrupted)"
    }
    _slug_fields: ClassVar[tuple[str, ...]] = ("p", "include_true")

    p: float
    include_true: bool = True

    def __post_init__(self) -> None:
        self._number("p", 0.0, 1.0, "it is the probability that a client is clean")
        self._flag("include_true")

    def slug(self) -> str:
        return f"nclbern-p{fmt_float(self.p)}" + ("" if self.include_true else "-excl") + self._hash_suffix()

    def check_dataset(self, num_classes: int, num_clients: int | None = None) -> None:
        check_num_classes(num_classes, minimum=1 if self.include_true else 2)

    def run(self, labels, assignment, num_classes, seed, soft_labels=None) -> NoiseResult:
        _no_soft(self, soft_labels)
        self.check_dataset(num_classes)
        return generators.fedncl_bernoulli_noise(
            labels, assignment, self.p, _check_seed(seed), num_classes, self.include_true
        )

    def noisy_clients(self, num_clients: int, seed: int) -> list[int]:
        noisy = schedules.fedncl_bernoulli_noisy(legacy_rng(_check_seed(seed)), num_clients, self.p)
        return [int(k) for k in np.flatnonzero(noisy)]


@dataclass(frozen=True)
class FedNCLGaussian(NoiseSpec):
    """Fed-NCL truncated Gaussian: per-client flip probability x_k ~ N(mu, sigma) on [0, 1].

    mu, sigma: mean and standard deviation of the per-client noise degree.
    truncation: 'clip' (code: normal draw clipped) | 'truncnorm' (paper Eq. 5).
    include_true: as in fedncl_bernoulli.
    """

    name: ClassVar[str] = "fedncl_gaussian"
    paper: ClassVar[str] = "Fed-NCL (Tam et al.) Sec. III case 2 (Eq. 5), truncated Gaussian"
    switches: ClassVar[dict[str, str]] = {
        "truncation": "'clip' (code: N(mu, sigma) clipped to [0, 1]) | 'truncnorm' (paper: truncated normal)",
        "include_true": "true (code) | false (paper), as for fedncl_bernoulli",
    }
    _slug_fields: ClassVar[tuple[str, ...]] = ("mu", "sigma", "truncation", "include_true")

    mu: float
    sigma: float
    truncation: str = "clip"
    include_true: bool = True

    def __post_init__(self) -> None:
        self._number("mu", 0.0, 1.0, "it is the mean per-client noise degree")
        self._number("sigma", 0.0, None, "it is a standard deviation")
        self._choice("truncation", ("clip", "truncnorm"))
        self._flag("include_true")

    def slug(self) -> str:
        s = f"nclgauss-mu{fmt_float(self.mu)}-sd{fmt_float(self.sigma)}"
        s += "-truncnorm" if self.truncation == "truncnorm" else ""
        s += "" if self.include_true else "-excl"
        return s + self._hash_suffix()

    def check_dataset(self, num_classes: int, num_clients: int | None = None) -> None:
        check_num_classes(num_classes, minimum=1 if self.include_true else 2)

    def run(self, labels, assignment, num_classes, seed, soft_labels=None) -> NoiseResult:
        _no_soft(self, soft_labels)
        self.check_dataset(num_classes)
        return generators.fedncl_gaussian_noise(
            labels,
            assignment,
            self.mu,
            self.sigma,
            _check_seed(seed),
            num_classes,
            self.truncation,
            self.include_true,
        )

    def noisy_clients(self, num_clients: int, seed: int) -> list[int]:
        level = schedules.fedncl_gaussian_levels(
            legacy_rng(_check_seed(seed)), num_clients, self.mu, self.sigma, self.truncation
        )
        return [int(k) for k in np.flatnonzero(level > 0)]


@dataclass(frozen=True)
class FedGRNoise(NoiseSpec):
    """FedGR: a fraction phi of clients noisy, rho_k ~ U(rho_min, rho_max), exactly int(n_k rho_k) flips.

    noise_type: 'sym' (other C-1 classes) | 'asym' (class map) | 'mixed' (each noisy client
    sym or asym with prob. 1/2). asym_map: 'auto' | 'cifar10_classic' | 'cyclic' |
    'next_in_group' | explicit list.
    """

    name: ClassVar[str] = "fedgr"
    paper: ClassVar[str] = "FedGR (ICML'26) Sec. 5 / dev fednllbase.py"
    switches: ClassVar[dict[str, str]] = {
        "asym_map": "'auto' (dev code: cyclic c->c+1 on CIFAR-10, next_in_group on CIFAR-100) "
        "| 'cifar10_classic' (field convention 9->1, 2->0, 4->7, 3<->5)"
    }
    _slug_fields: ClassVar[tuple[str, ...]] = ("noise_type", "phi", "rho_min", "rho_max")

    noise_type: str
    phi: float
    rho_min: float
    rho_max: float
    asym_map: Any = "auto"

    def __post_init__(self) -> None:
        self._choice("noise_type", ("sym", "asym", "mixed"))
        self._number("phi", 0.0, 1.0, "it is the fraction of noisy clients")
        self._number("rho_min", 0.0, 1.0, "it is the lower bound of the per-client noise ratio")
        self._number("rho_max", 0.0, 1.0, "it is the upper bound of the per-client noise ratio")
        if self.rho_min > self.rho_max:
            raise self._err("rho_min", f"= {self.rho_min} is larger than rho_max = {self.rho_max}; swap them")
        if self.asym_map != "auto":
            object.__setattr__(self, "asym_map", canonical_map(self.asym_map, "asym_map"))

    def slug(self) -> str:
        s = (
            f"fedgr-{self.noise_type}-phi{fmt_float(self.phi)}"
            f"-r{fmt_float(self.rho_min)}-{fmt_float(self.rho_max)}"
        )
        if self.noise_type != "sym":
            shown = "auto" if self.asym_map == "auto" else map_slug(self.asym_map)
            return s + "-" + shown + self._hash_suffix(also_shown=("asym_map",))
        return s + self._hash_suffix()

    def check_dataset(self, num_classes: int, num_clients: int | None = None) -> None:
        num_classes = check_num_classes(num_classes, minimum=2)
        if self.noise_type != "sym":
            resolve_map(generators.resolve_auto_map(self.asym_map, num_classes), num_classes)

    def run(self, labels, assignment, num_classes, seed, soft_labels=None) -> NoiseResult:
        _no_soft(self, soft_labels)
        self.check_dataset(num_classes)
        return generators.fedgr_noise(
            labels,
            assignment,
            self.noise_type,
            self.phi,
            self.rho_min,
            self.rho_max,
            _check_seed(seed),
            num_classes,
            self.asym_map,
        )

    def noisy_clients(self, num_clients: int, seed: int) -> list[int]:
        sched = schedules.fedgr_schedule(
            legacy_rng(_check_seed(seed)), num_clients, self.phi, self.rho_min, self.rho_max, self.noise_type
        )
        return sched.noisy_clients()


@dataclass(frozen=True)
class SymmetricNoise(NoiseSpec):
    """Symmetric noise on every client: exactly int(rate * n_k) samples per client relabelled.

    rate: fraction of each client's samples to corrupt.
    include_true: False (new label among the other C-1 classes) | True (uniform over all C).
    """

    name: ClassVar[str] = "symmetric"
    paper: ClassVar[str] = "field convention (all clients noisy)"
    _slug_fields: ClassVar[tuple[str, ...]] = ("rate", "include_true")

    rate: float
    include_true: bool = False

    def __post_init__(self) -> None:
        self._number("rate", 0.0, 1.0, "it is the fraction of each client's samples to corrupt")
        self._flag("include_true")

    def slug(self) -> str:
        return f"sym-r{fmt_float(self.rate)}" + ("-incl" if self.include_true else "") + self._hash_suffix()

    def check_dataset(self, num_classes: int, num_clients: int | None = None) -> None:
        check_num_classes(num_classes, minimum=1 if self.include_true else 2)

    def run(self, labels, assignment, num_classes, seed, soft_labels=None) -> NoiseResult:
        _no_soft(self, soft_labels)
        self.check_dataset(num_classes)
        return generators.symmetric_noise(
            labels, assignment, self.rate, _check_seed(seed), num_classes, self.include_true
        )

    def noisy_clients(self, num_clients: int, seed: int) -> list[int]:
        return list(range(num_clients)) if self.rate > 0 else []


@dataclass(frozen=True)
class AsymmetricNoise(NoiseSpec):
    """Asymmetric noise on every client: exactly int(rate * n_k) samples per client mapped by ``asym_map``.

    rate: fraction of each client's samples to corrupt.
    asym_map: 'cifar10_classic' | 'cyclic' | 'next_in_group' | explicit list of C classes.
    """

    name: ClassVar[str] = "asymmetric"
    paper: ClassVar[str] = "field convention (Patrini et al. 2017), all clients noisy"
    _slug_fields: ClassVar[tuple[str, ...]] = ("rate", "asym_map")

    rate: float
    asym_map: Any = "cifar10_classic"

    def __post_init__(self) -> None:
        self._number("rate", 0.0, 1.0, "it is the fraction of each client's samples to corrupt")
        object.__setattr__(self, "asym_map", canonical_map(self.asym_map, "asym_map"))

    def slug(self) -> str:
        return f"asym-r{fmt_float(self.rate)}-{map_slug(self.asym_map)}" + self._hash_suffix()

    def check_dataset(self, num_classes: int, num_clients: int | None = None) -> None:
        resolve_map(self.asym_map, check_num_classes(num_classes))

    def run(self, labels, assignment, num_classes, seed, soft_labels=None) -> NoiseResult:
        _no_soft(self, soft_labels)
        self.check_dataset(num_classes)
        return generators.asymmetric_noise(
            labels, assignment, self.rate, _check_seed(seed), num_classes, self.asym_map
        )

    def noisy_clients(self, num_clients: int, seed: int) -> list[int]:
        return list(range(num_clients)) if self.rate > 0 else []


@dataclass(frozen=True)
class FedMLPPartial(NoiseSpec):
    """FedMLP partial labels: each client annotates C - missing classes; the others become 0.

    missing: number of classes each client misses (1 .. C-1).
    class_seed: seed of the Python ``random.sample`` draw of the annotated classes;
    1037 (default) is the official one; null uses the run's noise seed.
    """

    name: ClassVar[str] = "fedmlp_partial"
    paper: ClassVar[str] = "FedMLP (MICCAI'24) main.py active classes"
    multi_label: ClassVar[bool] = True
    _slug_fields: ClassVar[tuple[str, ...]] = ("missing", "class_seed")

    missing: int
    class_seed: int | None = FEDMLP_CLASS_SEED

    def __post_init__(self) -> None:
        self._integer("missing", 1, "every client misses at least one class")
        if self.class_seed is not None:
            self._integer("class_seed", 0)

    def slug(self) -> str:
        s = f"mlp-miss{self.missing}"
        if self.class_seed is None:
            s += "-csnoise"
        elif self.class_seed != FEDMLP_CLASS_SEED:
            s += f"-cs{self.class_seed}"
        return s + self._hash_suffix()

    def check_dataset(self, num_classes: int, num_clients: int | None = None) -> None:
        num_classes = check_num_classes(num_classes, minimum=2)
        if self.missing >= num_classes:
            raise self._err(
                "missing", f"= {self.missing} must be < num_classes = {num_classes}; "
                "every client must keep at least one class"
            )
        if num_clients is not None and num_classes - self.missing == 1 and num_clients != num_classes:
            raise self._err(
                "missing",
                f"= {self.missing} leaves one class per client ('client k labels class k'), which needs "
                f"num_clients == num_classes, got {num_clients} clients and {num_classes} classes",
            )

    def _class_seed(self, seed: int) -> int:
        return _check_seed(seed) if self.class_seed is None else self.class_seed

    def run(self, labels, assignment, num_classes, seed, soft_labels=None) -> NoiseResult:
        _no_soft(self, soft_labels)
        self.check_dataset(num_classes, assignment.num_clients)
        return fedmlp_partial_noise(labels, assignment, num_classes, self.missing, self._class_seed(seed))

    def active_classes(self, num_clients: int, num_classes: int, seed: int) -> list[list[int]]:
        """Annotated classes per client (sorted), see :func:`fedmlp_active_classes`."""
        self.check_dataset(num_classes, num_clients)
        return fedmlp_active_classes(num_clients, num_classes, self.missing, self._class_seed(seed))

    def noisy_clients(self, num_clients: int, seed: int) -> list[int]:
        return list(range(num_clients))
