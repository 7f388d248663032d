"""What a table costs: a per-round cost model of training runs, calibrated on the machine at hand.

A run's device time is estimated as

    sum over the method's stages of  rounds x clients a round x local steps of a client x t_step x factor
    + evaluated rounds x test samples x t_eval

* ``t_step``: one local step (training augmentation, forward pass, loss, backward pass,
  optimiser step) of the run's model on a batch of the run's input shape, precision and
  memory format; ``t_eval``: the forward pass of one test sample at the evaluation batch
  size, its forward in the sub-batches a run takes (:func:`fnlcore.fl.local.forward_bounded`:
  bounded by activation bytes, so 512-pixel inputs run in sub-batches of about a hundred). Both
  are measured here on random data (:func:`measure_step`) and cached per device
  in a JSON file (:class:`Calibration`), so a plan of a thousand runs measures each distinct
  shape once.
* local steps of a client: ``local_epochs x ceil(n_k / batch_size)`` with ``n_k`` the mean
  client size (the partition's :meth:`expected_samples` over its clients).
* the method's stretches of rounds (:meth:`FLMethod.schedule`): FedCorr's and FedDiv's one-client
  rounds come on top of ``training.rounds``; ``factor`` is a round's cost over a FedAvg
  round on the same clients, per device kind (:mod:`fnlcore.app.method_costs`,
  ``benchmarks/method_costs.json``): on a CPU the time ratio ``benchmarks/bench_methods.py``
  measured on the digits MLP, on a GPU the ratios of dispatched ops and FLOPs counted over the
  whole round (local steps and the method's extra passes) at the run's local steps, priced by
  the GPU's step-time model;
  a method or stretch without one counts 1.0 and is flagged.

On a GPU (:class:`Pricing`) the plan prices the engine each run will use there
(``training.engine: default`` batches where the method's stage batches, the images are in memory
and the model stacks: :func:`fnlcore.fl.simulation.effective_engine`) with the clients a step stacks
sized by the device's memory (:func:`fnlcore.fl.simulation.clients_in_memory`), a batched step priced by the GPU's
step-time model (:mod:`fnlcore.app.gpu_cost`), which also estimates the shapes that GPU never
measured; a CPU's cost never prices a GPU. Each run's FLOPs give the floor beside the estimate.
A CPU plan prices the sequential engine, the CPU's default.

Not modelled: data preparation, partitions, noise and FedNoRo's annotator networks (minutes
against hours of training), reading and decoding on-disk images (224 and 512 pixel sets).
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from ..datasets import expected_shape, get_dataset
from ..errors import ConfigError
from ..fl.context import resolve_model_name
from ..fl.local import forward_bounded
from ..fl.pipeline import InputPipeline
from ..fl.simulation import client_bytes, clients_at_once, effective_engine, use_batched_engine
from ..methods import METHODS
from ..models import build_model
from .gpu_cost import FLOOR_EFFICIENCY, H100_TF32_DENSE_FLOPS, DeviceModel, batched_measurements, floor_seconds
from .measurements import is_shipped, measured_on, read_calibration, short_device, write_calibration
from .method_costs import COUNT_COMMAND, MethodCosts
from .step_shape import StepShape
from .train import auto_augmentation

# Other processes' load per core above which a measured step time is called unreliable.
HIGH_LOAD_PER_CORE = 0.5
# Test samples of the evaluation probe on a CPU: a 1,024-image batch of 224-pixel images takes
# minutes there, and per-sample time hardly changes above a few dozen images on a CPU.
CPU_EVAL_PROBE = 64


@dataclass(frozen=True)
class StepCost:
    train_s: float  # seconds of one local step
    eval_s: float  # seconds of one test sample's forward pass


def device_description(device: torch.device) -> str:
    """Names the device a calibration belongs to: its model, and the thread count on a CPU."""
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}|torch {torch.__version__}"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"cpu:{cpu}|{torch.get_num_threads()} threads|torch {torch.__version__}"


def load_per_core(own_threads: int = 0) -> float | None:
    """The 1-minute load average of the *other* processes per core (``own_threads``: what this
    process keeps busy, taken off), None where the system does not report a load."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    return max(0.0, load - own_threads) / (os.cpu_count() or 1)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_step(shape: StepShape, device: torch.device, batch_size: int | None = None, foreach: bool | None = None):
    """(one local step as a function, the model, the input pipeline, the autocast context) of ``shape`` on
    random data: what :func:`measure_step` times and :mod:`fnlcore.app.counts` counts. ``batch_size``:
    another batch than the shape's; ``foreach``: the optimiser's multi-tensor form (torch's default: on a GPU)."""

    gen = torch.Generator(device="cpu").manual_seed(0)
    model = build_model(shape.model, shape.num_classes, shape.channels, shape.image_size).to(device)
    if shape.channels_last:
        model = model.to(memory_format=torch.channels_last)
    pipeline = InputPipeline((0.5,) * shape.channels, (0.5,) * shape.channels, shape.augmentation,
                             channels_last=shape.channels_last)
    opt = (torch.optim.Adam(model.parameters(), lr=1e-4, foreach=foreach) if shape.optimizer == "adam"
           else torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.5, foreach=foreach))
    h, w = shape.image_size
    b = batch_size or shape.batch_size
    x = torch.randint(0, 256, (b, shape.channels, h, w), generator=gen, dtype=torch.uint8).to(device)
    if shape.multi_label:
        y = torch.randint(0, 2, (b, shape.num_classes), generator=gen).float().to(device)
        loss_fn = torch.nn.functional.binary_cross_entropy_with_logits
    else:
        y = torch.randint(0, shape.num_classes, (b,), generator=gen).to(device)
        loss_fn = torch.nn.functional.cross_entropy
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if shape.precision == "bf16"
                else torch.autocast(device.type, enabled=False))
    aug_gen = torch.Generator(device=device).manual_seed(0)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = loss_fn(model(pipeline.train(x, aug_gen)), y)
        loss.backward()
        opt.step()

    return step, model, pipeline, autocast


