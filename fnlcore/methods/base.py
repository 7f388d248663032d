"""The method contract: a method is its hyper-parameters, its losses and its decisions.

A method is one module: a frozen hyper-parameter dataclass (subclass of :class:`MethodParams`)
and a subclass of :class:`FLMethod`, registered with ``@METHODS.register``. The engine owns the loop,
the state and the batching (:mod:`fnlcore.fl.simulation`, :mod:`fnlcore.fl.sequential`,
:mod:`fnlcore.fl.batched`, :mod:`fnlcore.fl.persist`); a round is

    begin_round(r) -> select_clients(r) -> aggregate(r, <each client's ClientUpdate>) -> end_round(r)
    -> evaluate(eval_model())

A method declares:

* ``networks``: its global networks (FedAvg: one; Co-teaching, DivideMix: two), each aggregated
  by name; ``client_networks``: working networks a client uses besides them (FedGR's EMA model);
* ``stages``: its stage table, stage name -> :class:`~fnlcore.fl.contract.Stage` (what to prepare
  for a client, the one loss form of a step over K clients, what a client uploads, the per-chunk
  hooks), and ``stage_name(r)``: the name of round r's stage;
* ``persistent``: the attributes that carry across rounds (tensors, arrays, samplers, per-client
  :class:`~fnlcore.fl.persist.ClientStore` objects); the engine checkpoints and restores them;
* the server steps: ``aggregate(r, updates)`` over the round's updates (consumed once, in
  client order; the default streams them into FedAvg) and ``end_round(r)`` (detection,
  relabelling, GMMs); ``select_clients``, ``num_rounds``, ``should_evaluate``, ``eval_model``,
  ``client_results``.

Shared pieces live beside, not in methods: :mod:`.parts`, :mod:`.logit_adjust`, :mod:`.multilabel`,
:mod:`.schedule`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Iterable

import torch

from ..errors import ConfigError
from ..registry import Registry
from ..fl import sampling
from ..fl.contract import ClientUpdate, StackedBatch, Stage, clients_cross_entropy
from ..fl.contract import capturable
from ..fl.context import RunContext
from ..fl.persist import ClientStore, load_method_state, method_state, persistent_names
from ..fl.state import RunningAverage, load
from ..spec import Spec
from .schedule import Stretch
from .multilabel import client_active_classes, client_pos_weights, partial_bce


@dataclass(frozen=True)
class MethodParams(Spec):
    """Base of every method's hyper-parameter dataclass (frozen, typed, validated).

    Declare fields with :func:`fnlcore.registry.param` (bounds, choices, ``rounds=True``);
    ``name`` is the config name and the slug's head, ``slug_fields`` the fields shown
    readably in the slug (the others hash); a code≠paper switch is ``param(..., switch=...)``. The
    method class (not this dataclass) joins METHODS, through ``@METHODS.register``.
    """

    kind: ClassVar[str] = "method"

    def check_training(self, settings) -> None:
        """Reject hyper-parameters that cannot work with these training settings (before any job runs)."""


class FLMethod:
    """FedAvg; a method overrides what it changes and declares what it keeps (module docstring)."""

    Params: ClassVar[type[MethodParams]] = MethodParams
    paper: ClassVar[str] = ""
    # Stages whose rounds count for a table's Best/Last (None = every round); FedNoRo: stage 2 only.
    reported_stages: ClassVar[tuple[str, ...] | None] = None
    # Label kinds the method trains on: "single" (one class per sample) and/or "multi"
    # (multi-label, FedMLP's partial labels). Running on another kind is a ConfigError.
    label_kinds: ClassVar[tuple[str, ...]] = ("single",)
    # Global networks, aggregated by name; the first is evaluated unless eval_model says otherwise.
    networks: ClassVar[tuple[str, ...]] = ("model",)
    # Working networks of a client besides copies of the global ones (loaded by the stage's prepare).
    client_networks: ClassVar[tuple[str, ...]] = ()
    # Attributes that carry across rounds, saved and restored by the engine (fnlcore.fl.persist).
    persistent: ClassVar[tuple[str, ...]] = ()

    @capturable  # reads only the batch's device tensors (a CUDA graph may replay it: fnlcore.fl.batched)
    def loss(self, sb: StackedBatch) -> torch.Tensor:
        """The local objective of K clients' step (:class:`~fnlcore.fl.contract.StackedBatch`) -> (K,)
        losses; the sequential engine runs it at K = 1 on the plain model (:mod:`fnlcore.fl.one_client`).

        Single-label: each client's mean cross-entropy on the given labels over its real rows.
        Multi-label: FedMLP's FedAvg loss (fedmlp.md §6 "FedAvg", baselines.md §14):
        BCE-with-logits with pos_weight N_k / n_c^+ over ALL classes, unannotated (missing)
        classes as 0 (fedmlp.md §1), sum / (B * C) with B the nominal batch size even for a
        smaller last batch (fedmlp.md §1).
        """
        k, b, c = sb.logits.shape
        if self.ctx.data.multi_label:
            y = self.multi_label_targets(sb.idx.reshape(-1)).view(k, b, c)
            return partial_bce(sb.logits, y, self.pos_weights()[sb.clients], self.ctx.settings.batch_size, sb.mask)
        return clients_cross_entropy(sb.logits, self.labels(sb.idx.reshape(-1)), sb.mask)

    # stage name -> what the stage does (fnlcore.fl.contract.Stage); functions of this class body
    stages: ClassVar[dict[str, Stage]] = {"main": Stage(loss=loss)}

    def __init_subclass__(cls, **kw) -> None:
        super().__init_subclass__(**kw)
        if "loss" in cls.__dict__ and "stages" not in cls.__dict__:
            raise TypeError(f"{cls.__name__} defines loss but no stage table: add "
                            "`stages = {\"main\": Stage(loss=loss)}` to its class body")
        if callable(cls.__dict__.get("stage")):  # the old name: left alone it would silently never be called
            raise TypeError(f"{cls.__name__} defines stage(r): the name of round r's stage is stage_name(r) now; "
                            "rename the method")

    @classmethod
    def schedule(cls, params: MethodParams, settings, num_clients: int) -> list[Stretch]:
        """The run's rounds as stretches (:class:`~fnlcore.methods.schedule.Stretch`), in order: one of
        ``training.rounds`` by default; a method whose rounds differ in clients or in what they do
        (FedCorr, FedDiv, FedNoRo, DivideMix) lists its stretches. What each costs is `fnl plan`'s
        (fnlcore.app.method_costs)."""
        m = sampling.clients_per_round(num_clients, settings.client_fraction)
        return [Stretch("main", settings.rounds, m)]

    def __init__(self, params: MethodParams, ctx: RunContext):
        check_label_kind(type(self), ctx.data.multi_label)
        self.params = params
        self.ctx = ctx
        self._pos_weight: torch.Tensor | None = None
        self.active = client_active_classes(ctx.data)  # (K, C) 0/1: the classes each client annotates (FedMLP's A_k)
        # each global network, then its working copy (one reusable model per name for every local update)
        self.globals: dict[str, torch.nn.Module] = {}
        self.workers: dict[str, torch.nn.Module] = {}
        for n in self.networks:
            self.globals[n] = ctx.new_model()
            self.workers[n] = ctx.new_model()
        for n in self.client_networks:
            self.workers[n] = ctx.new_model()
        self.global_model = self.globals[self.networks[0]]
        self.worker = self.workers[self.networks[0]]
        self.round_info: dict[str, float] = {}

    # -- schedule ------------------------------------------------------------------------
    def num_rounds(self) -> int:
        return self.ctx.settings.rounds

    def stage_name(self, r: int) -> str:
        """The name of round r's stage: its label in the metrics and its row of ``stages``."""
        return "main"

    def stage_key(self, r: int) -> str:
        """Round r's row of the stage table (the stage label unless a method labels finer)."""
        return self.stage_name(r)

    def current_stage(self, r: int) -> Stage:
        key = self.stage_key(r)
        if key not in self.stages:
            raise KeyError(f"{type(self).__name__}: round {r} is in stage {key!r}, which its stage table "
                           f"({sorted(self.stages)}) lacks")
        return self.stages[key]

    def select_clients(self, r: int) -> list[int]:
        return sampling.uniform_fraction(self.ctx.rng, self.ctx.data.num_clients, self.ctx.settings.client_fraction)

    # -- a round ----------------------------------------------------------------------------
    def begin_round(self, r: int) -> None:
        self.round_info = {}

    def labels(self, idx: torch.Tensor) -> torch.Tensor:
        return self.ctx.data.given[idx.to(self.ctx.device, non_blocking=True)]

    def multi_label_targets(self, idx: torch.Tensor) -> torch.Tensor:
        """(B, C) float targets: the given labels, 0 on classes not annotated for the sample (fedmlp.md §1)."""
        data = self.ctx.data
        i = idx.to(self.ctx.device, non_blocking=True)
        y = data.given[i].float()
        return y if data.active is None else y * data.active[i]

    def global_logits(self, sb: StackedBatch, view: torch.Tensor | None = None) -> torch.Tensor:
        """(K, B, C) logits of the round's global model, frozen (eval mode, no gradient), on the step's input
        or ``view``: the teacher of FedNoRo's, FedNoRo-ML's and FedMLP's distillation."""
        with torch.no_grad():
            return sb.per_client(self.global_model.eval()(sb.x if view is None else view))

    def pos_weights(self) -> torch.Tensor:
        """(K, C) BCE positive weights N_k / n_c^+ per client (fedmlp.md §6), see :func:`client_pos_weights`."""
        if self._pos_weight is None:
            self._pos_weight = client_pos_weights(self.ctx.data)
        return self._pos_weight

    def aggregation_weight(self, upd: ClientUpdate) -> float:
        return float(upd.num_samples) if self.ctx.settings.weighting == "size" else 1.0

    def aggregate(self, r: int, updates: Iterable[ClientUpdate]) -> None:
        """Server step over the round's updates (consumed once, in client order): FedAvg of each network."""
        self.fedavg(updates)

    def fedavg(self, updates: Iterable[ClientUpdate], weight=None) -> list[ClientUpdate]:
        """Stream ``updates`` into each global network's weighted average (``weight(upd)``, default
        :meth:`aggregation_weight`); returns the updates with their networks dropped (uploads kept)."""
        weight = weight or self.aggregation_weight
        avgs = {n: RunningAverage() for n in self.networks}
        kept = []
        for upd in updates:
            w = weight(upd)
            for n in self.networks:
                avgs[n].add(upd.states[n], w)
            kept.append(ClientUpdate(upd.client, upd.num_samples, {}, upd.uploads))
        for n, g in self.globals.items():
            load(g, avgs[n].result(g.state_dict()))
        return kept

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

    # -- state (the engine's; methods declare ``networks`` and ``persistent``) ----------------
    def stores(self) -> list[ClientStore]:
        return [v for v in (getattr(self, n) for n in persistent_names(type(self))) if isinstance(v, ClientStore)]

    def state_dict(self) -> dict:
        return method_state(self)

    def load_state_dict(self, d: dict) -> None:
        load_method_state(self, d)


