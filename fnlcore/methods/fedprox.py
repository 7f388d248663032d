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

from .api import FLMethod, MethodParams, param, parameter_keys, METHODS, snapshot, Stage
from .parts import add_proximal


@dataclass(frozen=True)
class FedProxParams(MethodParams):
    name = "fedprox"
    slug_fields = ("mu",)
    mu: float = param(0.01, ge=0, doc="proximal weight")
    form: str = param("squared_half", choices=("squared_half", "fedcorr_unsquared"),
                      switch="'squared_half' (paper: mu/2 ||w - w_g||^2) | 'fedcorr_unsquared' (FedCorr code: mu ||w - "
                             "w_g||, behind FedDiv's copied numbers)")
    skip_first_batch: bool = param(False,
                                   switch="false | true (Fed-NCL and FedCorr code skip the term on batch 0 of every "
                                          "epoch)")


@METHODS.register
class FedProx(FLMethod):
    Params = FedProxParams
    paper = "Li et al. 2020; baseline in FedNoRo, Fed-NCL, FedGR, FedDiv"

    def begin_round(self, r: int) -> None:
        super().begin_round(r)
        self._ref = snapshot(self.global_model)
        self._keys = parameter_keys(self.global_model)

    def loss(self, sb):
        loss = super().loss(sb)
        p = self.params
        if p.mu <= 0:
            return loss
        skip = sb.epoch_step_host == 0 if p.skip_first_batch else None
        return add_proximal(loss, sb, self._ref, self._keys, p.mu, p.form, skip)

    stages = {"main": Stage(loss=loss)}