def measure_step(shape: StepShape, device: torch.device, steps: int = 5, warmup: int = 2) -> StepCost:
    """Median seconds of ``steps`` local steps (after ``warmup``) and of one test sample's forward pass."""

    step, model, pipeline, autocast = build_step(shape, device)
    gen = torch.Generator(device="cpu").manual_seed(1)
    h, w = shape.image_size
    model.train()
    times = []
    for i in range(warmup + steps):
        _sync(device)
        t0 = time.perf_counter()
        step()
        _sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)

    model.eval()
    n_eval = shape.eval_batch_size if device.type == "cuda" else min(shape.eval_batch_size, CPU_EVAL_PROBE)
    xe = torch.randint(0, 256, (n_eval, shape.channels, h, w), generator=gen, dtype=torch.uint8).to(device)
    eval_times = []
    with torch.no_grad():
        for i in range(3):
            _sync(device)
            t0 = time.perf_counter()
            with autocast:  # in the sub-batches a run's evaluation takes (bounded by bytes)
                forward_bounded(model, pipeline.eval(xe))
            _sync(device)
            if i >= 1:
                eval_times.append(time.perf_counter() - t0)
    return StepCost(statistics.median(times), statistics.median(eval_times) / n_eval)


class Calibration:
    """Measured step costs of one device, cached in a step-cost file (measured on first use; read and
    written by :mod:`fnlcore.app.measurements`: this device's own entries come before ``fallback``, its rule).

    The file maps device descriptions to shape keys to ``{"train_s", "eval_s"}``, so one file
    can hold a CPU's and a GPU's measurements; ``refresh`` measures every shape again.
    """

    def __init__(self, path: str | os.PathLike, device: torch.device | None, refresh: bool = False, steps: int = 5,
                 progress=None, fallback: Mapping[str, tuple[Mapping[str, Any], str]] | None = None,
                 description: str | None = None):
        """``progress(message)``: told of each shape as it is measured (its time and the load).
        ``fallback``: shape key -> (entry, where it came from), step costs measured elsewhere (the
        project's shipped ones, :func:`fnlcore.app.measurements.shipped_step_costs`), used for a shape this
        device has not measured instead of measuring it; not with ``refresh`` (measure everything),
        where they only estimate how long the measuring takes.
        ``device`` None with a ``description``: the costs of a device that is not here (`fnl plan --gpu`),
        from the file's entries of that description and the fallback; nothing is measured."""
        if device is None and (description is None or refresh):
            raise ConfigError("a calibration of a device that is not here takes its description and cannot measure")
        self.path = Path(path)
        self.refresh = refresh
        self.fallback = dict(fallback or {})
        self.device = device
        self.description = description or device_description(device)
        self.steps = steps
        self.measured: list[str] = []  # shape keys measured in this process
        self.progress = progress
        self.to_measure = 0  # shapes a plan will measure (for "[i/n]" in progress lines)
        self.estimate_of: dict[str, float | None] = {}  # shape key -> estimated seconds of its measuring
        self.remaining_estimate_s: float | None = None  # of the shapes still to measure, when all are known
        self._all: dict[str, dict[str, dict[str, float]]] = read_calibration(self.path)
        if refresh:
            self._all.pop(self.description, None)

    @property
    def entries(self) -> dict[str, dict[str, float]]:
        return self._all.setdefault(self.description, {})

    def has(self, key: str) -> bool:
        """A cost for ``key`` without measuring: this device's own, else (not refreshing) a fallback."""
        return key in self.entries or (not self.refresh and key in self.fallback)

    def entry(self, key: str) -> Mapping[str, Any]:
        if key in self.entries or self.refresh or key not in self.fallback:
            return self.entries[key]
        return self.fallback[key][0]

    def source(self, key: str) -> str:
        """Where the cost of ``key`` came from: measured now / here (this device), or the fallback's source."""
        if key in self.measured:
            return "measured now"
        if key in self.entries:
            return "measured here"
        return self.fallback[key][1] if key in self.fallback else "none"

    def measuring_estimate_s(self, key: str) -> float | None:
        """Seconds measuring ``key`` may take, from an earlier measurement of it (own or fallback)."""
        e = self.entries.get(key)
        if not e and key in self.fallback and "a CPU's" not in self.fallback[key][1]:  # not another kind's
            e = self.fallback[key][0]
        if not e:
            return None
        if e.get("took_s"):
            return float(e["took_s"])
        n_eval = CPU_EVAL_PROBE if self.device is None or self.device.type != "cuda" else 1024
        return (self.steps + 2) * float(e["train_s"]) + 3 * n_eval * float(e["eval_s"]) + 1.0

    def own_threads(self) -> int:
        """CPU threads a measurement keeps busy (not counted as others' load)."""
        return torch.get_num_threads() if self.device is not None and self.device.type == "cpu" else 1

    def cost(self, shape: StepShape) -> StepCost:
        key = shape.key()
        if not self.has(key) and self.device is None:
            raise ConfigError(f"step shape {key}: no cost of {self.description} measured or estimated, and that "
                              "device is not here to measure it; run `fnl plan --device cuda` on a node of it")
        if not self.has(key):
            # measured before this shape's work and without this process's own threads (after a
            # first measurement the 1-minute average includes them)
            load = load_per_core(self.own_threads() if self.measured else 0)
            t0 = time.perf_counter()
            entry: dict[str, Any] = asdict(measure_step(shape, self.device, steps=self.steps))
            took = time.perf_counter() - t0
            entry["load"] = None if load is None else round(load, 3)
            entry["took_s"] = round(took, 2)
            self.entries[key] = entry
            self.measured.append(key)
            self._save()  # after each shape: an interrupted calibration keeps what it measured
            if self.progress is not None:
                n = f"[{len(self.measured)}/{self.to_measure}] " if self.to_measure else ""
                busy = "" if load is None else f", load {load:.2f} per core" + (" (high)" if load > HIGH_LOAD_PER_CORE else "")
                left = ""
                if self.remaining_estimate_s is not None:
                    self.remaining_estimate_s = max(0.0, self.remaining_estimate_s - (self.estimate_of.get(key) or took))
                    left = f"; about {_duration(self.remaining_estimate_s)} left" if len(self.measured) < self.to_measure else ""
                self.progress(f"{n}measured {key}: {entry['train_s']:.4f} s/step in {took:.1f}s{busy}{left}")
        e = self.entry(key)
        return StepCost(float(e["train_s"]), float(e["eval_s"]))

    def _save(self) -> None:
        write_calibration(self.path, self._all)


