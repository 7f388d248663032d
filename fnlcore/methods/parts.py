"""Building blocks several methods share (FedCorr, FedDiv and the baselines FedCorr adapted; the
proximal term, FedNoRo's per-class loss matrix, the linear and Gaussian ramp-ups, Beta draws).

Not a method: no registration. Each block is the reference codes' behaviour, named
for what it computes, so a method file reads as its algorithm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from .api import ConfigError, draw_device, draw_predict, host_side, masked_mean, on, predict, Stretch
from .api import numerics


def check_rounds_left(params, field: str, settings, why: str = "") -> None:
    """ConfigError (saying ``why``) unless the round-valued ``field`` of a method's hyper-parameters is
    below ``training.rounds``: the stage it starts would never run."""
    value = getattr(params, field)
    if value >= settings.rounds:
        raise ConfigError(f"method {params.name!r}: {field}={value} must be < training.rounds={settings.rounds}"
                          + (f" {why}" if why else ""))


def fit_two_gaussians(x: np.ndarray, seed: int, **options):
    """sklearn's 2-component GaussianMixture (its defaults, ``random_state=seed``, ``options``) fitted on
    the (n, d) values ``x``, with BLAS on one thread: these fits are tiny, and threads only add contention.

    sklearn is imported here, not with the module: it costs every job and Snakefile parse ~1.7 s."""
    from sklearn.mixture import GaussianMixture  # lazy: scikit-learn takes ~1 s to import; only this step uses it
    from threadpoolctl import threadpool_limits  # lazy: scikit-learn takes ~1 s to import; only this step uses it

    with threadpool_limits(1):
        return GaussianMixture(n_components=2, random_state=seed, **options).fit(x)


def double_softmax_loss(probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-sample cross-entropy applied to softmax *probabilities* (FedCorr's and FedDiv's code).

    ``nn.CrossEntropyLoss(reduction='none')(softmax(z), y)`` = -P_y + log sum_c exp(P_c):
    the codes feed probabilities where logits belong; the loss scale (e.g. [1.461, 2.461]
    on 10 classes) is what their GMMs and rankings saw (fedcorr.md §4, A2).
    """
    return F.cross_entropy(probs.float(), labels, reduction="none")


def true_noise_rates(data, labels: torch.Tensor | None = None, empty: float = 0.0) -> list[float]:
    """Each client's share of wrong ``labels`` (default: the current given labels); ``empty`` without samples."""
    wrong = ((data.given if labels is None else labels) != data.y_true).cpu().numpy()
    return [float(wrong[idx.numpy()].mean()) if len(idx) else empty for idx in data.clients]


def client_table(data, rates, **columns) -> pd.DataFrame:
    """``client_results``' table, a row per client k: "client" k, "n" its size, "noise_rate" ``rates[k]``, then
    each of ``columns`` at k."""
    return pd.DataFrame([{"client": k, "n": len(idx), "noise_rate": rates[k], **{c: v[k] for c, v in columns.items()}}
                         for k, idx in enumerate(data.clients)])


def linear_ramp(r: int, top: float, length: int) -> float:
    """top · r / length before round ``length``, then top: FedLSR's gamma_t, RoFL's λ_cen(t)."""
    return top * r / length if r < length else top


def gaussian_ramp_up(r: int, begin: int, end: int, top: float) -> float:
    """top * exp(-5 (1 - (clip(r, b, e) - b) / (e - b))^2), top when e <= b: the Gaussian ramp-up of
    FedNoRo's distillation weight lambda(r) and of its multi-label port's w(r)."""
    if end <= begin:
        return top
    t = (min(max(r, begin), end) - begin) / (end - begin)
    return top * math.exp(-5.0 * (1.0 - t) ** 2)


