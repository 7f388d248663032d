"""One client's step as a :class:`~fnlcore.fl.step.StackedBatch` of K = 1: how the sequential
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
order); where a decision reads it, ``fl.batched.clients_cross_entropy`` keeps the per-client
value (Fed-NCL).
"""

from __future__ import annotations

import torch

from .step import StackedBatch, flatten


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


def one_client_batch(ctx, b, models: tuple[torch.nn.Module, ...], names: tuple[str, ...], raw: bool,
                     ends_epoch: bool, copies: dict | None = None) -> OneClientBatch:
    """Sequential step ``b`` (:class:`~fnlcore.fl.client.Batch`) as the one loss form sees K = 1 clients:
    sample ids (1, B) on the device, no mask, the views and draws with a leading client axis, the
    train view's logits (``raw``: None, the loss runs :meth:`forward` on the views it wants)."""
    dev = ctx.device
    idx = b.idx.to(dev, non_blocking=True).unsqueeze(0)
    step_host = torch.tensor([b.step])
    clients_host = torch.tensor([b.k])
    # the declared draws on the device, as the batched engine hands them over (one copy per step)
    draws = tuple(d.unsqueeze(0).to(dev, non_blocking=True) for d in flatten(b.draws)) if b.draws else ()
    x = b.streams[next(iter(b.streams))][0] if raw else b.x
    sb = OneClientBatch(None, idx, None, clients_host.to(dev, non_blocking=True), x,
                        step_host.to(dev, non_blocking=True), None, b.r, dict(b.views), draws, [b.job],
                        names if len(names) > 1 else (), (0,) if ends_epoch else (), step_host, clients_host,
                        torch.ones(1, dtype=torch.bool), copies or {})
    sb.models = models
    if not raw:
        sb.logits = sb.forward(b.x)
    return sb
