"""FedProx (Li et al. 2020; baselines.md §2): local loss + proximal term to the round's global model.

Forms (switch ``form``):
- ``squared_half`` (default, the paper): mu/2 * sum ||w - w_g||^2 over trainable parameters;
- ``fedcorr_unsquared``: mu * ||w - w_g||_2 (un-squared, not halved), FedCorr's code, used
  for the numbers FedDiv copied from FedCorr.
``skip_first_batch``: Fed-NCL's and FedCorr's code skip the term on batch 0 of every epoch.
With mu = 0 the method is FedAvg exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F

from ..fl.batched import masked_mean
from ..fl.state import parameter_keys, snapshot
from ..registry import param
from .base import FLMethod, MethodParams, Stage, register
from .parts import batched_proximal_term, proximal_term


@dataclass(frozen=True)
class FedProxParams(MethodParams):
    name = "fedprox"
    slug_fields = ("mu",)
    switches = {
        "form": "'squared_half' (paper: mu/2 ||w - w_g||^2) | 'fedcorr_unsquared' (FedCorr code: mu ||w - w_g||, behind FedDiv's copied numbers)",
        "skip_first_batch": "false | true (Fed-NCL and FedCorr code skip the term on batch 0 of every epoch)",
    }
    mu: float = param(0.01, ge=0, doc="proximal weight")
    form: str = param("squared_half", choices=("squared_half", "fedcorr_unsquared"))
    skip_first_batch: bool = False


@register
class FedProx(FLMethod):
    Params = FedProxParams
    paper = "Li et al. 2020; baseline in FedNoRo, Fed-NCL, FedGR, FedDiv"
    round_cost = 1.5  # benchmarks/README.md, bench_methods.py: 1.54x with FedCorr's mu = 1 form, 1.51x with mu = 0.01

    def begin_round(self, r: int) -> None:
        super().begin_round(r)
        self._ref = snapshot(self.global_model)
        self._keys = parameter_keys(self.global_model)

    def loss(self, b):
        loss = F.cross_entropy(b.model(b.x), self.labels(b.idx))
        p = self.params
        if p.mu > 0 and not (p.skip_first_batch and b.step == 0):
            loss = loss + proximal_term(b.model, self._ref, self._keys, p.mu, p.form)
        return loss

    def batched_loss(self, sb):
        k, b, c = sb.logits.shape
        per = F.cross_entropy(sb.logits.reshape(k * b, c), self.labels(sb.idx.reshape(-1)), reduction="none")
        loss = masked_mean(per.view(k, b), sb.mask)
        p = self.params
        if p.mu > 0:
            skip = sb.epoch_step == 0 if p.skip_first_batch else None
            loss = loss + batched_proximal_term(sb.net, self._ref, self._keys, p.mu, p.form, skip)
        return loss

    stages = {"main": Stage(loss=loss, batched_loss=batched_loss)}
