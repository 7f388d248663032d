"""The method plug-in interface of the FL engine.

A method is one module: a frozen hyper-parameter dataclass (subclass of
:class:`MethodParams`) and a subclass of :class:`FLMethod`, registered with
:func:`register`. The engine (:mod:`fnlcore.fl.simulation`) drives a round as

    begin_round(r) -> select_clients(r) -> for k: accumulate(r, local_update(r, k))
    -> aggregate(r) -> end_round(r) -> evaluate(eval_model())

and checkpoints ``state_dict()`` with the random streams. The defaults are
FedAvg; methods override only what they change. The interface was designed
for the hardest methods still to come:

* persistent per-client state across rounds — keep it in attributes and return
  it from ``state_dict`` (FedDiv's priors and local filters, FedGR's loss
  histories and per-client EMA models, FedCorr's LID scores);
* several global models — keep several (Co-teaching's two networks, FedFixer's
  global + personalised, DivideMix); ``local_update`` returns a ``ClientUpdate``
  whose ``state`` may hold the entries of both, ``eval_model`` picks the
  evaluated one;
* per-sample label overrides that persist — ``ctx.data.relabel(idx, labels, r, stage, k)``
  (relabelling, pseudo labels); the engine checkpoints it;
* multi-stage schedules and non-standard sampling — ``num_rounds``, ``stage(r)``
  and ``select_clients(r)`` (FedCorr's stage 1 trains one client per round
  sequentially: ``select_clients`` returns [k] and ``aggregate`` adopts its
  model; FedGR's warm-up uses :class:`~fnlcore.fl.sampling.CyclicSampler`);
* extra uploads and server-side steps — ``ClientUpdate.uploads`` carries any
  per-client payload (per-class losses, per-sample proxies with sample ids,
  GMM parameters, layer-wise weights) and ``aggregate``/``end_round`` run the
  server step (GMMs, distance-aware or layer-wise aggregation).

How the methods still to come sit on it: FedCorr = stages (1: sequential
single clients with proximal term + LID/GMM + relabel in ``end_round``; 2:
candidate clients; 3: all); FedDiv = per-client state {prior, cached labels,
participation count} + filter parameters uploaded and aggregated in
``aggregate``; FedGR = per-client EMA models and loss history in attributes,
per-sample loss proxies uploaded and a global GMM in ``aggregate``;
Co-teaching = two global models, the local loss exchanges small-loss samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..registry import Registry
from ..fl import sampling
from ..fl.context import RunContext
from ..fl.local import train_epochs
from ..fl.state import RunningAverage, State, load, snapshot
from ..spec import Spec


@dataclass(frozen=True)
class MethodParams(Spec):
    """Base of every method's hyper-parameter dataclass (frozen, typed, validated).

    Declare fields with :func:`fnlcore.registry.param` (bounds, choices, ``rounds=True``);
    ``name`` is the config name and the slug's head, ``slug_fields`` the fields shown
    readably in the slug (the others hash), ``switches`` the code≠paper switches. The
    method class (not this dataclass) joins METHODS, through :func:`register`.
    """

    kind: ClassVar[str] = "method"

    def check_training(self, settings) -> None:
        """Reject hyper-parameters that cannot work with these training settings (before any job runs)."""


@dataclass(frozen=True)
class CostStage:
    """A stretch of rounds as `fnl plan`'s cost model sees it (fnlcore/app/cost.py).

    ``clients``: clients trained a round; ``factor``: a round's cost over a FedAvg round on
    the same clients; ``evaluated``: whether these rounds score the test set.
    """

    name: str
    rounds: int
    clients: int
    factor: float
    evaluated: bool = True


def warm_up_then(cls: type["FLMethod"], warmup_rounds: int, settings, num_clients: int, name: str) -> list[CostStage]:
    """Cost stages of a method whose first ``warmup_rounds`` rounds cost a FedAvg round and the
    rest ``cls.round_cost`` (FedNoRo, DivideMix)."""
    m = sampling.clients_per_round(num_clients, settings.client_fraction)
    warm = min(warmup_rounds, settings.rounds)
    return [CostStage("warmup", warm, m, 1.0), CostStage(name, settings.rounds - warm, m, cls.round_cost or 1.0)]


@dataclass
class ClientUpdate:
    client: int
    num_samples: int
    state: State
    uploads: dict[str, Any] = field(default_factory=dict)


class FLMethod:
    """FedAvg behaviour; subclasses override what they change.

    Hooks, in the order the engine calls them (each a no-op or FedAvg by default):
    ``begin_round(r)`` and ``end_round(r)`` at the round boundaries (server steps,
    detection, relabelling); ``on_local_epoch_start(r, k, epoch, model)`` before each
    local epoch of client k (called only when overridden, so FedAvg pays nothing);
    ``should_evaluate(r)`` after the round. Building blocks for ``local_update``:
    :func:`~fnlcore.fl.local.train_epochs` (one stream, ``loss(model, x, idx, step)``),
    :func:`~fnlcore.fl.local.train_streams` (several streams with their own batch
    sizes; the epoch hook may return new streams), ``ctx.pipeline.views`` (named
    augmented views of one batch), ``ctx.optimizer(params, r, lr=None)`` and
    ``model.forward_features(x)`` (logits and penultimate features).
    """

    Params: ClassVar[type[MethodParams]] = MethodParams
    paper: ClassVar[str] = ""
    # Stages whose rounds count for a table's Best/Last (None = every round); FedNoRo: stage 2 only.
    reported_stages: ClassVar[tuple[str, ...] | None] = None
    # Label kinds the method trains on: "single" (one class per sample) and/or "multi"
    # (multi-label, FedMLP's partial labels). Running on another kind is a ConfigError.
    label_kinds: ClassVar[tuple[str, ...]] = ("single",)
    # Seconds of a round over a FedAvg round on the same clients, as benchmarks/bench_methods.py
    # measures it (digits MLP, CPU; benchmarks/README.md). None: not measured; `fnl plan`
    # counts 1.0 and flags the estimate.
    round_cost: ClassVar[float | None] = None

    @classmethod
    def cost_stages(cls, params: MethodParams, settings, num_clients: int) -> list[CostStage]:
        """The run's rounds for the cost model: one stage of ``training.rounds`` by default;
        a method whose rounds differ in clients or cost (FedCorr, FedDiv) lists its stages."""
        m = sampling.clients_per_round(num_clients, settings.client_fraction)
        return [CostStage("main", settings.rounds, m, cls.round_cost or 1.0)]

    def __init__(self, params: MethodParams, ctx: RunContext):
        check_label_kind(type(self), ctx.data.multi_label)
        self.params = params
        self.ctx = ctx
        self._pos_weight: torch.Tensor | None = None
        self.global_model = ctx.new_model()
        self.worker = ctx.new_model()  # one reusable model for every local update
        self._batched = use_batched_engine(type(self), ctx.settings.engine) and batched_fits(
            ctx, self.global_model, strict=ctx.settings.engine == "batched"
        )
        self._stacked: dict = {}  # K -> StackedNet of the batched engine
        self._round_avg: RunningAverage | None = None
        self.round_info: dict[str, float] = {}

    # -- schedule ------------------------------------------------------------------------
    def num_rounds(self) -> int:
        return self.ctx.settings.rounds

    def stage(self, r: int) -> str:
        return "main"

    def select_clients(self, r: int) -> list[int]:
        return sampling.uniform_fraction(self.ctx.rng, self.ctx.data.num_clients, self.ctx.settings.client_fraction)

    # -- a round ----------------------------------------------------------------------------
    def begin_round(self, r: int) -> None:
        self._round_avg = RunningAverage()
        self.round_info = {}

    def local_updates(self, r: int, clients: list[int]):
        """The round's client updates, in client order: one after another (``training.engine``
        sequential), or all of them as one stacked computation (batched; :mod:`fnlcore.fl.batched`)."""
        if not self._batched or not clients:
            return (self.local_update(r, k) for k in clients)
        return self._batched_updates(r, clients)

    def _batched_updates(self, r: int, clients: list[int]) -> list[ClientUpdate]:
        from ..fl.batched import train_clients
        from ..fl.stacked import StackedNet

        for k in clients:
            self.before_local(r, k)
        chunk = self.ctx.settings.batched_clients or len(clients)
        out: list[ClientUpdate] = []
        for at in range(0, len(clients), chunk):  # chunks in client order keep the sequential draw order
            part = clients[at : at + chunk]
            ids = torch.as_tensor(part, dtype=torch.int64, device=self.ctx.device)
            loss = lambda logits, idx, mask: self.batched_loss(logits, idx, mask, ids, r)  # noqa: E731
            idx = [self.ctx.data.clients[k] for k in part]
            if len(part) not in self._stacked:  # one per chunk size, reused every round (no re-allocation)
                self._stacked[len(part)] = StackedNet(self.global_model, len(part)).to(self.ctx.device)
            states, losses = train_clients(self.ctx, self.global_model, idx, loss, r, self._stacked[len(part)])
            out.extend(
                ClientUpdate(k, len(i), st, {"train_loss": l}) for k, i, st, l in zip(part, idx, states, losses)
            )
        return out

    @classmethod
    def batched_support(cls) -> str | None:
        """Why the batched engine cannot run this method, or None when it can.

        It can when the local update is the engine's (``local_update`` and the epoch hook not
        overridden; ``before_local`` may be) and the loss is the engine's or has a batched form
        (``batched_loss`` overridden next to ``loss``)."""
        if cls.local_update is not FLMethod.local_update:
            return "it trains its clients its own way (local_update)"
        if cls.on_local_epoch_start is not FLMethod.on_local_epoch_start:
            return "it runs a hook before every local epoch"
        if cls.loss is not FLMethod.loss and cls.batched_loss is FLMethod.batched_loss:
            return "its loss has no batched form (batched_loss)"
        return None

    def before_local(self, r: int, k: int) -> None:
        """Runs before client k's local training in round r (Fed-NCL: relabel the client's samples)."""

    def local_update(self, r: int, k: int) -> ClientUpdate:
        self.before_local(r, k)
        load(self.worker, self.global_model.state_dict())
        idx = self.ctx.data.clients[k]
        hook = None
        if type(self).on_local_epoch_start is not FLMethod.on_local_epoch_start:  # costs nothing when unused
            hook = lambda e: self.on_local_epoch_start(r, k, e, self.worker)  # noqa: E731
        loss = train_epochs(
            self.ctx, self.worker, idx, lambda m, x, b, s: self.loss(m, x, b, s, k, r), r, on_epoch_start=hook
        )
        return ClientUpdate(k, len(idx), snapshot(self.worker), {"train_loss": loss})

    def on_local_epoch_start(self, r: int, k: int, epoch: int, model: torch.nn.Module) -> None:
        """Runs before each local epoch of client k (DivideMix: evaluation pass + GMM split)."""

    def loss(self, model: torch.nn.Module, x: torch.Tensor, idx: torch.Tensor, step: int, k: int, r: int) -> torch.Tensor:
        """Local objective on one batch.

        Single-label: cross-entropy on the given labels. Multi-label: FedMLP's FedAvg loss
        (fedmlp.md §6 "FedAvg", baselines.md §14): BCE-with-logits with pos_weight N_k / n_c^+
        over ALL classes, unannotated (missing) classes as 0 (fedmlp.md §1), sum / (B * C)
        with B the nominal batch size even for a smaller last batch (fedmlp.md §1).
        """
        if self.ctx.data.multi_label:
            return partial_bce(model(x), self.multi_label_targets(idx), self.pos_weights()[k], self.ctx.settings.batch_size)
        return F.cross_entropy(model(x), self.labels(idx))

    def batched_loss(
        self, logits: torch.Tensor, idx: torch.Tensor, mask: torch.Tensor | None, clients: torch.Tensor, r: int
    ) -> torch.Tensor:
        """:meth:`loss` for the batched engine: (K, B, classes) logits of clients ``clients`` (K,) ->
        (K,) losses; ``idx`` (K, B) sample ids, ``mask`` (K, B) real rows or None when all are real
        (:func:`~fnlcore.fl.batched.masked_mean`). The engine's loss, CE or FedMLP's BCE."""
        from ..fl.batched import masked_mean

        k, b, c = logits.shape
        if self.ctx.data.multi_label:
            y = self.multi_label_targets(idx.reshape(-1)).view(k, b, c)
            return batched_partial_bce(logits, y, self.pos_weights()[clients], self.ctx.settings.batch_size, mask)
        per = F.cross_entropy(logits.reshape(k * b, c), self.labels(idx.reshape(-1)), reduction="none")
        return masked_mean(per.view(k, b), mask)

    def labels(self, idx: torch.Tensor) -> torch.Tensor:
        return self.ctx.data.given[idx.to(self.ctx.device, non_blocking=True)]

    def multi_label_targets(self, idx: torch.Tensor) -> torch.Tensor:
        """(B, C) float targets: the given labels, 0 on classes not annotated for the sample (fedmlp.md §1)."""
        data = self.ctx.data
        i = idx.to(self.ctx.device, non_blocking=True)
        y = data.given[i].float()
        return y if data.active is None else y * data.active[i]

    def pos_weights(self) -> torch.Tensor:
        """(K, C) BCE positive weights N_k / n_c^+ per client (fedmlp.md §6), see :func:`client_pos_weights`."""
        if self._pos_weight is None:
            self._pos_weight = client_pos_weights(self.ctx.data)
        return self._pos_weight

    def aggregation_weight(self, upd: ClientUpdate) -> float:
        return float(upd.num_samples) if self.ctx.settings.weighting == "size" else 1.0

    def accumulate(self, r: int, upd: ClientUpdate) -> None:
        self._round_avg.add(upd.state, self.aggregation_weight(upd))

    def aggregate(self, r: int) -> None:
        load(self.global_model, self._round_avg.result(self.global_model.state_dict()))
        self._round_avg = None

    def end_round(self, r: int) -> None:
        pass

    def should_evaluate(self, r: int) -> bool:
        """Score the test set after round r? (FedCorr's one-client pre-processing rounds: no.)

        Rounds not evaluated keep their row in the metrics with NaN test metrics, so
        round numbers and checkpoints stay aligned; summaries skip NaN.
        """
        return True

    # -- outputs -------------------------------------------------------------------------
    def eval_model(self) -> torch.nn.Module:
        return self.global_model

    def client_results(self):
        """Per-client results (e.g. detected noisy clients) as a DataFrame, or None."""
        return None

    def state_dict(self) -> dict:
        return {"global": snapshot(self.global_model)}

    def load_state_dict(self, d: dict) -> None:
        load(self.global_model, d["global"])


def use_batched_engine(cls: type[FLMethod], engine: str, where: str = "") -> bool:
    """Whether method class ``cls`` trains with the batched engine under ``training.engine``.

    batched: yes, or a ConfigError naming why it cannot; auto: where it can; sequential: no."""
    if engine == "sequential":
        return False
    why = cls.batched_support()
    if why is not None and engine == "batched":
        prefix = f"{where}: " if where else ""
        raise ConfigError(
            f"{prefix}training.engine: batched cannot run method {cls.Params.name!r}: {why}; use engine: auto "
            "(batched where possible) or sequential"
        )
    return why is None


def batched_fits(ctx: RunContext, model: torch.nn.Module, strict: bool) -> bool:
    """Whether the run's data and model suit the batched engine (in-memory images, a stackable model).

    ``strict`` (engine: batched) raises the ConfigError that says why not; otherwise (auto) False,
    also where batching is measured slower: on a CPU for models with BatchNorm or wide convolutions."""
    from ..fl.stacked import check_stackable, gains_on_cpu

    if not strict and ctx.device.type == "cpu" and not gains_on_cpu(model):
        return False
    try:
        if not ctx.data.train.in_memory:
            raise ConfigError(
                "training.engine: batched needs the training images in memory (this dataset streams from files); "
                "use engine: auto or sequential"
            )
        check_stackable(model)
    except ConfigError:
        if strict:
            raise
        return False
    return True


def check_label_kind(cls: type[FLMethod], multi_label: bool, where: str = "") -> None:
    """Raise a ConfigError when method class ``cls`` does not train on this kind of labels."""
    kind = "multi" if multi_label else "single"
    if kind in cls.label_kinds:
        return
    fits = sorted(n for n in METHODS if kind in METHODS[n].label_kinds)
    prefix = f"{where}: " if where else ""
    raise ConfigError(
        f"{prefix}method {cls.Params.name!r} trains on {'/'.join(cls.label_kinds)}-label data only, but the "
        f"dataset is {kind}-label; pick a method for {kind}-label data: {', '.join(fits) or '(none)'}"
    )


def client_pos_weights(data) -> torch.Tensor:
    """(K, C) pos_weight_c = N_k / n_c^+ with n_c^+ the client's TRUE positives of class c (fedmlp.md §6).

    The true counts equal the observed ones on annotated classes; on missing classes every
    target is 0, so the weight has no effect there. A class without local positives gets 1
    (its weight multiplies only positive targets, of which there are none; N_k / 0 would
    turn the loss into NaN).
    """
    y = data.y_true.float()
    out = torch.ones(data.num_clients, data.num_classes, device=y.device)
    for k, idx in enumerate(data.clients):
        pos = y[idx.to(y.device)].sum(0)
        out[k] = torch.where(pos > 0, len(idx) / pos.clamp_min(1), torch.ones_like(pos))
    return out


def client_active_classes(data) -> torch.Tensor:
    """(K, C) 0/1 float: the classes each client annotates (FedMLP's A_k; fedmlp.md §1, §3).

    A class counts for client k when it is annotated on all of its samples (FedMLP's
    partial labels are per client); every class when the data has no ``active`` mask.
    """
    dev = data.given.device
    c = data.num_classes
    if data.active is None:
        return torch.ones(data.num_clients, c, device=dev)
    act = data.active.float()
    return torch.stack([
        act[idx.to(act.device)].amin(0) if len(idx) else torch.zeros(c, device=act.device) for idx in data.clients
    ]).to(dev)


def partial_bce(
    logits: torch.Tensor, y: torch.Tensor, pos_weight: torch.Tensor | None, batch_size: int,
    classes: torch.Tensor | None = None,
) -> torch.Tensor:
    """FedMLP's FedAvg / FedAvg-PL loss (fedmlp.md §6, baselines.md §14).

    Σ_i Σ_{c} BCEwithlogits_pw(z_ic, y_ic) / (B * C), or with ``classes`` (a (C,) 0/1 mask of
    the client's annotated classes, FedAvg-PL) the sum over those classes / (B * |A_k|);
    B = the nominal batch size (``batch_size``), also for a smaller last batch.
    """
    per = F.binary_cross_entropy_with_logits(logits.float(), y, pos_weight=pos_weight, reduction="none")
    if classes is None:
        return per.sum() / (batch_size * logits.shape[1])
    return (per * classes).sum() / (batch_size * classes.sum().clamp_min(1))


def batched_partial_bce(
    logits: torch.Tensor, y: torch.Tensor, pos_weight: torch.Tensor, batch_size: int, mask: torch.Tensor | None,
    classes: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`partial_bce` of K clients at once: (K, B, C) logits and targets, (K, C) pos_weight and
    class masks, (K, B) real rows (None: all) -> (K,)."""
    per = F.binary_cross_entropy_with_logits(logits.float(), y, pos_weight=pos_weight[:, None, :], reduction="none")
    if classes is not None:
        per = per * classes[:, None, :]
    per = per.sum(2)
    if mask is not None:
        per = torch.where(mask, per, torch.zeros_like(per))
    if classes is None:
        return per.sum(1) / (batch_size * logits.shape[2])
    return per.sum(1) / (batch_size * classes.sum(1).clamp_min(1))


class MultiNetwork(FLMethod):
    """Several networks per client, each with its own optimiser, aggregated by name.

    Co-teaching, DivideMix and FedFixer keep two (or more) global networks; a client
    trains a copy of each. ``network_names`` lists them; ``optimizer_for(name, params, r)``
    builds each network's optimiser (default: the run's, so a subclass changes only the
    one that differs); ``local_networks(r, k, nets, optimizers)`` trains the copies in
    whatever interleaving the method needs. Uploads are ``{name: state}``; the server
    averages each name separately with the client's aggregation weight. ``eval_model``
    is the first network unless overridden.
    """

    network_names: ClassVar[tuple[str, ...]] = ("net1", "net2")

    def __init__(self, params: MethodParams, ctx: RunContext):
        super().__init__(params, ctx)
        self.globals = {n: ctx.new_model() for n in self.network_names}
        self.workers = {n: ctx.new_model() for n in self.network_names}
        self.global_model = self.globals[self.network_names[0]]
        self._avgs: dict[str, RunningAverage] = {}

    def optimizer_for(self, name: str, params, r: int) -> torch.optim.Optimizer:
        """A fresh optimiser for network ``name`` in round r (its own rate: ``ctx.optimizer(params, r, lr=...)``).

        Built per local update like every reference code's; a method that keeps an
        optimiser across rounds must return its ``state_dict()`` from ``state_dict``.
        """
        return self.ctx.optimizer(params, r)

    def local_networks(self, r: int, k: int, nets: dict, optimizers: dict) -> dict[str, Any]:
        """Train the client's copies; returns uploads (default: each network on its own, plain CE)."""
        idx = self.ctx.data.clients[k]
        hooked = type(self).on_local_epoch_start is not FLMethod.on_local_epoch_start
        out = {}
        for n, net in nets.items():
            hook = (lambda e, net=net: self.on_local_epoch_start(r, k, e, net)) if hooked else None
            out[f"train_loss_{n}"] = train_epochs(
                self.ctx, net, idx, lambda m, x, b, s: self.loss(m, x, b, s, k, r), r,
                optimizer=optimizers[n], on_epoch_start=hook,
            )
        return out

    def begin_round(self, r: int) -> None:
        super().begin_round(r)
        self._avgs = {n: RunningAverage() for n in self.network_names}

    def local_update(self, r: int, k: int) -> ClientUpdate:
        for n in self.network_names:
            load(self.workers[n], self.globals[n].state_dict())
        opts = {n: self.optimizer_for(n, self.workers[n].parameters(), r) for n in self.network_names}
        uploads = self.local_networks(r, k, self.workers, opts)
        states = {n: snapshot(self.workers[n]) for n in self.network_names}
        return ClientUpdate(k, len(self.ctx.data.clients[k]), states, uploads)

    def accumulate(self, r: int, upd: ClientUpdate) -> None:
        w = self.aggregation_weight(upd)
        for n in self.network_names:
            self._avgs[n].add(upd.state[n], w)

    def aggregate(self, r: int) -> None:
        for n in self.network_names:
            load(self.globals[n], self._avgs[n].result(self.globals[n].state_dict()))
        self._avgs = {}

    def state_dict(self) -> dict:
        return {"globals": {n: snapshot(m) for n, m in self.globals.items()}}

    def load_state_dict(self, d: dict) -> None:
        for n, st in d["globals"].items():
            load(self.globals[n], st)


#: config name -> method class; every module of fnlcore.methods is imported on first use,
#: so a new method is one file with ``@register`` on its class.
METHODS: Registry[type[FLMethod]] = Registry(
    "method", "fnlcore.methods", key=lambda cls: cls.Params.name, spec=lambda cls: cls.Params
)


def register(cls: type[FLMethod]) -> type[FLMethod]:
    """Class decorator: make ``cls`` the method named ``cls.Params.name``."""
    return METHODS.register(cls)


def method_from_dict(d: dict) -> MethodParams:
    """Build a method's typed hyper-parameters from a config entry {name: ..., **params}."""
    return METHODS.from_dict(d)
