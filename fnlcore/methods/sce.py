"""FedAvg with the symmetric cross-entropy (Wang et al., ICCV 2019) as the local loss.

SCE = alpha CE + beta RCE, the reverse CE RCE = -sum_c p_c log q_c of the prediction p against the
one-hot label q, whose log 0 is a constant A: RCE = -A (1 - p_y) (p clamped to [1e-7, 1]).
[CODE≠PAPER] ``log_zero``: 'code' (default: the official code clamps the one-hot label to
[1e-4, 1], so A = log 1e-4 ~ -9.21, as RHFL's port also does) | 'paper' (the text's A = -4).
Defaults alpha 0.1, beta 1.0: the paper's CIFAR-10 values (CIFAR-100: alpha 6.0, beta 0.1).
"""

from __future__ import annotations

from dataclasses import dataclass

from .api import clients_mean, FLMethod, MethodParams, param, METHODS, Stage
from .symmetric_ce import LOG_ZERO, sce_per_sample

@dataclass(frozen=True)
class SCEParams(MethodParams):
    name = "sce"
    slug_fields = ("alpha", "beta")
    alpha: float = param(0.1, ge=0, doc="weight of CE")
    beta: float = param(1.0, ge=0, doc="weight of the reverse CE")
    log_zero: str = param("code", choices=tuple(LOG_ZERO),
                          switch="'code' (A = log 1e-4, the official clamp) | 'paper' (A = -4, the text)")


@METHODS.register
class SCE(FLMethod):
    Params = SCEParams
    paper = "Wang et al., ICCV 2019 (symmetric cross-entropy); FedAvg's server; FNBench baseline"

    def loss(self, sb):  # each client's mean per-sample loss over its real rows
        p = self.params
        per = sce_per_sample(sb.logits.flatten(0, 1), self.labels(sb.idx.reshape(-1)), p.alpha, p.beta,
                             LOG_ZERO[p.log_zero])
        return clients_mean(sb, per)

    stages = {"main": Stage(loss=loss)}
