"""What a training job asks the scheduler for: memory, disk and run time predicted from
measurements, capped by the site's limits, and how many jobs a run longer than one job needs.

Sources, read once per workflow (:class:`TrainResources`): the user's own measurements under
``RESULTS/plan/`` and, where they have none for a configuration or step shape, the ones this
project ships under ``benchmarks/`` (``rehearsal_*.csv``, the whole rehearsal, and
``step_costs.json``, step costs per device kind with where and when they were measured), all read
through :mod:`fnlcore.app.measurements` and its one precedence rule: per configuration / step shape,
a measurement on the job's kind of device wins over one on the other kind (a GPU job: GPU rows
first), and at the same kind the user's own wins over the shipped one. Each request records where its memory and its time came from
(:attr:`Resources.mem_source`, :attr:`Resources.time_source`; ``fnl plan`` prints them):

* ``RESULTS/plan/rehearsal.csv`` (``fnl rehearse``): a configuration's peak host RSS, peak
  device memory, checkpoint size and bytes written per checkpoint, joined to a run through
  :func:`fnlcore.app.rehearse.training_config` ``(run).key``; rows of status ``pass``, and
  ``no_weights`` (pretrained weights not at hand, measured with random initialisation: the
  same tensors, so the same memory and sizes; loading ResNet-50's 98 MB of weights raised the
  peak before training by 92 MB and the training peak not at all, benchmarks/README.md).
* ``RESULTS/plan/step_costs.json`` (``fnl plan``): seconds of a local step and of a test
  sample per step shape (:mod:`fnlcore.app.cost`). A GPU job takes a GPU's measurement when
  the file has one (the slowest GPU's, when several), else the CPU's (an overestimate).

Prediction (:func:`predict`), with headroom because a measurement is one sample:

* ``mem_mb = RSS x 1.3 + 1 GB`` (+ 2 GB for the CUDA context when a GPU job was rehearsed
  on a CPU); without a rehearsal :data:`DEFAULT_MEM_MB` (what every train job asked before).
* ``disk_mb = 2 x checkpoint + bytes written by one checkpoint + 1 GB`` (the atomic write
  keeps the old checkpoint until the new one is complete); without one :data:`DEFAULT_DISK_MB`.
* ``runtime = device seconds (the cost model) x 1.5 + 10 min`` (start-up, data loading,
  checkpoints, on-disk image decoding that the cost model does not count); without a step
  cost the site's whole job length.

A run predicted longer than the site's ``max_runtime`` asks for ``max_runtime`` and takes
``jobs`` jobs. Each job trains within :func:`time_budget_s` (its runtime less
:data:`STOP_MARGIN_MIN`): before a round that might not fit, it checkpoints and stops with
exit status :data:`fnlcore.errors.EXIT_CONTINUE` (:mod:`fnlcore.fl.time_budget`); the
workflow resubmits it (the rule's ``retries``: the most jobs any run of the plan needs, plus
:data:`RETRY_MARGIN` for a pre-emption or a node that died, which loses up to a checkpoint
interval) and the next job resumes from that checkpoint. A job therefore loses at most its
start-up and one round (:func:`job_lengths`), whatever ``training.checkpoint_every`` is.

The site cap comes from the ``train`` entry of the profile's ``set-resources``
(``max_mem_mb``, ``max_runtime`` in minutes; :func:`site_cap`), default :data:`DEFAULT_CAP`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..errors import ConfigError
from .measurements import (DEFAULT, OWN, Measured, device_memory_mb, gpu_descriptions, measured_on, own_rehearsal,
                           own_step_costs, rehearsal_with_sources, shipped_provenance, shipped_step_costs_path,
                           step_costs_with_sources)
from .gpu_cost import find_gpu
from .rehearse import training_config

MEM_HEADROOM = 1.3
MEM_MARGIN_MB = 1024
CUDA_CONTEXT_MB = 2048  # host memory of a CUDA context, missing from a CPU rehearsal
DISK_MARGIN_MB = 1024
RUNTIME_HEADROOM = 1.5
STARTUP_MIN = 10  # data loading, model building, resuming, the final checkpoint and outputs
# Of a job's runtime, not given to training (time_budget_s): the scheduler's and the workflow's
# start-up before training starts, and a round that runs longer than every earlier one. Part of
# STARTUP_MIN, so a run that fits one job is not stopped by its own budget.
STOP_MARGIN_MIN = 5
DEFAULT_MEM_MB = 16000  # no rehearsal of the run's configuration
DEFAULT_DISK_MB = 10240
DEFAULT_JOBS = 5  # no step cost: job lengths a run may take
RETRY_MARGIN = 2  # attempts beyond the predicted jobs: pre-emption, a node that died


@dataclass(frozen=True)
class SiteCap:
    """The largest job a site runs: ``max_mem_mb`` (None: no cap) and ``max_runtime`` (minutes)."""

    max_mem_mb: int | None = None
    max_runtime: int = 1440


DEFAULT_CAP = SiteCap()


def site_cap(overwrite_resources: Mapping[str, Mapping[str, Any]] | None) -> SiteCap:
    """The cap in the ``train`` entry of Snakemake's ``set-resources`` (profile or command line)."""
    train = _plain(overwrite_resources["train"]) if overwrite_resources and "train" in overwrite_resources else {}

    def positive(key: str, default):
        if key not in train:
            return default
        try:
            value = int(train[key])
        except (TypeError, ValueError):
            value = 0
        if value <= 0:
            raise ConfigError(f"set-resources train:{key}={train[key]!r}: give a positive whole number"
                              f" ({'MB' if key == 'max_mem_mb' else 'minutes'})")
        return value

    cap = SiteCap(positive("max_mem_mb", DEFAULT_CAP.max_mem_mb), positive("max_runtime", DEFAULT_CAP.max_runtime))
    if "runtime" in train:
        # a fixed job length replaces every run's prediction: count the jobs (the retries) in it
        cap = SiteCap(cap.max_mem_mb, min(cap.max_runtime, _minutes(train["runtime"])))
    return cap