# -- runs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunCost:
    """The estimate of one training run."""

    shape: StepShape
    seconds: float
    factor_measured: bool  # every stretch's round cost was measured or counted (not the 1.0 default)
    longest_round_s: float = 0.0
    flops: float = 0.0  # its local steps' and test passes' FLOPs, the floor's (0: not counted)
    at_once: int = 1  # the most clients one step trains (1: the sequential engine)
    method: str = ""
    factors: tuple = ()  # (stretch name, fnlcore.app.method_costs.Factor) of each stretch of the run


def _data_shape(run, dataset_options: Mapping[str, Any] | None):

    return expected_shape(get_dataset(run.dataset), dataset_options)


def _step_shape(run, ds) -> StepShape:

    t = run.training
    aug = auto_augmentation(run.dataset, ds.image_size) if t.augmentation == "auto" else t.augmentation
    return StepShape(
        model=resolve_model_name(t.model, ds.channels, ds.image_size),
        channels=ds.channels, image_size=tuple(ds.image_size), num_classes=ds.num_classes,
        multi_label=ds.multi_label, batch_size=t.batch_size, augmentation=aug, optimizer=t.optimizer,
        precision=t.precision, channels_last=t.channels_last, eval_batch_size=t.eval_batch_size,
    )


@dataclass(frozen=True)
class StagePlan:
    """A stretch of a run's rounds as it will train: ``at_once`` clients a step (1: sequential)."""

    name: str
    rounds: int
    clients: int  # trained a round
    steps: float  # local steps of a client (local epochs x batches)
    factor: float  # the method's round cost over a FedAvg round
    evaluated: bool
    at_once: int = 1
    source: Any = None  # the factor's fnlcore.app.method_costs.Factor


