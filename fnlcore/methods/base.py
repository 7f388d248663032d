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
* per-sample label overrides that persist — write into ``ctx.data.given``
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

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..registry import spec_from_dict
from ..fl import sampling
from ..fl.context import RunContext
from ..fl.local import train_epochs
from ..fl.state import RunningAverage, State, load, snapshot
from ..slugs import fmt_float, short_hash


@dataclass(frozen=True)
class MethodParams:
    """Base of every method's hyper-parameter dataclass (frozen, typed, validated)."""

    name: ClassVar[str] = ""
    # code≠paper switches: field -> "value (code) | value (paper)" explanation, for the README
    switches: ClassVar[dict[str, str]] = {}
    # fields shown readably in the slug, in this order; other non-default fields go into a short hash
    slug_fields: ClassVar[tuple[str, ...]] = ()

    def slug(self) -> str:
        parts = [self.name]
        for f in self.slug_fields:
            v = getattr(self, f)
            parts.append(f"{_abbrev(f)}{fmt_float(v) if isinstance(v, float) else v}")
        rest = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in self.slug_fields and getattr(self, f.name) != f.default
        }
        if rest:
            parts.append(short_hash(rest))
        return "-".join(str(p) for p in parts)

    def check_training(self, settings) -> None:
        """Reject hyper-parameters that cannot work with these training settings (before any job runs)."""

    def to_dict(self) -> dict:
        return {"name": self.name, **dataclasses.asdict(self)}


def _abbrev(field_name: str) -> str:
    return field_name.replace("_", "")


@dataclass
class ClientUpdate:
    client: int
    num_samples: int
    state: State
    uploads: dict[str, Any] = field(default_factory=dict)


class FLMethod:
    """FedAvg behaviour; subclasses override what they change."""

    Params: ClassVar[type[MethodParams]] = MethodParams
    paper: ClassVar[str] = ""
    # Stages whose rounds count for a table's Best/Last (None = every round); FedNoRo: stage 2 only.
    reported_stages: ClassVar[tuple[str, ...] | None] = None

    def __init__(self, params: MethodParams, ctx: RunContext):
        self.params = params
        self.ctx = ctx
        self.global_model = ctx.new_model()
        self.worker = ctx.new_model()  # one reusable model for every local update
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

    def local_update(self, r: int, k: int) -> ClientUpdate:
        load(self.worker, self.global_model.state_dict())
        idx = self.ctx.data.clients[k]
        loss = train_epochs(self.ctx, self.worker, idx, lambda m, x, b, s: self.loss(m, x, b, s, k, r), r)
        return ClientUpdate(k, len(idx), snapshot(self.worker), {"train_loss": loss})

    def loss(self, model: torch.nn.Module, x: torch.Tensor, idx: torch.Tensor, step: int, k: int, r: int) -> torch.Tensor:
        """Local objective on one batch (default: cross-entropy on the given labels)."""
        return F.cross_entropy(model(x), self.labels(idx))

    def labels(self, idx: torch.Tensor) -> torch.Tensor:
        return self.ctx.data.given[idx.to(self.ctx.device, non_blocking=True)]

    def aggregation_weight(self, upd: ClientUpdate) -> float:
        return float(upd.num_samples) if self.ctx.settings.weighting == "size" else 1.0

    def accumulate(self, r: int, upd: ClientUpdate) -> None:
        self._round_avg.add(upd.state, self.aggregation_weight(upd))

    def aggregate(self, r: int) -> None:
        load(self.global_model, self._round_avg.result(self.global_model.state_dict()))
        self._round_avg = None

    def end_round(self, r: int) -> None:
        pass

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


METHODS: dict[str, type[FLMethod]] = {}


def register(cls: type[FLMethod]) -> type[FLMethod]:
    name = cls.Params.name
    if not name:
        raise ValueError(f"{cls.__name__}.Params has no name")
    if name in METHODS and METHODS[name] is not cls:
        raise ValueError(f"method {name!r} registered twice")
    METHODS[name] = cls
    return cls


def method_from_dict(d: dict) -> MethodParams:
    """Build a method's typed hyper-parameters from a config entry {name: ..., **params}."""
    return spec_from_dict("method", {k: c.Params for k, c in METHODS.items()}, d)