def group_shape(num_clients: int, fraction: float | None, method: str = "") -> tuple[int, int]:
    """(clients per group, groups per pass) of FedCorr's stage-1 draw; a ConfigError names ``method``'s frac1.

    ``fraction`` None = one client per group and K groups, exactly (computing 1/K in floats
    and applying the code's ``int()`` loses a client for some K, e.g. int(49 * (1/49)) = 0).
    An explicit fraction is used as the code does: ``int(K * f)`` and ``int(1 / f)``.
    """
    if fraction is None:
        return 1, num_clients
    per_group, groups = int(num_clients * fraction), int(1.0 / fraction)
    if per_group < 1:
        where = f"method {method!r}: " if method else ""
        raise ConfigError(f"{where}frac1: fraction {fraction} gives 0 clients per group for K={num_clients}; "
                          "use >= 1/K or leave it unset")
    return per_group, groups


def sequential_client_groups(rng: np.random.RandomState, num_clients: int, fraction: float | None) -> list[list[int]]:
    """FedCorr's stage-1 draw (also FedDiv's warm-up): one pass over the clients in groups.

    ``groups`` times (see :func:`group_shape`): draw ``per_group`` clients with
    ``rng.choice(K, n, p=prob)`` (with replacement, as the code: A7), zero their
    probability and renormalise. One client per group: every client once, in random order.
    """
    per_group, n_groups = group_shape(num_clients, fraction)
    prob = np.full(num_clients, 1.0 / num_clients)
    groups = []
    for _ in range(n_groups):
        chosen = rng.choice(num_clients, per_group, p=prob)
        groups.append([int(k) for k in chosen])
        prob[chosen] = 0.0
        total = prob.sum()
        if total <= 0:
            break
        prob = prob / total
    return groups


class GroupPasses:
    """Mixin of a method whose first rounds pass over the clients in :func:`sequential_client_groups` (``frac1``),
    a group a round, before ``training.rounds`` (FedCorr's stage 1, FedDiv's warm-up): not evaluated, at
    training round 0's learning rate. The method's ``__init__`` calls :meth:`init_passes`."""

    passes_param: ClassVar[str]  # the hyper-parameter counting the passes
    pass_stage: ClassVar[str]  # the name of their stretch of the schedule

    @classmethod
    def schedule(cls, params, settings, num_clients):
        per_group, groups = group_shape(num_clients, params.frac1, params.name)
        passes = Stretch(cls.pass_stage, getattr(params, cls.passes_param) * groups, per_group, evaluated=False)
        return [passes, *super().schedule(params, settings, num_clients)]

    def init_passes(self) -> None:
        self.groups_per_iteration = group_shape(self.ctx.data.num_clients, self.params.frac1, self.params.name)[1]
        self.pre_rounds = getattr(self.params, self.passes_param) * self.groups_per_iteration

    def num_rounds(self) -> int:
        return self.pre_rounds + self.ctx.settings.rounds

    def should_evaluate(self, r: int) -> bool:
        return r >= self.pre_rounds

    def lr_round(self, r: int) -> int:
        return max(r - self.pre_rounds, 0)


PASS_BATCH = 100  # FedCorr's and FedDiv's codes run their detection passes (client_outputs) in batches of 100