@dataclass
class Pricing:
    """How a plan prices a run on a device: ``device_type`` ("cuda" prices the engine the run will
    use there, :func:`fnlcore.fl.simulation.effective_engine`); ``model``: the GPU's step-time model
    (:class:`fnlcore.app.gpu_cost.DeviceModel`: the batched step and estimated shapes); ``counts``:
    the shapes' ops and FLOPs (:class:`fnlcore.app.counts.ShapeCounts`: the floor, stackable
    models, a client's memory); ``memory_bytes``: the device's memory (clients at once);
    ``method_costs``: the methods' round costs (:class:`fnlcore.app.method_costs.MethodCosts`,
    default the shipped file)."""

    device_type: str = "cpu"
    model: Any = None
    counts: Any = None
    memory_bytes: float | None = None
    method_costs: Any = None

    def factor(self, run, stretch: str, shape: StepShape, steps: float = 1.0):
        """The round cost of ``run``'s stretch ``stretch``, ``steps`` local steps a client, on this device
        (:mod:`fnlcore.app.method_costs`)."""

        costs = self.method_costs or MethodCosts()
        split = None
        if self.device_type == "cuda" and self.model is not None:
            split = self.model.split(shape, self.model.train_s(shape))
        return costs.factor(run.method.name, run.method, stretch, self.device_type, split, steps)

    def stages(self, run, ds, shape: StepShape) -> list[StagePlan]:
        """The run's stages, each with the clients a step trains on this device."""

        t = run.training
        k = run.partition.num_clients
        n_k = run.partition.expected_samples(ds.n_train) / k
        per_epoch = math.floor(n_k / t.batch_size) if t.drop_last else math.ceil(n_k / t.batch_size)
        cls = METHODS[run.method.name]
        counts = self.counts.of(shape) if self.counts is not None else None
        # what RoundEngine decides on this device: the method batches, the images are in memory
        # (rounds.batched_fits), the model stacks; a CPU plan prices the sequential engine (its default)
        batched = (self.device_type == "cuda" and use_batched_engine(cls, effective_engine(t.engine, "cuda"))
                   and get_dataset(run.dataset).in_memory and (counts is None or counts["stackable"]))
        out = []
        for st in cls.schedule(run.method, t, k):
            stage = cls.stages.get(st.name)
            f = self.factor(run, st.name, shape, t.local_epochs * per_epoch)
            at_once = 1
            if batched and (stage.batchable if stage is not None else True):
                per_client = (client_bytes(counts["param_bytes"], counts["activation_bytes"], shape.batch_size,
                                           shape.optimizer, len(cls.networks)) if counts else None)
                at_once = clients_at_once(t.batched_clients, st.clients, self.memory_bytes, per_client)
            out.append(StagePlan(st.name, st.rounds, st.clients, t.local_epochs * per_epoch, f.value,
                                 st.evaluated, at_once, f))
        return out

    def price(self, run, ds, shape: StepShape, cost: StepCost) -> tuple[float, float, float, int]:
        """(device seconds of the run, of its longest round, its FLOPs, the most clients a step trains)."""
        return self.priced(run, ds, shape, cost)[:4]

    def priced(self, run, ds, shape: StepShape, cost: StepCost) -> tuple[float, float, float, int, tuple]:
        """:meth:`price`'s figures and (stretch name, :class:`~fnlcore.app.method_costs.Factor`) of each stretch."""
        total, longest, flops, most = 0.0, 0.0, 0.0, 1
        counts = self.counts.of(shape) if self.counts is not None else None
        stretches = self.stages(run, ds, shape)
        for sp in stretches:
            if sp.at_once > 1 and self.model is not None:
                steps = math.ceil(sp.clients / sp.at_once) * sp.steps * sp.factor
                train = steps * self.model.group_step_s(shape, cost.train_s, sp.at_once)
            else:
                train = sp.clients * sp.steps * sp.factor * cost.train_s
            one = train + (ds.n_test * cost.eval_s if sp.evaluated else 0.0)
            total += sp.rounds * one
            longest = max(longest, one if sp.rounds else 0.0)
            most = max(most, sp.at_once)
            if counts is not None:  # a lower bound: a method's extra passes not counted
                flops += sp.rounds * (sp.clients * sp.steps * counts["flops"]
                                      + (ds.n_test * counts["eval_flops"] if sp.evaluated else 0.0))
        return total, longest, flops, most, tuple((sp.name, sp.source) for sp in stretches)


