"""Seconds per round of the engines against a bare torch loop, at the papers' shapes, on one device.

The timing part of ``fnl device-check``: the round driver of ``benchmarks/bench_batched.py`` and the
bare loop of ``benchmarks/bench_engine.py`` as a library module (the command never imports
``benchmarks/``). One :class:`Case` is a method, model, input shape, clients and batch size on
random uint8 images (a round's time depends on the shapes and settings, not on the pixels).

Every variant — bare loop, sequential engine, batched engine (on CUDA also with
``training.cuda_graphs``: ``batched_graphs``, with ``diff_vs_batched`` the largest difference of its
global model from the batched engine's after the same first round), each in NCHW and
channels-last memory, fp32 and bf16 — gets its own runner; after one untimed warm-up round each, a repetition
runs one round of every variant back to back (the order rotating, so a drifting clock or a busy
neighbour weighs on all alike), and the ratios are taken per repetition, then their median.

* engine round: ``begin_round``, the round's client updates through the run's engine,
  ``aggregate``, ``end_round``, as :class:`~fnlcore.fl.simulation.Simulation` drives them (no
  evaluation);
* bare loop: the same number of samples in the same batches, one model and one optimiser,
  per batch the case's view (the train augmentation, or FedGR's strong view), the forward
  pass under the run's precision, cross-entropy, backward, step.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from ..fl.data import FederatedData, ImageSource
from ..fl.settings import TrainSettings
from ..fl.simulation import Simulation
from ..methods import METHODS
from ..models import build_model
from .train import build_context

ENGINES = ("bare", "sequential", "batched")
GRAPHS = "batched_graphs"  # the batched engine with training.cuda_graphs (a CUDA device only)


def engines(device: torch.device) -> tuple[str, ...]:
    """The engine variants timed on ``device``: CUDA graphs where there are any."""
    return ENGINES + ((GRAPHS,) if torch.device(device).type == "cuda" else ())
LAYOUTS = ("nchw", "channels_last")
PRECISIONS = ("fp32", "bf16")


@dataclass(frozen=True)
class Case:
    """A paper's training shape, timed as FedAvg rounds (or the method's own, ``method``)."""

    name: str
    label: str
    model: str
    channels: int
    size: int
    clients: int  # all of them train every round
    per_client: int  # samples a client: a multiple of ``batch``, so the bare loop runs the same batches
    batch: int
    augmentation: str
    lr: float = 0.01
    momentum: float = 0.5
    method: str = "fedavg"
    view: str = "train"  # what a bare step augments: the train view, or 'strong' (FedGR's RandAugment)

    @property
    def steps(self) -> int:
        """Local steps of one round, over all clients (one local epoch)."""
        return self.clients * (self.per_client // self.batch)

    def quick(self) -> "Case":
        """The same case at a CPU test's size: few clients, one small batch each, a tiny model for ResNets."""
        batch = min(self.batch, 16)
        model = "tiny" if self.model.startswith("resnet") else self.model
        return dataclasses.replace(self, model=model, clients=min(self.clients, 3), batch=batch, per_client=batch,
                                   size=min(self.size, 16) if model == "tiny" else self.size)


# The papers' shapes (fewer samples per client and one local epoch: a round's time scales linearly
# in both, the ratios do not move).
PAPER_CASES = (
    Case("fedcorr_resnet18", "FedCorr/FedDiv ResNet-18 CIFAR, 10 clients x batch 10", "resnet18_cifar", 3, 32,
         clients=10, per_client=50, batch=10, augmentation="crop_flip"),
    Case("fedgr_resnet18", "FedGR ResNet-18 CIFAR, 10 clients x batch 32, strong view (RandAugment)",
         "resnet18_cifar", 3, 32, clients=10, per_client=64, batch=32, augmentation="crop_flip", lr=0.02,
         momentum=0.9, method="fedgr", view="strong"),
    Case("fedncl_lenet5", "Fed-NCL LeNet-5 MNIST, 20 clients x batch 128", "lenet5", 1, 28, clients=20,
         per_client=256, batch=128, augmentation="none", momentum=0.9),
)


