"""Single-label noise models built from a client schedule and the sample-level blocks.

Every generator: ``rng = legacy_rng(seed)`` (the state ``np.random.seed(seed)``
leaves), draw the client schedule, then loop over clients in ascending id and
draw per client with one vectorised call per step, over the client's samples in
the client's order. Samples that belong to no client are never touched.
"""

from __future__ import annotations

import random

import numpy as np

from ..assignment import ClientAssignment
from ..errors import ConfigError
from ..rng import legacy_rng
from . import flips, schedules
from .checks import any_labels, single_labels
from .maps import resolve_map
from .result import ASYM, CLEAN, SYM, SYM_INCL, NoiseResult, make_result

FIRST10 = 10


def clean_noise(labels: np.ndarray, assignment: ClientAssignment, num_classes: int) -> NoiseResult:
    """No noise: given = true labels (single- or multi-label)."""

    y = any_labels(labels, num_classes, assignment)
    k = assignment.num_clients
    return make_result("clean", y, y.copy(), np.zeros(k, bool), np.zeros(k), [CLEAN] * k)


def label_space_size(label_space: str, num_classes: int) -> int:
    """Number of candidate labels: 10 for FedCorr's hard-coded "first10", C for "all"."""
    if label_space == "all":
        return num_classes
    if label_space == "first10":
        if num_classes < FIRST10:
            raise ConfigError(
                f"label_space = 'first10' draws new labels from 0..9 (FedCorr's code) but the dataset has "
                f"only {num_classes} classes; set label_space: all"
            )
        return FIRST10
    raise ConfigError(f"label_space = {label_space!r} is not one of ['first10', 'all']")


def fedcorr_noise(
    labels: np.ndarray,
    assignment: ClientAssignment,
    rho: float,
    tau: float,
    seed: int,
    num_classes: int,
    label_space: str = "first10",
) -> NoiseResult:
    """FedCorr / FedDiv client-level symmetric noise (fedcorr.md §3, feddiv.md §1, FedDiv Eq. 16).

    Schedule :func:`schedules.fedcorr_levels` (noisy with prob. rho, level ~ U(tau, 1)),
    then for each client with level > 0 in ascending id: ``r = rand(N_k)``,
    noisy = r <= level, new labels ``randint(0, L, #noisy)``. The true label can be
    redrawn (realised rate ~ 0.9 * level for L = 10).

    [CODE≠PAPER] ``label_space="first10"`` (default, code): L = 10 on every
    dataset, so CIFAR-100 noise only lands on classes 0-9; ``"all"`` (paper
    text): L = C.
    """
    y = single_labels(labels, num_classes, assignment)
    space = label_space_size(label_space, num_classes)
    rng = legacy_rng(seed)
    level = schedules.fedcorr_levels(rng, assignment.num_clients, rho, tau)
    given = y.copy()
    for k in np.flatnonzero(level > 0):
        idx = assignment.clients[k]
        pos = flips.select_bernoulli(rng, idx.size, level[k])
        given[idx[pos]] = flips.replace_uniform(rng, pos.size, space)
    noisy = level > 0
    return make_result("fedcorr", y, given, noisy, level, schedules.client_kinds(noisy, SYM_INCL))


FEDNCL_STREAMS = ("python", "numpy")


def fedncl_python_flips(
    y: np.ndarray,
    assignment: ClientAssignment,
    level: np.ndarray,
    seed: int,
    num_classes: int,
    include_true: bool = True,
) -> np.ndarray:
    """Fed-NCL's ``generated_noise_data`` draws, Python ``random`` seeded with ``seed`` (fedncl.md §3).

    For every client in ascending id (clean ones too) and every sample in the
    client's order: one ``random()``; when it is < the client's level, the label
    becomes ``randint(0, C-1)`` (true class included). A level of 1 always flips,
    0 never, so a raw Gaussian draw and its clip give the same labels.
    ``include_true=False`` (paper) draws ``randint(1, C-1)`` and adds it to the true
    label mod C instead. One Python step per sample: ``randint`` consumes a variable
    number of bits, so the stream cannot be vectorised (60,000 samples: ~50 ms).
    The official function then shuffles each client's list in place with NumPy;
    that permutes only the order of a client's samples, never a label.
    """
    rnd = random.Random(seed)
    given = y.copy()
    for k, idx in enumerate(assignment.clients):
        lvl = float(level[k])
        out = given[idx]
        true = y[idx]
        for j in range(idx.size):
            if rnd.random() < lvl:
                out[j] = rnd.randint(0, num_classes - 1) if include_true else (true[j] + rnd.randint(1, num_classes - 1)) % num_classes
        given[idx] = out
    return given