def _minutes(value) -> int:
    """A Snakemake ``runtime`` (whole minutes, or a time span such as "90m" or "2h") in minutes."""
    try:
        minutes = int(value)
    except (TypeError, ValueError):
        # lazy: Snakemake (humanfriendly is its dependency) is absent from envs/labels.yaml and device checks
        from humanfriendly import InvalidTimespan, parse_timespan  # Snakemake's own parser (its dependency)

        try:
            minutes = math.ceil(parse_timespan(str(value)) / 60)
        except InvalidTimespan:
            minutes = 0
    if minutes <= 0:
        raise ConfigError(f"set-resources train:runtime={value!r}: give positive minutes or a time span such as 2h")
    return minutes


def _plain(mapping) -> dict[str, Any]:
    """A rule's set-resources as plain values (Snakemake hands them over as Resource objects)."""
    return {k: getattr(v, "raw", v) for k, v in mapping.items()}


@dataclass(frozen=True)
class Resources:
    """One run's request. ``jobs``: job lengths the run takes (``runtime`` each)."""

    mem_mb: int
    disk_mb: int
    runtime: int  # minutes a job asks for
    jobs: int
    device_seconds: float | None  # the cost model's estimate (no headroom); None: no step cost
    gpu_mem_mb: int | None = None  # predicted device memory (a GPU rehearsal only)
    rehearsed: bool = False
    over_cap: bool = False  # needs more memory than the site's cap: asks for the cap, will likely fail
    note: str = ""
    # a round longer than a job holds: no job would advance the run; a workflow that would train it
    # stops at once, naming it (:meth:`TrainResources.of`); `fnl plan` marks its table
    round_too_long: str = ""
    mem_source: str = "default"  # where memory and disk came from: measured here, shipped (device), default
    time_source: str = "default"  # where the runtime came from: measured here, shipped (device), default


# -- prediction ---------------------------------------------------------------------------------


def _round_seconds(run, dataset_options, train_s: float, eval_s: float, pricing=None) -> tuple[float, float]:
    """(device seconds of the run, of its longest round) by the cost model (fnlcore/app/cost.py), on
    the engine ``pricing`` says the device runs (the sequential one without it)."""
    # lazy: imports torch; fnlcore.app.resources imports without it (envs/labels.yaml)
    from .cost import Pricing, StepCost, _data_shape, _step_shape

    ds = _data_shape(run, dataset_options)
    total, longest, _, _ = (pricing or Pricing()).price(run, ds, _step_shape(run, ds), StepCost(train_s, eval_s))
    return total, longest


