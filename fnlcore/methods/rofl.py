"""RoFL (Yang et al. 2022, "Robust Federated Learning with Noisy Labels"; baselines.md §5, A4).

Class-wise feature centroids shared between clients and server. Client k in round t:

1. with the received global model (eval mode, no augmentation) compute a global pseudo-label
   ŷ_i = argmax f_{w_g}(x_i) for every local sample;
2. local centroids f_k = the mean feature per given class under w_g at t = 0 (empty class:
   zero), else the received global centroids f_G;
3. every mini-batch (train mode): keep the ⌊(1 − r_t)|B|⌋ smallest-CE samples S (forget rate r_t
   linear 0 -> forget_rate over forget_ramp_rounds rounds); ỹ_i = argmax_c cos(f_k[c], φ_i),
   mask m_i = [ỹ_i = y_i]; target y*_i = y_i where m_i else ŷ_i (ŷ_i := y_i while t < T_pl);
   L = mean_S CE(z, y*) + λ_cen(t) Σ_S m_i ||φ_i − f_k[y_i]||² + λ_e mean_S H(softmax z),
   λ_cen(t) = λ_cen · t / T_pl before T_pl;
4. after every optimiser step, per class c: f̂_c = mean feature of S with given label c,
   s = cos(f_k[c], f̂_c), f_k[c] <- (1 − s²) f_k[c] + s² f̂_c;
5. upload w_k and f_k. Server: mean of the models; f_G[c] <- Σ_k s_kc f_k[c] / Σ_k s_kc with
   s_kc = cos(f_G_old[c], f_k[c]). f_G starts standard normal (server state, checkpointed).

Official code (jangsoohyuk/Robust-Federated-Learning-with-Noisy-Labels; FedNoRo ran it with
T_pl = 10, "other parameters as the code") by default; each difference is a switch:
- ``cen_grad`` false (code: φ detached, L_cen adds no gradient) | true (paper);
- ``weighting`` 'uniform' (code: plain mean of client models) | 'size' (n_k weights);
- ``fg_init`` 'random' (code: round-0 client centroids weighted by their cosine to the random
  f_G; a denominator |Σ_k s_kc| < 1e-8 is replaced by 1, spec A4(d)) | 'round0_mean' (f_G := plain
  mean of the round-0 client centroids).

Decided where the spec is silent: the pseudo-label / round-0 feature pass runs on un-augmented
images; at least one sample of each batch is kept (⌊0.8 · 1⌋ = 0 would make an empty mean, NaN);
the centroid update uses the features of the step's forward pass (before the step).

One loss form over K clients (the batched engine's chunk; the sequential engine: K = 1 with the same
hooks): their selections, losses and centroid updates at once (centroids stacked (K, C, d), updated
only for the clients that stepped).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .api import (
    ClientUpdate, FLMethod, forward_bounded, LocalJob, masked_mean, MethodParams, param, Phase, METHODS, Stage,
)
from .api import numerics
from .parts import check_rounds_left, linear_ramp
from .small_loss import small_loss_order

DENOMINATOR_GUARD = 1e-8  # |Σ_k s_kc| below this is replaced by 1 (spec A4(d))


@dataclass(frozen=True)
class RoFLParams(MethodParams):
    name = "rofl"
    slug_fields = ("t_pl",)
    t_pl: int = param(100, ge=0, rounds=True, doc="round from which global pseudo-labels are used (FedNoRo: 10; code: 100)")
    forget_rate: float = param(0.2, ge=0, lt=1, doc="final fraction of large-loss samples dropped per batch")
    forget_ramp_rounds: int = param(10, ge=0, rounds=True, doc="rounds over which the forget rate grows linearly from 0")
    lambda_cen: float = param(1.0, ge=0, doc="centroid loss weight (ramped up until t_pl)")
    lambda_e: float = param(0.8, ge=0, doc="entropy minimisation weight")
    cen_grad: bool = param(False, switch="false (code: features detached, L_cen adds no gradient) | true (paper)")
    weighting: str = param("uniform", choices=("uniform", "size"),
                           switch="'uniform' (code: plain mean of client models) | 'size' (n_k weights)")
    fg_init: str = param("random", choices=("random", "round0_mean"),
                         switch="'random' (code: round-0 centroids weighted by cosine to a random f_G, tiny "
                                "denominators -> 1) | 'round0_mean' (plain mean of round-0 client centroids)")

    def check_training(self, settings) -> None:
        check_rounds_left(self, "t_pl", settings, "(pseudo-labels would never be used); lower t_pl")


# -- schedules -----------------------------------------------------------------------------


def forget_rate_at(t: int, rate: float, ramp_rounds: int) -> float:
    """r_t: linspace(0, rate, ramp_rounds)[t] during the ramp, then ``rate`` (0, 0.0222, ..., 0.2 for 10 rounds)."""
    if t >= ramp_rounds:
        return rate
    return rate * t / (ramp_rounds - 1) if ramp_rounds > 1 else 0.0


# -- pure parts ----------------------------------------------------------------------------


def class_means(features: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(C, d) mean feature per label; a class without samples gets the zero vector."""
    sums = torch.zeros(num_classes, features.shape[1], dtype=features.dtype, device=features.device)
    sums.index_add_(0, labels, features)
    return sums / torch.bincount(labels, minlength=num_classes).to(features.dtype).clamp_min(1).unsqueeze(1)


