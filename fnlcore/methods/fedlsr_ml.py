"""FedLSR as FedMLP's code ports it to multi-label partial labels (baselines.md §7 note 5, fedmlp.md §6).

Per mini-batch: two independent weak views (the run's training augmentation), logits z1, z2;
- mixed prediction p = lam sigma(z1) + (1 - lam) sigma(z2), lam ~ Beta(1, 1) once per batch;
- per-class sharpening p_s = sigma(2 logit(p)) = p^2 / (p^2 + (1 - p)^2);
- L_cls = BCE-with-logits(p_s, y) with pos_weight N_k / n_c^+ over ALL classes, missing classes
  0, sum / (B C) as FedMLP's FedAvg loss: the code feeds the already-sigmoided p_s to a
  with-logits loss, a weak signal (BCEwl(1, 1) = log(1 + e^-1) = 0.3133, not 0), reproduced;
- L_js = JS(q1, q2) on q = clamp(sigma(3 z), 1e-6, 1), element-wise as single-label FedLSR
  (each KL summed over entries / (B C)); no entropy term (absent in FedMLP's version);
- L = L_cls + beta_t L_js, beta_t = gamma min(r / t_w, 1) (0.4, 40 rounds: FedMLP's code default).
Decisions where the spec is silent: the BCE reduction is FedMLP's FedAvg one (sum / (B C), B the
nominal batch size); q is clamped at 1e-6 as in single-label FedLSR, so the logarithms stay finite.
Switch: ``cls_on_probs`` true (code: with-logits loss on probabilities) | false (BCE on p_s itself).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .api import FLMethod, MethodParams, on, param, METHODS, StackedBatch, Stage
from .self_regularisation import js_elementwise, two_weak_views


@dataclass(frozen=True)
class FedLSRMLParams(MethodParams):
    name = "fedlsr_ml"
    slug_fields = ("t_w",)
    gamma: float = param(0.4, ge=0, doc="JS weight after the ramp")
    t_w: int = param(40, ge=1, rounds=True, doc="ramp length in rounds (FedMLP's code default 40 of 500)")
    distill_temperature: float = param(1 / 3, gt=0, doc="T_d: the JS term compares sigma(z / T_d)")
    cls_on_probs: bool = param(True,
                               switch="true (FedMLP's code: BCE-with-logits applied to the sharpened probabilities) | "
                                      "false (BCE on the sharpened probabilities)")


def sharpen_binary(p: torch.Tensor) -> torch.Tensor:
    """sigma(2 logit(p)) = p^2 / (p^2 + (1 - p)^2), per entry."""
    s, t = p * p, (1 - p) * (1 - p)
    return s / (s + t)


def ramp(r: int, gamma: float, t_w: int) -> float:
    return gamma * min(r / t_w, 1.0)


def fedlsr_ml_loss(z1, z2, y, pos_weight, lam, beta_t: float, batch_size: int, p: FedLSRMLParams,
                   mask: torch.Tensor | None = None) -> torch.Tensor:
    """The loss of K clients: logits z and targets y (K, B, C), pos_weight (K, C), lam (K,) (each
    client's batch draw), mask (K, B) real rows or None -> (K,)."""
    z1, z2 = z1.float(), z2.float()
    lam = lam.to(z1.dtype)[..., None, None]
    ps = sharpen_binary(lam * torch.sigmoid(z1) + (1.0 - lam) * torch.sigmoid(z2))
    pw = pos_weight.unsqueeze(-2)  # over the rows
    if p.cls_on_probs:
        per = F.binary_cross_entropy_with_logits(ps, y, pos_weight=pw, reduction="none")
    else:
        per = F.binary_cross_entropy(ps, y, reduction="none") * (1 + (pw - 1) * y)
    if mask is not None:
        per = torch.where(mask[..., None], per, torch.zeros((), dtype=per.dtype, device=per.device))
    cls = per.sum((-2, -1)) / (batch_size * z1.shape[-1])
    scale = 1.0 / p.distill_temperature
    q1, q2 = (torch.sigmoid(z * scale).clamp(1e-6, 1.0) for z in (z1, z2))
    return cls + beta_t * js_elementwise(q1, q2, mask)


@METHODS.register
class FedLSRML(FLMethod):
    Params = FedLSRMLParams
    paper = "Jiang et al. (CIKM'22) as FedMLP's code ports it; baseline in FedMLP"
    label_kinds = ("multi",)

    def loss(self, sb: StackedBatch):
        p = self.params
        z1, z2 = sb.forward(sb.views["weak:1"]), sb.forward(sb.views["weak:2"])
        y = self.multi_label_targets(sb.idx)
        lam = on(sb.draws[0], z1.device)  # the batch's lam, (K,) (the sequential engine's stays on the host)
        return fedlsr_ml_loss(z1, z2, y, self.pos_weights()[sb.clients], lam, ramp(sb.r, p.gamma, p.t_w),
                              self.ctx.settings.batch_size, p, sb.mask)

    stages = {"main": Stage(prepare=two_weak_views, loss=loss)}  # FedLSR's two weak views and lam draw