def check_label_kind(cls: type[FLMethod], multi_label: bool, where: str = "") -> None:
    """Raise a ConfigError when method class ``cls`` does not train on this kind of labels."""
    kind = "multi" if multi_label else "single"
    if kind in cls.label_kinds:
        return
    fits = sorted(n for n in METHODS if kind in METHODS[n].label_kinds)
    prefix = f"{where}: " if where else ""
    raise ConfigError(f"{prefix}method {cls.Params.name!r} trains on {'/'.join(cls.label_kinds)}-label data only, "
                      f"but the dataset is {kind}-label; pick a method for {kind}-label data: "
                      f"{', '.join(fits) or '(none)'}")


__all__ = ["ClientStore", "FLMethod", "MethodParams", "Stretch", "check_label_kind", "method_from_dict", "METHODS"]


#: config name -> method class; every module of fnlcore.methods is imported on first use,
#: so a new method is one file with ``@METHODS.register`` on its class.
METHODS: Registry[type[FLMethod]] = Registry("method", "fnlcore.methods", key=lambda cls: cls.Params.name,
                                              spec=lambda cls: cls.Params)


def method_from_dict(d: dict) -> MethodParams:
    """Build a method's typed hyper-parameters from a config entry {name: ..., **params}."""
    return METHODS.from_dict(d)
