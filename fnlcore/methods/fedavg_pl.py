"""FedAvg-PL (FedMLP's partial-loss baseline; baselines.md §14, fedmlp.md §6).

FedAvg whose local loss is FedMLP's FedAvg BCE-with-logits (pos_weight N_k / n_c^+, true local
positive counts) restricted to the client's annotated classes A_k, sum / (B |A_k|) with B the
nominal batch size: the missing classes get no gradient. (The official code has it as the
commented alternative in ``train``; the all-class form is the engine's multi-label default,
i.e. method ``fedavg``.) A class without local positives has pos_weight 1 (the guard of
:func:`~fnlcore.methods.base.client_pos_weights`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .api import FLMethod, MethodParams, METHODS, Stage
from .multilabel import annotated_bce


@dataclass(frozen=True)
class FedAvgPLParams(MethodParams):
    name = "fedavg_pl"


@METHODS.register
class FedAvgPL(FLMethod):
    Params = FedAvgPLParams
    paper = "FedMLP (MICCAI'24) baseline: FedAvg with a partial loss on annotated classes"
    label_kinds = ("multi",)

    def loss(self, sb):
        return annotated_bce(self, sb, sb.logits)

    stages = {"main": Stage(loss=loss)}