def synthetic_data(case: Case, device: torch.device, seed: int = 0):
    """Random uint8 images and labels of the case's shape, split evenly over its clients."""

    rs = np.random.RandomState(seed)
    n = case.clients * case.per_client
    x = rs.randint(0, 256, (n, case.size, case.size, case.channels)).astype(np.uint8)
    y = torch.as_tensor(rs.randint(0, 10, n))
    test = 64
    clients = [torch.arange(k * case.per_client, (k + 1) * case.per_client) for k in range(case.clients)]
    return FederatedData(ImageSource(device, images=x), ImageSource(device, images=x[:test]), y.to(device),
                         y.clone().to(device), y[:test].to(device), clients, 10)


def _settings(case: Case, engine: str, layout: str, precision: str):
    return TrainSettings(
        model=case.model, rounds=100_000, local_epochs=1, batch_size=case.batch, lr=case.lr, momentum=case.momentum,
        augmentation=case.augmentation, normalize="imagenet" if case.channels == 3 else "half",
        engine="sequential" if engine == "bare" else "batched" if engine == GRAPHS else engine,
        channels_last=layout == "channels_last", precision=precision, cuda_graphs=engine == GRAPHS,
    )


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class EngineRunner:
    """The case's method on its synthetic clients, one round per call, timed on the device."""

    def __init__(self, case: Case, engine: str, layout: str, precision: str, device: torch.device):
        self.device = device
        self.ctx = build_context(synthetic_data(case, device), "bench", (case.size, case.size), case.channels,
                                 _settings(case, engine, layout, precision), 0, device, log=lambda m: None)
        cls = METHODS[case.method]
        self.method = cls(cls.Params(), self.ctx)  # FedGR's defaults: every timed round in its warm-up
        self.sim = Simulation(self.method, self.ctx, progress=lambda m: None)  # attaches stores, picks the engine
        self.r = 0

    @property
    def batched(self) -> bool:
        """Whether the batched engine trains this run's rounds (engine ``batched`` and a batched stage)."""
        stage = self.method.current_stage(self.r)
        return self.sim.engine.batched and stage.batchable

    def round(self) -> float:
        m, sim, r = self.method, self.sim, self.r
        sync(self.device)
        t0 = time.perf_counter()
        sim.checkpoint.begin_round(r)
        m.begin_round(r)
        m.aggregate(r, sim.engine.updates(r, m.select_clients(r)))
        m.end_round(r)
        sim.checkpoint.end_round()
        sync(self.device)
        self.r += 1
        return time.perf_counter() - t0


