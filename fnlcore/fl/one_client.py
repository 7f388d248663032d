"""One client's step as a :class:`~fnlcore.fl.contract.StackedBatch` of K = 1: how the sequential
engine runs a stage's one loss form.

A method writes each stage's loss once, over K clients (``Stage.loss``: StackedBatch -> (K,)).
The batched engine hands it K clients on a :class:`~fnlcore.fl.stacked.StackedNet`; the
sequential engine hands it one client on the plain model, through :class:`OneClientBatch`.
The plain model is what K = 1 uses because the stacked network rounds differently from it even
at K = 1 (a batched matrix product's weight gradient, a convolution's layout), while a loss's
own reductions (a per-client masked mean for a batch mean) do not move a gradient bit, so the
sequential engine keeps every number it had with a per-client loss written separately: the
golden set holds it to that. Two things did move bits while the methods were merged, and a
loss form keeps clear of them: terms that read different views of one tensor (flat and
(K, B, C)) sum their gradients in another order, and a hand-written KL rounds its gradient
differently from ``F.kl_div``. The loss VALUE may differ in its last bit (reductions in another
order); where a decision reads it, ``fl.contract.clients_cross_entropy`` keeps the per-client
value (Fed-NCL).
"""

from __future__ import annotations

import torch

from .contract import StackedBatch
from .step import flatten


class OneClientBatch(StackedBatch):
    """A :class:`StackedBatch` of one client whose networks are the plain models (``models``:
    the trained networks in order, one for a one-network phase)."""

    models: tuple[torch.nn.Module, ...] = ()

    def forward(self, view: torch.Tensor) -> torch.Tensor:
        return torch.cat([m(view).unsqueeze(0) for m in self.models]) if len(self.models) > 1 \
            else self.models[0](view).unsqueeze(0)

    def forward_features(self, view: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        outs = [m.forward_features(view) for m in self.models]
        return (torch.cat([o[0].unsqueeze(0) for o in outs]), torch.cat([o[1].unsqueeze(0) for o in outs]))

    def parameters(self, network: str | None = None) -> dict[str, torch.Tensor]:
        m = self.models[self.networks.index(network) if network and self.networks else 0]
        return {n: p.unsqueeze(0) for n, p in m.named_parameters()}


class OneClientSteps:
    """What the steps of one client's phase share, made once a phase: the client id and the
    "stepped" flag on the host and the device, each batch number's (1,) tensors (an epoch repeats them)."""

    def __init__(self, device: torch.device, k: int):
        self.device = device
        self.clients_host = torch.tensor([k])
        self.clients = self.clients_host.to(device, non_blocking=True)
        self.moved_host = torch.ones(1, dtype=torch.bool)
        self.moved = self.moved_host.to(device, non_blocking=True)
        self._steps: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def step(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch number ``i`` as (1,) tensors on the host and on the device."""
        if i not in self._steps:
            host = torch.tensor([i])
            self._steps[i] = host, host.to(self.device, non_blocking=True)
        return self._steps[i]


def one_client_batch(ctx, b, models: tuple[torch.nn.Module, ...], names: tuple[str, ...], raw: bool,
                     ends_epoch: bool, copies: dict | None = None, fixed: OneClientSteps | None = None
                     ) -> OneClientBatch:
    """Sequential step ``b`` (:class:`~fnlcore.fl.contract.Batch`) as the one loss form sees K = 1 clients:
    sample ids (1, B) on the device, no mask, the views and draws with a leading client axis, the
    train view's logits (``raw``: None, the loss runs :meth:`forward` on the views it wants).
    ``fixed``: the phase's shared tensors (:class:`OneClientSteps`; made here when absent)."""
    dev = ctx.device
    fixed = fixed or OneClientSteps(dev, b.k)
    idx = b.idx.to(dev, non_blocking=True).unsqueeze(0)
    step_host, step = fixed.step(b.step)
    # the declared draws on the device, as the batched engine hands them over (one copy per step)
    draws = tuple(d.unsqueeze(0).to(dev, non_blocking=True) for d in flatten(b.draws)) if b.draws else ()
    x = b.streams[next(iter(b.streams))][0] if raw else b.x
    sb = OneClientBatch(None, idx, None, fixed.clients, x, step, None, b.r, dict(b.views), draws, [b.job],
                        names if len(names) > 1 else (), (0,) if ends_epoch else (), step_host, fixed.clients_host,
                        fixed.moved_host, copies or {}, (b.epoch,))
    sb.models = models
    if not raw:
        sb.logits = sb.forward(b.x)
    return sb
