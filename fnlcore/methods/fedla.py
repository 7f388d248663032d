"""FedLA: FedAvg with logit-adjusted local CE (Menon et al. 2021; baselines.md §3, fednoro.md §4.1).

Training logits z + tau * log(pi_k), pi_k = client k's class frequencies of its
current (noisy) labels; absent classes get log 0 = -inf (probability 0, no
gradient), as in FedNoRo's code. Evaluation uses raw logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..registry import param
from ..fl.batched import masked_mean
from .base import FLMethod, MethodParams, register


@dataclass(frozen=True)
class FedLAParams(MethodParams):
    name = "fedla"
    slug_fields = ("tau",)
    tau: float = param(1.0, ge=0, doc="logit-adjustment strength")


def log_priors(counts: torch.Tensor) -> torch.Tensor:
    """(K, C) counts -> log class frequencies per client (-inf where a class is absent)."""
    return torch.log(counts / counts.sum(1, keepdim=True).clamp_min(1)).float()


def la_cross_entropy(logits: torch.Tensor, y: torch.Tensor, log_prior: torch.Tensor, tau: float) -> torch.Tensor:
    return F.cross_entropy(logits + tau * log_prior, y)


class LogitAdjusted:
    """Mixin: client log-priors from the current given labels, recomputed at each round start."""

    def refresh_priors(self) -> None:
        self.log_prior = log_priors(self.ctx.data.class_counts())


@register
class FedLA(LogitAdjusted, FLMethod):
    Params = FedLAParams
    paper = "FedNoRo (IJCAI'23) baseline"
    # FedAvg's local work with a shifted CE (benchmarks/README.md, bench_methods.py measured
    # 0.54-0.78x: the noise of a 0.15 s round)
    round_cost = 1.0

    def begin_round(self, r: int) -> None:
        super().begin_round(r)
        self.refresh_priors()

    def loss(self, model, x, idx, step, k, r):
        return la_cross_entropy(model(x), self.labels(idx), self.log_prior[k], self.params.tau)

    def batched_loss(self, logits, idx, mask, clients, r):
        k, b, c = logits.shape
        z = logits + self.params.tau * self.log_prior[clients][:, None, :]
        per = F.cross_entropy(z.reshape(k * b, c), self.labels(idx.reshape(-1)), reduction="none")
        return masked_mean(per.view(k, b), mask)