def aggregate_centroids(global_old: torch.Tensor, client_centroids: torch.Tensor) -> torch.Tensor:
    """f_G[c] = Σ_k s_kc f_k[c] / Σ_k s_kc, s_kc = cos(f_G_old[c], f_k[c]); (K, C, d) clients. The cosines to a
    random f_G (round 0) are ≈ 0 with mixed signs: a denominator below 1e-8 in magnitude is replaced by 1 (spec
    A4(d)'s guard) instead of dividing by ~0."""
    s = F.cosine_similarity(global_old.unsqueeze(0), client_centroids, dim=2)  # (K, C)
    num = (s.unsqueeze(2) * client_centroids).sum(0)
    den = s.sum(0)
    den = torch.where(den.abs() < DENOMINATOR_GUARD, torch.ones_like(den), den)
    return num / den.unsqueeze(1)


def nearest_centroid(features: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """argmax_c cos(f[c], φ_i) for every row of ``features`` (K, B, d) against its client's ``centroids``
    (K, C, d) -> (K, B) (one batched matmul of unit vectors; also (B, d) against (C, d))."""
    return (F.normalize(features, dim=-1) @ F.normalize(centroids, dim=-1).transpose(-1, -2)).argmax(-1)


def keep_counts(rows: torch.Tensor, forget_rate: float) -> torch.Tensor:
    """(K,) ⌊(1 − r)|B_k|⌋ (at least one) of each client's real rows, computed as in Python floats
    (float64 here); a client without rows (a rider) keeps none."""
    keep = torch.floor(rows.double() * (1.0 - forget_rate)).clamp_min(1)
    return torch.where(rows > 0, keep, torch.zeros_like(keep))


class BatchLoss(NamedTuple):
    loss: torch.Tensor  # (K,)
    order: torch.Tensor  # (K, B) rows sorted by loss: the tensors below are in this order
    kept: torch.Tensor  # (K, B) bool: the selected rows
    targets: torch.Tensor  # (K, B) y*
    mask: torch.Tensor  # (K, B) bool m_i (False outside the selection)


def rofl_loss(logits: torch.Tensor, features: torch.Tensor, labels: torch.Tensor, pseudo: torch.Tensor,
              centroids: torch.Tensor, forget_rate: float, lambda_cen: float, lambda_e: float,
              use_pseudo: bool, cen_grad: bool, rows: torch.Tensor | None) -> BatchLoss:
    """RoFL's local objective (§5 step 3) of K clients: logits (K, B, C), features (K, B, d), labels
    and global pseudo-labels (K, B), centroids (K, C, d), ``rows`` (K, B) real rows or None; one
    loss per client."""
    k, b, c = logits.shape
    per_sample = F.cross_entropy(logits.reshape(k * b, c), labels.reshape(-1), reduction="none").view(k, b)
    keep = keep_counts(torch.full((k,), b, device=logits.device) if rows is None else rows.sum(1), forget_rate)
    order, kept = small_loss_order(per_sample, keep, rows)
    z, y = logits.gather(1, order[:, :, None].expand(k, b, c)), labels.gather(1, order)
    f = features.gather(1, order[:, :, None].expand(k, b, features.shape[2]))
    phi = f if cen_grad else f.detach()
    mask = (nearest_centroid(phi.detach(), centroids) == y) & kept
    targets = torch.where(mask, y, pseudo.gather(1, order)) if use_pseudo else y
    ce = F.cross_entropy(z.reshape(k * b, c), targets.reshape(-1), reduction="none").view(k, b)
    l_c = masked_mean(ce, kept)  # over the keep_k kept rows
    dist = (mask.unsqueeze(2) * (phi - centroids.gather(1, y[:, :, None].expand(k, b, phi.shape[2]))).pow(2)).sum(2)
    l_cen = torch.where(kept, dist, torch.zeros((), dtype=dist.dtype, device=dist.device)).sum(1)
    log_p = F.log_softmax(z, dim=2)
    l_e = masked_mean(-(numerics.exp(log_p) * log_p).sum(2), kept)  # mean entropy
    return BatchLoss(l_c + lambda_cen * l_cen + lambda_e * l_e, order, kept, targets, mask)


def update_centroids(centroids: torch.Tensor, features: torch.Tensor, labels: torch.Tensor,
                     kept: torch.Tensor) -> torch.Tensor:
    """§5 step 4 for K clients: f[c] <- (1 − s²) f[c] + s² f̂_c, s = cos(f[c], f̂_c), f̂_c the mean of
    the kept rows of class c (zero, f[c] unchanged, when there are none); centroids (K, C, d), the
    rows' features (K, B, d) and labels (K, B), ``kept`` (K, B); the class sums add the rows in order."""
    k, c, d = centroids.shape
    # Rows not kept go to one spare slot (k * c), dropped after: fixed shapes, no device sync; each
    # real slot still adds its rows in their order.
    slot = torch.where(kept, torch.arange(k, device=labels.device)[:, None] * c + labels, k * c).reshape(-1)
    sums = torch.zeros(k * c + 1, d, dtype=features.dtype, device=features.device).index_add_(
        0, slot, features.reshape(-1, d))[: k * c]
    counts = torch.bincount(slot, minlength=k * c + 1)[: k * c].to(features.dtype)
    means = (sums / counts.clamp_min(1).unsqueeze(1)).view(k, c, d)
    s2 = F.cosine_similarity(centroids, means, dim=2).pow(2).unsqueeze(2)
    return (1 - s2) * centroids + s2 * means


@torch.no_grad()
def logits_and_features(ctx, model: torch.nn.Module, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eval-mode logits and penultimate features of training samples ``idx`` (no augmentation)."""
    model.eval()
    batches = ctx.data.train.batches(idx, ctx.settings.eval_batch_size)
    outs = [forward_bounded(model, ctx.pipeline.eval(xb), model.forward_features) for xb, _ in batches]
    return torch.cat([z.float() for z, _ in outs]), torch.cat([f.float() for _, f in outs])


@METHODS.register
class RoFL(FLMethod):
    Params = RoFLParams
    paper = "Yang et al. 2022; baseline in FedNoRo and (via FedCorr) FedDiv"

    persistent = ("f_g",)

    def __init__(self, params: RoFLParams, ctx):
        super().__init__(params, ctx)
        # f_G: standard normal, from a generator seeded off the run's method stream (no global RNG)
        gen = torch.Generator().manual_seed(int(ctx.rng.randint(0, 2**31 - 1)))
        self.f_g = torch.randn(ctx.data.num_classes, self.global_model.feature_dim, generator=gen).to(ctx.device)
        self._pseudo = torch.zeros(len(ctx.data.train), dtype=torch.int64, device=ctx.device)
        # a chunk's centroids (K, C, d) and its last step's (features, labels, kept) in loss order
        self._chunk_centroids: torch.Tensor | None = None
        self._chunk_step: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def aggregation_weight(self, upd: ClientUpdate) -> float:
        return float(upd.num_samples) if self.params.weighting == "size" else 1.0

    def begin_round(self, r: int) -> None:
        super().begin_round(r)
        p = self.params
        self._forget = forget_rate_at(r, p.forget_rate, p.forget_ramp_rounds)
        self._lambda_cen = linear_ramp(r, p.lambda_cen, p.t_pl)
        self._counts = torch.zeros(3, dtype=torch.float64, device=self.ctx.device)  # selected, masked, changed
        self.round_info.update(forget_rate=self._forget, lambda_cen=self._lambda_cen)

    def prepare(self, r, k, nets):
        """Global pseudo-labels of the client's samples and its starting centroids (§5 steps 1-2)."""
        ctx = self.ctx
        idx = ctx.data.clients[k]
        logits, feats = logits_and_features(ctx, self.global_model, idx)
        dev_idx = idx.to(ctx.device)
        self._pseudo[dev_idx] = logits.argmax(1)
        centroids = class_means(feats, ctx.data.given[dev_idx], ctx.data.num_classes) if r == 0 else self.f_g.clone()
        # the train augmentation declared as the "weak" view: the loss runs forward_features on it
        return LocalJob(phases=[Phase(augment="raw", views=("weak",))], info={"centroids": centroids})

    def upload(self, r, k, job, nets):
        return {"centroids": job.info["centroids"]}

    # the one loss form over a chunk of K clients (the sequential engine: K = 1), with its hooks
    def begin_chunk(self, r, clients, jobs):
        self._chunk_centroids = torch.stack([job.info["centroids"] for job in jobs])

    def loss(self, sb):
        p = self.params
        k, b = sb.idx.shape
        labels = self.ctx.data.given[sb.idx]
        logits, feats = sb.forward_features(sb.views["weak"])
        out = rofl_loss(logits, feats, labels, self._pseudo[sb.idx], self._chunk_centroids,
                        self._forget, self._lambda_cen, p.lambda_e, sb.r >= p.t_pl, p.cen_grad, sb.mask)
        f = feats.detach().float().gather(1, out.order[:, :, None].expand(k, b, feats.shape[2]))
        y = labels.gather(1, out.order)
        self._chunk_step = (f, y, out.kept)
        self._counts += torch.stack([out.kept.sum().double(), out.mask.sum().double(),
                                     ((out.targets != y) & out.kept).sum().double()])
        return out.loss

    def after_step(self, sb, stepped):
        """§5 step 4 on the step's selected features, for the clients that stepped."""
        feats, labels, kept = self._chunk_step
        new = update_centroids(self._chunk_centroids, feats, labels, kept)
        self._chunk_centroids = torch.where(stepped[:, None, None], new, self._chunk_centroids)
        self._chunk_step = None

    def end_chunk(self, r, clients, jobs):
        for job, centroids in zip(jobs, self._chunk_centroids):
            job.info["centroids"] = centroids.clone()
        self._chunk_centroids = None

    stages = {"main": Stage(prepare=prepare, upload=upload, loss=loss, begin=begin_chunk, after_step=after_step,
                            end=end_chunk)}

    def aggregate(self, r: int, updates) -> None:
        stacked = torch.stack([u.uploads["centroids"] for u in self.fedavg(updates)])
        round0_mean = r == 0 and self.params.fg_init == "round0_mean"
        self.f_g = stacked.mean(0) if round0_mean else aggregate_centroids(self.f_g, stacked)

    def end_round(self, r: int) -> None:
        selected, masked, changed = self._counts.tolist()
        if selected:
            self.round_info.update(rofl_mask_rate=masked / selected, rofl_pseudo_target_rate=changed / selected)
