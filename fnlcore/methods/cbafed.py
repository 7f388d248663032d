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

from ..errors import ConfigError
from ..fl.local import train_streams
from ..fl.state import load, snapshot, weighted_average
from ..registry import param
from .base import ClientUpdate, FLMethod, MethodParams, register
from .multilabel import client_active_classes, partial_bce


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
        if self.warmup_rounds >= settings.rounds:
            raise ConfigError(
                f"method 'cbafed': warmup_rounds={self.warmup_rounds} must be < training.rounds={settings.rounds}"
            )


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
    """(positives, confident negatives), (B, C) bool: p > tau_c / p < 1 - tau_c on missing classes."""
    m = missing.bool()[None]
    return (p > tau[None]) & m, (p < 1 - tau[None]) & m


def missing_class_loss(z: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """sum_c mean_{i in P_c u Q_c} BCE_pw(z_ic, 1[i in P_c]), pw_c = |P_c u Q_c| / |P_c| (1 if P_c is empty)."""
    sel = (pos | neg).float()
    n_sel, n_pos = sel.sum(0), pos.float().sum(0)
    pw = torch.where(n_pos > 0, n_sel / n_pos.clamp_min(1), torch.ones_like(n_pos))
    per = F.binary_cross_entropy_with_logits(z.float(), pos.float(), pos_weight=pw, reduction="none")
    return ((per * sel).sum(0) / n_sel.clamp_min(1)).sum()


# -- the method --------------------------------------------------------------------------------


@register
class CBAFed(FLMethod):
    Params = CBAFedParams
    paper = "Li et al. CVPR'23 (CBAFed), as FedMLP (MICCAI'24) adapts it to partial labels"
    label_kinds = ("multi",)

    def __init__(self, params: CBAFedParams, ctx):
        super().__init__(params, ctx)
        params.check_training(ctx.settings)
        self.active = client_active_classes(ctx.data)
        self.thresholds: torch.Tensor | None = None  # (C,)
        self.w_rec: dict | None = None
        self._counts = torch.zeros(ctx.data.num_classes, dtype=torch.float64)
        self._data = self._pseudo = 0.0

    def stage(self, r: int) -> str:
        return "warmup" if r < self.params.warmup_rounds else "pseudo"

    def begin_round(self, r: int) -> None:
        super().begin_round(r)
        self._counts = torch.zeros(self.ctx.data.num_classes, dtype=torch.float64)
        self._data = self._pseudo = 0.0

    def local_update(self, r: int, k: int) -> ClientUpdate:
        ctx = self.ctx
        load(self.worker, self.global_model.state_dict())
        idx = ctx.data.clients[k]
        active, bs = self.active[k], ctx.settings.batch_size
        missing = 1.0 - active
        pw = self.pos_weights()[k]
        pseudo = r >= self.params.warmup_rounds
        tau = self.thresholds.to(ctx.device, torch.float32) if pseudo else None
        acc = {"active": 0, "pseudo": torch.zeros(ctx.data.num_classes, device=ctx.device)}

        def loss_fn(model, batches, step):
            x, bidx = batches["x"]
            z = model(ctx.pipeline.train(x, ctx.aug_gen))
            loss = partial_bce(z, self.multi_label_targets(bidx), pw, bs, classes=active)
            acc["active"] += len(bidx)
            if pseudo:
                pos, neg = select_missing(torch.sigmoid(z.detach().float()), tau, missing)
                acc["pseudo"] += (pos | neg).float().sum(0)
                loss = loss + missing_class_loss(z, pos, neg)
            return loss

        loss = train_streams(ctx, self.worker, {"x": (idx, bs)}, loss_fn, r)
        pseudo_counts = acc["pseudo"].double().cpu()
        counts = active.double().cpu() * acc["active"] + pseudo_counts
        return ClientUpdate(k, len(idx), snapshot(self.worker), {
            "train_loss": loss, "counts": counts, "data": float(counts.sum()), "pseudo": float(pseudo_counts.sum()),
        })

    def accumulate(self, r: int, upd: ClientUpdate) -> None:
        # warm-up: FedAvg by N_k (or the run's weighting); stage 2: by data_k, the label entries used
        stage2 = r >= self.params.warmup_rounds
        weight = max(upd.uploads["data"], 1e-12) if stage2 else self.aggregation_weight(upd)
        self._round_avg.add(upd.state, weight)
        self._counts += upd.uploads["counts"]
        self._data += upd.uploads["data"]
        self._pseudo += upd.uploads["pseudo"]

    def aggregate(self, r: int) -> None:
        p = self.params
        new = self._round_avg.result(self.global_model.state_dict())
        self._round_avg = None
        w = p.warmup_rounds
        if r == 0 or r == w:
            self.w_rec = new
        elif r < w and r % p.period == 0:
            new = self.w_rec = residual_mix(new, self.w_rec, p.residual_warmup)
        elif r > w and (r - w) % p.period == 0:
            new = self.w_rec = residual_mix(new, self.w_rec, p.residual_after)
        load(self.global_model, new)
        if r >= w - 1 and self._data > 0:
            self.thresholds = class_thresholds(self._counts, self._data, p.base, p.tau_min, p.tau_max).float()
            for c, t in enumerate(self.thresholds.tolist()):
                self.round_info[f"cbafed_tau_{c}"] = t
        if r >= w:
            self.round_info["cbafed_pseudo_labels"] = self._pseudo  # missing-class entries used this round

    def state_dict(self) -> dict:
        d = super().state_dict()
        d["w_rec"] = None if self.w_rec is None else {k: v.detach().cpu().clone() for k, v in self.w_rec.items()}
        d["thresholds"] = None if self.thresholds is None else self.thresholds.detach().cpu().clone()
        return d

    def load_state_dict(self, d: dict) -> None:
        super().load_state_dict(d)
        dev = self.ctx.device
        self.w_rec = None if d["w_rec"] is None else {k: v.to(dev).clone() for k, v in d["w_rec"].items()}
        self.thresholds = None if d["thresholds"] is None else d["thresholds"].to(dev).clone()