class BareRunner:
    """A bare training loop over the same samples and batches as one engine round (pre-made batches on the device)."""

    def __init__(self, case: Case, layout: str, precision: str, device: torch.device):
        # the engine's context, for the same data, pipeline (FedGR's strong view included) and draws
        ref = EngineRunner(case, "sequential", layout, precision, device)
        ctx = ref.ctx
        self.device, self.pipeline, self.gen, self.view = device, ctx.pipeline, ctx.aug_gen, case.view
        torch.manual_seed(0)
        self.model = build_model(case.model, 10, case.channels, (case.size, case.size)).to(device)
        if layout == "channels_last":
            self.model = self.model.to(memory_format=torch.channels_last)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=case.lr, momentum=case.momentum)
        self.autocast = ctx.autocast
        order = torch.randperm(len(ctx.data.given), generator=torch.Generator().manual_seed(0))
        images, labels = ctx.data.train.images, ctx.data.given
        self.batches = [(images[b.to(device)], labels[b.to(device)]) for b in order.split(case.batch)]
        self.batched = False

    def _input(self, xb: torch.Tensor) -> torch.Tensor:
        if self.view == "train":
            return self.pipeline.train(xb, self.gen)
        return self.pipeline.view(self.view, xb, self.gen)

    def round(self) -> float:
        model, opt = self.model, self.opt
        model.train()
        sync(self.device)
        t0 = time.perf_counter()
        for xb, yb in self.batches:
            x = self._input(xb)
            with self.autocast():
                loss = F.cross_entropy(model(x), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        sync(self.device)
        return time.perf_counter() - t0


def make_runner(case: Case, engine: str, layout: str, precision: str, device: torch.device):
    if engine == "bare":
        return BareRunner(case, layout, precision, device)
    return EngineRunner(case, engine, layout, precision, device)


ROW_COLUMNS = ("case", "engine", "layout", "precision", "model", "clients", "batch", "steps_per_round", "reps",
               "s_per_round", "s_per_step", "speedup_vs_sequential", "efficiency_vs_bare", "batched_ran",
               "diff_vs_batched", "status", "error")


def time_case(case: Case, device: torch.device, reps: int, deadline: float,
              log: Callable[[str], None] = print) -> list[dict]:
    """One row per variant of ``case`` (see ROW_COLUMNS): median seconds per round over ``reps``
    interleaved repetitions (fewer when ``deadline``, a ``time.monotonic()``, comes first; at least one),
    and per-repetition ratios to the sequential engine and to the bare loop of the same layout and precision.

    ``speedup_vs_sequential`` = t(sequential) / t(variant); ``efficiency_vs_bare`` = t(bare) / t(variant)
    (the engine's samples/s over the bare loop's, as ``benchmarks/bench_engine.py`` reports it)."""
    keys = [(e, lay, p) for lay in LAYOUTS for p in PRECISIONS for e in engines(device)]
    runners, errors = {}, {}
    for key in keys:  # built and warmed up one at a time: a variant that cannot run fails alone
        if time.monotonic() > deadline:
            errors[key] = "skipped: time box spent before its warm-up"
            continue
        try:
            runner = make_runner(case, *key, device)
            runner.round()  # warm-up: allocations, kernel choice (cuDNN), first-touch
            runners[key] = runner
        except Exception as err:  # noqa: BLE001 (recorded in its row)
            errors[key] = f"{type(err).__name__}: {err}"[:300]
            log(f"  {case.name} {'/'.join(key)}: {errors[key]}")
    # graphs on against off after the same warm-up round from the same start: equal up to float rounding
    diffs = {key: _max_diff(runners[key], runners[("batched", *key[1:])]) for key in runners
             if key[0] == GRAPHS and ("batched", *key[1:]) in runners}
    times: dict[tuple, list[float]] = {k: [] for k in runners}
    live = list(runners)
    for rep in range(reps):
        if rep and time.monotonic() > deadline:
            break
        order = live[rep % len(live):] + live[: rep % len(live)] if live else []
        for key in order:
            try:
                times[key].append(runners[key].round())
            except Exception as err:  # noqa: BLE001
                errors[key] = f"{type(err).__name__}: {err}"[:300]
                live.remove(key)
                times.pop(key, None)
    return [{**_row(case, key, times, errors, runners), "diff_vs_batched": _round(diffs.get(key), 9)}
            for key in keys]


def _max_diff(a: "EngineRunner", b: "EngineRunner") -> float:
    """The largest absolute difference of two runners' global models."""
    sa, sb = a.method.global_model.state_dict(), b.method.global_model.state_dict()
    return max((float((sa[k].double() - sb[k].double()).abs().max()) for k in sa if sa[k].numel()), default=0.0)


def _ratio(times: dict, ref: tuple, key: tuple) -> float | None:
    if ref not in times or key not in times or not times[key]:
        return None
    return statistics.median(a / b for a, b in zip(times[ref], times[key]))


def _row(case: Case, key: tuple, times: dict, errors: dict, runners: dict) -> dict:
    engine, layout, precision = key
    t = times.get(key) or []
    s = statistics.median(t) if t else None
    r = runners.get(key)
    return {
        "case": case.name, "engine": engine, "layout": layout, "precision": precision, "model": case.model,
        "clients": case.clients, "batch": case.batch, "steps_per_round": case.steps, "reps": len(t),
        "s_per_round": _round(s), "s_per_step": _round(s / case.steps if s else None),
        "speedup_vs_sequential": _round(_ratio(times, ("sequential", layout, precision), key), 3),
        "efficiency_vs_bare": _round(_ratio(times, ("bare", layout, precision), key), 3),
        "batched_ran": "" if r is None else bool(r.batched),
        "status": "ok" if t else "failed" if key in errors and not errors[key].startswith("skipped") else "skipped",
        "error": errors.get(key, ""),
    }


def _round(v: float | None, digits: int = 5):
    return "" if v is None else round(float(v), digits)