def _work(run, ds) -> tuple[float, int, bool]:
    """(weighted client steps, test samples scored, every factor measured), at a CPU's round costs."""

    t = run.training
    k = run.partition.num_clients
    n_k = run.partition.expected_samples(ds.n_train) / k
    per_epoch = math.floor(n_k / t.batch_size) if t.drop_last else math.ceil(n_k / t.batch_size)
    cls = METHODS[run.method.name]
    costs = MethodCosts()
    steps, evaluated, measured = 0.0, 0, True
    for st in cls.schedule(run.method, t, k):
        f = costs.factor(run.method.name, run.method, st.name, "cpu")
        steps += st.rounds * st.clients * t.local_epochs * per_epoch * f.value
        evaluated += st.rounds if st.evaluated else 0
        measured = measured and f.measured
    return steps, evaluated * ds.n_test, measured


def step_shape(run, dataset_options: Mapping[str, Any] | None = None) -> StepShape:
    """The :class:`StepShape` of a run (the model and augmentation its ``auto`` settings resolve to)."""
    return _step_shape(run, _data_shape(run, dataset_options))


def run_work(run, dataset_options: Mapping[str, Any] | None = None) -> tuple[float, int, bool]:
    """(weighted client steps, test samples scored, factor measured) of a run, from its specs alone."""
    return _work(run, _data_shape(run, dataset_options))


def estimate_run(run, calibration: Calibration, dataset_options: Mapping[str, Any] | None = None,
                 pricing: Pricing | None = None) -> RunCost:
    """The run's estimate (its step shape measured first where the calibration lacks it)."""
    ds = _data_shape(run, dataset_options)
    shape = _step_shape(run, ds)
    c = calibration.cost(shape)
    seconds, longest, flops, at_once, factors = (pricing or Pricing()).priced(run, ds, shape, c)
    return RunCost(shape, seconds, all(f.measured for _, f in factors), longest, flops, at_once,
                   run.method.name, factors)


# -- a plan's report -------------------------------------------------------------------------


@dataclass(frozen=True)
class TableCost:
    paper: str
    table: str
    runs: int
    seconds: float
    longest_s: float
    floor_s: float = 0.0  # its runs' FLOPs at the floor's rate (fnlcore.app.gpu_cost.floor_seconds)
    batched: int = 0  # runs that train batched (more than one client a step somewhere)
    keys: frozenset = frozenset()  # its runs' metrics paths (a paper's total counts a shared run once)


@dataclass(frozen=True)
class CostEstimate:
    """The estimated cost of a plan (:class:`fnlcore.app.plan.Plan`): each table's, each distinct run's."""

    tables: list[TableCost]
    runs: dict[str, RunCost]  # metrics path -> estimate, each distinct run once
    unmeasured: dict[str, int]  # method name -> runs counted at 1.0x
    pricing: Pricing | None = None

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.runs.values())

    @property
    def floor_s(self) -> float:

        return sum(floor_seconds(r.flops) for r in self.runs.values())


def estimate_plan(plan, calibration: Calibration, progress=None, pricing: Pricing | None = None) -> CostEstimate:
    """Every distinct run of ``plan`` once; each table's sum over its own runs (shared ones included).

    ``progress(message)``: told how many step shapes must be measured (and whether the machine
    is busy now), then of each as it is measured (through the calibration's ``progress``).
    ``pricing``: the device's engine model and the shapes' counts (:class:`Pricing`); without it
    the sequential engine and no floor."""

    runs: dict[str, RunCost] = {}
    unmeasured: dict[str, int] = {}
    options = {name: ds.options for name, ds in plan.datasets.items()}
    todo = {k for k in (step_shape(run, options.get(run.dataset)).key() for run in plan.runs()) if not calibration.has(k)}
    if progress is not None:
        calibration.progress = calibration.progress or progress
        calibration.to_measure = len(todo)
        if todo:
            calibration.estimate_of = {k: calibration.measuring_estimate_s(k) for k in todo}
            known = [v for v in calibration.estimate_of.values() if v is not None]
            if len(known) == len(todo):
                calibration.remaining_estimate_s = sum(known)
                how_long = (f"about {_duration(sum(known))} in all by earlier measurements of these shapes "
                            "(on another machine: this one may differ)")
            else:
                how_long = (f"{len(todo) - len(known)} of them never measured before (each seconds to minutes)"
                            + (f", the others about {_duration(sum(known))}" if known else ""))
            progress(f"measuring {len(todo)} step shape(s) on {calibration.description} "
                     f"(cached in {calibration.path}): {how_long}")
            busy = busy_now_warning(calibration)
            if busy:
                progress(busy)
    if pricing is not None and pricing.device_type == "cuda" and pricing.model is None and pricing.counts is not None:
        pricing = _fit_here(plan, calibration, pricing, options)
    for run in plan.runs():
        key = run.files(plan.results_dir)["metrics"]
        runs[key] = rc = estimate_run(run, calibration, options.get(run.dataset), pricing)
        if not rc.factor_measured:
            unmeasured[run.method.name] = unmeasured.get(run.method.name, 0) + 1
    tables = []
    for t in plan.tables:
        mine = {tr.run.files(plan.results_dir)["metrics"] for tr in t.runs}
        secs = [runs[k].seconds for k in mine]
        tables.append(TableCost(t.paper, t.table, len(mine), sum(secs), max(secs, default=0.0),
                                sum(floor_seconds(runs[k].flops) for k in mine),
                                sum(runs[k].at_once > 1 for k in mine), frozenset(mine)))
    return CostEstimate(tables, runs, unmeasured, pricing)


