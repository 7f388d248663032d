"""The batched-clients engine: the selected clients of a round train together, as one computation.

``train_clients`` is what :func:`~fnlcore.fl.sequential.train_epochs` is for one client, for K
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

The capture-ready step, and its CUDA graphs (``training.cuda_graphs``)
---------------------------------------------------------------------
A GPU step at the papers' sizes is host-bound: the host dispatches some 50 to 500 ops a step, each
costing more than its kernel. A CUDA graph replays a captured step's kernels in one launch; it
needs a step that does the same thing on the same memory every time:

* fixed shapes: every step is the full batch wide for every client, a short or missing batch padded
  and masked (padded rows leave the loss, the BatchNorm statistics and, for a client without a
  batch, the optimiser step), so a chunk's steps have at most two forms (every row real, some rows
  masked), one graph each;
* inputs staged in fixed buffers: each step's sample ids, row mask, batch numbers and augmentation
  parameters are copied (device to device) into the same tensors before the step runs on them;
* a capturable optimiser (:class:`~fnlcore.fl.stacked.StackedSGD` / ``StackedAdam`` with
  ``capturable=True``: its state updated in place).

:class:`StepRunner` runs that step; with ``graphs`` (a CUDA device) it runs each form's first step
eagerly on a side stream (a real step that also warms the allocator and kernels up), captures the
form's next step and replays it from then on. Without, the same step runs eagerly: on the CPU the
tests compare it with the engine's ordinary step (tests/test_capture_ready.py).

Only a plain chunk is captured (:func:`graphable`): the train view, one network, no per-step hooks
or rates, and a loss declared :func:`~fnlcore.fl.contract.capturable` (it reads only the batch's device tensors: a host
field of :class:`~fnlcore.fl.contract.StackedBatch`, fixed at capture, would replay unchanged).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

import torch

from .context import RunContext
from ..syncs import host_side, step_region
from .data import trim_last_batch
from .stacked import StackedNet, stacked_optimizer
from .contract import StackedBatch, is_capturable
from .copies import StackedCopies
from .sequential import epoch_order
from .step import StackedNetBatch, flatten as _flatten



BatchedLossFn = Callable[[StackedBatch], torch.Tensor]


def graphable(loss, augment: str, models, copies, before_step, after_step, epoch_lr) -> bool:
    """Whether a chunk's step can be captured: see the module doc."""
    return (augment == "train" and models is None and not copies and before_step is None
            and after_step is None and epoch_lr is None and is_capturable(loss))


Body = Callable[[dict, bool], torch.Tensor]


class StepRunner:
    """Runs a chunk's capture-ready step: ``step(inputs, masked)`` copies ``inputs`` (name -> tensor, the
    same shapes every step) into the form's fixed buffers and runs ``body(buffers, masked)`` -> (K,)
    losses on them, eagerly, or (``graphs``) as the form's CUDA graph once captured."""

    def __init__(self, body: Body, graphs: bool = False):
        self.body, self.graphs = body, graphs
        self.buffers: dict[bool, dict[str, torch.Tensor]] = {}
        self.captured: dict[bool, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[bool, torch.Tensor] = {}
        self.warm: set[bool] = set()

    def step(self, inputs: dict[str, torch.Tensor], masked: bool) -> torch.Tensor:
        buf = self.buffers.get(masked)
        if buf is None:
            buf = self.buffers[masked] = {n: torch.empty_like(v) for n, v in inputs.items()}
        for n, v in inputs.items():
            buf[n].copy_(v, non_blocking=True)
        if not self.graphs:
            return self.body(buf, masked)
        graph = self.captured.get(masked)
        if graph is None:
            if masked not in self.warm:  # the form's first step: eager, on a side stream (PyTorch's recipe)
                self.warm.add(masked)
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    out = self.body(buf, masked)
                torch.cuda.current_stream().wait_stream(side)
                return out
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):  # records the kernels, runs none
                self.outputs[masked] = self.body(buf, masked)
            self.captured[masked] = graph
        graph.replay()
        return self.outputs[masked].clone()  # the graph's output is overwritten by its next replay


