"""The method contract: everything a method's stage table writes against, and what the engine
promises in return. A method imports these names from :mod:`fnlcore.methods.api`.

The types
---------
* :class:`Stage`: what a method does in the rounds of one stage (a row of ``FLMethod.stages``):
  the stage's one loss form ``loss(sb)``, what a client ``prepare``s before it trains and
  ``upload``s after, the per-chunk hooks ``begin``/``end``, the per-step hooks
  ``before_step``/``after_step``, a per-epoch learning rate ``epoch_lr``, the per-client
  networks it keeps (``copies``) and an upload's draws made ahead (``reserve``).
* :class:`LocalJob`: what ``prepare`` returns, what a client trains in a round: its
  :class:`Phase` list (or a generator that decides the next phase after the previous ran), the
  round whose scheduled learning rate it takes, per-network rates and ``info`` for the loss and
  the upload. None from ``prepare`` means the default job: one phase, the stage's loss.
* :class:`Phase`: a stretch of local training: which networks step, on which batch streams,
  with which augmentation, for how many epochs, with which hooks.
* :class:`StackedBatch`: one step of K clients as the one loss form sees it. At K = 1 (the
  sequential engine) it is one client's batch: the same fields with a leading client axis of 1.
* :class:`Batch`: one step of one client, for a phase that brings its own loss
  (``Phase.loss``: several streams, DivideMix's co-divided sets).
* :class:`ClientUpdate`: what one client sends to the server: its trained networks by name
  and its uploads; :meth:`FLMethod.aggregate` consumes them.
* :class:`OneForm`: a stage's loss and per-step hooks bound to the method for one round, as
  both engines call them.

The one loss form over K clients
--------------------------------
A stage's loss is written once, over K clients: ``loss(sb: StackedBatch) -> (K,)``, each
client's mean loss over its real rows. ``sb.logits`` is (K, B, classes) on the train view
(None with ``augment="raw"``: the loss calls ``sb.forward(view)`` on the views it declared),
``sb.idx`` (K, B) sample ids, ``sb.mask`` (K, B) real rows or None when every row is real.
Reduce per sample with the reducers below, never with a mean over the whole (K, B) tensor: a
padded row must not count and one client's loss must not depend on another's. The batched
engine runs the form on K clients of a stacked network; the sequential engine runs it on one
client's plain model (K = 1) and takes entry 0. Both engines step each client on the gradient of
its own entry.

The reducers
------------
* :func:`clients_cross_entropy` ``(logits (K, B, C), labels, mask) -> (K,)``: each client's mean
  cross-entropy over its real rows (at K = 1 unmasked, ``F.cross_entropy``'s own mean, bit for
  bit the per-client value a decision may read);
* :func:`masked_mean` ``(per_sample (K, B), mask) -> (K,)``: each client's mean of any
  per-sample term over its real rows;
* :func:`clients_mean` ``(sb, per_sample (K * B,)) -> (K,)``: the same for a flat per-sample
  term computed on ``sb.x`` or a view (client after client).

A loss that reads only ``sb``'s device tensors and the method's device state, and decides
nothing on the host from them, may be declared :func:`capturable`: the batched engine may then
capture its plain steps as a CUDA graph and replay them (``training.cuda_graphs``; the batched
engine's module doc).

What the engine guarantees
--------------------------
* It owns the loop: for client k in round r it loads the client's working networks from the
  global ones, calls ``prepare``, runs the job's phases (shuffling, batching, augmentation,
  autocast, the optimiser steps, the hooks), then calls ``upload``. No method writes the
  load -> train -> snapshot skeleton.
* The random draws happen in one fixed order, the same on both engines: per epoch one
  permutation of the lead stream from ``ctx.shuffle_gen``, then per step the lead batch, each
  other stream's next batch (a stream that runs out is reshuffled), the augmentation
  (``augment="train"``: the train view before the loss; ``"raw"``: the declared views and
  draws), the loss. A client's run on the batched engine differs from its sequential run only by
  floating-point rounding.
* Augmentation runs in full precision outside autocast; the loss runs inside it.
* A client with fewer steps than the others of its chunk rides along masked: its parameters,
  optimiser state and BatchNorm statistics do not move (``sb.moved``/``stepped``).
* ``begin``/``end`` run around each chunk of clients (one client on the sequential engine),
  ``before_step`` after the gradient and before the optimiser step, ``after_step`` after it.

This module holds no engine: it imports none, and trains nothing. The sequential engine is
:mod:`fnlcore.fl.sequential`, the batched one :mod:`fnlcore.fl.batched`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from types import MethodType
from typing import Any, Callable, Iterable

import torch
import torch.nn.functional as F

from .state import State

# What a method writes against (fnlcore.methods.api re-exports each); OneForm is the engines' binding of a Stage.
__all__ = ["Batch", "ClientUpdate", "LocalJob", "Phase", "StackedBatch", "Stage",
           "capturable", "clients_cross_entropy", "clients_mean", "masked_mean"]

Streams = dict[str, tuple[torch.Tensor, int]]


@dataclass
class Batch:
    """One step of one client as a phase's own loss sees it (``Phase.loss``; the stage's loss form
    takes a :class:`StackedBatch`).

    ``model``: the network being trained (the phase's first); ``nets``: every working network
    of the client by name (trained ones in train mode); ``x``: the train view of the lead batch
    (``augment="train"``) or None; ``idx``: the lead batch's sample ids (CPU int64);
    ``streams``: each stream's (uint8 images on the device, sample ids) for ``augment="raw"``;
    ``views``: the phase's declared views of the lead batch (name -> normalised batch) and
    ``draws``: its declared per-batch draws (``Phase.views``/``Phase.draws``);
    ``step``/``epoch``: the batch number within the epoch and the epoch within the phase.
    """

    model: torch.nn.Module
    nets: dict[str, torch.nn.Module]
    x: torch.Tensor | None
    idx: torch.Tensor
    streams: dict[str, tuple[torch.Tensor, torch.Tensor]]
    step: int
    epoch: int
    r: int
    k: int
    job: "LocalJob"
    views: dict[str, torch.Tensor] = field(default_factory=dict)
    draws: tuple = ()


LossFn = Callable[[Batch], torch.Tensor]


@dataclass
class Phase:
    """A stretch of local training: which networks step, on which streams, with which loss.

    ``loss`` (None: the stage's); ``train``: names of the networks the optimiser steps (None:
    the method's first network); ``streams``: name -> (sample ids, batch size), the first sets
    the epoch length (None: the client's samples at the run's batch size); ``augment``: "train"
    gives ``Batch.x`` (one stream only), "raw" leaves the views to the loss; ``epochs`` (None:
    the run's); ``on_epoch(epoch)`` runs before each epoch and may return new streams;
    ``after_step()`` runs after every optimiser step (EMA trackers). A step that is not one
    optimiser step on one loss (FedFixer's twin step) is a stage's one loss form with trainable
    client copies and ``Stage.before_step`` (:mod:`fnlcore.fl.copies`).
    """

    loss: LossFn | None = None
    train: tuple[str, ...] | None = None
    streams: Streams | None = None
    augment: str = "train"
    epochs: int | None = None
    on_epoch: Callable[[int], Streams | None] | None = None
    after_step: Callable[[], None] | None = None
    views: tuple[str, ...] = ()
    draws: Callable[[int, torch.Generator | None, Any], tuple] | None = None


@dataclass
class LocalJob:
    """What a client trains in a round: its phases (a list, or a generator that decides the next
    phase after the previous one ran — DivideMix's per-epoch co-divide), the round whose
    scheduled learning rate the optimisers take (``lr_round``, None: this round), per-network
    learning rates that differ from the schedule (``lr``), and ``info``: whatever the method's
    loss and upload need from its preparation. ``losses`` collects each phase's mean loss.
    """

    phases: Iterable[Phase] | None = None
    lr_round: int | None = None
    lr: dict[str, float] = field(default_factory=dict)
    info: Any = None
    losses: list[float] = field(default_factory=list)
    reserved: Any = None  # the upload's draws made ahead by Stage.reserve (batched engine), else None
    # the engine's optimisers by network, filled as phases start (a phase's on_epoch may retune them)
    optimizers: dict[str, torch.optim.Optimizer] = field(default_factory=dict)

    @property
    def train_loss(self) -> float:
        """The mean loss of a one-phase job (the mean of the phases' means otherwise)."""
        return self.losses[0] if len(self.losses) == 1 else (sum(self.losses) / len(self.losses) if self.losses else 0.0)


@dataclass
class Stage:
    """What a method does in the rounds of one stage (a row of its stage table).

    The callables are functions of the method's class body, called with the method first:
    ``prepare(r, k, nets) -> LocalJob | None`` runs before client k trains (``nets``: the
    client's working networks, loaded from the global ones); None means the default job.
    ``loss(sb)`` is the stage's one loss form, written once over K clients
    (:class:`StackedBatch` -> (K,)): the batched engine hands it the round's
    clients on the stacked network, the sequential engine one client (K = 1) on the plain model
    (:mod:`fnlcore.fl.one_client`). A phase of the job may bring its own loss over one client's
    :class:`Batch` (``Phase.loss``: several streams, DivideMix's co-divided sets).
    ``upload(r, k, job, nets) -> dict`` is what the client sends besides its networks (default:
    its mean training loss).

    ``batches`` (default True): the engine may train the round's clients as one stacked
    computation; False for a stage whose jobs are not one stacked step (several phases or
    streams, a per-epoch hook), which the sequential engine runs.

    Per-chunk and per-step work, run by both engines around the one loss form: ``begin(r,
    clients, jobs)`` before a chunk of clients trains (the batched engine's chunk; the sequential
    engine's one client), ``after_step(sb, stepped)`` after each optimiser step (``stepped`` (K,)
    the clients whose parameters moved: a client without a batch rides along), ``end(r, clients,
    jobs)`` after the chunk trained, before the uploads; the state they keep is the method's, sized
    by the chunk. ``copies`` names the method's ``client_networks`` the stage keeps per client (an
    EMA teacher, :mod:`fnlcore.fl.copies`): each client's copy is what its ``prepare`` left in the
    working network; a loss reads ``sb.copies[name]``, ``after_step`` moves it, the upload finds
    the trained copy in the working network (a copy left in train mode trains: ``forward`` with a
    gradient, ``grads``, ``assign_``: FedFixer's personalised model). ``before_step(sb, stepped)``
    runs after the step's gradient is taken, before the optimiser steps (FedFixer moves w towards
    θ there, as its code does); ``epoch_lr(r, epoch)`` is the trained network's learning rate in
    each local epoch, replacing the run's schedule (FedFixer's plr / (1 + β_e)); the batched engine
    steps each client at its own epoch's rate. A batchable stage's ``prepare`` may act (relabel,
    read a store) and returns a job of phases on distinct networks (DivideMix's warm-up: net1's
    epochs, then net2's), each on one stream with no hooks of its own
    (``lr_round``, ``info``, the stream's sample ids, ``augment="raw"`` with declared
    ``views``/``draws``: see ``rounds.client_phases``).

    A stage with no ``loss`` never batches.
    ``upload(r, k, job, nets)`` runs on each client's trained networks. An upload that
    draws random numbers (a detection pass on augmented images) declares ``reserve(r, k, job)``:
    the batched engine calls it right after the client's training draws, where the sequential
    engine's upload draws, and it returns those draws (e.g. ``fl.local.draw_predict``) into
    ``job.reserved`` for the upload to apply; the sequential engine never calls it
    (``job.reserved`` stays None: the upload draws live).
    """

    loss: Callable | None = None  # the one form: StackedBatch -> (K,)
    prepare: Callable[[int, int, dict], LocalJob | None] | None = None
    upload: Callable[[int, int, LocalJob, dict], dict] | None = None
    batches: bool = True
    copies: tuple[str, ...] = ()
    reserve: Callable | None = None
    begin: Callable | None = None
    before_step: Callable | None = None
    after_step: Callable | None = None
    end: Callable | None = None
    epoch_lr: Callable[[int, int], float] | None = None

    @property
    def batchable(self) -> bool:
        """Whether the batched engine may train this stage's clients together."""
        return self.loss is not None and self.batches


@dataclass(frozen=True)
class OneForm:
    """A stage's one loss form and its per-step hooks, bound to the method for round ``r``: what
    both engines call (the sequential one at K = 1)."""

    loss: Callable
    before_step: Callable | None = None
    after_step: Callable | None = None
    epoch_lr: Callable[[int], float] | None = None  # local epoch -> learning rate (round bound)
    copies: tuple[str, ...] = ()

    @classmethod
    def of(cls, method, stage: Stage, r: int) -> "OneForm | None":
        if stage.loss is None:
            return None
        bound = lambda f: None if f is None else MethodType(f, method)  # noqa: E731
        lr = None if stage.epoch_lr is None else (lambda epoch: stage.epoch_lr(method, r, epoch))
        return cls(MethodType(stage.loss, method), bound(stage.before_step), bound(stage.after_step), lr,
                   tuple(stage.copies))


@dataclass
class ClientUpdate:
    """What one client sends: its trained networks by name and its uploads."""

    client: int
    num_samples: int
    states: dict[str, State]
    uploads: dict[str, Any] = field(default_factory=dict)

    @property
    def state(self) -> State:
        """The first (for most methods: the only) network's state."""
        return next(iter(self.states.values()))


@dataclass
class StackedBatch(ABC):
    """One step of K clients as the one loss form sees it (at K = 1, on the sequential engine:
    one client's batch, with a leading client axis of 1); the K-client twin of :class:`Batch`.

    ``logits`` (K, B, classes) of the clients' network on the train view (None for a phase with
    ``augment="raw"``: the loss runs :meth:`forward` on the views it wants); ``idx`` (K, B)
    sample ids on the device; ``mask`` (K, B) real rows, or None when every row is real;
    ``clients`` (K,) client ids; ``x`` the train view of the K batches, client after client
    ((K * B, C, H, W): a global model's forward on it, viewed as (K, B, classes), is the
    clients' teacher output), or the raw uint8 batches for ``augment="raw"``;
    ``epoch_step`` (K,) each client's batch number within its epoch (FedProx skips batch 0);
    ``net`` the batched engine's stacked network (None at K = 1); ``r`` the round; ``views`` the
    phase's declared views (name -> (K * B, C, H, W)); ``draws`` its declared draws (a per-batch
    draw as (K,), a per-sample one as (K, B, ...)); ``jobs`` each client's prepared
    :class:`LocalJob` (its ``info``), in client order; ``networks`` the trained networks' names
    when a phase trains several (empty: one); ``epoch_ends`` the positions of the clients whose
    step ends one of their epochs, known on the host (a per-epoch decision needs no device sync);
    ``copies`` each of the method's ``client_networks`` kept per client (:mod:`fnlcore.fl.copies`:
    ``sb.copies[name](view)`` -> (K, B, ...), moved by a stage's ``after_step``); ``epochs`` each
    client's local epoch, host ints (a per-epoch rate, no sync).

    Each engine supplies :meth:`forward`, :meth:`forward_features` and :meth:`parameters` for its
    networks (the batched engine's stacked network, the sequential engine's plain model).
    """

    logits: torch.Tensor | None
    idx: torch.Tensor
    mask: torch.Tensor | None
    clients: torch.Tensor
    x: torch.Tensor
    epoch_step: torch.Tensor
    net: Any
    r: int
    views: dict[str, torch.Tensor] = field(default_factory=dict)
    draws: tuple = ()
    jobs: list | None = None
    networks: tuple[str, ...] = ()
    epoch_ends: tuple[int, ...] = ()  # positions of the clients whose step ends one of their epochs (host side)
    epoch_step_host: torch.Tensor | None = None  # ``epoch_step`` on the host (a per-batch decision, no sync)
    clients_host: torch.Tensor | None = None  # ``clients`` on the host
    moved_host: torch.Tensor | None = None  # (K,) on the host: the clients that have a batch at this step
    copies: dict = field(default_factory=dict)  # the method's client networks, one per client (fl.copies)
    epochs: tuple[int, ...] = ()  # each client's local epoch within the phase (read once per chunk, host ints)

    @property
    def moved(self) -> torch.Tensor | None:
        """(K,) on the device: the clients that have a batch at this step (None: all of them)."""
        return None if self.mask is None else self.mask[:, 0]

    def per_client(self, flat: torch.Tensor) -> torch.Tensor:
        """(K * B, ...) rows of a forward on ``x`` -> (K, B, ...)."""
        return flat.view(self.idx.shape[0], self.idx.shape[1], *flat.shape[1:])

    @abstractmethod
    def forward(self, view: torch.Tensor) -> torch.Tensor:
        """The clients' trained network on a (K * B, C, H, W) view -> (K, B, classes) (padded rows
        masked); with several trained networks, every network's K clients: (G * K, B, classes),
        see :meth:`of`."""

    @abstractmethod
    def forward_features(self, view: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward` returning the model's logits and penultimate features: (K, B, classes) and
        (K, B, features) (with several trained networks, (G * K, B, ...) each, see :meth:`of`)."""

    @abstractmethod
    def parameters(self, network: str | None = None) -> dict[str, torch.Tensor]:
        """Each trainable parameter of the clients' network ``network`` (default: the first trained)
        by the model's own name, stacked (K, ...): what a proximal term compares to a reference."""

    def of(self, name: str, logits: torch.Tensor | None = None) -> torch.Tensor:
        """Network ``name``'s (K, B, ...) part of (G * K, B, ...) outputs (default: ``logits``)."""
        t = self.logits if logits is None else logits
        k = self.idx.shape[0]
        g = self.networks.index(name) if self.networks else 0
        return t[g * k : (g + 1) * k]


# -- the reducers: per-sample terms -> (K,) per-client means over real rows -------------------------------


def clients_cross_entropy(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """(K, B, C) logits, (K * B,) or (K, B) labels -> (K,) each client's mean cross-entropy over its
    real rows. One unmasked client takes ``F.cross_entropy``'s own mean: the same gradient as the
    masked mean, and the loss value (which Fed-NCL's decision reads) bit for bit the per-client
    code's."""
    k, b, c = logits.shape
    if k == 1 and mask is None:
        return F.cross_entropy(logits[0], y.reshape(-1)).unsqueeze(0)
    return masked_mean(F.cross_entropy(logits.reshape(k * b, c), y.reshape(-1), reduction="none").view(k, b), mask)


def masked_mean(per_sample: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """(K, B) per-sample losses -> (K,) means over each client's real rows (``mask`` (K, B), None: every
    row); also one client's (B,) -> a scalar."""
    if mask is None:
        return per_sample.mean(-1)
    zero = torch.zeros((), dtype=per_sample.dtype, device=per_sample.device)
    return torch.where(mask, per_sample, zero).sum(-1) / mask.sum(-1).clamp_min(1).to(per_sample.dtype)


def clients_mean(sb: StackedBatch, per_sample: torch.Tensor) -> torch.Tensor:
    """(K * B,) per-sample values of a step, client after client -> (K,) each client's mean over its real rows."""
    return masked_mean(per_sample.view(sb.idx.shape), sb.mask)


# -- a loss a CUDA graph may replay ------------------------------------------------------------


def capturable(loss):
    """Declare a stage's loss capturable: it reads only ``sb``'s device tensors (``logits``, ``idx``,
    ``mask``, ``clients``, ``x``, ``epoch_step``, ``net``) and the method's device state, and makes
    no host decision from them."""
    loss.capturable = True
    return loss


def is_capturable(loss) -> bool:
    return bool(getattr(getattr(loss, "__func__", loss), "capturable", False))
