"""FedLSR (Jiang et al., CIKM'22; baselines.md §7): local self-regularisation on two views, FedAvg server.

Per mini-batch: two independent weak views x, x' (the run's training augmentation;
FedNoRo's mild view is not stated, A), logits z1, z2;
- tempered probabilities q_i = clamp(softmax(z_i / T_d), 1e-6, 1), T_d = 1/3;
- mixed prediction p = lam softmax(z1) + (1 - lam) softmax(z2), lam ~ Beta(1, 1) once per
  batch, sharpened p_s = p^2 / sum p^2;
- L = L_cls + gamma_t JS(q1, q2) + lambda_e L_e, gamma_t = gamma t / t_w before round t_w.
The official code's choices are the defaults, the paper-intended forms switches:
- ``cls_on_probs`` true (code: CE applied to p_s as if it were logits, a double softmax with a
  weak signal: -log(e/(e+1)) = 0.3133 for a one-hot p_s on 2 classes) | false (-log p_s[y]);
- JS uses element-wise-mean KL (divides by B*C, the code's reduction);
- ``entropy_on`` 'tempered_probs' (code: entropy of softmax(q1), original view only) | 'logits'
  (entropy of softmax(z1)). ``lambda_e`` 0.6 (FedNoRo's source, the official demo); 0 drops L_e.
Single-label only; FedMLP's multi-label port is a different loss (not here).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .api import FLMethod, masked_mean, MethodParams, on, param, METHODS, StackedBatch, Stage
from .api import numerics
from .parts import linear_ramp
from .self_regularisation import js_elementwise, two_weak_views


@dataclass(frozen=True)
class FedLSRParams(MethodParams):
    name = "fedlsr"
    slug_fields = ("t_w",)
    gamma: float = param(0.4, ge=0, doc="JS weight after the ramp")
    t_w: int = param(20, ge=1, rounds=True, doc="ramp length in rounds (FedNoRo: 20 ICH, 60 ISIC = 0.2 x rounds)")
    distill_temperature: float = param(1 / 3, gt=0, doc="T_d (logits divided by it)")
    lambda_e: float = param(0.6, ge=0, doc="entropy weight (0 = no entropy term)")
    cls_on_probs: bool = param(True,
                               switch="true (code: CE on the sharpened probabilities as logits) | false (paper: -log "
                                      "p_s[y])")
    entropy_on: str = param("tempered_probs", choices=("tempered_probs", "logits"),
                            switch="'tempered_probs' (code: entropy of softmax(q1)) | 'logits' (entropy of "
                                   "softmax(z1))")


def sharpen_square(p: torch.Tensor) -> torch.Tensor:
    """p^2 / sum p^2 over the classes (temperature 1/2)."""
    s = p * p
    return s / s.sum(-1, keepdim=True)


def fedlsr_loss(z1, z2, y, lam, gamma_t: float, p: FedLSRParams, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The FedLSR loss of K clients: logits z (K, B, C) of the two views, labels y (K, B), lam (K,)
    (each client's batch draw), mask (K, B) real rows or None -> (K,)."""
    scale = 1.0 / p.distill_temperature
    q1, q2 = (F.softmax(z * scale, dim=-1).clamp(1e-6, 1.0) for z in (z1, z2))
    lam = lam.to(z1.dtype)[..., None, None]
    ps = sharpen_square(lam * F.softmax(z1, dim=-1) + (1.0 - lam) * F.softmax(z2, dim=-1))
    logits = ps if p.cls_on_probs else ps.clamp_min(1e-12).log()
    per = (F.cross_entropy if p.cls_on_probs else F.nll_loss)(logits.flatten(0, -2), y.reshape(-1), reduction="none")
    loss = masked_mean(per.view(y.shape), mask) + gamma_t * js_elementwise(q1, q2, mask)
    if p.lambda_e > 0:
        target = F.softmax(q1, dim=-1) if p.entropy_on == "tempered_probs" else F.softmax(z1, dim=-1)
        entropy = -(target * numerics.log(target.clamp_min(1e-12))).sum(-1)
        loss = loss + p.lambda_e * masked_mean(entropy, mask)
    return loss


@METHODS.register
class FedLSR(FLMethod):
    Params = FedLSRParams
    paper = "Jiang et al. (CIKM'22); baseline in FedNoRo and FedMLP"

    def loss(self, sb: StackedBatch):
        z1, z2 = sb.forward(sb.views["weak:1"]), sb.forward(sb.views["weak:2"])
        y = self.labels(sb.idx)
        lam = on(sb.draws[0], z1.device)  # the batch's lam, (K,) (the sequential engine's stays on the host)
        return fedlsr_loss(z1, z2, y, lam, linear_ramp(sb.r, self.params.gamma, self.params.t_w), self.params, sb.mask)

    stages = {"main": Stage(prepare=two_weak_views, loss=loss)}