def predict(run, step_costs: Mapping[str, tuple[float, float]], rehearsal: Mapping[str, Measured],
            cap: SiteCap = DEFAULT_CAP, dataset_options: Mapping[str, Any] | None = None,
            gpu: bool = True, mem_sources: Mapping[str, str] | None = None,
            cost_sources: Mapping[str, str] | None = None, pricing=None,
            priced: tuple[float, float] | None = None) -> Resources:
    """The request of one run (see the module docstring for the rules and defaults).
    ``mem_sources`` / ``cost_sources``: where each configuration's / shape's measurement came from.
    ``pricing``: how a run's seconds follow from its step cost (:class:`fnlcore.app.cost.Pricing`: the
    engine the device runs); ``priced``: (seconds, longest round) already priced (`fnl plan`'s own)."""
    # lazy: imports torch; fnlcore.app.resources imports without it (envs/labels.yaml)
    from .cost import step_shape

    notes = []
    config = training_config(run, dataset_options).key
    m = rehearsal.get(config)
    mem_source = DEFAULT if m is None else (mem_sources or {}).get(config, OWN)
    shape = step_shape(run, dataset_options).key()
    time_source = DEFAULT if shape not in step_costs and priced is None else (cost_sources or {}).get(shape, OWN)
    if m is None:
        mem, disk, gpu_mem = DEFAULT_MEM_MB, DEFAULT_DISK_MB, None
        notes.append("not rehearsed: default memory and disk")
    else:
        rss = m.peak_rss_mb + (CUDA_CONTEXT_MB if gpu and not m.on_gpu else 0)
        mem = math.ceil(rss * MEM_HEADROOM + MEM_MARGIN_MB)
        disk = math.ceil(2 * m.checkpoint_mb + m.written_per_checkpoint_mb + DISK_MARGIN_MB)
        gpu_mem = math.ceil(m.peak_device_mb * MEM_HEADROOM) if gpu and m.on_gpu and m.peak_device_mb else None
        if m.random_init:
            notes.append("rehearsed with random initialisation (no pretrained weights at hand)")
    over = cap.max_mem_mb is not None and mem > cap.max_mem_mb
    if over:
        notes.append(f"needs {mem} MB, over the site cap of {cap.max_mem_mb} MB")
        mem = cap.max_mem_mb

    cost = step_costs.get(shape)
    if cost is None and priced is None:
        notes.append("no step cost: the site's whole job length")
        runtime, jobs, seconds = cap.max_runtime, DEFAULT_JOBS, None
    else:
        seconds, longest = priced if priced is not None else _round_seconds(run, dataset_options, *cost, pricing)
        try:
            runtime, jobs = job_lengths(seconds, longest, cap.max_runtime)
        except ConfigError as err:
            return Resources(mem, disk, cap.max_runtime, 1, seconds, gpu_mem, m is not None, over,
                             "; ".join(notes + [str(err)]), round_too_long=str(err),
                             mem_source=mem_source, time_source=time_source)
        if jobs > 1:
            notes.append(f"{jobs} jobs of {runtime} min, each continuing from the checkpoint of the one before")
            one_round = longest * RUNTIME_HEADROOM / 60
            if one_round > runtime / 4:  # a job stops up to a round before its limit: a large share of it
                notes.append(f"a round takes up to {one_round:.0f} min, which a job may leave unused: "
                             "raise the site's max_runtime")
    return Resources(mem, disk, runtime, jobs, seconds, gpu_mem, m is not None, over, "; ".join(notes),
                     mem_source=mem_source, time_source=time_source)


def job_lengths(device_seconds: float, longest_round_s: float, max_runtime: int) -> tuple[int, int]:
    """(minutes a job asks for, jobs) of a run of ``device_seconds``.

    Above ``max_runtime`` each job stops before its limit with a checkpoint, and the next
    resumes from it: a job advances by its length less the start-up (the checkpoint at the
    stop included) and one round, the most it leaves unused when the next round might not fit."""
    minutes = device_seconds * RUNTIME_HEADROOM / 60 + STARTUP_MIN
    if minutes <= max_runtime:
        return max(1, math.ceil(minutes)), 1
    one_round = longest_round_s * RUNTIME_HEADROOM / 60
    progress = max_runtime - STARTUP_MIN - one_round
    if progress <= 0:
        raise ConfigError(
            f"a round takes about {one_round:.0f} min, more than a job of {max_runtime} min holds beside its "
            f"{STARTUP_MIN} min of start-up: raise the site's max_runtime (set-resources train:max_runtime)"
        )
    return max_runtime, math.ceil((minutes - STARTUP_MIN) / progress)


