"""The sequential engine: one client's local update after another, on the plain model.

For client k in round r, :func:`train_client` loads the client's working copies of the method's
global networks, asks the round's :class:`~fnlcore.fl.contract.Stage` to ``prepare`` a
:class:`~fnlcore.fl.contract.LocalJob` (or takes the default: one epoch loop over the client's
samples with the stage's loss), runs the job's phases (:func:`run_phase`: shuffling, batching,
augmentation, autocast, the optimiser steps, the per-step and per-epoch hooks), then asks the
stage what the client ``upload``s. A stage's one loss form runs here at K = 1 on the plain model
(:mod:`fnlcore.fl.one_client`). :func:`train_epochs` and :func:`train_streams` run one phase on
one model for callers outside a federated round (annotators, tests).

The draw order is fixed by this module and equals the one the reference loops of
:mod:`fnlcore.fl.local` use: per epoch, one permutation of the lead stream from
``ctx.shuffle_gen`` (:func:`epoch_order`, which the batched engine replays), then per step the
lead batch, each other stream's next batch (a stream that runs out is reshuffled), the
augmentation (``augment="train"``: the train view of the lead batch before the loss; ``"raw"``:
the loss makes its own views), the loss.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..errors import ConfigError
from ..syncs import step_region
from .context import RunContext
from .contract import Batch, ClientUpdate, LocalJob, LossFn, OneForm, Phase, Streams
from .copies import OneCopy
from .data import trim_last_batch
from .one_client import OneClientSteps, one_client_batch
from .state import load, snapshot


def epoch_order(ctx: RunContext, idx: torch.Tensor) -> torch.Tensor:
    """A local epoch's order of samples ``idx``: one permutation drawn from ``ctx.shuffle_gen``."""
    perm = torch.randperm(len(idx), generator=ctx.shuffle_gen)
    return idx.index_select(0, perm) if idx.device == perm.device else idx[perm]  # same values


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