def _fit_here(plan, calibration: Calibration, pricing: Pricing, options) -> Pricing:
    """A GPU with no shipped measurements of its model: every shape measured here first, then its
    step-time model fitted on them (what prices its batched step; :mod:`fnlcore.app.gpu_cost`)."""


    for run in plan.runs():
        calibration.cost(step_shape(run, options.get(run.dataset)))
    measured = {k: (float(e["train_s"]), float(e["eval_s"])) for k, e in calibration.entries.items()}
    if len(measured) < 2:
        return pricing  # one shape: no model; the batched engine priced as sequential
    rows = [r for d, rs in batched_measurements().items() if short_device(d) == short_device(calibration.description)
            for r in rs]
    return dataclasses.replace(pricing, model=DeviceModel(calibration.description, measured, pricing.counts, rows))


def busy_now_warning(calibration: Calibration) -> str | None:
    """A warning when other processes load this machine now (step times measured now run slow)."""
    load = load_per_core(calibration.own_threads() if calibration.measured else 0)
    if load is None or load <= HIGH_LOAD_PER_CORE:
        return None
    return (f"warning: this machine is busy (other processes' load {load:.2f} per core): step times measured now "
            "come out too slow; run `fnl plan --recalibrate` again when it is quiet")


def load_warnings(cost: CostEstimate, calibration: Calibration) -> list[str]:
    """Warnings about the step costs ``cost`` used: cached entries measured under high load or
    with no load recorded (older files), naming the fix. Only this machine's: a shipped cost's load
    is in its shape line."""
    used = {k for k in _shapes(cost) if _source(calibration, k).startswith("measured")}
    high = {k: _entry(calibration, k).get("load") for k in used if (_entry(calibration, k).get("load") or 0) > HIGH_LOAD_PER_CORE}
    unknown = [k for k in used if "load" not in _entry(calibration, k)]
    out = []
    if high:
        worst = max(high.values())
        now = " (measured now)" if set(high) & set(calibration.measured) else ""
        out.append(f"warning: {len(high)} of {len(used)} step costs were measured on a busy machine{now} (up to "
                   f"{worst:.2f} load per core from other processes); the estimates are too high: rerun "
                   "`fnl plan --recalibrate` on a quiet machine")
    if unknown:
        out.append(f"note: {len(unknown)} of {len(used)} step costs were cached without the machine's load; "
                   "`fnl plan --recalibrate` measures them again and records it")
    return out


def _shapes(cost: CostEstimate) -> dict[str, list[RunCost]]:
    by_shape: dict[str, list[RunCost]] = {}
    for rc in cost.runs.values():
        by_shape.setdefault(rc.shape.key(), []).append(rc)
    return by_shape


def _entry(calibration, key: str) -> Mapping[str, Any]:
    return calibration.entry(key) if hasattr(calibration, "entry") else calibration.entries[key]


def _source(calibration, key: str) -> str:
    return calibration.source(key) if hasattr(calibration, "source") else "measured here"


def device_label(description: str) -> tuple[str, str]:
    """(the device's short name, the unit of its hours): ``cuda:NVIDIA H200`` -> GPU-hours; a CPU's core-hours."""
    short = description.split("|torch")[0]
    return short, ("GPU-hours" if short.startswith("cuda") else "CPU core-hours")


