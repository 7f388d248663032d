"""CBAFed (Li et al., CVPR'23) as FedMLP's code adapts it to partial labels (baselines.md §18, fedmlp.md §6).

Client k (annotated classes A_k, missing M_k), one weak view; L_sup = FedAvg-PL's BCE-with-logits
(pos_weight N_k / n_c^+) over A_k, sum / (B |A_k|), B nominal.

- Warm-up, r < warmup_rounds (50): L = L_sup. Server: FedAvg by N_k, except at rounds r = P, 2P, ...
  < warmup_rounds (P = period, 5): w <- 0.2 FedAvg + 0.8 w_rec, then w_rec <- w; w_rec starts as the
  round-0 FedAvg result.
- Class thresholds (server), after round warmup_rounds - 1 and every later round, from the round's
  client counts: p_c = sum_k count_kc / sum_k data_k, tau_c = clip(p_c + base - std(p), tau_min,
  tau_max) (std over classes, unbiased). count_kc += the batch size for an annotated c, += |P_c u Q_c|
  for a missing c (below); data_k accumulates the same entries (data_k = sum_c count_kc, so p is the
  class distribution of the labels and pseudo-labels used).
- Stage 2, r >= warmup_rounds, per batch on the local model's own training-forward probabilities
  (no gradient through the selection), for each missing c: P_c = {sigma(z_ic) > tau_c} (label 1),
  Q_c = {sigma(z_ic) < 1 - tau_c} (label 0); pos_weight_c = |P_c u Q_c| / |P_c| (1 when P_c is empty);
  L = L_sup + sum_{c in M_k} mean_{i in P_c u Q_c} BCE_pw(z_ic, label_ic) (a class with nothing
  selected adds 0). Server: FedAvg weighted by data_k; at r = warmup_rounds w_rec <- that aggregate;
  at r > warmup_rounds with (r - warmup_rounds) mod P = 0: w <- 0.5 new + 0.5 w_rec, w_rec <- w.

Decisions where the spec is silent: "data_k accumulates the same entries" is read as data_k =
sum_c count_kc (label entries used, not samples); the pos weight is per batch (the code's client-
persistent value only matters in batches with positives, where it is recomputed); integer buffers of
a residual mix come from the new aggregate.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .api import FLMethod, load, MethodParams, param, METHODS, snapshot, StackedBatch, Stage, weighted_average
from .multilabel import annotated_bce
from .parts import check_rounds_left


@dataclass(frozen=True)
class CBAFedParams(MethodParams):
    name = "cbafed"
    slug_fields = ("warmup_rounds",)
    warmup_rounds: int = param(50, ge=1, rounds=True, doc="supervised warm-up rounds")
    period: int = param(5, ge=1, rounds=True, doc="rounds between residual aggregations")
    base: float = param(0.45, doc="threshold offset: tau_c = p_c + base - std(p)")
    tau_min: float = param(0.55, ge=0.5, le=1, doc="lower clip of the class thresholds")
    tau_max: float = param(0.95, ge=0.5, le=1, doc="upper clip of the class thresholds")
    residual_warmup: float = param(0.2, ge=0, le=1, doc="share of the new aggregate in a warm-up residual step")
    residual_after: float = param(0.5, ge=0, le=1, doc="share of the new aggregate in a stage-2 residual step")

    def validate(self) -> None:
        if self.tau_min > self.tau_max:
            raise self.error("tau_min", f"is larger than tau_max={self.tau_max}; swap them")

    def check_training(self, settings) -> None:
        check_rounds_left(self, "warmup_rounds", settings)


# -- pure rules ------------------------------------------------------------------------------


def class_thresholds(counts: torch.Tensor, total: float, base: float, lo: float, hi: float) -> torch.Tensor:
    """tau_c = clip(p_c + base - std(p), lo, hi), p = counts / total, std unbiased over classes."""
    p = counts.double() / total
    std = p.std(unbiased=True) if len(p) > 1 else torch.zeros((), dtype=p.dtype)
    return (p + base - std).clamp(lo, hi)


def residual_mix(new, rec, share_new: float):
    """share_new * new + (1 - share_new) * rec on float entries (integer entries from ``new``)."""
    return weighted_average([new, rec], [share_new, 1.0 - share_new]) if share_new < 1 else dict(new)


def select_missing(p: torch.Tensor, tau: torch.Tensor, missing: torch.Tensor):
    """(positives, confident negatives), bool: p > tau_c / p < 1 - tau_c where ``missing`` (the
    missing classes, broadcast against p: (K, B, C) probabilities, (C,) thresholds)."""
    m = missing.bool()
    return (p > tau) & m, (p < 1 - tau) & m


def missing_class_loss(z: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """sum_c mean_{i in P_c u Q_c} BCE_pw(z_ic, 1[i in P_c]), pw_c = |P_c u Q_c| / |P_c| (1 if P_c is
    empty), of K clients: (K, B, C) logits and selections (real rows only) -> (K,)."""
    sel = (pos | neg).float()
    n_sel, n_pos = sel.sum(1), pos.float().sum(1)
    pw = torch.where(n_pos > 0, n_sel / n_pos.clamp_min(1), torch.ones_like(n_pos))
    per = F.binary_cross_entropy_with_logits(z.float(), pos.float(), pos_weight=pw[:, None, :], reduction="none")
    return ((per * sel).sum(1) / n_sel.clamp_min(1)).sum(1)


# -- the method --------------------------------------------------------------------------------


@METHODS.register
class CBAFed(FLMethod):
    Params = CBAFedParams
    paper = "Li et al. CVPR'23 (CBAFed), as FedMLP (MICCAI'24) adapts it to partial labels"
    label_kinds = ("multi",)
    persistent = ("w_rec", "thresholds")

    def __init__(self, params: CBAFedParams, ctx):
        super().__init__(params, ctx)
        params.check_training(ctx.settings)
        self.thresholds: torch.Tensor | None = None  # (C,)
        self.w_rec: dict | None = None
        self._tally: tuple[torch.Tensor, torch.Tensor] | None = None  # a chunk's (K,) rows, (K, C) pseudo-labels

    def stage_name(self, r: int) -> str:
        return "warmup" if r < self.params.warmup_rounds else "pseudo"

    def upload(self, r, k, job, nets):
        pseudo = job.info["pseudo"].double().cpu()
        counts = self.active[k].double().cpu() * job.info["active"] + pseudo
        return {"counts": counts, "data": float(counts.sum()), "pseudo": float(pseudo.sum())}

    # the one loss form over a chunk of K clients (the sequential engine: K = 1), with its hooks
    def begin_chunk(self, r, clients, jobs):
        # the chunk's label entries used (the batch sizes on the annotated classes, pseudo-labels on the
        # missing ones), written into each job's info at its end
        k, c, dev = len(clients), self.ctx.data.num_classes, self.ctx.device
        self._tally = (torch.zeros(k, dtype=torch.int64, device=dev), torch.zeros(k, c, device=dev))

    def _supervised(self, sb: StackedBatch) -> torch.Tensor:
        self._tally[0].add_(sb.idx.shape[1] if sb.mask is None else sb.mask.sum(1))
        return annotated_bce(self, sb, sb.logits)

    def pseudo_loss(self, sb: StackedBatch):
        loss = self._supervised(sb)
        p = torch.sigmoid(sb.logits.detach().float())
        tau = self.thresholds.to(self.ctx.device, torch.float32, non_blocking=True)
        missing = (self.active[sb.clients] == 0)[:, None, :]
        if sb.mask is not None:
            missing = missing & sb.mask[:, :, None]  # padded rows select nothing
        pos, neg = select_missing(p, tau, missing)
        self._tally[1].add_((pos | neg).float().sum(1))
        return loss + missing_class_loss(sb.logits, pos, neg)

    def end_chunk(self, r, clients, jobs):
        rows, pseudo = self._tally
        for job, n, counts in zip(jobs, rows.tolist(), pseudo):
            job.info = {"active": n, "pseudo": counts}

    _hooks = dict(upload=upload, begin=begin_chunk, end=end_chunk)
    stages = {"warmup": Stage(loss=_supervised, **_hooks), "pseudo": Stage(loss=pseudo_loss, **_hooks)}

    def aggregate(self, r, updates):
        p, w = self.params, self.params.warmup_rounds
        # warm-up: FedAvg by N_k (or the run's weighting); stage 2: by data_k, the label entries used
        ups = self.fedavg(updates, (lambda u: max(u.uploads["data"], 1e-12)) if r >= w else None)
        if r == 0 or r == w:
            self.w_rec = snapshot(self.global_model)
        elif (r if r < w else r - w) % p.period == 0:  # a residual step, in warm-up or in stage 2
            share = p.residual_warmup if r < w else p.residual_after
            self.w_rec = residual_mix(snapshot(self.global_model), self.w_rec, share)
            load(self.global_model, self.w_rec)
        data = sum(u.uploads["data"] for u in ups)
        if r >= w - 1 and data > 0:
            counts = sum(u.uploads["counts"] for u in ups)
            self.thresholds = class_thresholds(counts, data, p.base, p.tau_min, p.tau_max).float()
            self.round_info.update({f"cbafed_tau_{c}": t for c, t in enumerate(self.thresholds.tolist())})
        if r >= w:  # missing-class entries used this round
            self.round_info["cbafed_pseudo_labels"] = float(sum(u.uploads["pseudo"] for u in ups))