@dataclass
class Timeline:
    """Every client's batches of one local update on a common step axis.

    ``index`` (T, K, B) sample ids (padding: 0), ``mask`` (T, K, B) real rows, ``width`` the
    real width of each step (max rows of any client), ``full`` whether step t has a full batch
    for every client (no masking needed), ``aug`` the random parameters laid out like ``index``
    (one tensor per leaf: per-sample (T, K, B, ...), per-batch (T, K)), ``epoch_step`` (T, K)
    each client's batch number within its epoch, ``epoch`` (T, K) its local epoch (a rider's last).
    """

    index: torch.Tensor
    mask: torch.Tensor
    width: list[int]
    full: list[bool]
    aug: tuple
    epoch_step: torch.Tensor
    like: tuple = ()  # the structure of one batch's draws
    epoch_ends: list[tuple[int, ...]] = field(default_factory=list)  # per step: who ends an epoch (no device sync)
    epoch: torch.Tensor | None = None

    @property
    def steps(self) -> int:
        return self.index.shape[0]


def client_batches(ctx: RunContext, idx: torch.Tensor, epochs: int, batch_size: int) -> list[torch.Tensor]:
    """Client's batches for ``epochs`` epochs, drawing the orders from ``ctx.shuffle_gen`` as train_epochs does."""
    out: list[torch.Tensor] = []
    for _ in range(epochs):
        order = trim_last_batch(epoch_order(ctx, idx), batch_size, ctx.settings.drop_last)
        out.extend(b for b in order.split(batch_size) if len(b))  # no samples: no batch (a rider all along)
    return out


DrawFn = Callable[[int], tuple]


@dataclass
class ClientDraws:
    """One client's batches (sample ids) and each batch's random parameters, as drawn."""

    batches: list[torch.Tensor]
    draws: list[tuple]


def draw_client(ctx: RunContext, idx: torch.Tensor, epochs: int, batch_size: int, draw: DrawFn | None = None
                ) -> ClientDraws:
    """Client's batch orders (``ctx.shuffle_gen``) and each batch's random parameters (``draw(n)``,
    default the train augmentation's), in the sequential engine's order."""
    draw = draw or draw_fn(ctx, ChunkPhase())
    batches = client_batches(ctx, idx, epochs, batch_size)
    return ClientDraws(batches, [draw(len(b)) for b in batches])


