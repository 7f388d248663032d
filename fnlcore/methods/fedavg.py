"""FedAvg (McMahan et al. 2017; baselines.md §1): local CE, size-weighted averaging of the full state."""

from __future__ import annotations

from dataclasses import dataclass

from .base import FLMethod, MethodParams, register


@dataclass(frozen=True)
class FedAvgParams(MethodParams):
    name = "fedavg"


@register
class FedAvg(FLMethod):
    """Everything is the engine default (weighting: ``training.weighting``, size by default)."""

    Params = FedAvgParams
    paper = "McMahan et al. 2017; baseline in all five papers"