class _Together:
    """Several optimisers stepped as one (a phase that trains several networks on one loss)."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        self.optimizers = optimizers

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for o in self.optimizers:
            o.step()


def run_phase(ctx: RunContext, job: LocalJob, phase: Phase, nets: dict[str, torch.nn.Module],
              optimizers: dict[str, torch.optim.Optimizer], default_loss: LossFn | None, idx: torch.Tensor,
              r: int, k: int, form: OneForm | None = None) -> float:
    """Run one phase; returns the mean of its per-step losses.

    The phase's own ``loss`` (a :class:`Batch` loss) first; else the stage's one loss form
    (``form``) at K = 1 (:mod:`fnlcore.fl.one_client`); else ``default_loss`` (a
    :class:`Batch` loss: the one-model loops below)."""
    s = ctx.settings
    train = phase.train or (next(iter(nets)),)
    model = nets[train[0]]
    opt = optimizers[train[0]] if len(train) == 1 else _Together([optimizers[n] for n in train])
    one = form.loss if form is not None and phase.loss is None else None
    loss_fn = phase.loss or (None if one is not None else default_loss)
    if loss_fn is None and one is None:
        raise ConfigError("a phase needs a loss")
    streams = phase.streams if phase.streams is not None else {"data": (idx, s.batch_size)}
    if one is not None and len(streams) != 1:
        raise ConfigError("a phase on several streams needs its own Phase.loss: a stage's one loss form "
                          "(Stage.loss) takes one stream")
    if phase.augment not in ("train", "raw"):
        raise ConfigError(f"Phase.augment must be 'train' or 'raw', not {phase.augment!r}")
    if phase.augment == "train" and len(streams) != 1:
        raise ConfigError("Phase.augment='train' takes one stream; use augment='raw' and make the views in the loss")
    if phase.augment == "train" and (phase.views or phase.draws is not None):
        raise ConfigError("Phase.views/draws come with augment='raw' (augment='train' gives Batch.x)")
    epochs = s.local_epochs if phase.epochs is None else phase.epochs
    names, lead_idx, lead_bs, cursors = _open(ctx, streams)
    if one is not None:
        models = tuple(nets[n] for n in train)
        fixed = OneClientSteps(ctx.device, k)  # what every step of the phase shares
        copies = {n: OneCopy(nets[n], models[0]) for n in form.copies}  # the client networks a loss reads
    augment, aug_gen = ctx.pipeline.train, ctx.aug_gen
    losses = _LossSum()
    amp = ctx.autocast()
    for n in train:
        nets[n].train()
    for epoch in range(epochs):
        if phase.on_epoch is not None:
            fresh = phase.on_epoch(epoch)
            if fresh is not None:
                names, lead_idx, lead_bs, cursors = _open(ctx, fresh)
            for n in train:
                nets[n].train()  # the hook may have run an evaluation pass
        if one is not None and form.epoch_lr is not None:
            rate = form.epoch_lr(epoch)
            for o in (opt.optimizers if isinstance(opt, _Together) else [opt]):
                for group in o.param_groups:
                    group["lr"] = rate
        order = epoch_order(ctx, lead_idx)
        b = Batch(model, nets, None, lead_idx[:0], {}, 0, epoch, r, k, job)  # one per epoch, refilled per step
        last = _steps(len(trim_last_batch(order, lead_bs, s.drop_last)), lead_bs) - 1
        for step, (xb, bidx) in enumerate(ctx.data.train.batches(order, lead_bs, drop_last=s.drop_last)):
            with step_region():
                b.idx, b.step = bidx, step
                # Augmentation in full precision, outside autocast: bf16 would round the
                # interpolated and blended pixel values. The draws are host tensors.
                if phase.augment == "train":
                    b.x = augment(xb, aug_gen)
                else:
                    b.streams = {names[0]: (xb, bidx)}
                    b.streams.update((nm, c.next()) for nm, c in cursors.items())
                    if phase.views or phase.draws is not None:
                        b.views = ctx.pipeline.views(xb, aug_gen, phase.views)
                        b.draws = phase.draws(len(bidx), aug_gen, xb.device) if phase.draws is not None else ()
                with amp:
                    if one is None:
                        loss = loss_fn(b)
                    else:  # the (1,) losses of K = 1 clients; its one entry is this client's
                        sb = one_client_batch(ctx, b, models, train, phase.augment == "raw", step == last, copies, fixed)
                        loss = one(sb)[0]
                opt.zero_grad(set_to_none=True)
                loss.backward()
                if one is not None and form.before_step is not None:
                    form.before_step(sb, fixed.moved)
                opt.step()
                if phase.after_step is not None:
                    phase.after_step()
                if one is not None and form.after_step is not None:
                    form.after_step(sb, fixed.moved)
                losses.append(loss.detach())
    return losses.mean()


def _steps(n: int, batch_size: int) -> int:
    return -(-n // batch_size)


def _open(ctx: RunContext, streams: Streams):
    if not streams:
        raise ConfigError("a phase needs at least one stream: {name: (sample indices, batch size)}")
    for name, (_, bs) in streams.items():
        if int(bs) < 1:
            raise ConfigError(f"stream {name!r}: batch size {bs} must be >= 1")
    names = list(streams)
    lead_idx, lead_bs = streams[names[0]]
    cursors = {n: _Cycle(ctx, i, bs) for n, (i, bs) in list(streams.items())[1:] if len(i)}
    return names, lead_idx, lead_bs, cursors


def train_client(method, r: int, k: int) -> ClientUpdate:
    """Client k's local update in round r under ``method``'s stage table (the sequential engine)."""
    ctx = method.ctx
    stage = method.current_stage(r)
    nets = method.workers
    for name, g in method.globals.items():
        load(nets[name], g.state_dict())
    job = stage.prepare(method, r, k, nets) if stage.prepare is not None else None
    if job is None:
        job = LocalJob()
    idx = ctx.data.clients[k]
    lr_round = r if job.lr_round is None else job.lr_round
    optimizers = job.optimizers

    def optimizer(name: str) -> torch.optim.Optimizer:
        if name not in optimizers:  # one per network and local update, kept across phases (momentum)
            optimizers[name] = ctx.optimizer(nets[name].parameters(), lr_round, lr=job.lr.get(name))
        return optimizers[name]

    # the stage's one loss form at K = 1 with its per-chunk hooks (a phase may bring its own loss)
    form = OneForm.of(method, stage, r)
    one = form is not None
    if one and stage.begin is not None:
        stage.begin(method, r, [k], [job])
    phases = job.phases if job.phases is not None else [Phase()]
    for phase in phases:
        train = phase.train or (method.networks[0],)
        for n in train:
            if n not in nets:
                raise ConfigError(f"phase trains network {n!r}, which the method does not declare")
            optimizer(n)
        job.losses.append(run_phase(ctx, job, phase, nets, optimizers, None, idx, r, k, form))
    if one and stage.end is not None:
        stage.end(method, r, [k], [job])
    uploads = stage.upload(method, r, k, job, nets) if stage.upload is not None else {}
    uploads = {"train_loss": job.train_loss, **uploads}
    return ClientUpdate(k, len(idx), {n: snapshot(nets[n]) for n in method.networks}, uploads)


# -- one model, no method: the loop for callers outside a federated round (annotators, tests) ------------


def train_epochs(ctx: RunContext, model: torch.nn.Module, idx: torch.Tensor,
                 loss_fn: Callable[[torch.nn.Module, torch.Tensor, torch.Tensor, int], torch.Tensor],
                 round_index: int, epochs: int | None = None, optimizer: torch.optim.Optimizer | None = None,
                 on_epoch_start: Callable[[int], None] | None = None) -> float:
    """Train ``model`` on samples ``idx`` with ``loss_fn(model, train view, sample ids, step)``: one
    :class:`Phase` with ``augment="train"``; returns the mean per-batch loss."""
    phase = Phase(loss=lambda b: loss_fn(b.model, b.x, b.idx, b.step), epochs=epochs, on_epoch=on_epoch_start)
    return _one_model(ctx, model, idx, phase, round_index, optimizer)


def train_streams(ctx: RunContext, model: torch.nn.Module, streams: Streams,
                  loss_fn: Callable[[torch.nn.Module, dict, int], torch.Tensor], round_index: int,
                  epochs: int | None = None, optimizer: torch.optim.Optimizer | None = None,
                  on_epoch_start: Callable[[int], Streams | None] | None = None) -> float:
    """Train ``model`` on several batch streams with ``loss_fn(model, {name: (uint8 x, ids)}, step)``: one
    :class:`Phase` with ``augment="raw"``; returns the mean per-batch loss."""
    phase = Phase(loss=lambda b: loss_fn(b.model, b.streams, b.step), streams=streams, augment="raw", epochs=epochs,
                  on_epoch=on_epoch_start)
    return _one_model(ctx, model, next(iter(streams.values()))[0] if streams else None, phase, round_index, optimizer)


def _one_model(ctx, model, idx, phase, round_index, optimizer) -> float:
    opt = optimizer if optimizer is not None else ctx.optimizer(model.parameters(), round_index)
    return run_phase(ctx, LocalJob(), phase, {"model": model}, {"model": opt}, None, idx, round_index, -1)