def build_timeline(ctx: RunContext, clients: list[torch.Tensor], epochs: int, batch_size: int,
                   draw: DrawFn | None = None, drawn: list[ClientDraws] | None = None) -> Timeline:
    """Every client's batches and random parameters, drawn in the sequential order, laid out by step.

    ``drawn``: the clients' draws made already (the round engine draws each client's right after
    its ``prepare``, where the sequential engine draws them); else drawn here, client after client."""
    if drawn is None:
        drawn = [draw_client(ctx, idx, epochs, batch_size, draw) for idx in clients]
    plans = [d.batches for d in drawn]
    k, t_max = len(clients), max((len(p) for p in plans), default=0)
    index = torch.zeros(t_max, k, batch_size, dtype=torch.int64)
    lengths = torch.zeros(t_max, k, dtype=torch.int64)
    epoch_step = torch.zeros(t_max, k, dtype=torch.int64)
    epoch_of = torch.zeros(t_max, k, dtype=torch.int64)
    draws = [d.draws for d in drawn]
    ends: list[list[int]] = [[] for _ in range(t_max)]
    for i, batches in enumerate(plans):
        per_epoch = max(len(batches) // max(epochs, 1), 1)  # every epoch of a client has as many batches
        for t, b in enumerate(batches):
            index[t, i, : len(b)] = b
            lengths[t, i] = len(b)
            epoch_step[t, i] = t % per_epoch
            epoch_of[t, i] = t // per_epoch
            if t % per_epoch == per_epoch - 1:
                ends[t].append(i)
        if len(batches):  # a rider after its last batch stays in its last epoch
            epoch_of[len(batches):, i] = (len(batches) - 1) // per_epoch
    mask = torch.arange(batch_size)[None, None, :] < lengths[:, :, None]
    aug, like = _layout_params(draws, mask)  # on the host, where the draws are
    width = lengths.amax(1).tolist() if t_max else []
    # "full": every client has a batch of the step's width (no padding, no rider): nothing to mask
    full = (lengths == lengths.amax(1, keepdim=True)).all(1).tolist() if t_max else []
    return Timeline(index, mask, width, full, aug, epoch_step, like, [tuple(e) for e in ends], epoch_of)


def _layout_params(draws: list[list[tuple]], mask: torch.Tensor) -> tuple[tuple, tuple]:
    """Each leaf of the draws laid out by step: a per-sample leaf (first axis the batch) as
    (T, K, B, ...) like the sample ids, a per-batch leaf (0-dim) as (T, K); and the draws'
    structure. Padding repeats the first real value, so padded rows stay valid parameters."""
    first = next((d for client in draws for d in client), ())
    if not _flatten(first):
        return (), first
    by_client = mask.permute(1, 0, 2)  # (K, T, B): a client's real rows in its own step order
    k, t_max, _ = by_client.shape
    flat = [[_flatten(d) for d in client] for client in draws]
    out = []
    for j, ref in enumerate(_flatten(first)):
        if ref.dim() == 0:
            grid = ref.expand(k, t_max).clone()
            for i, client in enumerate(flat):
                if client:
                    grid[i, : len(client)] = torch.stack([leaves[j] for leaves in client])
            out.append(grid.t().contiguous())
            continue
        trail = tuple(ref.shape[1:])
        grid = ref[:1].reshape(1, 1, 1, *trail).expand(*by_client.shape, *trail).clone()
        sel = by_client.view(*by_client.shape, *([1] * len(trail))).expand_as(grid)
        for i, client in enumerate(flat):
            if client:
                grid[i].masked_scatter_(sel[i], torch.cat([leaves[j] for leaves in client]))
        out.append(grid.transpose(0, 1))
    return tuple(out), first


def _at_step(grids: tuple, t: int, w: int, host: int = 0) -> list[torch.Tensor]:
    """Step t's leaves: per-sample (K * w, ...) client after client, per-batch (K,); the first ``host``
    grids are host tensors (their slicing is host work)."""
    def leaf(g):
        return g[t] if g.dim() == 2 else g[t, :, :w].reshape(-1, *g.shape[3:])

    with host_side():
        on_host = [leaf(g) for g in grids[:host]]
    return on_host + [leaf(g) for g in grids[host:]]


def _unflatten(like: tuple, flat: list[torch.Tensor]) -> tuple:
    it = iter(flat)

    def build(t):
        return tuple(build(p) if isinstance(p, tuple) else next(it) for p in t)

    return build(like)


@dataclass(frozen=True)
class ChunkPhase:
    """The one phase every client of a batched chunk trains (see fnlcore.fl.contract.Phase).

    ``augment`` "train" (the engine's train view, forwarded for the loss) or "raw" (the loss
    forwards the declared ``views``); ``draws`` the phase's declared per-batch draws;
    ``epochs``/``batch_size`` None: the run's; ``lr_round`` the round whose scheduled learning
    rate the optimiser takes (None: this round); ``train`` the names of several networks that
    step together on the same batches (Co-teaching's pair), in the order of ``models``."""

    augment: str = "train"
    views: tuple[str, ...] = ()
    draws: Callable | None = None
    epochs: int | None = None
    batch_size: int | None = None
    lr_round: int | None = None
    train: tuple[str, ...] = ()  # the networks stepped together (empty: the one model given)


AfterStep = Callable[[StackedBatch, torch.Tensor], None]


def _epoch_rates(epoch_lr: Callable[[int], float], epochs: tuple[int, ...], device) -> float | torch.Tensor:
    """The step's learning rate from each client's epoch (K,): one value when the clients agree,
    else (K,) float64 on the device (each client steps at its own epoch's rate)."""
    rates = [epoch_lr(e) for e in epochs]
    if all(v == rates[0] for v in rates):
        return rates[0]
    return torch.tensor(rates, dtype=torch.float64).to(device, non_blocking=True)


def train_clients(
    ctx: RunContext,
    global_model: torch.nn.Module,
    clients: list[torch.Tensor],
    loss_fn: BatchedLossFn,
    round_index: int,
    net: StackedNet | None = None,
    clients_ids: torch.Tensor | None = None,
    phase: ChunkPhase = ChunkPhase(),
    jobs: list | None = None,
    after_step: AfterStep | None = None,
    models: list[torch.nn.Module] | None = None,
    drawn: list[ClientDraws] | None = None,
    copies: dict[str, StackedNet] | None = None,
    before_step: AfterStep | None = None,
    epoch_lr: Callable[[int], float] | None = None,
    fixed_shapes: bool | None = None,
) -> tuple[list, list[float]]:
    """Train K copies of ``global_model`` on the K clients' samples; returns their states and mean losses.

    ``net``: a StackedNet of K copies of the model to train in (its contents are overwritten;
    built here when absent); ``clients_ids``: the clients' ids for :class:`StackedBatch` (default
    0..K-1); ``phase``: what the clients train (default: the run's epochs and batch size on the
    train view); ``jobs``: the clients' prepared jobs, passed to the loss; ``after_step(sb,
    stepped)``: runs after every optimiser step, ``stepped`` (K,) the clients whose parameters
    moved (a client without a batch at this step rides along unchanged). ``models``: several
    networks per client stepped together (``phase.train`` names them; ``net`` then holds
    G * K copies, network-major); each client's states are then a list, one per network.
    ``drawn``: the clients' batches and random parameters drawn already (:func:`draw_client`).
    ``copies``: the method's client networks, K stacked copies each (loaded), for ``sb.copies``.
    ``before_step(sb, stepped)``: runs after the gradient, before the optimiser step; ``epoch_lr(epoch)``:
    the learning rate of a local epoch (each client steps at its own epoch's). ``fixed_shapes``: a plain
    chunk (:func:`graphable`) runs the capture-ready step (every step the full batch wide,
    padded rows masked, inputs in fixed buffers; None: when ``training.cuda_graphs`` is on, which also
    captures it on CUDA).
    """
    s = ctx.settings
    k = len(clients)
    group = models if models is not None else [global_model]
    g = len(group)
    if net is None:
        net = StackedNet(group[0], g * k).to(ctx.device)
    elif net.k != g * k:
        raise ValueError(f"train_clients: the StackedNet holds {net.k} copies for {g} network(s) of {k} clients")
    net.load_groups([m.state_dict() for m in group])
    net.train()
    params = net.trainable()
    fixed = (s.cuda_graphs if fixed_shapes is None else fixed_shapes) and graphable(
        loss_fn, phase.augment, models, copies, before_step, after_step, epoch_lr)
    opt = stacked_optimizer(s, params, s.lr_at(round_index if phase.lr_round is None else phase.lr_round),
                            capturable=fixed)
    epochs = s.local_epochs if phase.epochs is None else phase.epochs
    tl = build_timeline(ctx, clients, epochs, phase.batch_size or s.batch_size, draw_fn(ctx, phase), drawn)
    images = ctx.data.train.images
    index_dev = tl.index.to(ctx.device, non_blocking=True)
    mask_dev = tl.mask.to(ctx.device, non_blocking=True)
    step_dev = tl.epoch_step.to(ctx.device, non_blocking=True)
    # The train view's parameters (crop offsets, flips, affine matrices; it decides nothing on the host)
    # and a method's own draws (a mixup's lambda and partners) go to the device once per chunk, not a
    # copy each per step. A raw phase's view parameters stay on the host: the views decide from them
    # there and copy what they need.
    # (contiguous there: a step's slice of a per-sample grid is then a view, not a copy)
    host_leaves = len(_flatten(tl.like[0])) if phase.augment == "raw" and tl.like else 0
    grids = tuple(g if i < host_leaves else g.to(ctx.device, non_blocking=True).contiguous()
                  for i, g in enumerate(tl.aug))
    ids_host = clients_ids if clients_ids is not None else torch.arange(k)
    ids = ids_host.to(ctx.device, non_blocking=True)
    names = tuple(phase.train) if models is not None else ()
    kept = {n: StackedCopies(c, net) for n, c in (copies or {}).items()}
    client_epochs = [tuple(row) for row in tl.epoch.tolist()]  # read once: each step's epochs as host ints
    step_losses = []
    autocast = ctx.autocast()
    raw = phase.augment == "raw"
    refs = _flatten(tl.like[1]) if raw and tl.like else []  # the declared draws' leaves: a 0-dim one is per batch
    if fixed:
        runner = _fixed_step(ctx, tl, net, params, opt, loss_fn, ids, jobs, round_index, grids)
        width = tl.index.shape[2]
    for t in range(tl.steps):
        if fixed:  # the capture-ready step: the full batch wide, padded rows masked (the module doc)
            with step_region():
                masked = not (tl.full[t] and tl.width[t] == width)
                inputs = {"idx": index_dev[t], "step": step_dev[t]}
                inputs.update((f"draw{i}", leaf) for i, leaf in enumerate(_at_step(grids, t, width)))
                if masked:
                    inputs["mask"] = mask_dev[t]
                step_losses.append(runner.step(inputs, masked).detach().float())
            continue
        with step_region():
            w = tl.width[t]
            idx = index_dev[t, :, :w]
            x = images.index_select(0, idx.reshape(-1))
            drawn = _unflatten(tl.like, _at_step(grids, t, w, host_leaves)) if grids else tl.like
            mask = None if tl.full[t] else mask_dev[t, :, :w]
            # Augmentation in full precision (outside autocast, as the sequential engine): bf16 would
            # round the interpolated and blended pixel values.
            if raw:
                view_params, extra = drawn if drawn else ((), ())
                views = {n: ctx.pipeline.apply_view(n.split(":", 1)[0], x, p) for n, p in zip(phase.views, view_params)}
                extra = tuple(e if ref.dim() == 0 else e.view(k, w, *e.shape[1:]) for e, ref in zip(_flatten(extra), refs))
                sb = StackedNetBatch(None, idx, mask, ids, x, step_dev[t], net, round_index, views, extra, jobs, names,
                                  epoch_ends=tl.epoch_ends[t], epoch_step_host=tl.epoch_step[t],
                                  clients_host=ids_host, moved_host=tl.mask[t, :, 0], copies=kept,
                                  epochs=client_epochs[t])
            else:
                view = ctx.pipeline.apply_train(x, drawn)
                sb = StackedNetBatch(None, idx, mask, ids, view, step_dev[t], net, round_index, jobs=jobs, networks=names,
                                  epoch_ends=tl.epoch_ends[t], epoch_step_host=tl.epoch_step[t],
                                  clients_host=ids_host, moved_host=tl.mask[t, :, 0], copies=kept,
                                  epochs=client_epochs[t])
            with autocast:
                if not raw:
                    sb.logits = sb.forward(view)
                losses = loss_fn(sb)
            grads = torch.autograd.grad(losses, params, _seed(losses))
            stepped = mask_dev[t, :, 0]  # a client with a batch has a real row 0
            if before_step is not None:
                before_step(sb, stepped)
            if epoch_lr is not None:
                opt.lr = _epoch_rates(epoch_lr, client_epochs[t] * g, ctx.device)  # network-major, as the copies
            opt.step(grads, None if mask is None else stepped.repeat(g))
            if after_step is not None:
                after_step(sb, stepped)
            step_losses.append(losses.detach().float())
    if models is None:
        states = [net.client_state(i) for i in range(k)]
    else:
        states = [[net.client_state(j * k + i) for j in range(g)] for i in range(k)]
    return states, _mean_losses(step_losses, tl)


@functools.lru_cache(maxsize=16)
def _ones(k: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.ones(k, dtype=dtype, device=device)


def _seed(losses: torch.Tensor) -> torch.Tensor:
    """The gradient of the summed (K,) losses with respect to each: ones, made once (not a ``sum`` and a
    ``ones_like`` a step)."""
    return _ones(losses.shape[0], losses.dtype, losses.device)


def _fixed_step(ctx: RunContext, tl: Timeline, net: StackedNet, params, opt, loss_fn, ids, jobs, round_index: int,
                grids: tuple) -> StepRunner:
    """The StepRunner of a plain chunk: the engine's step (train view, forward, loss, gradient, optimiser)
    on a step's fixed buffers (``idx`` (K, B), ``step`` (K,), ``draw<i>`` the train view's parameters at
    full width, ``mask`` (K, B) when some row is padded)."""
    images, autocast = ctx.data.train.images, ctx.autocast()
    graphs = ctx.settings.cuda_graphs and ctx.device.type == "cuda"
    if graphs and ctx.settings.precision == "bf16":  # autocast's cast cache cannot live across graph replays
        autocast = torch.autocast(ctx.device.type, dtype=torch.bfloat16, cache_enabled=False)

    def body(buf: dict, masked: bool) -> torch.Tensor:
        idx = buf["idx"]
        mask = buf["mask"] if masked else None
        x = images.index_select(0, idx.reshape(-1))
        drawn = _unflatten(tl.like, [buf[f"draw{i}"] for i in range(len(grids))]) if grids else tl.like
        view = ctx.pipeline.apply_train(x, drawn)  # in full precision, as the ordinary step
        sb = StackedNetBatch(None, idx, mask, ids, view, buf["step"], net, round_index, jobs=jobs)
        with autocast:
            sb.logits = sb.forward(view)
            losses = loss_fn(sb)
        grads = torch.autograd.grad(losses, params, _seed(losses))
        opt.step(grads, None if mask is None else mask[:, 0])  # a client with a batch has a real row 0
        return losses

    return StepRunner(body, graphs=graphs)


def draw_fn(ctx: RunContext, phase: ChunkPhase) -> DrawFn:
    """A batch's random parameters as the sequential engine draws them for ``phase``: the train
    augmentation's, or the declared views' then the declared draws."""
    size, gen, dev = tuple(ctx.data.train.images.shape[-2:]), ctx.aug_gen, ctx.device
    if phase.augment != "raw":
        return lambda n: ctx.pipeline.draw_train(n, gen, dev, size)
    if not phase.views and phase.draws is None:
        return lambda n: ()

    def draw(n: int) -> tuple:
        views = tuple(ctx.pipeline.draw_view(v.split(":", 1)[0], n, gen, dev, size) for v in phase.views)
        return views, tuple(phase.draws(n, gen, dev)) if phase.draws is not None else ()

    return draw


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
