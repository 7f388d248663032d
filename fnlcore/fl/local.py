"""The client-side training loop and batched prediction, shared by all methods.

A method supplies only its loss: ``loss_fn(model, x, idx, step) -> scalar``
where ``x`` is the augmented, normalised batch on the device, ``idx`` the
batch's sample indices (CPU int64, to look up labels, priors, cached teacher
outputs...) and ``step`` the batch number within the epoch (FedProx variants
skip their term on batch 0). Everything else — shuffling, batching,
augmentation, the optimiser step — is here, once.
"""

from __future__ import annotations

from typing import Callable

import torch

from .context import RunContext

LossFn = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor, int], torch.Tensor]


def epoch_order(ctx: RunContext, idx: torch.Tensor) -> torch.Tensor:
    """A local epoch's order of samples ``idx``: one permutation drawn from ``ctx.shuffle_gen``."""
    perm = torch.randperm(len(idx), generator=ctx.shuffle_gen)
    return idx.index_select(0, perm) if idx.device == perm.device else idx[perm]  # same values


def train_epochs(
    ctx: RunContext,
    model: torch.nn.Module,
    idx: torch.Tensor,
    loss_fn: LossFn,
    round_index: int,
    epochs: int | None = None,
    batch_size: int | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    after_step: Callable[[], None] | None = None,
    on_epoch_start: Callable[[int], None] | None = None,
) -> float:
    """Train ``model`` on samples ``idx`` for E epochs; returns the mean of the per-batch losses.

    ``on_epoch_start(epoch)`` runs before each epoch's shuffle (DivideMix's evaluation
    pass + GMM split; it may change labels or per-sample weights the loss reads).
    """
    s = ctx.settings
    epochs = s.local_epochs if epochs is None else epochs
    bs = s.batch_size if batch_size is None else batch_size
    opt = optimizer if optimizer is not None else ctx.optimizer(model.parameters(), round_index)
    model.train()
    batches, augment, aug_gen = ctx.data.train.batches, ctx.pipeline.train, ctx.aug_gen
    losses = _LossSum()
    amp = ctx.autocast()  # bf16 forward passes and losses when training.precision is bf16
    for epoch in range(epochs):
        if on_epoch_start is not None:
            on_epoch_start(epoch)
            model.train()  # the hook may have run an evaluation pass
        for step, (xb, bidx) in enumerate(batches(epoch_order(ctx, idx), bs, drop_last=s.drop_last)):
            with amp:
                loss = loss_fn(model, augment(xb, aug_gen), bidx, step)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if after_step is not None:
                after_step()
            losses.append(loss.detach())
    return losses.mean()


StreamLossFn = Callable[[torch.nn.Module, dict[str, tuple[torch.Tensor, torch.Tensor]], int], torch.Tensor]
Streams = dict[str, tuple[torch.Tensor, int]]


def train_streams(
    ctx: RunContext,
    model: torch.nn.Module,
    streams: Streams,
    loss_fn: StreamLossFn,
    round_index: int,
    epochs: int | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    on_epoch_start: Callable[[int], Streams | None] | None = None,
    after_step: Callable[[], None] | None = None,
) -> float:
    """Local training on several batch streams per step (labelled + unlabelled, DivideMix/FixMatch).

    ``streams``: name -> (sample indices, batch size), in order; the FIRST stream sets
    the epoch length (its number of batches, last partial batch kept unless
    ``drop_last``); every other stream is reshuffled and restarted whenever it runs
    out (DivideMix's and FixMatch's loaders). ``loss_fn(model, batches, step)`` gets
    ``{name: (uint8 images on the device, sample indices)}``: it makes the views it
    needs with ``ctx.pipeline.views(x, ctx.aug_gen, names)``. A stream with no
    samples is absent from ``batches``; an empty first stream makes an epoch of no steps.

    ``on_epoch_start(epoch)`` runs before each epoch; when it returns a streams dict
    (DivideMix: a fresh GMM split into labelled and unlabelled sets every epoch), the
    streams are replaced from that epoch on. Returns the mean of the per-batch losses.
    """
    s = ctx.settings
    epochs = s.local_epochs if epochs is None else epochs
    opt = optimizer if optimizer is not None else ctx.optimizer(model.parameters(), round_index)
    names, lead_idx, lead_bs, cursors = _open_streams(ctx, streams)
    model.train()
    losses = _LossSum()
    amp = ctx.autocast()
    for epoch in range(epochs):
        if on_epoch_start is not None:
            fresh = on_epoch_start(epoch)
            if fresh is not None:
                names, lead_idx, lead_bs, cursors = _open_streams(ctx, fresh)
            model.train()
        perm = torch.randperm(len(lead_idx), generator=ctx.shuffle_gen)
        order = lead_idx[perm]
        for step, lead in enumerate(ctx.data.train.batches(order, lead_bs, drop_last=s.drop_last)):
            batches = {names[0]: lead}
            batches.update((n, c.next()) for n, c in cursors.items())
            with amp:
                loss = loss_fn(model, batches, step)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if after_step is not None:
                after_step()
            losses.append(loss.detach())
    return losses.mean()