def time_budget_s(runtime_min: float) -> float:
    """Seconds a train job of ``runtime_min`` minutes may train (fnlcore.app.train's ``time_budget_s``):
    its runtime less :data:`STOP_MARGIN_MIN`; at least one round runs in any case."""
    return max(0.0, (float(runtime_min) - STOP_MARGIN_MIN) * 60.0)


# -- the workflow's view ------------------------------------------------------------------------


def _run_key(fields: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(str(fields[k]) for k in ("dataset", "partition", "pseed", "noise", "nseed", "train", "method", "seed"))


class TrainResources:
    """The train rule's resources and retries for every run of a plan, predicted once.

    ``mem_mb``, ``disk_mb`` and ``runtime`` are Snakemake resource callables of a job's wildcards.
    A run outside the plan (a path asked for by hand) gets the defaults."""

    def __init__(self, plan, cap: SiteCap = DEFAULT_CAP, gpu: bool = True, results_dir: str | None = None,
                 shipped_dir: str | os.PathLike | None = None, step_costs_path: str | os.PathLike | None = None,
                 run_costs: Mapping[str, Any] | None = None, cost_sources: Mapping[str, str] | None = None):
        """``shipped_dir``: the project's shipped measurements (default :data:`fnlcore.app.measurements.SHIPPED_DIR`);
        ``step_costs_path``: the user's step costs (default ``RESULTS/plan/step_costs.json``);
        ``run_costs``: metrics path -> :class:`fnlcore.app.cost.RunCost`, `fnl plan`'s estimates, which
        the runtimes then follow (``cost_sources``: shape key -> where its step cost came from)."""
        self.run_costs = run_costs
        self.cost_sources = cost_sources
        self.plan = plan
        self.cap = cap
        self.gpu = gpu
        self.results_dir = results_dir or plan.results_dir
        self.shipped_dir = shipped_dir
        self.step_costs_path = step_costs_path
        self._by_run: dict[tuple[str, ...], Resources] | None = None

    @property
    def by_run(self) -> dict[tuple[str, ...], Resources]:
        if self._by_run is None:
            options = {name: ds.options for name, ds in self.plan.datasets.items()}
            if self.run_costs is not None:  # `fnl plan`'s own estimates: the same numbers as its table
                costs, cost_sources, pricing = {}, dict(self.cost_sources or {}), None
            elif self.gpu:
                costs, cost_sources, pricing = self._gpu_costs(options)
            else:
                costs, cost_sources = step_costs_with_sources(self.results_dir, self.gpu, self.shipped_dir,
                                                              self.step_costs_path)
                pricing = None
            rehearsal, mem_sources = rehearsal_with_sources(self.results_dir, self.gpu, self.shipped_dir)
            by_run = {}
            for run in self.plan.runs():
                rc = (self.run_costs or {}).get(run.files(self.plan.results_dir)["metrics"])
                by_run[_run_key(run.fields())] = predict(
                    run, costs, rehearsal, self.cap, options.get(run.dataset), self.gpu, mem_sources, cost_sources,
                    pricing, priced=None if rc is None else (rc.seconds, rc.longest_round_s))
            self._by_run = by_run
        return self._by_run

    def _gpu_costs(self, options) -> tuple[dict, dict, Any]:
        """A GPU job's step costs: a GPU's measurement of the shape (the user's own first, the slowest
        GPU's), else the estimate from the measured shapes of one GPU (the user's own with two or more,
        else the shipped one with the most; fnlcore/app/gpu_cost.py); never a CPU's: a 2-second table
        must not ask for a day. Also the pricing of that GPU (its batched engine, clients at once)."""
        # lazy: imports torch; fnlcore.app.resources imports without it (envs/labels.yaml)
        from .cost import gpu_step_costs, step_shape
        # lazy: imports torch; fnlcore.app.resources imports without it (envs/labels.yaml)
        from .counts import ShapeCounts

        costs, sources = step_costs_with_sources(self.results_dir, True, self.shipped_dir, self.step_costs_path)
        gpu_only = {k for k, src in sources.items() if "a CPU's" not in src}
        costs, sources = {k: costs[k] for k in gpu_only}, {k: sources[k] for k in gpu_only}
        own = Path(self.step_costs_path) if self.step_costs_path else own_step_costs(self.results_dir)
        files = [own, shipped_step_costs_path(self.shipped_dir)]
        mine = [d for d in gpu_descriptions([own]) if len(measured_on(d, [own])) >= 2]
        try:
            gpu = mine[0] if mine else find_gpu("", files[1:])
        except ConfigError:
            return costs, sources, None  # no GPU measured anywhere: unmeasured shapes get the whole job length
        shapes = {s.key(): s for s in (step_shape(r, options.get(r.dataset)) for r in self.plan.runs())}
        counts = ShapeCounts(Path(self.results_dir) / "plan" / "shape_counts.json", write=False)  # fnl plan fills it
        memory = (device_memory_mb(gpu, files[1]) or 0) * 2**20 or None
        pricing, found = gpu_step_costs(shapes.values(), gpu, files, counts, memory)
        for key, (entry, src) in found.items():
            if key not in costs and entry.get("estimated"):
                costs[key], sources[key] = (float(entry["train_s"]), float(entry["eval_s"])), src
        return costs, sources, pricing

    def of(self, wildcards) -> Resources:
        key = _run_key(dict(wildcards.items()))
        found = self.by_run.get(key)
        if found is None:
            return Resources(min(DEFAULT_MEM_MB, self.cap.max_mem_mb or DEFAULT_MEM_MB), DEFAULT_DISK_MB,
                             self.cap.max_runtime, DEFAULT_JOBS, None, note="not in the plan: defaults")
        if found.round_too_long:  # only a run that is to be trained: Snakemake asks when it builds the job
            raise ConfigError(f"training run {'/'.join(key)}: {found.round_too_long} (step cost "
                              f"{found.time_source}; own ones go to "
                              f"{own_step_costs(self.results_dir)}; a GPU's, measured by "
                              "`fnl plan --device cuda` on a GPU node, are far shorter than a CPU's)")
        return found

    def mem_mb(self, wildcards) -> int:
        return self.of(wildcards).mem_mb

    def disk_mb(self, wildcards) -> int:
        return self.of(wildcards).disk_mb

    def runtime(self, wildcards) -> int:
        return self.of(wildcards).runtime

    @property
    def retries(self) -> int:
        """Attempts after the first: the most jobs a run of the plan needs, less one, plus the margin."""
        return max((r.jobs for r in self.by_run.values() if not r.round_too_long), default=1) - 1 + RETRY_MARGIN


def plan_resources(plan, results_dir: str | None = None, cap: SiteCap = DEFAULT_CAP, gpu: bool = True,
                   step_costs_path: str | os.PathLike | None = None, run_costs: Mapping[str, Any] | None = None,
                   cost_sources: Mapping[str, str] | None = None) -> dict[str, Resources]:
    """metrics path -> :class:`Resources` of every run of ``plan`` (what ``fnl plan`` prints)."""
    tr = TrainResources(plan, cap, gpu, results_dir, step_costs_path=step_costs_path, run_costs=run_costs,
                        cost_sources=cost_sources)
    return {run.files(plan.results_dir)["metrics"]: tr.by_run[_run_key(run.fields())] for run in plan.runs()}


_WORKFLOW_RESOURCES: dict[int, TrainResources] = {}


def train_resources(plan, workflow) -> TrainResources:
    """The :class:`TrainResources` of a Snakemake workflow's plan (one per workflow): the cap
    from its ``set-resources`` for ``train``; a GPU job unless ``device: cpu`` or ``train:gpu=0``."""
    key = id(plan)
    if key not in _WORKFLOW_RESOURCES:
        overwrite = workflow.resource_settings.overwrite_resources or {}
        train = _plain(overwrite["train"]) if "train" in overwrite else {}
        gpu = plan.device != "cpu" and str(train.get("gpu", 1)) != "0"
        _WORKFLOW_RESOURCES[key] = TrainResources(plan, site_cap(overwrite), gpu)
    return _WORKFLOW_RESOURCES[key]


def _count_sources(sources: list[str], total: int) -> str:
    """ "12 measured here (...), 30 shipped (...), 3 default" over ``total`` runs."""
    counts: dict[str, int] = {}
    for src in sources:
        counts[src] = counts.get(src, 0) + 1
    order = sorted(counts, key=lambda s: (not s.startswith(OWN), s == DEFAULT, -counts[s], s))
    return "; ".join(f"{counts[s]} of {total} runs {s}" for s in order)


# -- `fnl plan`'s columns -----------------------------------------------------------------------


@dataclass(frozen=True)
class ResourceColumns:
    """What ``fnl plan`` prints beside device-hours: a header, each table's columns, notes."""

    header: str
    columns: dict[tuple[str, str], str]  # (paper, table) -> the table's columns
    notes: list[str]


def resource_columns(plan, results_dir: str | None = None, cap: SiteCap = DEFAULT_CAP, gpu: bool = True,
                     step_costs_path: str | os.PathLike | None = None, run_costs: Mapping[str, Any] | None = None,
                     cost_sources: Mapping[str, str] | None = None) -> ResourceColumns:
    """The largest request of each table's runs: memory, disk, a job's hours, jobs of a run.
    ``*`` marks a table where some run's figures are not the user's own measurements (shipped
    ones, or the defaults); the notes count where memory and time came from."""
    res = plan_resources(plan, results_dir, cap, gpu, step_costs_path, run_costs, cost_sources)
    columns = {}
    for t in plan.tables:
        mine = [res[tr.run.files(plan.results_dir)["metrics"]] for tr in t.runs]
        if not mine:
            columns[(t.paper, t.table)] = ""
            continue
        default = ("!" if any(r.round_too_long for r in mine) else
                   "*" if any(not (r.mem_source.startswith(OWN) and r.time_source.startswith(OWN)) for r in mine)
                   else " ")
        columns[(t.paper, t.table)] = (
            f"{max(r.mem_mb for r in mine) / 1000:7.1f} {max(r.disk_mb for r in mine) / 1000:8.1f} "
            f"{max(r.runtime for r in mine) / 60:6.1f} {max(r.jobs for r in mine):4d}{default}")
    runs = list(res.values())
    notes = [f"mem/disk/job h/jobs: the largest request of a table's runs (train jobs; site cap "
             f"{cap.max_runtime} min a job{'' if cap.max_mem_mb is None else f', {cap.max_mem_mb} MB'}; "
             "docs/cluster.md, \"Resources and wall-time limits\"); * marks a table where some run's figures are "
             "not measured here (shipped or default)"]
    notes.append("memory and disk from: " + _count_sources([r.mem_source for r in runs], len(runs)))
    notes.append("job time from: " + _count_sources([r.time_source for r in runs], len(runs)))
    for device, text in shipped_provenance().items():
        if any(f"shipped ({device})" in r.time_source for r in runs):
            notes.append(f"  shipped ({device}): {text}")
    unrehearsed = sum(not r.mem_source.startswith(OWN) for r in runs)
    if unrehearsed:
        defaults = sum(r.mem_source == DEFAULT for r in runs)
        notes.append(f"* {unrehearsed} of {len(runs)} runs not rehearsed here (no measured row in "
                     f"{own_rehearsal(results_dir or plan.results_dir)}): "
                     f"{unrehearsed - defaults} take the shipped rehearsal, {defaults} the default "
                     f"{DEFAULT_MEM_MB} MB memory, {DEFAULT_DISK_MB} MB disk; `fnl rehearse` measures them")
    uncosted = sum(r.device_seconds is None for r in runs)
    if uncosted:
        notes.append(f"* {uncosted} of {len(runs)} runs without a step cost: the whole job length, {DEFAULT_JOBS} jobs")
    too_long = [r for r in runs if r.round_too_long]
    if too_long:
        worst = max(too_long, key=lambda r: r.device_seconds or 0.0)
        notes.append(f"! {len(too_long)} of {len(runs)} runs have a round longer than a job can hold "
                     f"(a workflow that would train one stops, naming it), e.g. {worst.round_too_long}")
    over = sum(r.over_cap for r in runs)
    if over:
        notes.append(f"! {over} runs need more memory than the site cap (they ask for the cap and will likely fail)")
    return ResourceColumns(f"{'mem GB':>7s} {'disk GB':>8s} {'job h':>6s} {'jobs':>4s}", columns, notes)
