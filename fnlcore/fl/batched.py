"""The batched-clients engine: the selected clients of a round train together, as one computation.

``train_clients`` is what :func:`~fnlcore.fl.client.train_epochs` is for one client, for K
clients at once: the K local models are one :class:`~fnlcore.fl.stacked.StackedNet`, each
step gathers every client's next batch into one tensor, runs one forward and one backward
pass and one optimiser step over the stacked parameters.

It reproduces the sequential engine's random draws exactly: before training, every client's
mini-batch orders (``ctx.shuffle_gen``) and augmentation parameters (``ctx.aug_gen``) are
drawn client after client, epoch after epoch, batch after batch, the order in which the
sequential engine draws them, and the generators end in the same state. Client k's run then
differs from its sequential run only by floating-point rounding (grouped vs single kernels,
summation order), which the engine tests bound.

Clients of different sizes: the steps of all clients are aligned on one timeline; a client
with fewer steps rides along masked (its parameters, optimiser state and BatchNorm statistics
do not move), a short last batch is padded and masked (padded rows leave the loss and the
BatchNorm statistics). Methods supply the loss as ``loss_fn(StackedBatch) -> (K,)``: the
clients' logits (K, B, classes), sample ids, real-row mask, train views and stacked network.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .context import RunContext
from .data import trim_last_batch
from .client import epoch_order
from .stacked import StackedNet, stacked_input, stacked_optimizer



@dataclass
class StackedBatch:
    """One step of K clients as a batched loss sees it (the batched twin of fnlcore.fl.client.Batch).

    ``logits`` (K, B, classes) of the stacked network; ``idx`` (K, B) sample ids on the device;
    ``mask`` (K, B) real rows, or None when every row is real; ``clients`` (K,) client ids;
    ``x`` the train view of the K batches, client after client ((K * B, C, H, W): a global
    model's forward on it, viewed as (K, B, classes), is the clients' teacher output);
    ``epoch_step`` (K,) each client's batch number within its epoch (FedProx skips batch 0);
    ``net`` the :class:`~fnlcore.fl.stacked.StackedNet` (``net.net`` holds each parameter
    stacked (K, ...) under the model's own name); ``r`` the round.
    """

    logits: torch.Tensor
    idx: torch.Tensor
    mask: torch.Tensor | None
    clients: torch.Tensor
    x: torch.Tensor
    epoch_step: torch.Tensor
    net: StackedNet
    r: int

    def per_client(self, flat: torch.Tensor) -> torch.Tensor:
        """(K * B, ...) rows of a forward on ``x`` -> (K, B, ...)."""
        return flat.view(self.idx.shape[0], self.idx.shape[1], *flat.shape[1:])


BatchedLossFn = Callable[[StackedBatch], torch.Tensor]


@dataclass
class Timeline:
    """Every client's batches of one local update on a common step axis.

    ``index`` (T, K, B) sample ids (padding: 0), ``mask`` (T, K, B) real rows, ``width`` the
    real width of each step (max rows of any client), ``full`` whether step t has a full batch
    for every client (no masking needed), ``aug`` the augmentation parameters laid out like
    ``index`` (one tensor per parameter), ``epoch_step`` (T, K) each client's batch number
    within its epoch.
    """

    index: torch.Tensor
    mask: torch.Tensor
    width: list[int]
    full: list[bool]
    aug: tuple
    epoch_step: torch.Tensor

    @property
    def steps(self) -> int:
        return self.index.shape[0]


def client_batches(ctx: RunContext, idx: torch.Tensor, epochs: int, batch_size: int) -> list[torch.Tensor]:
    """Client's batches for ``epochs`` epochs, drawing the orders from ``ctx.shuffle_gen`` as train_epochs does."""
    out: list[torch.Tensor] = []
    for _ in range(epochs):
        out.extend(trim_last_batch(epoch_order(ctx, idx), batch_size, ctx.settings.drop_last).split(batch_size))
    return out


def build_timeline(ctx: RunContext, clients: list[torch.Tensor], epochs: int, batch_size: int) -> Timeline:
    """Draw every client's batch orders and augmentation parameters in the sequential order; lay them out."""
    plans = [client_batches(ctx, idx, epochs, batch_size) for idx in clients]
    k, t_max = len(clients), max((len(p) for p in plans), default=0)
    index = torch.zeros(t_max, k, batch_size, dtype=torch.int64)
    lengths = torch.zeros(t_max, k, dtype=torch.int64)
    epoch_step = torch.zeros(t_max, k, dtype=torch.int64)
    draws = []
    for i, batches in enumerate(plans):
        draws.append([ctx.pipeline.draw_train(len(b), ctx.aug_gen, ctx.device) for b in batches])  # train_epochs' order
        per_epoch = max(len(batches) // max(epochs, 1), 1)  # every epoch of a client has as many batches
        for t, b in enumerate(batches):
            index[t, i, : len(b)] = b
            lengths[t, i] = len(b)
            epoch_step[t, i] = t % per_epoch
    mask = torch.arange(batch_size)[None, None, :] < lengths[:, :, None]
    aug = _layout_params(draws, mask.to(ctx.device))
    width = lengths.amax(1).tolist() if t_max else []
    # "full": every client has a batch of the step's width (no padding, no rider): nothing to mask
    full = (lengths == lengths.amax(1, keepdim=True)).all(1).tolist() if t_max else []
    return Timeline(index, mask, width, full, aug, epoch_step)


def _layout_params(draws: list[list[tuple]], mask: torch.Tensor) -> tuple:
    """Each parameter of the draws as a (T, K, B) tensor laid out like the sample ids (padding: zeros)."""
    first = next((d for client in draws for d in client), ())
    if not first:
        return ()
    by_client = mask.permute(1, 0, 2)  # (K, T, B): a client's real rows in its own step order
    out = []
    for j, ref in enumerate(_flatten(first)):
        grid = torch.zeros(by_client.shape, dtype=ref.dtype, device=mask.device)
        for i, client in enumerate(draws):
            if client:
                grid[i].masked_scatter_(by_client[i], torch.cat([_flatten(d)[j] for d in client]))
        out.append(grid.permute(1, 0, 2))
    return tuple(out)


def _flatten(params: tuple) -> list[torch.Tensor]:
    out = []
    for p in params:
        out.extend(_flatten(p) if isinstance(p, tuple) else [p])
    return out


def _unflatten(like: tuple, flat: list[torch.Tensor]) -> tuple:
    it = iter(flat)

    def build(t):
        return tuple(build(p) if isinstance(p, tuple) else next(it) for p in t)

    return build(like)


def train_clients(
    ctx: RunContext,
    global_model: torch.nn.Module,
    clients: list[torch.Tensor],
    loss_fn: BatchedLossFn,
    round_index: int,
    net: StackedNet | None = None,
    clients_ids: torch.Tensor | None = None,
) -> tuple[list[dict[str, torch.Tensor]], list[float]]:
    """Train K copies of ``global_model`` on the K clients' samples; returns their states and mean losses.

    ``net``: a StackedNet of K copies of the model to train in (its contents are overwritten;
    built here when absent); ``clients_ids``: the clients' ids for :class:`StackedBatch` (default 0..K-1).
    """
    s = ctx.settings
    k = len(clients)
    if net is None:
        net = StackedNet(global_model, k).to(ctx.device)
    elif net.k != k:
        raise ValueError(f"train_clients: the StackedNet holds {net.k} copies for {k} clients")
    net.load_all(global_model.state_dict())
    net.train()
    params = net.trainable()
    opt = stacked_optimizer(s, params, s.lr_at(round_index))
    tl = build_timeline(ctx, clients, s.local_epochs, s.batch_size)
    like = ctx.pipeline.draw_train(1, torch.Generator(device=ctx.device), ctx.device)  # structure only
    images = ctx.data.train.images
    index_dev = tl.index.to(ctx.device, non_blocking=True)
    mask_dev = tl.mask.to(ctx.device, non_blocking=True)
    step_dev = tl.epoch_step.to(ctx.device, non_blocking=True)
    ids = clients_ids if clients_ids is not None else torch.arange(k, device=ctx.device)
    step_losses = []
    autocast = ctx.autocast()
    for t in range(tl.steps):
        w = tl.width[t]
        idx = index_dev[t, :, :w]
        x = images.index_select(0, idx.reshape(-1))
        aug = _unflatten(like, [p[t, :, :w].reshape(-1) for p in tl.aug]) if tl.aug else ()
        view = ctx.pipeline.apply_train(x, aug)
        x = stacked_input(view, k)
        mask = None if tl.full[t] else mask_dev[t, :, :w]
        with autocast:
            logits = net(x, None if mask is None else mask.t().to(x.dtype))
            losses = loss_fn(StackedBatch(logits, idx, mask, ids, view, step_dev[t], net, round_index))
        grads = torch.autograd.grad(losses.sum(), params)
        opt.step(grads, None if mask is None else mask[:, 0])  # a client with a batch has a real row 0
        step_losses.append(losses.detach().float())
    states = [net.client_state(i) for i in range(k)]
    return states, _mean_losses(step_losses, tl)


def _mean_losses(step_losses: list[torch.Tensor], tl: Timeline) -> list[float]:
    """Each client's mean over its own steps, summed in order in float64 (as train_epochs' _LossSum)."""
    k = tl.index.shape[1]
    if not step_losses:
        return [0.0] * k
    values = torch.stack(step_losses).double().cpu().tolist()
    real = tl.mask[:, :, 0].tolist()
    out = []
    for i in range(k):
        total, count = 0.0, 0
        for t in range(len(values)):
            if real[t][i]:
                total += values[t][i]
                count += 1
        out.append(total / max(count, 1))
    return out


def masked_mean(per_sample: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """(K, B) per-sample losses -> (K,) means over each client's real rows."""
    if mask is None:
        return per_sample.mean(1)
    zero = torch.zeros((), dtype=per_sample.dtype, device=per_sample.device)
    return torch.where(mask, per_sample, zero).sum(1) / mask.sum(1).clamp_min(1).to(per_sample.dtype)
