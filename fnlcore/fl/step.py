"""The batched engine's side of a K-client step: :class:`StackedNetBatch`, the contract's
:class:`~fnlcore.fl.contract.StackedBatch` on a :class:`~fnlcore.fl.stacked.StackedNet`, and
:func:`flatten`, how both engines hand a phase's declared draws to a loss.

The sequential engine's twin (one client on the plain model) is
:class:`~fnlcore.fl.one_client.OneClientBatch`.
"""

from __future__ import annotations

import torch

from .contract import StackedBatch
from .stacked import stacked_input


class StackedNetBatch(StackedBatch):
    """A :class:`StackedBatch` of K clients on the batched engine's stacked network ``net``
    (``net.net`` holds each parameter stacked (K, ...) under the model's own name)."""

    def forward(self, view: torch.Tensor) -> torch.Tensor:
        return self.net(*self._stacked(view))

    def forward_features(self, view: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.net.forward_features(*self._stacked(view))

    def _stacked(self, view: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The view on the stacked layout, once per trained network, and its real-row mask (B, G * K)."""
        g = max(len(self.networks), 1)
        rows = None if self.mask is None else self.mask.t().to(view.dtype).repeat(1, g)
        x = view if g == 1 else torch.cat([view] * g)
        return stacked_input(x, g * self.idx.shape[0]), rows

    def parameters(self, network: str | None = None) -> dict[str, torch.Tensor]:
        k = self.idx.shape[0]
        g = self.networks.index(network) if network and self.networks else 0
        return {n: p[g * k : (g + 1) * k] if self.networks else p for n, p in self.net.net.named_parameters()}


def flatten(params: tuple) -> list[torch.Tensor]:
    """The leaves of nested tuples of tensors, in order."""
    out = []
    for p in params:
        out.extend(flatten(p) if isinstance(p, tuple) else [p])
    return out
