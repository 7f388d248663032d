"""Model states as plain tensor dicts, and the arithmetic the server does on them.

Conventions shared by every reference code (baselines.md §0.3): the *whole*
state dict is aggregated, BatchNorm running statistics included; integer
buffers (BN batch counters) are not averaged but copied from the first
selected client.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

State = dict[str, torch.Tensor]


def snapshot(model: torch.nn.Module) -> State:
    """A detached copy of the model's state (parameters and buffers)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def load(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy ``state`` into ``model`` in place (no re-allocation)."""
    with torch.no_grad():
        for k, v in model.state_dict().items():
            v.copy_(state[k])


def weighted_average(states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]) -> State:
    """sum_i w_i * state_i over float entries (weights normalised to sum 1); integer entries from states[0]."""
    if not states:
        raise ValueError("weighted_average needs at least one state")
    w = torch.as_tensor(list(weights), dtype=torch.float64)
    if (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"aggregation weights must be non-negative with a positive sum, got {w.tolist()}")
    w = w / w.sum()
    out: State = {}
    for key, ref in states[0].items():
        if ref.is_floating_point():
            acc = torch.zeros_like(ref, dtype=torch.float64 if ref.device.type == "cpu" else ref.dtype)
            for s, wi in zip(states, w.tolist()):
                acc.add_(s[key].to(acc.dtype), alpha=wi)
            out[key] = acc.to(ref.dtype)
        else:
            out[key] = ref.clone()
    return out


class RunningAverage:
    """Streaming weighted average, so a round over many clients holds one extra state, not K."""

    def __init__(self) -> None:
        self._sum: State | None = None
        self._first: State | None = None
        self._total = 0.0

    def add(self, state: Mapping[str, torch.Tensor], weight: float) -> None:
        if weight < 0:
            raise ValueError("aggregation weight must be non-negative")
        if self._sum is None:
            self._first = {k: v.clone() for k, v in state.items() if not v.is_floating_point()}
            self._sum = {
                k: v.to(torch.float64 if v.device.type == "cpu" else v.dtype).clone().mul_(weight)
                for k, v in state.items()
                if v.is_floating_point()
            }
        else:
            for k, acc in self._sum.items():
                acc.add_(state[k].to(acc.dtype), alpha=weight)
        self._total += weight

    def result(self, like: Mapping[str, torch.Tensor]) -> State:
        if self._sum is None or self._total <= 0:
            raise ValueError("no client contributed a positive weight this round")
        out: State = {}
        for k, ref in like.items():
            out[k] = (self._sum[k] / self._total).to(ref.dtype) if k in self._sum else self._first[k]
        return out


def per_tensor_distance(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    """Sum over float entries of the L2 norm of their difference (FedNoRo's / RSCFed's model distance)."""
    total = 0.0
    for k, v in a.items():
        if v.is_floating_point():
            total += float(torch.linalg.vector_norm((v - b[k]).double()))
    return total


def parameter_keys(model: torch.nn.Module) -> list[str]:
    """Names of trainable parameters (buffers excluded), e.g. for proximal terms."""
    return [k for k, p in model.named_parameters() if p.requires_grad]
