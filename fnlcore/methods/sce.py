"""FedAvg with the symmetric cross-entropy (Wang et al., ICCV 2019) as the local loss.

SCE = alpha CE + beta RCE, the reverse CE RCE = -sum_c p_c log q_c of the prediction p against the
one-hot label q, whose log 0 is a constant A: RCE = -A (1 - p_y) (p clamped to [1e-7, 1]).
[CODE≠PAPER] ``log_zero``: 'code' (default: the official code clamps the one-hot label to
[1e-4, 1], so A = log 1e-4 ~ -9.21, as RHFL's port also does) | 'paper' (the text's A = -4).
Defaults alpha 0.1, beta 1.0: the paper's CIFAR-10 values (CIFAR-100: alpha 6.0, beta 0.1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .api import clients_mean, FLMethod, MethodParams, param, register, Stage

LOG_ZERO = {"code": math.log(1e-4), "paper": -4.0}


@dataclass(frozen=True)
class SCEParams(MethodParams):
    name = "sce"
    slug_fields = ("alpha", "beta")
    alpha: float = param(0.1, ge=0, doc="weight of CE")
    beta: float = param(1.0, ge=0, doc="weight of the reverse CE")
    log_zero: str = param("code", choices=tuple(LOG_ZERO),
                          switch="'code' (A = log 1e-4, the official clamp) | 'paper' (A = -4, the text)")


def sce_per_sample(logits: torch.Tensor, y: torch.Tensor, alpha: float, beta: float, log_zero: float) -> torch.Tensor:
    """alpha CE + beta (-A) (1 - p_y) of each row: (N, C) logits, y (N,); 1 - p_y summed over c != y."""
    ce = F.cross_entropy(logits, y, reduction="none")
    p = F.softmax(logits, dim=1).clamp(1e-7, 1.0)
    others = p.sum(1) - p.gather(1, y[:, None]).squeeze(1)
    return alpha * ce + beta * (-log_zero) * others


@register
class SCE(FLMethod):
    Params = SCEParams
    paper = "Wang et al., ICCV 2019 (symmetric cross-entropy); FedAvg's server; FNBench baseline"

    def loss(self, sb):  # each client's mean per-sample loss over its real rows
        p = self.params
        per = sce_per_sample(sb.logits.flatten(0, 1), self.labels(sb.idx.reshape(-1)), p.alpha, p.beta,
                             LOG_ZERO[p.log_zero])
        return clients_mean(sb, per)

    stages = {"main": Stage(loss=loss)}
