"""The small-loss selection RoFL and Co-teaching share: order each client's rows by their loss
and keep the smallest. Not a method: no registration."""

from __future__ import annotations

import torch


def small_loss_order(losses: torch.Tensor, keep: torch.Tensor, mask: torch.Tensor | None):
    """The small-loss selection of K clients: (order (K, B) of the rows by loss, a stable sort with
    padded rows last; kept (K, B) bool in that order, the first ``keep`` (K,) of each client)."""
    k, b = losses.shape
    keyed = losses.detach() if mask is None else torch.where(mask, losses.detach(), float("inf"))
    return torch.argsort(keyed, dim=1, stable=True), torch.arange(b, device=losses.device).expand(k, b) < keep[:, None]
