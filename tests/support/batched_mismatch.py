"""Test-only method plug-ins for the batched ≡ sequential contract (tests/test_batched_contract.py).

Written in the one-file form of tests/support/plugins.py (docs/extending.md), but NEVER
registered: this module is not named in FNL_PLUGINS and calls no ``METHODS.register``, so no
registry (hence no registry-wide test: golden records, pinned slugs, resume contracts) ever sees them.
The contract test hands the classes to its comparison directly.

* ``GCE``: FedAvg with generalized cross-entropy, L_q = (1 - p_y^q) / q (Zhang & Sabuncu 2018),
  its one loss form each client's mean over its real rows: it must pass the contract;
* ``GCEStackMean``: the same loss divided by every row of the step (K * B) instead of each
  client's own rows: right at K = 1, the sequential engine's case, and wrong on the batched
  engine, where each client's gradient shrinks by K (the mistake the contract exists for: every
  other test passes it): it must fail the contract.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fnlcore.fl.contract import masked_mean
from fnlcore.methods import FLMethod, MethodParams, Stage
from fnlcore.registry import param


def gce(logits: torch.Tensor, y: torch.Tensor, q: float) -> torch.Tensor:
    """Per-sample generalized cross-entropy (1 - p_y^q) / q of (N, C) logits."""
    p = F.softmax(logits, dim=1).gather(1, y[:, None]).squeeze(1)
    return (1 - p.clamp_min(1e-7) ** q) / q


@dataclass(frozen=True)
class GCEParams(MethodParams):
    name = "test_gce"
    slug_fields = ("q",)
    q: float = param(0.7, gt=0, le=1, doc="GCE exponent (q -> 0: cross-entropy, q = 1: MAE)")


class GCE(FLMethod):
    Params = GCEParams
    paper = "test plug-in (not registered)"

    def loss(self, sb):
        k, b, c = sb.logits.shape
        per = gce(sb.logits.reshape(k * b, c), self.labels(sb.idx.reshape(-1)), self.params.q)
        return masked_mean(per.view(k, b), sb.mask)

    stages = {"main": Stage(loss=loss)}


@dataclass(frozen=True)
class GCEStackMeanParams(GCEParams):
    name = "test_gce_stack_mean"


class GCEStackMean(GCE):
    """GCE whose loss form divides by the whole step's rows: per client only at K = 1."""

    Params = GCEStackMeanParams

    def loss(self, sb):
        k, b, c = sb.logits.shape
        per = gce(sb.logits.reshape(k * b, c), self.labels(sb.idx.reshape(-1)), self.params.q)
        return per.view(k, b).sum(1) / per.numel()

    stages = {"main": Stage(loss=loss)}