def method_factor_lines(cost: CostEstimate) -> list[str]:
    """The plan's round cost of each method's stretches on the device priced, and where each came from
    (:mod:`fnlcore.app.method_costs`); a GPU's counted factor varies with the shape: its range."""

    seen: dict[str, dict[str, list]] = {}
    for rc in cost.runs.values():
        for stretch, f in rc.factors:
            seen.setdefault(rc.method, {}).setdefault(stretch, []).append(f)
    kinds = {f.kind for per in seen.values() for fs in per.values() for f in fs}
    costs = (cost.pricing.method_costs if cost.pricing is not None else None) or MethodCosts()
    lines = ["method round costs (x a FedAvg round on the same clients, per stretch of the method's rounds; "
             f"{costs.path.name}), [source]:"]
    if "counted" in kinds:
        lines.append("  [counted] the ratios of ops dispatched and of matrix FLOPs over a whole round (local steps and "
                     f"the method's extra passes) to FedAvg's, counted on the CPU at the reference run ({costs.reference()}), "
                     "weighted by this GPU's fitted time per op and per FLOP at each run's shape (a range over shapes)")
    if "cpu time" in kinds:
        lines.append("  [cpu time] a round's seconds over FedAvg's, measured on the digits MLP on a CPU "
                     "(benchmarks/bench_methods.py)")
    if "unmeasured" in kinds:
        how = (f"`{COUNT_COMMAND.format(name='NAME')}` counts a method" if cost.pricing is not None
               and cost.pricing.device_type == "cuda" else "`python benchmarks/bench_methods.py --methods fedavg "
               f"NAME` measures a method's CPU time ratio (its `cpu` entry in {costs.path.name})")
        lines.append(f"  [unmeasured] 1.0 (FedAvg's): {how}")

    def shown(fs: list) -> str:
        lo, hi = f"{min(f.value for f in fs):.2f}", f"{max(f.value for f in fs):.2f}"
        return lo if lo == hi else f"{lo}-{hi}"

    for name, per in sorted(seen.items()):
        parts = [f"{stretch} {shown(fs)} [{'/'.join(sorted({f.kind for f in fs}))}]" for stretch, fs in per.items()]
        lines.append(f"  {name}: " + ", ".join(parts))
    return lines


