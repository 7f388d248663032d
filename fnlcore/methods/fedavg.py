"""FedAvg (McMahan et al. 2017; baselines.md §1): local CE, size-weighted averaging of the full state.

Multi-label data: FedMLP's FedAvg loss (fedmlp.md §6), the engine default of ``FLMethod.loss``."""

from __future__ import annotations

from dataclasses import dataclass

from .api import FLMethod, MethodParams, METHODS


@dataclass(frozen=True)
class FedAvgParams(MethodParams):
    name = "fedavg"


@METHODS.register
class FedAvg(FLMethod):
    """Everything is the engine default (weighting: ``training.weighting``, size by default)."""

    Params = FedAvgParams
    label_kinds = ("single", "multi")  # multi-label: the engine's default loss (FedMLP's FedAvg)
    paper = "McMahan et al. 2017; baseline in all five papers"