def _check_stream(stream: str) -> None:
    if stream not in FEDNCL_STREAMS:
        raise ConfigError(f"stream = {stream!r} is not one of {list(FEDNCL_STREAMS)}")


def fedncl_bernoulli_noise(
    labels: np.ndarray,
    assignment: ClientAssignment,
    p_clean: float,
    seed: int,
    num_classes: int,
    include_true: bool = True,
    stream: str = "python",
) -> NoiseResult:
    """Fed-NCL Bernoulli client noise (fedncl.md §3).

    ``u = rand(K)`` from ``np.random.seed(seed)``'s state; client k noisy iff
    u_k <= 1 - p (the official code re-seeds NumPy with 42 right before, so
    noise seed 42 reproduces its noisy clients). Per-sample draws:
    ``stream="python"`` (default, official): :func:`fedncl_python_flips` with
    Python ``random`` seeded with ``seed`` — the labels the official
    ``generated_noise_data`` gives right after ``random.seed(seed)``;
    ``stream="numpy"`` (earlier project convention): for each noisy client in
    ascending id ``randint(0, C, N_k)`` continuing the NumPy state.

    [CODE≠PAPER] ``include_true=True`` (default, code: ``random.randint(0, K-1)``)
    vs ``False`` (paper: every label of a noisy client is corrupted; new label
    uniform over the other C-1 classes).
    """
    _check_stream(stream)
    y = single_labels(labels, num_classes, assignment)
    rng = legacy_rng(seed)
    noisy = schedules.fedncl_bernoulli_noisy(rng, assignment.num_clients, p_clean)
    if stream == "python":
        given = fedncl_python_flips(y, assignment, noisy.astype(np.float64), seed, num_classes, include_true)
    else:
        given = y.copy()
        for k in np.flatnonzero(noisy):
            idx = assignment.clients[k]
            given[idx] = _fedncl_replace(rng, y[idx], num_classes, include_true)
    kind = SYM_INCL if include_true else SYM
    return make_result(
        "fedncl_bernoulli", y, given, noisy, noisy.astype(np.float64), schedules.client_kinds(noisy, kind)
    )


def _fedncl_replace(rng: np.random.RandomState, true: np.ndarray, num_classes: int, include_true: bool) -> np.ndarray:
    if include_true:
        return flips.replace_uniform(rng, true.size, num_classes)
    return flips.replace_other(rng, true, num_classes)


def fedncl_gaussian_noise(
    labels: np.ndarray,
    assignment: ClientAssignment,
    mu: float,
    sigma: float,
    seed: int,
    num_classes: int,
    truncation: str = "clip",
    include_true: bool = True,
    stream: str = "python",
) -> NoiseResult:
    """Fed-NCL truncated-Gaussian client noise (fedncl.md §3).

    x = :func:`schedules.fedncl_gaussian_levels` (NumPy state of ``seed``).
    ``stream="python"`` (default, official): :func:`fedncl_python_flips` with level
    x_k. ``stream="numpy"``: for each client with x_k > 0 in ascending id
    ``r = rand(N_k)``, flipped = r <= x_k, new labels ``randint(0, C, #flipped)``
    continuing the NumPy state.

    [CODE≠PAPER] ``truncation="clip"`` (default, code) vs ``"truncnorm"`` (paper);
    ``include_true`` as in :func:`fedncl_bernoulli_noise`.
    """
    _check_stream(stream)
    y = single_labels(labels, num_classes, assignment)
    rng = legacy_rng(seed)
    level = schedules.fedncl_gaussian_levels(rng, assignment.num_clients, mu, sigma, truncation)
    if stream == "python":
        given = fedncl_python_flips(y, assignment, level, seed, num_classes, include_true)
    else:
        given = y.copy()
        for k in np.flatnonzero(level > 0):
            idx = assignment.clients[k]
            chosen = idx[flips.select_bernoulli(rng, idx.size, level[k])]
            given[chosen] = _fedncl_replace(rng, y[chosen], num_classes, include_true)
    noisy = level > 0
    kind = SYM_INCL if include_true else SYM
    return make_result("fedncl_gaussian", y, given, noisy, level, schedules.client_kinds(noisy, kind))