def format_estimate(cost: CostEstimate, calibration: Calibration, scale: str, resources=None) -> str:
    """``resources``: the train jobs' requests per table (:func:`fnlcore.app.resources.resource_columns`).
    Every figure is of one device, named in the header; the last line is the total."""

    hours = 3600.0
    device, unit = device_label(calibration.description)
    res_head = f" {resources.header}" if resources is not None else ""

    def res(t) -> str:
        return f" {resources.columns.get((t.paper, t.table), '')}" if resources is not None else ""

    by_shape = _shapes(cost)
    estimated = [k for k in by_shape if _source(calibration, k).startswith("estimated")]
    pricing = cost.pricing
    batched = sum(r.at_once > 1 for r in cost.runs.values())
    lines = [
        f"scale {scale}: {len(cost.tables)} tables, {len(cost.runs)} distinct training runs",
        f"device: {calibration.description}; every figure below is of this device ({unit}), the floor's excepted",
        f"step costs: {calibration.path} ({len(calibration.measured)} of {len(by_shape)} shapes measured now, "
        f"{len(estimated)} estimated; where each came from: the shape lines below)",
    ]
    if pricing is not None and pricing.model is not None:
        lines.append(f"estimates: {pricing.model.describe()}")
    elif pricing is not None and pricing.device_type == "cuda":
        lines.append("estimates: none (fewer than two shapes measured on this GPU): the batched engine priced as sequential")
    if pricing is not None and pricing.device_type == "cuda":
        mem = f"{pricing.memory_bytes / 2**20:,.0f} MiB" if pricing.memory_bytes else "unknown memory: all"
        lines.append(f"engine: {batched} of {len(cost.runs)} runs batched (training.engine default: batched where the "
                     f"method batches on a GPU, images in memory, the model stacks), clients at once sized by the "
                     f"device's memory ({mem}); the others sequential")
    else:
        lines.append("engine: sequential (the default on a CPU)")
    lines.append(f"floor: the runs' training and evaluation FLOPs (every local step's forward and backward once, "
                 f"a method's extra passes not counted) at {FLOOR_EFFICIENCY:.0%} of an H100's dense TF32 "
                 f"peak ({FLOOR_EFFICIENCY * H100_TF32_DENSE_FLOPS / 1e12:.0f} TFLOP/s); half of it at BF16")
    lines += ["", f"{'paper':8s} {'table':6s} {'runs':>6s} {'batched':>7s} {'device-h':>10s} {'floor h':>8s} "
                  f"{'longest run h':>14s}{res_head}"]
    for t in cost.tables:
        lines.append(f"{t.paper:8s} {t.table:6s} {t.runs:6d} {t.batched:7d} {t.seconds / hours:10.2f} "
                     f"{t.floor_s / hours:8.2f} {t.longest_s / hours:14.2f}{res(t)}")
    lines.append(f"{'all':8s} {'':6s} {len(cost.runs):6d} {batched:7d} {cost.seconds / hours:10.2f} "
                 f"{cost.floor_s / hours:8.2f}   (a run shared by tables counts once)")
    paper_runs: dict[str, set[str]] = {}
    for t in cost.tables:
        paper_runs.setdefault(t.paper, set()).update(t.keys)
    if len(paper_runs) > 1:
        lines.append("per paper (its distinct runs): " + ", ".join(
            f"{p} {sum(cost.runs[k].seconds for k in ks) / hours:,.0f} h "
            f"(floor {sum(floor_seconds(cost.runs[k].flops) for k in ks) / hours:,.0f})"
            for p, ks in paper_runs.items()))
    lines += ["", "per shape (model|input|classes|batch|augmentation|optimiser|precision|eval batch); "
              "load: other processes' load per core when it was measured:",
              f"  {'s/step':>8s} {'ms/test sample':>15s} {'runs':>5s} {'device-h':>9s} {'load':>5s}  shape  [from]"]
    for key, rcs in sorted(by_shape.items(), key=lambda kv: -sum(r.seconds for r in kv[1])):
        c = _entry(calibration, key)
        load = "?" if c.get("load") is None else f"{c['load']:.2f}"
        lines.append(f"  {c['train_s']:8.4f} {1000 * c['eval_s']:15.4f} {len(rcs):5d} "
                     f"{sum(r.seconds for r in rcs) / hours:9.1f} {load:>5s}  {key}  [{_source(calibration, key)}]")
    shipped = [k for k in by_shape if not _source(calibration, k).startswith(("measured", "estimated"))]
    if shipped:
        how = ("`fnl plan --recalibrate` measures them here (minutes to an hour on a CPU)" if calibration.device is not None
               else "`fnl plan --device cuda --recalibrate` on a node of that GPU measures them")
        lines += ["", f"{len(shipped)} of {len(by_shape)} step costs are not this machine's (shipped with the project, "
                  f"device in [from]): {how}"]
        seen = {}
        for k in shipped:
            e = _entry(calibration, k)
            if e.get("provenance"):
                seen.setdefault(_source(calibration, k), e["provenance"])
        lines += [f"  {src}: {text}" for src, text in seen.items()]
    if estimated:
        lines += ["", f"{len(estimated)} of {len(by_shape)} step costs are estimated from the shapes this device "
                  "measured (dispatched ops and FLOPs counted on the CPU: benchmarks/shape_counts.json); "
                  "`fnl plan --device cuda --recalibrate` on such a GPU measures them"]
    lines += ["", *method_factor_lines(cost)]
    if cost.unmeasured:
        listed = ", ".join(f"{m} ({n})" for m, n in sorted(cost.unmeasured.items()))
        lines += [f"round cost not measured, counted as FedAvg's (runs): {listed}"]
    if resources is not None:
        lines += ["", *resources.notes]
    lines += ["", "not counted: data preparation, partitions, noise, annotator networks, reading on-disk images"]
    warnings = load_warnings(cost, calibration)
    if warnings:
        lines += ["", *warnings]
    def h(seconds: float) -> str:  # a smoke plan's minutes are not "0"
        return f"{seconds / hours:,.0f}" if seconds >= 10 * hours else f"{seconds / hours:.2f}"

    floor_unit = "" if unit == "GPU-hours" else " GPU-hours"  # the floor is an H100's, on any device
    lines += ["", f"total: {h(cost.seconds)} {unit} on {device} (floor {h(cost.floor_s)}{floor_unit}; each run once)"]
    return "\n".join(lines)


def gpu_step_costs(shapes, description: str, paths: list, counts, memory_bytes: float | None = None
                   ) -> tuple[Pricing, dict[str, tuple[dict[str, Any], str]]]:
    """(the pricing of GPU ``description``, shape key -> (entry, where it came from)) for ``shapes``:
    that GPU model's measurements in the step-cost files ``paths`` (the first path's winning), and for
    a shape it never measured the estimate of its :class:`~fnlcore.app.gpu_cost.DeviceModel`, marked
    ``estimated``; never another device's cost. Fewer than two measured shapes: no model, no estimates."""

    found = measured_on(description, paths)
    out: dict[str, tuple[dict[str, Any], str]] = {}
    for key, (t, e, where) in found.items():
        src = (f"shipped ({short_device(description)})" if is_shipped(where)
               else f"measured ({where}, {short_device(description)})")
        out[key] = ({"train_s": t, "eval_s": e}, src)
    model = None
    if len(found) >= 2:
        rows = [r for d, rs in batched_measurements().items() if short_device(d) == short_device(description) for r in rs]
        model = DeviceModel(description, {k: v[:2] for k, v in found.items()}, counts, rows)
        for shape in shapes:
            key = shape.key()
            if key not in out:
                out[key] = ({"train_s": model.train_s(shape), "eval_s": model.eval_s(shape), "estimated": True},
                            f"estimated from {len(found)} shapes measured on {short_device(description)}")
    return Pricing("cuda", model, counts, memory_bytes), out
