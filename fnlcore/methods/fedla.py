"""FedLA: FedAvg with logit-adjusted local CE (Menon et al. 2021; baselines.md §3, fednoro.md §4.1).

Training logits z + tau * log(pi_k), pi_k = client k's class frequencies of its
current (noisy) labels; absent classes get log 0 = -inf (probability 0, no
gradient), as in FedNoRo's code. Evaluation uses raw logits.
"""

from __future__ import annotations

from dataclasses import dataclass

from .api import FLMethod, MethodParams, param, METHODS, Stage
from .logit_adjust import LogitAdjusted


@dataclass(frozen=True)
class FedLAParams(MethodParams):
    name = "fedla"
    slug_fields = ("tau",)
    tau: float = param(1.0, ge=0, doc="logit-adjustment strength")


@METHODS.register
class FedLA(LogitAdjusted, FLMethod):
    Params = FedLAParams
    paper = "FedNoRo (IJCAI'23) baseline"

    def begin_round(self, r: int) -> None:
        super().begin_round(r)
        self.refresh_priors()

    stages = {"main": Stage(loss=LogitAdjusted.la_loss)}