@torch.no_grad()
def client_outputs(ctx, model: torch.nn.Module, idx: torch.Tensor, augment: bool = True,
                   batch_size: int = PASS_BATCH, drawn: list[tuple] | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits, softmax probabilities, double-softmax losses on the current labels) for samples ``idx``.

    The codes run these passes in eval mode on the *training* dataset object, i.e. with
    training augmentation (``augment=True``), in batches of 100; ``drawn``: the augmentation
    drawn ahead (:func:`~fnlcore.fl.local.draw_predict`, a stage's ``reserve``), else drawn here.
    """
    logits = predict(ctx, model, ctx.data.train, idx, augment=augment, batch_size=batch_size, drawn=drawn)
    probs = F.softmax(logits, dim=1)
    return logits, probs, double_softmax_loss(probs, ctx.data.given[idx.to(ctx.device)])


def reserve_pass(method, r: int, k: int, job) -> list[tuple]:
    """A ``Stage.reserve``: the augmentation of the upload's :func:`client_outputs` pass over client k's samples,
    drawn where the sequential upload draws it."""
    return draw_predict(method.ctx, len(method.ctx.data.clients[k]), PASS_BATCH)


def proximal_term(params: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], keys: list[str], mu,
                  form: str, skip: torch.Tensor | None = None) -> torch.Tensor:
    """The proximal term of K clients -> (K,): ``params`` each trainable parameter (K, ...) by name
    (``StackedBatch.parameters()``), ``ref`` the round's global values; ``form`` "squared_half":
    mu/2 ||w - w_g||^2, else mu ||w - w_g|| (FedCorr's un-squared form); ``mu`` a float or (K,).
    0 where ``skip`` (K,) is set, with no gradient (the square root's at 0 would be infinite).

    Each client's squares are summed over all but the client axis in one reduction: at K = 1 the
    same order, and so the same bits, as a whole-tensor ``sum()`` of one model's parameter."""
    sq = 0
    for k in keys:
        d = (params[k] - ref[k].unsqueeze(0)) ** 2
        sq = sq + d.sum(tuple(range(1, d.dim())))
    if skip is not None:
        sq = torch.where(skip, torch.ones_like(sq), sq)
    out = 0.5 * mu * sq if form == "squared_half" else mu * numerics.sqrt(sq)
    return out if skip is None else torch.where(skip, torch.zeros_like(out), out)


def add_proximal(loss: torch.Tensor, sb, ref, keys: list[str], mu, form: str, skip: torch.Tensor | None):
    """``loss`` (K,) + :func:`proximal_term` of ``sb``'s clients but those ``skip`` (K,) sets. ``mu`` (a float
    or (K,)) and ``skip`` are host values: decided on the host (no device sync), then one copy of each."""
    with host_side():
        if skip is not None and bool(skip.all()):
            return loss
        skip = on(skip, loss.device) if skip is not None and bool(skip.any()) else None
    mu = on(mu, loss.device) if torch.is_tensor(mu) else mu
    return loss + proximal_term(sb.parameters(), ref, keys, mu, form, skip)


def beta_draw(alpha: float, gen: torch.Generator, device) -> float:
    """lambda ~ Beta(alpha, alpha) from two Gammas on ``gen`` (seeded, checkpointed), read where it was
    drawn (the host in a run: no device sync)."""
    g = torch._standard_gamma(torch.full((2,), float(alpha), device=draw_device(gen, device)), generator=gen)
    with host_side():
        return float(g[0] / (g[0] + g[1]))


def class_loss_matrix(losses: np.ndarray, labels: np.ndarray, clients: list[np.ndarray], num_classes: int) -> np.ndarray:
    """K x C mean loss per client and (given) class; missing entries filled with the column minimum."""
    mat = np.full((len(clients), num_classes), np.nan)
    for i, idx in enumerate(clients):
        s = np.bincount(labels[idx], weights=losses[idx], minlength=num_classes)
        n = np.bincount(labels[idx], minlength=num_classes)
        with np.errstate(invalid="ignore", divide="ignore"):
            mat[i] = np.where(n > 0, s / np.maximum(n, 1), np.nan)
    col_min = np.nanmin(np.where(np.isnan(mat), np.inf, mat), axis=0)
    col_min = np.where(np.isinf(col_min), 0.0, col_min)  # a class nobody holds
    return np.where(np.isnan(mat), col_min[None, :], mat)


def minmax_columns(mat: np.ndarray) -> np.ndarray:
    """Column-wise min-max normalisation (Eq. 3); a constant column becomes 0."""
    lo, hi = mat.min(0), mat.max(0)
    span = hi - lo
    return np.where(span > 0, (mat - lo) / np.where(span > 0, span, 1.0), 0.0)


LID_EPS = 1e-6


def lid_scores(probs: torch.Tensor | np.ndarray, k: int = 20) -> torch.Tensor:
    """Per-sample LID of the rows of ``probs`` among themselves (fedcorr.md §4.1).

    Euclidean distances to every row, ascending, position 0 (self) dropped, the next k:
    LID_i = -k / (sum_j log(r_j / (r_k + 1e-6)) + 1e-6). Fewer than k+1 rows: all the
    others are used and the numerator stays k (the code's slice). float64 as scipy's cdist.
    """
    x = torch.as_tensor(probs).double()
    n = x.shape[0]
    if n < 2:  # undefined (the code would fail); a neutral value keeps the client's mean finite
        return torch.zeros(n, dtype=torch.float64, device=x.device)
    d = torch.cdist(x, x, compute_mode="donot_use_mm_for_euclid_dist")  # exact distances, self = 0
    r = torch.topk(d, min(k, n - 1) + 1, dim=1, largest=False, sorted=True).values[:, 1:]
    return -k / (numerics.log(r / (r[:, -1:] + LID_EPS)).sum(1) + LID_EPS)


# -- mixup with declared draws (FedCorr, FedDiv): the batched engine draws them ahead ------------------


@dataclass(frozen=True, slots=True)
class MixupDraw:
    """A mixup batch's random draws, as :func:`~fnlcore.randaugment.mixup` makes them: lambda ~
    Beta(alpha, alpha) from two Gammas (a 0-dim tensor: per batch), then the partner permutation (n,).

    A ``Phase.draws`` declaration (after the views), so the batched engine draws every client's
    batches ahead in the sequential order; equal for equal alpha (a batched chunk's clients agree)."""

    alpha: float

    def __call__(self, n: int, gen: torch.Generator | None, device) -> tuple[torch.Tensor, torch.Tensor]:
        device = draw_device(gen, device)  # the generator's (the host in a run)
        g = torch._standard_gamma(torch.full((2,), float(self.alpha), device=device), generator=gen)
        return g[0] / (g[0] + g[1]), torch.randperm(n, generator=gen, device=device)


def mixup_view(view: torch.Tensor, lam: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """K clients' mixed inputs from their :class:`MixupDraw` draws: view (K * B, ...), lam (K,), perm (K, B)
    within each client's batch -> lam_k x + (1 - lam_k) x[perm_k], (K * B, ...) client after client."""
    k, b = perm.shape
    x = view.reshape(k, b, *view.shape[1:])
    partner = x[torch.arange(k, device=x.device)[:, None], _real_partners(perm)]
    lam = lam.view(k, 1, *([1] * (x.dim() - 2)))
    return (lam * x + (1.0 - lam) * partner).reshape(view.shape)


def mixup_cross_entropy(logits: torch.Tensor, y: torch.Tensor, lam: torch.Tensor, perm: torch.Tensor,
                        mask: torch.Tensor | None, shift: torch.Tensor | None = None) -> torch.Tensor:
    """lambda CE(f(x~), y) + (1 - lambda) CE(f(x~), y[pi]) of K clients (FedCorr, FedDiv): logits (K, B, C) of
    the mixed batches (:func:`mixup_view`), y (K, B), lam (K,), perm (K, B), mask (K, B) real rows or None,
    ``shift`` (K, 1, C) added to the logits inside both CE terms (logit adjustment) or None -> (K,)."""
    k, b, c = logits.shape
    z = (logits if shift is None else logits + shift).reshape(k * b, c)
    ce_a = F.cross_entropy(z, y.reshape(-1), reduction="none").view(k, b)
    ce_b = F.cross_entropy(z, y.gather(1, _real_partners(perm)).reshape(-1), reduction="none").view(k, b)
    return lam * masked_mean(ce_a, mask) + (1.0 - lam) * masked_mean(ce_b, mask)


def _real_partners(perm: torch.Tensor) -> torch.Tensor:
    """Partner indices (K, B) inside the step's width: a padded row repeats another batch's first value,
    which a shorter batch may not hold (its row is masked; any index in range serves)."""
    return perm.clamp_max(perm.shape[1] - 1)
