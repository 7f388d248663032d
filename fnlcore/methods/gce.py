"""FedAvg with the generalized cross-entropy (Zhang & Sabuncu, NeurIPS 2018) as the local loss:
L_q = (1 - p_y^q) / q, CE as q -> 0, MAE at q = 1; the paper's q = 0.7 (FedNoisy's GCE baseline keeps
it). The truncated variant (L_q cut at a loss threshold, with its pruning epochs) is not ported."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .api import clients_mean, FLMethod, MethodParams, param, METHODS, Stage


@dataclass(frozen=True)
class GCEParams(MethodParams):
    name = "gce"
    slug_fields = ("q",)
    q: float = param(0.7, gt=0, le=1, doc="the exponent q of L_q: 0 < q <= 1 (1: mean absolute error)")


def gce_per_sample(logits: torch.Tensor, y: torch.Tensor, q: float) -> torch.Tensor:
    """(1 - p_y^q) / q of each row (N, C) logits, y (N,)."""
    return (1.0 - F.softmax(logits, dim=1).gather(1, y[:, None]).squeeze(1).pow(q)) / q


@METHODS.register
class GCE(FLMethod):
    Params = GCEParams
    paper = "Zhang & Sabuncu, NeurIPS 2018 (generalized cross-entropy); FedAvg's server; FNBench and FedNoisy baseline"

    def loss(self, sb):  # the one loss form: each client's mean over its real rows -> (K,)
        per = gce_per_sample(sb.logits.flatten(0, 1), self.labels(sb.idx.reshape(-1)), self.params.q)
        return clients_mean(sb, per)

    stages = {"main": Stage(loss=loss)}
