"""Typed, validated parameters of every noise model (one frozen dataclass each).

A spec is what a config entry ``{"name": ..., **params}`` becomes. It checks
its values on construction from the :func:`~fnlcore.spec.param` declarations
(ConfigError naming the key), makes its slug with the one scheme of
:class:`fnlcore.spec.Spec` (readable primary parameters, readable tokens for
code≠paper switches, ``-h<6 hex>`` for the other non-default fields), runs the
model, and (where cheap) tells which clients will be noisy without touching any
labels. A new noise model is one file in this package with a subclass of :class:`NoiseSpec`
decorated with ``@NOISE_MODELS.register``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..assignment import ClientAssignment
from ..errors import ConfigError, DataError
from ..registry import Registry
from ..slugs import fmt_float
from ..spec import Spec, param
from ..rng import legacy_rng
from . import generators, schedules
from .checks import check_num_classes
from .hidn import assemble_soft_labels, fednoro_noisy_clients, hidn_noise
from .maps import canonical_map, map_slug, resolve_map
from .partial import FEDMLP_CLASS_SEED, fedmlp_active_classes, fedmlp_partial_noise
from .result import NoiseResult
from ..datasets.ich import official_soft_labels

_SAFE_TOKEN = re.compile(r"^[A-Za-z0-9_.]+$")


#: config name -> noise-model spec class; ``@NOISE_MODELS.register`` on a subclass adds it,
#: and every module of fnlcore.noise is imported on first use (a new noise model is one file).
NOISE_MODELS: Registry[type] = Registry("noise model", "fnlcore.noise")


@dataclass(frozen=True)
class NoiseSpec(Spec):
    """Base class of the noise-model parameter dataclasses; ``@NOISE_MODELS.register`` adds a subclass.

    ClassVars: ``name`` (config name), ``paper``, ``needs_soft_labels`` (H-IDN),
    ``multi_label`` (works on (n, C) 0/1 labels), ``slug_head``/``slug_fields``; a code≠paper
    switch is declared on its field, ``param(..., switch=...)`` (fnlcore.spec).

    :meth:`run` is a template: it runs the checks every model shares (the noise seed, the
    soft labels as ``needs_soft_labels`` says, :meth:`check_dataset` for the class and client
    counts), then the model's own :meth:`draw`, which a subclass overrides. Labels are
    checked by the generators (``fnlcore.noise.checks``).

    Artifacts made before the draw (the workflow's jobs): :meth:`annotator_slug` and
    :meth:`annotator_clients` declare per-client annotator networks (rule ``annotator``), and
    :meth:`soft_labels_from` turns the prepared dataset and those networks' probability files
    into ``run``'s ``soft_labels``. The defaults declare none.
    """

    kind: ClassVar[str] = "noise model"
    needs_soft_labels: ClassVar[bool] = False
    multi_label: ClassVar[bool] = False

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
        """Apply the model; ``seed`` is the noise seed (see fnlcore.rng for the convention).

        The shared checks (seed, soft labels, :meth:`check_dataset`), then :meth:`draw`.
        """
        seed = _check_seed(seed)
        if self.needs_soft_labels:
            if soft_labels is None:
                raise DataError(
                    f"noise model {self.name!r} needs soft_labels, an (n, C) array of class probabilities "
                    f"({self.soft_labels_source})"
                )
        else:
            _no_soft(self, soft_labels)
        num_clients = assignment.num_clients if isinstance(assignment, ClientAssignment) else None
        self.check_dataset(num_classes, num_clients)
        return self.draw(labels, assignment, num_classes, seed, soft_labels)

    def draw(
        self,
        labels: np.ndarray,
        assignment: ClientAssignment,
        num_classes: int,
        seed: int,
        soft_labels: np.ndarray | None = None,
    ) -> NoiseResult:
        """The model's own draw, called by :meth:`run` after the shared checks (``seed`` checked)."""
        raise NotImplementedError(f"noise model {self.name!r} defines no draw()")

    def noisy_clients(self, num_clients: int, seed: int) -> list[int] | None:
        """Ascending ids of the nominally noisy clients, without labels; None where not cheap."""
        return None

    # -- artifacts the draw reads (made by the workflow before the noise job) --------------------
    #: where ``soft_labels`` come from, for the error when they are missing
    soft_labels_source: ClassVar[str] = "none"

    def annotator_slug(self) -> str | None:
        """Name of the annotator networks this model's settings train (their folder); None: no annotators."""
        return None

    def annotator_clients(self, num_clients: int, seed: int) -> list[int]:
        """Clients whose annotator network (one workflow job each) the draw with ``seed`` reads."""
        return []

    def soft_labels_from(self, dataset: Any, annotator_files: list[str]) -> np.ndarray | None:
        """``run``'s soft_labels from the prepared dataset and the annotators' probability files."""
        return None


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"noise seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def _no_soft(spec: NoiseSpec, soft_labels: Any) -> None:
    if soft_labels is not None:
        raise DataError(f"noise model {spec.name!r} does not use soft_labels; pass soft_labels=None")


# -----------------------------------------------------------------------------


@NOISE_MODELS.register
@dataclass(frozen=True)
class CleanNoise(NoiseSpec):
    """No noise: the given labels are the true labels (single- or multi-label)."""

    name: ClassVar[str] = "clean"
    paper: ClassVar[str] = "all (rho = 0 baselines)"

    def draw(self, labels, assignment, num_classes, seed, soft_labels=None) -> NoiseResult:
        return generators.clean_noise(labels, assignment, num_classes)

    def noisy_clients(self, num_clients: int, seed: int) -> list[int]:
        return []


@NOISE_MODELS.register
@dataclass(frozen=True)
class FedCorrNoise(NoiseSpec):
    """FedCorr / FedDiv: each client noisy with prob. rho, level ~ U(tau, 1), per-sample Bernoulli flips.

    rho: probability that a client is noisy (number of noisy clients is random).
    tau: lower bound of the per-client noise level.
    label_space: 'first10' (code; new labels 0..9 on every dataset) | 'all' (paper; 0..C-1).
    """

    name: ClassVar[str] = "fedcorr"
    paper: ClassVar[str] = "FedCorr (CVPR'22) util.add_noise; FedDiv (AAAI'24) Eq. 16"
    slug_fields: ClassVar[tuple] = ("rho", "tau", ("label_space", {"all": "all"}))

    rho: float = param(ge=0, le=1, doc="probability that a client is noisy")
    tau: float = param(ge=0, le=1, doc="lower bound of the per-client noise level")
    label_space: str = param("first10", choices=("first10", "all"),
                             switch="'first10' (code: new label randint(0, 10) on every dataset, the CIFAR-100 bug) | "
                                    "'all' (paper text: uniform over all C classes)")

    def check_dataset(self, num_classes: int, num_clients: int | None = None) -> None:
        generators.label_space_size(self.label_space, check_num_classes(num_classes))

    def draw(self, labels, assignment, num_classes, seed, soft_labels=None) -> NoiseResult:
        return generators.fedcorr_noise(labels, assignment, self.rho, self.tau, seed, num_classes, self.label_space)

    def noisy_clients(self, num_clients: int, seed: int) -> list[int]:
        level = schedules.fedcorr_levels(legacy_rng(_check_seed(seed)), num_clients, self.rho, self.tau)
        return [int(k) for k in np.flatnonzero(level > 0)]


@NOISE_MODELS.register
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
    slug_head: ClassVar[str] = "hidn"
    slug_fields: ClassVar[tuple] = ("rho", ("eta_l", "eta"), ("eta_u", ""))

    rho: float = param(ge=0, le=1, doc="fraction of noisy clients")
    eta_l: float = param(ge=0, le=1, doc="lower bound of the per-client noise rate")
    eta_u: float = param(ge=0, le=1, doc="upper bound of the per-client noise rate")
    soft_labels: str = param("annotator", choices=("annotator", "official_csv"),
                             switch="'annotator' (paper Alg. 1: an annotator network per noisy client) | 'official_csv'"
                                    " (code: one precomputed soft-label table, ICH only)")
    annotator_model: str = param("auto", doc="'auto' or a model name")
    annotator_epochs: int = param(5, ge=1)
    annotator_lr: float = param(3e-4, gt=0)
    annotator_weight_decay: float = param(5e-4, ge=0)
    annotator_batch_size: int = param(16, ge=1)
    annotator_seed: int = param(0, ge=0)

    def validate(self) -> None:
        if self.eta_l > self.eta_u:
            raise self.error("eta_l", f"is larger than eta_u={self.eta_u}; swap them")
        if not _SAFE_TOKEN.match(self.annotator_model):
            raise self.error("annotator_model", "must be a name of letters, digits, '_' or '.'")

    def annotator_slug(self) -> str:
        """Names the annotator networks (also with soft_labels='official_csv', which trains none);
        a pure function of the annotator_* fields only.

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

    def check_dataset(self, num_classes: int, num_clients: int | None = None) -> None:
        check_num_classes(num_classes, minimum=2)

    def draw(self, labels, assignment, num_classes, seed, soft_labels=None) -> NoiseResult:
        return hidn_noise(labels, assignment, self.rho, self.eta_l, self.eta_u, soft_labels, seed, num_classes)

    # the annotator networks (paper Alg. 1), one workflow job per noisy client
    soft_labels_source: ClassVar[str] = "from the annotator networks or the official soft-label CSV"

    def annotator_clients(self, num_clients: int, seed: int) -> list[int]:
        return self.noisy_clients(num_clients, seed) if self.soft_labels == "annotator" else []

    def soft_labels_from(self, dataset: Any, annotator_files: list[str]) -> np.ndarray:
        n, c = len(dataset.labels("train")), dataset.info.num_classes
        if self.soft_labels == "annotator":
            return assemble_soft_labels(list(annotator_files), n, c)

        return official_soft_labels(dataset)

    def noisy_clients(self, num_clients: int, seed: int) -> list[int]:
        return fednoro_noisy_clients(num_clients, self.rho, _check_seed(seed))


@NOISE_MODELS.register
@dataclass(frozen=True)
class FedNCLBernoulli(NoiseSpec):
    """Fed-NCL Bernoulli: each client clean with probability p, else all its labels redrawn.

    p: probability that a client is clean (the paper's S1..: p = 0.6/0.7/0.8).
    include_true: True (code: redraw uniform over all C classes) | False (paper: all corrupted).
    """

    name: ClassVar[str] = "fedncl_bernoulli"
    paper: ClassVar[str] = "Fed-NCL (Tam et al.) Sec. III case 1, Bernoulli"
    slug_head: ClassVar[str] = "nclbern"
    slug_fields: ClassVar[tuple] = ("p", ("include_true", {False: "excl"}), ("stream", {"numpy": "npstream"}))

    p: float = param(ge=0, le=1, doc="probability that a client is clean")
    include_true: bool = param(True,
                               switch="true (code: random.randint(0, K-1), ~1/C of the labels stay correct) | false "
                                      "(paper: every label of a noisy client is corrupted)")
    stream: str = param("python", choices=generators.FEDNCL_STREAMS, doc="per-sample random stream",
                        switch="'python' (code: per-sample Python random seeded with the noise seed, the official "
                               "labels) | 'numpy' (earlier project draws continuing the NumPy state)")

    def check_dataset(self, num_classes: int, num_clients: int | None = None) -> None:
        check_num_classes(num_classes, minimum=1 if self.include_true else 2)

    def draw(self, labels, assignment, num_classes, seed, soft_labels=None) -> NoiseResult:
        return generators.fedncl_bernoulli_noise(
            labels, assignment, self.p, seed, num_classes, self.include_true, self.stream
        )

    def noisy_clients(self, num_clients: int, seed: int) -> list[int]:
        noisy = schedules.fedncl_bernoulli_noisy(legacy_rng(_check_seed(seed)), num_clients, self.p)
        return [int(k) for k in np.flatnonzero(noisy)]


@NOISE_MODELS.register
@dataclass(frozen=True)
class FedNCLGaussian(NoiseSpec):
    """Fed-NCL truncated Gaussian: per-client flip probability x_k ~ N(mu, sigma) on [0, 1].

    mu, sigma: mean and standard deviation of the per-client noise degree.
    truncation: 'clip' (code: normal draw clipped) | 'truncnorm' (paper Eq. 5).
    include_true: as in fedncl_bernoulli.
    """

    name: ClassVar[str] = "fedncl_gaussian"
    paper: ClassVar[str] = "Fed-NCL (Tam et al.) Sec. III case 2 (Eq. 5), truncated Gaussian"
    slug_head: ClassVar[str] = "nclgauss"
    slug_fields: ClassVar[tuple] = (
        "mu", ("sigma", "sd"), ("truncation", {"truncnorm": "truncnorm"}), ("include_true", {False: "excl"}),
        ("stream", {"numpy": "npstream"}),
    )

    mu: float = param(ge=0, le=1, doc="mean per-client noise degree")
    sigma: float = param(ge=0, doc="standard deviation of the per-client noise degree")
    truncation: str = param("clip", choices=("clip", "truncnorm"),
                            switch="'clip' (code: N(mu, sigma) clipped to [0, 1]) | 'truncnorm' (paper: truncated "
                                   "normal)")
    include_true: bool = param(True, switch="true (code) | false (paper), as for fedncl_bernoulli")
    stream: str = param("python", choices=generators.FEDNCL_STREAMS, doc="per-sample random stream",
                        switch="'python' (code) | 'numpy', as for fedncl_bernoulli")

    def check_dataset(self, num_classes: int, num_clients: int | None = None) -> None:
        check_num_classes(num_classes, minimum=1 if self.include_true else 2)

    def draw(self, labels, assignment, num_classes, seed, soft_labels=None) -> NoiseResult:
        return generators.fedncl_gaussian_noise(
            labels,
            assignment,
            self.mu,
            self.sigma,
            seed,
            num_classes,
            self.truncation,
            self.include_true,
            self.stream,
        )

    def noisy_clients(self, num_clients: int, seed: int) -> list[int]:
        level = schedules.fedncl_gaussian_levels(
            legacy_rng(_check_seed(seed)), num_clients, self.mu, self.sigma, self.truncation
        )
        return [int(k) for k in np.flatnonzero(level > 0)]


@NOISE_MODELS.register
@dataclass(frozen=True)
class FedGRNoise(NoiseSpec):
    """FedGR: a fraction phi of clients noisy, rho_k ~ U(rho_min, rho_max), exactly int(n_k rho_k) flips.

    noise_type: 'sym' (other C-1 classes) | 'asym' (class map) | 'mixed' (each noisy client
    sym or asym with prob. 1/2). asym_map: 'auto' | 'cifar10_classic' | 'cyclic' |
    'next_in_group' | explicit list.
    """

    name: ClassVar[str] = "fedgr"
    paper: ClassVar[str] = "FedGR (ICML'26) Sec. 5 / dev fednllbase.py"
    slug_fields: ClassVar[tuple] = (
        ("noise_type", ""), "phi", ("rho_min", "r"), ("rho_max", ""), ("asym_map", lambda s: s._shown_map()),
    )

    noise_type: str = param(choices=("sym", "asym", "mixed"))
    phi: float = param(ge=0, le=1, doc="fraction of noisy clients")
    rho_min: float = param(ge=0, le=1, doc="lower bound of the per-client noise ratio")
    rho_max: float = param(ge=0, le=1, doc="upper bound of the per-client noise ratio")
    asym_map: Any = param("auto",
                          switch="'auto' (dev code: cyclic c->c+1 on CIFAR-10, next_in_group on CIFAR-100) | "
                                 "'cifar10_classic' (field convention 9->1, 2->0, 4->7, 3<->5)")

    def validate(self) -> None:
        if self.rho_min > self.rho_max:
            raise self.error("rho_min", f"is larger than rho_max={self.rho_max}; swap them")
        if self.asym_map != "auto":
            object.__setattr__(self, "asym_map", canonical_map(self.asym_map, "asym_map"))

    def _shown_map(self) -> str | None:
        """The class map in the slug; symmetric noise does not use it (a non-default one is hashed)."""
        if self.noise_type == "sym":
            return None
        return "auto" if self.asym_map == "auto" else map_slug(self.asym_map)

    def check_dataset(self, num_classes: int, num_clients: int | None = None) -> None:
        num_classes = check_num_classes(num_classes, minimum=2)
        if self.noise_type != "sym":
            resolve_map(generators.resolve_auto_map(self.asym_map, num_classes), num_classes)

    def draw(self, labels, assignment, num_classes, seed, soft_labels=None) -> NoiseResult:
        return generators.fedgr_noise(
            labels,
            assignment,
            self.noise_type,
            self.phi,
            self.rho_min,
            self.rho_max,
            seed,
            num_classes,
            self.asym_map,
        )

    def noisy_clients(self, num_clients: int, seed: int) -> list[int]:
        sched = schedules.fedgr_schedule(
            legacy_rng(_check_seed(seed)), num_clients, self.phi, self.rho_min, self.rho_max, self.noise_type
        )
        return sched.noisy_clients()


@NOISE_MODELS.register
@dataclass(frozen=True)
class SymmetricNoise(NoiseSpec):
    """Symmetric noise on every client: exactly int(rate * n_k) samples per client relabelled.

    rate: fraction of each client's samples to corrupt.
    include_true: False (new label among the other C-1 classes) | True (uniform over all C).
    """

    name: ClassVar[str] = "symmetric"
    paper: ClassVar[str] = "field convention (all clients noisy)"
    slug_head: ClassVar[str] = "sym"
    slug_fields: ClassVar[tuple] = (("rate", "r"), ("include_true", {True: "incl"}))

    rate: float = param(ge=0, le=1, doc="fraction of each client's samples to corrupt")
    include_true: bool = False

    def check_dataset(self, num_classes: int, num_clients: int | None = None) -> None:
        check_num_classes(num_classes, minimum=1 if self.include_true else 2)

    def draw(self, labels, assignment, num_classes, seed, soft_labels=None) -> NoiseResult:
        return generators.symmetric_noise(labels, assignment, self.rate, seed, num_classes, self.include_true)

    def noisy_clients(self, num_clients: int, seed: int) -> list[int]:
        return list(range(num_clients)) if self.rate > 0 else []


@NOISE_MODELS.register
@dataclass(frozen=True)
class AsymmetricNoise(NoiseSpec):
    """Asymmetric noise on every client: exactly int(rate * n_k) samples per client mapped by ``asym_map``.

    rate: fraction of each client's samples to corrupt.
    asym_map: 'cifar10_classic' | 'cyclic' | 'next_in_group' | explicit list of C classes.
    """

    name: ClassVar[str] = "asymmetric"
    paper: ClassVar[str] = "field convention (Patrini et al. 2017), all clients noisy"
    slug_head: ClassVar[str] = "asym"
    slug_fields: ClassVar[tuple] = (("rate", "r"), ("asym_map", lambda s: map_slug(s.asym_map)))

    rate: float = param(ge=0, le=1, doc="fraction of each client's samples to corrupt")
    asym_map: Any = "cifar10_classic"

    def validate(self) -> None:
        object.__setattr__(self, "asym_map", canonical_map(self.asym_map, "asym_map"))

    def check_dataset(self, num_classes: int, num_clients: int | None = None) -> None:
        resolve_map(self.asym_map, check_num_classes(num_classes))

    def draw(self, labels, assignment, num_classes, seed, soft_labels=None) -> NoiseResult:
        return generators.asymmetric_noise(labels, assignment, self.rate, seed, num_classes, self.asym_map)

    def noisy_clients(self, num_clients: int, seed: int) -> list[int]:
        return list(range(num_clients)) if self.rate > 0 else []


@NOISE_MODELS.register
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
    slug_head: ClassVar[str] = "mlp"
    slug_fields: ClassVar[tuple] = (("missing", "miss"), ("class_seed", lambda s: s._shown_class_seed()))

    missing: int = param(ge=1, doc="classes each client misses (every client misses at least one)")
    class_seed: int | None = param(FEDMLP_CLASS_SEED, ge=0, doc="seed of the annotated-class draw; null: the noise seed")

    def _shown_class_seed(self) -> str | None:
        if self.class_seed is None:
            return "csnoise"
        return None if self.class_seed == FEDMLP_CLASS_SEED else f"cs{self.class_seed}"

    def check_dataset(self, num_classes: int, num_clients: int | None = None) -> None:
        num_classes = check_num_classes(num_classes, minimum=2)
        if self.missing >= num_classes:
            raise self.error(
                "missing", f"must be < num_classes={num_classes}; every client must keep at least one class"
            )
        if num_clients is not None and num_classes - self.missing == 1 and num_clients != num_classes:
            raise self.error(
                "missing",
                "leaves one class per client ('client k labels class k'), which needs "
                f"num_clients == num_classes, got {num_clients} clients and {num_classes} classes",
            )

    def _class_seed(self, seed: int) -> int:
        return _check_seed(seed) if self.class_seed is None else self.class_seed

    def draw(self, labels, assignment, num_classes, seed, soft_labels=None) -> NoiseResult:
        return fedmlp_partial_noise(labels, assignment, num_classes, self.missing, self._class_seed(seed))

    def active_classes(self, num_clients: int, num_classes: int, seed: int) -> list[list[int]]:
        """Annotated classes per client (sorted), see :func:`fedmlp_active_classes`."""
        self.check_dataset(num_classes, num_clients)
        return fedmlp_active_classes(num_clients, num_classes, self.missing, self._class_seed(seed))

    def noisy_clients(self, num_clients: int, seed: int) -> list[int]:
        return list(range(num_clients))