def _open_streams(ctx: RunContext, streams: Streams):
    from ..errors import ConfigError

    if not streams:
        raise ConfigError("train_streams needs at least one stream: {name: (sample indices, batch size)}")
    for name, (idx, bs) in streams.items():
        if int(bs) < 1:
            raise ConfigError(f"stream {name!r}: batch size {bs} must be >= 1")
    names = list(streams)
    lead_idx, lead_bs = streams[names[0]]
    cursors = {n: _Cycle(ctx, idx, bs) for n, (idx, bs) in list(streams.items())[1:] if len(idx)}
    return names, lead_idx, lead_bs, cursors


class _Cycle:
    """An endless shuffled stream of batches over one index set."""

    def __init__(self, ctx: RunContext, idx: torch.Tensor, batch_size: int):
        self.ctx, self.idx, self.bs = ctx, idx, batch_size
        self.it = iter(())

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        for _ in range(2):
            try:
                return next(self.it)
            except StopIteration:
                perm = torch.randperm(len(self.idx), generator=self.ctx.shuffle_gen)
                self.it = iter(self.ctx.data.train.batches(self.idx[perm], self.bs))
        raise AssertionError("a non-empty stream yielded nothing")


class _LossSum:
    """Per-batch losses summed left to right in float64, read from the device in chunks.

    Keeps the training step free of extra ops and host syncs (a list append per
    batch); the sum equals that of adding each loss to a float64 accumulator in turn.
    """

    CHUNK = 1024

    def __init__(self) -> None:
        self.pending: list[torch.Tensor] = []
        self.total, self.count = 0.0, 0

    def append(self, loss: torch.Tensor) -> None:
        self.pending.append(loss)
        if len(self.pending) >= self.CHUNK:
            self._flush()

    def _flush(self) -> None:
        if self.pending:
            for v in torch.stack(self.pending).reshape(-1).tolist():  # Python floats: exact
                self.total += v
                self.count += 1
            self.pending = []

    def mean(self) -> float:
        self._flush()
        return self.total / max(self.count, 1)


@torch.no_grad()
def predict(
    ctx: RunContext,
    model: torch.nn.Module,
    source,
    idx: torch.Tensor | None = None,
    augment: bool = False,
    batch_size: int | None = None,
) -> torch.Tensor:
    """Logits for samples ``idx`` of ``source`` (default: all), in that order, model in eval mode.

    ``augment=True`` reproduces reference codes that run detection passes on
    the *training* dataset object, i.e. with training augmentation active.
    """
    model.eval()
    order = torch.arange(len(source)) if idx is None else idx
    bs = batch_size or ctx.settings.eval_batch_size
    outs = []
    amp = ctx.autocast()
    for xb, _ in source.batches(order, bs):
        x = ctx.pipeline.train(xb, ctx.aug_gen) if augment else ctx.pipeline.eval(xb)
        with amp:
            outs.append(model(x).float())
    return torch.cat(outs) if outs else torch.zeros(0, ctx.data.num_classes, device=ctx.device)


def evaluate(ctx: RunContext, model: torch.nn.Module) -> dict[str, float]:
    """Test metrics of ``model`` (raw logits: no logit adjustment at inference)."""
    from .. import metrics

    logits = predict(ctx, model, ctx.data.test)
    y = ctx.data.y_test.cpu().numpy()
    if ctx.data.multi_label:
        return metrics.evaluate_multi_label(y, torch.sigmoid(logits).cpu().numpy())
    return metrics.evaluate_single_label(y, logits.cpu().numpy())
