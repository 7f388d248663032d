"""FedNoRo as FedMLP's code ports it to multi-label partial labels (fedmlp.md §6 "FedNoRo").

Stage 2 only, every client treated as noisy (no detection), plain FedAvg aggregation (no
distance-aware weights). Local loss on one weak view, teacher = the received global model in
eval mode:
  L = w(r) MSE(sigma(z), sigma(z^G / T)) over the missing classes, mean over b |M_k|
      + (1 - w(r)) l_LA over the annotated classes, mean over b |A_k|,
b the actual batch size; w(r) = lambda_max exp(-5 (1 - (clip(r, r0, r1) - r0) / (r1 - r0))^2) with
lambda_max 0.8, T 0.8, r0 = 10, r1 = 499 (the code's constants for 500 rounds; they follow a scale's
change of rounds). l_LA = BCE(sigma(z + tau log(pi / (1 - pi))), y) as FedMLP's multi-label logit
adjustment, pi_c = n_c^+ / N_k the client's positive rate of each annotated class.
Decision where the spec is silent: tau = 1 and that prior (FedNoRo's LA uses the local class
distribution); a client with no missing class has no MSE term.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .api import FLMethod, MethodParams, param, METHODS, Stage
from .logit_adjust import la_shift
from .partial_label_losses import missing_distillation, wpc_loss
from .parts import gaussian_ramp_up


@dataclass(frozen=True)
class FedNoRoMLParams(MethodParams):
    name = "fednoro_ml"
    tau: float = param(1.0, ge=0, doc="logit-adjustment strength")
    kd_temperature: float = param(0.8, gt=0, doc="T: the teacher's logits are divided by it")
    lambda_max: float = param(0.8, ge=0, le=1)
    ramp_begin: int = param(10, ge=0, rounds=True, doc="r0 of w(r)")
    ramp_end: int = param(499, ge=1, rounds=True, doc="r1 of w(r) (the code's 499 of 500 rounds)")

    def validate(self) -> None:
        if self.ramp_end <= self.ramp_begin:
            raise self.error("ramp_end", f"must be larger than ramp_begin={self.ramp_begin}")


def fednoro_ml_loss(z, z_teacher, y, shift, active, w: float, temperature: float,
                    mask: torch.Tensor | None) -> torch.Tensor:
    """The loss of K clients -> (K,): z, z_teacher, y (K, B, C), shift and active (K, C), mask (K, B) real rows
    (None: all). FedMLP's two terms over b, the actual batch size: a client with no missing class has no MSE term."""
    z, z_teacher = z.float(), z_teacher.float()
    b = z.shape[1] if mask is None else mask.to(z.dtype).sum(1)
    mse = missing_distillation(torch.sigmoid(z), torch.sigmoid(z_teacher / temperature), 1.0 - active, b, mask)
    return w * mse + (1.0 - w) * wpc_loss(z, y, shift, active, b, mask)


@METHODS.register
class FedNoRoML(FLMethod):
    Params = FedNoRoMLParams
    paper = "Wu et al. (IJCAI'23) as FedMLP's code ports it; baseline in FedMLP"
    label_kinds = ("multi",)

    def __init__(self, params: FedNoRoMLParams, ctx):
        super().__init__(params, ctx)
        data = ctx.data
        shift = torch.stack([
            la_shift((data.given[idx.to(data.given.device)].float().mean(0) if len(idx) else
                      torch.zeros(data.num_classes, device=data.given.device)), params.tau)
            for idx in data.clients
        ]).to(ctx.device)
        # classes a client does not annotate get no LA shift (their prior is unused: masked out)
        self.shift = torch.where(self.active > 0, shift, torch.zeros_like(shift))

    def loss(self, sb):
        p = self.params
        zt = self.global_logits(sb).float()
        w = gaussian_ramp_up(sb.r, p.ramp_begin, p.ramp_end, p.lambda_max)  # ramp_end > ramp_begin (validate)
        y = self.multi_label_targets(sb.idx.reshape(-1)).view(sb.logits.shape)
        return fednoro_ml_loss(sb.logits, zt, y, self.shift[sb.clients], self.active[sb.clients], w, p.kd_temperature,
                               sb.mask)

    stages = {"main": Stage(loss=loss)}
