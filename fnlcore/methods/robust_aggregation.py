"""Pieces the robust server steps share (Krum, coordinate-wise median, trimmed mean, geometric
median): walking client states a chunk of coordinates at a time, the floating entries that take
part in distances and averages, a float64 weighted sum of states, and the per-client noisy flags
their diagnostic columns report. Not a method: no registration."""

from __future__ import annotations

import torch

from .api import State


def client_chunks(states: list, key: str, chunk_values: int, dtype: torch.dtype | None = None):
    """Entry ``key`` of n states a chunk of coordinates at a time (``chunk_values`` values, at least one
    coordinate): (the chunk's slice of the flattened entry, the (n, chunk) stack of its values in ``dtype``)."""
    flat = [s[key].reshape(-1) for s in states]
    step = max(1, chunk_values // len(states))
    for a in range(0, flat[0].numel(), step):
        x = torch.stack([f[a:a + step] for f in flat])
        yield slice(a, a + step), x if dtype is None else x.to(dtype)


def float_keys(state: State) -> list[str]:
    """The entries that take part in distances and averages (integer buffers do not)."""
    return [k for k, v in state.items() if v.is_floating_point()]


def weighted_sum(states: list[State], keys: list[str], weights: list[float]) -> State:
    """sum_i w_i states_i over ``keys``, float64."""
    out: State = {}
    for k in keys:
        acc = torch.zeros_like(states[0][k], dtype=torch.float64)
        for s, wi in zip(states, weights):
            acc.add_(s[k].to(torch.float64), alpha=wi)
        out[k] = acc
    return out


def noisy_client_flags(ctx, clients: list[int]) -> list[bool] | None:
    """Whether each client holds any wrong given label (single-label data; None otherwise)."""
    if ctx.data.multi_label:
        return None
    wrong = ctx.data.wrong_label_clients()
    return [bool(wrong[k]) for k in clients]