def _exact_count_flips(
    rng: np.random.RandomState,
    y: np.ndarray,
    given: np.ndarray,
    idx: np.ndarray,
    rate: float,
    kind: str,
    num_classes: int,
    mapping: np.ndarray | None,
) -> None:
    """Corrupt exactly int(rate * n_k) samples of one client chosen uniformly without replacement.

    Draws: ``choice(n_k, m, replace=False)``, then (sym) ``randint(1, C, m)`` or
    (sym_incl) ``randint(0, C, m)``; asym draws nothing more. A client with
    m = 0 draws nothing.
    """
    m = flips.exact_count(idx.size, rate)
    if m == 0:
        return
    chosen = idx[flips.select_exact(rng, idx.size, m)]
    if kind == SYM:
        given[chosen] = flips.replace_other(rng, y[chosen], num_classes)
    elif kind == SYM_INCL:
        given[chosen] = flips.replace_uniform(rng, m, num_classes)
    else:
        given[chosen] = flips.replace_mapped(y[chosen], mapping)


def resolve_auto_map(asym_map, num_classes: int):
    """``"auto"`` = FedGR dev convention: next_in_group for 100 classes, cyclic otherwise."""
    if asym_map == "auto":
        return "next_in_group" if num_classes == 100 else "cyclic"
    return asym_map


def fedgr_noise(
    labels: np.ndarray,
    assignment: ClientAssignment,
    noise_type: str,
    phi: float,
    rho_min: float,
    rho_max: float,
    seed: int,
    num_classes: int,
    asym_map="auto",
) -> NoiseResult:
    """FedGR client noise (fedgr.md §3): a fraction phi of clients, Sym / Asym / Mixed.

    Schedule :func:`schedules.fedgr_schedule` (our documented draw order; the
    official code is not public). Then for each noisy client in ascending id:
    exactly int(n_k * rho_k) samples chosen uniformly without replacement;
    Sym -> uniform over the other C-1 classes; Asym -> ``asym_map``.
    ``asym_map="auto"``: the dev code's maps (next_in_group on 100 classes,
    cyclic otherwise); ``"cifar10_classic"`` is the field convention.
    """
    y = single_labels(labels, num_classes, assignment)
    mapping = None
    if noise_type in (ASYM, "mixed"):
        mapping = resolve_map(resolve_auto_map(asym_map, num_classes), num_classes)
    rng = legacy_rng(seed)
    sched = schedules.fedgr_schedule(rng, assignment.num_clients, phi, rho_min, rho_max, noise_type)
    given = y.copy()
    for k in np.flatnonzero(sched.noisy):
        _exact_count_flips(
            rng, y, given, assignment.clients[k], sched.level[k], sched.kind[k], num_classes, mapping
        )
    return make_result("fedgr", y, given, sched.noisy, sched.level, sched.kind)


def _every_client_exact(
    name: str, labels, assignment: ClientAssignment, rate: float, seed: int, num_classes: int, kind: str, mapping
) -> NoiseResult:
    """Every client corrupted at the same ``rate`` (exact counts, clients in ascending id)."""
    y = single_labels(labels, num_classes, assignment)
    rng = legacy_rng(seed)
    given = y.copy()
    for idx in assignment.clients:
        _exact_count_flips(rng, y, given, idx, rate, kind, num_classes, mapping)
    noisy = np.full(assignment.num_clients, rate > 0)
    return make_result(name, y, given, noisy, np.where(noisy, rate, 0.0), schedules.client_kinds(noisy, kind))


def symmetric_noise(
    labels: np.ndarray,
    assignment: ClientAssignment,
    rate: float,
    seed: int,
    num_classes: int,
    include_true: bool = False,
) -> NoiseResult:
    """Symmetric noise on every client: exactly int(rate * n_k) samples per client.

    New labels uniform over the other C-1 classes (``include_true=False``, the
    usual "sym" convention) or over all C classes (``include_true=True``).
    Draws per client in ascending id as in :func:`fedgr_noise`.
    """
    kind = SYM_INCL if include_true else SYM
    return _every_client_exact("symmetric", labels, assignment, rate, seed, num_classes, kind, None)


def asymmetric_noise(
    labels: np.ndarray,
    assignment: ClientAssignment,
    rate: float,
    seed: int,
    num_classes: int,
    asym_map="cifar10_classic",
) -> NoiseResult:
    """Asymmetric noise on every client: exactly int(rate * n_k) samples per client mapped by ``asym_map``.

    With the classic CIFAR-10 map, samples of self-mapped classes keep their
    label, so the realised rate is below ``rate``.
    """
    mapping = resolve_map(asym_map, num_classes)
    return _every_client_exact("asymmetric", labels, assignment, rate, seed, num_classes, ASYM, mapping)
