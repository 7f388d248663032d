"""``fnl device-check``: measure a GPU node in one go, within a time budget, writing as it goes.

    fnl device-check --device cuda --out DIR [--budget-s 420]     # a GPU node (one H100/H200)
    fnl device-check --device cpu --quick --out DIR                # every section at a small size (the test)
    fnl device-check --ship-step-costs DIR/step_costs.json         # add a GPU's step costs to the shipped ones

Sections, in the order they run (each in its own ``try``: an error is written into its output and
the next section runs; each has a share of the budget, and what its share cannot hold is skipped
with a note):

* environment: torch, CUDA, cuDNN, the device, TF32 and cuDNN flags (``env.csv``);
* (a) every registered method, a short run on the device on both engines (sequential; batched
  where a stage declares a batched loss) beside the same run on the CPU with the same seed: the
  largest absolute difference of the global models after the first round and after the last, and
  of the per-round metrics (``methods.csv``). Flagged where the first round differs by more than
  1e-3 relative;
* (c) host-device synchronisations per local step, counted during (a)'s device runs: on CUDA every
  ``torch.cuda.set_sync_debug_mode("warn")`` warning, split by whether it came inside a step
  (:func:`fnlcore.syncs.step_region`); everywhere the project's own counter
  (:class:`fnlcore.syncs.SyncCounter`), which is what a CPU can measure (``syncs.csv``);
* (b) seconds per round of a bare loop and both engines at the papers' shapes, NCHW and
  channels-last, fp32 and bf16, on CUDA also the batched engine with CUDA graphs, and its difference
  from the batched engine without (:mod:`fnlcore.app.benchmark`; ``timing.csv``);
* (d) the device's step costs for every step shape the project ships, in ``fnl plan``'s
  calibration format (``step_costs.json``, ``step_costs.csv``);
* (e) a rehearsal (:mod:`fnlcore.app.rehearse`: start, checkpoint, kill, resume) of the six
  costliest paper configurations by the shipped estimates, with peak device memory
  (``rehearsal.csv``; ``rehearsal/rehearsal.csv`` in the project's rehearsal format).

``summary.md`` holds all of it, rewritten after every section. Nothing is downloaded
(pretrained models are rehearsed with random initialisation) and nothing is written outside
``--out``. Needs neither Snakemake nor jsonschema: the paper files it reads are the shipped ones,
which the test suite validates against their schema.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import gc
import json
import math
import os
import platform
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

DEFAULT_BUDGET_S = 420.0
GRACE_S = 10.0  # how far past its share an in-process section may run before its alarm stops it
FLAG_RELATIVE = 1e-3  # a first round further apart than this (relative) is flagged in (a)
COSTLIEST = 6  # configurations rehearsed in (e)


# -- output: CSVs and the summary, written as they grow ------------------------------------------


class Table:
    """One CSV, rewritten (atomically) after every row: a run cut short keeps what it measured."""

    def __init__(self, path: Path, columns: tuple[str, ...]):
        self.path, self.columns, self.rows = path, columns, []
        self._lock = threading.Lock()
        self.flush()

    def add(self, row: dict) -> None:
        with self._lock:
            self.rows.append({c: row.get(c, "") for c in self.columns})
            self.flush()

    def flush(self) -> None:
        from ..io import atomic_path

        with atomic_path(self.path, suffix=".csv") as tmp, open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(self.columns))
            w.writeheader()
            w.writerows(self.rows)


@dataclass
class Section:
    key: str
    title: str
    status: str = "not run"
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    table: Table | None = None
    shown: tuple[str, ...] = ()  # the table's columns in summary.md


class Report:
    """The output folder: each section's CSV and one ``summary.md``, rewritten after every section."""

    def __init__(self, out: Path, header: list[str]):
        self.out, self.header, self.sections = out, header, []
        out.mkdir(parents=True, exist_ok=True)

    def section(self, key: str, title: str) -> Section:
        s = Section(key, title)
        self.sections.append(s)
        return s

    def write(self) -> Path:
        from ..io import atomic_path

        lines = ["# fnl device-check", "", *self.header, ""]
        for s in self.sections:
            lines += [f"## {s.title}", "", f"**{s.status}** ({s.seconds:.0f} s)", ""]
            lines += [*s.notes, ""] if s.notes else []
            if s.table is not None and s.table.rows:
                lines += [markdown_table(s.table.rows, s.shown or s.table.columns), "",
                          f"All columns: `{s.table.path.name}`.", ""]
        path = self.out / "summary.md"
        with atomic_path(path, suffix=".md") as tmp:
            Path(tmp).write_text("\n".join(lines) + "\n")
        return path


def markdown_table(rows: list[dict], columns: tuple[str, ...]) -> str:
    cell = lambda v: str(v).replace("|", "\\|").replace("\n", " ")[:160]  # noqa: E731
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


# -- time boxes ------------------------------------------------------------------------------------


class TimeBoxExceeded(BaseException):
    """An in-process section ran past its share of the budget (raised by its alarm). A BaseException,
    as KeyboardInterrupt is: the ``except Exception`` of the code it interrupts lets it through."""


@contextlib.contextmanager
def time_box(seconds: float):
    """Raise :class:`TimeBoxExceeded` in the block after ``seconds`` (SIGALRM; main thread only,
    elsewhere the block runs unbounded). A kernel already queued finishes first: the alarm is
    handled when Python regains control."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def alarm(signum, frame):
        raise TimeBoxExceeded(f"stopped by its time box ({seconds:.0f} s)")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Check:
    """One device check: its options, the device, the report and the clock."""

    device: torch.device
    out: Path
    quick: bool
    budget_s: float
    threads: int
    rehearse_jobs: int
    report: Report
    log: Callable[[str], None] = print
    started: float = field(default_factory=time.monotonic)

    @property
    def ends(self) -> float:
        return self.started + self.budget_s

    def left(self) -> float:
        return self.ends - time.monotonic()


# (key, title, share of the budget, in-process: time-boxed by an alarm)
SECTIONS = (
    ("methods", "(a) every method on the device vs the CPU, and (c) host-device synchronisations", 0.25, True),
    ("timing", "(b) seconds per round at the papers' shapes", 0.22, True),
    ("step_costs", "(d) step costs of this device (`fnl plan`'s calibration)", 0.13, True),
    ("rehearsal", f"(e) rehearsal of the {COSTLIEST} costliest paper configurations", 0.40, False),
)


def run(device: str, out: str | os.PathLike, quick: bool = False, budget_s: float = DEFAULT_BUDGET_S,
        threads: int = 0, rehearse_jobs: int = 0, command: str = "", log: Callable[[str], None] = print) -> int:
    """The whole check (module docstring); 0 when every section ran, 1 when one failed or was cut,
    2 when the device cannot be used (the environment is written either way)."""
    from ..fl.device import device_problem, resolve_device

    if threads:
        torch.set_num_threads(threads)
    out = Path(out)
    header = [f"`{command or 'fnl device-check'}`", "",
              f"Started {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; budget {budget_s:.0f} s"
              f"{'; quick (small sizes: a test of the command, not a measurement)' if quick else ''}."]
    report = Report(out, header)
    env = environment(resolve_device(device) if device_problem(device) is None else torch.device("cpu"))
    env_section = report.section("env", "Environment")
    env_section.table = Table(out / "env.csv", ("key", "value"))
    for k, v in env.items():
        env_section.table.add({"key": k, "value": v})
        log(f"{k}: {v}")
    env_section.status = "done"
    problem = device_problem(device)
    if problem is not None:
        env_section.notes.append(f"Device {device!r} cannot be used here: {problem}. Nothing was measured.")
        report.write()
        log(f"fnl device-check: {problem}")
        return 2
    dev = resolve_device(device)
    check = Check(dev, out, quick, budget_s, threads, rehearse_jobs or (2 if dev.type == "cuda" else 1), report, log)
    report.write()
    ok = True
    for i, (key, title, share, boxed) in enumerate(SECTIONS):
        ok &= run_section(check, key, title, share / sum(s[2] for s in SECTIONS[i:]), boxed)
        if check.device.type == "cuda":
            torch.cuda.empty_cache()
    took = time.monotonic() - check.started
    header.append(f"Took {took:.0f} s.")
    path = report.write()
    log(f"fnl device-check: {'every section ran' if ok else 'some sections failed or were cut'} in {took:.0f} s; "
        f"{path}")
    return 0 if ok else 1


SECTION_FUNCTIONS: dict[str, Callable[[Check, Section, float], None]] = {}


def section_function(key: str):
    def register(fn):
        SECTION_FUNCTIONS[key] = fn
        return fn

    return register


def run_section(check: Check, key: str, title: str, fraction: float, boxed: bool) -> bool:
    """One section within ``fraction`` of the budget left; its errors go into its notes, never up."""
    section = check.report.section(key, title)
    left = check.left()
    if left < 5:
        section.status = "skipped: the budget is spent"
        check.log(f"== {title}: skipped, the budget is spent")
        check.report.write()
        return False
    share = left * fraction
    deadline = time.monotonic() + share
    check.log(f"== {title} (time box {share:.0f} s)")
    t0 = time.monotonic()
    ok = False
    try:
        with time_box(share + GRACE_S) if boxed else contextlib.nullcontext():
            SECTION_FUNCTIONS[key](check, section, deadline)
        section.status = "done"
        ok = True
    except TimeBoxExceeded as err:
        section.status = f"cut: {err}; the rows written so far are kept"
    except Exception as err:  # noqa: BLE001 (a section never stops the check)
        section.status = f"failed: {type(err).__name__}: {err}"
        section.notes.append("```\n" + traceback.format_exc()[-3000:] + "```")
    finally:
        section.seconds = time.monotonic() - t0
        check.report.write()
    check.log(f"   {section.status} ({section.seconds:.0f} s)")
    return ok and not any(r.get("status") == "skipped" for r in (section.table.rows if section.table else []))


# -- the environment -------------------------------------------------------------------------------


def _get(fn: Callable[[], Any]) -> Any:
    """A value, or why it could not be read (an old or new torch may lack an attribute)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecated flags still read
            return fn()
    except Exception as err:  # noqa: BLE001
        return f"n/a ({type(err).__name__})"


def environment(device: torch.device) -> dict[str, Any]:
    """What the numbers depend on: versions, the device, the flags that change float results."""
    from ..provenance import code_version

    env: dict[str, Any] = {
        "python": sys.version.split()[0], "platform": platform.platform(), "cpu_count": os.cpu_count(),
        "torch": torch.__version__, "torch_threads": torch.get_num_threads(), "numpy": np.__version__,
        "fnlcore": _get(code_version), "device": str(device),
        "cuda_available": torch.cuda.is_available(), "torch.version.cuda": torch.version.cuda,
        "cudnn_version": _get(torch.backends.cudnn.version),
        "cudnn.enabled": torch.backends.cudnn.enabled, "cudnn.benchmark": torch.backends.cudnn.benchmark,
        "cudnn.deterministic": torch.backends.cudnn.deterministic,
        "cudnn.allow_tf32": _get(lambda: torch.backends.cudnn.allow_tf32),
        "cuda.matmul.allow_tf32": _get(lambda: torch.backends.cuda.matmul.allow_tf32),
        "float32_matmul_precision": _get(torch.get_float32_matmul_precision),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
    }
    if device.type == "cuda":
        props = _get(lambda: torch.cuda.get_device_properties(device))
        env.update({
            "device_name": _get(lambda: props.name), "device_memory_mib": _get(lambda: props.total_memory // 2**20),
            "device_capability": _get(lambda: f"{props.major}.{props.minor}"),
            "multiprocessors": _get(lambda: props.multi_processor_count), "driver": _nvidia_driver(),
            "cuda.matmul.fp32_precision": _get(lambda: torch.backends.cuda.matmul.fp32_precision),
            "cudnn.conv.fp32_precision": _get(lambda: torch.backends.cudnn.conv.fp32_precision),
        })
    return env


def _nvidia_driver() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=15)
        return out.stdout.strip() or out.stderr.strip()[:100]
    except (OSError, subprocess.SubprocessError) as err:
        return f"n/a ({type(err).__name__})"


# -- (a) and (c): every method on the device vs the CPU -------------------------------------------


@dataclass(frozen=True)
class TinyRun:
    """The short run of every method in (a): random class-coloured images, 6 clients (RSCFed's
    groups need 6), every client every round, two clients with half their labels wrong."""

    model: str
    size: int
    per_client: int
    batch: int
    test: int
    rounds: int
    clients: int = 6

    def settings(self, engine: str, multi: bool):
        from ..fl.settings import TrainSettings

        # crop+flip on single-label images, affine+flip on multi-label ones: both augmentations on the device
        return TrainSettings(model=self.model, rounds=self.rounds, local_epochs=1, batch_size=self.batch,
                             optimizer="sgd", lr=0.05, momentum=0.5, normalize="imagenet",
                             augmentation="affine_flip" if multi else "crop_flip", eval_batch_size=64, engine=engine)


# quick: a CPU test of the command; full: every method on a small CNN (a run's cost is then the
# method's own work, not an 11M-parameter model's copies on the CPU side), and a few again on
# ResNet-18 (BatchNorm, the papers' CIFAR backbone): the engines' stacked BatchNorm on the device.
QUICK_RUN = TinyRun("tiny", 16, 8, 8, 32, 2)
FULL_RUN = TinyRun("tiny", 32, 16, 16, 64, 3)
BN_RUN = TinyRun("resnet18_cifar", 16, 16, 16, 64, 3)
# (FedFixer: a client copy that trains, BatchNorm in train mode on the stacked copies)
BN_METHODS = ("fedavg", "fedcorr", "fedgr", "fednoro", "coteaching", "dividemix", "fedfixer")
ML_CLASSES = 4  # multi-label classes: the 4 bits of a 10-class label

METHOD_COLUMNS = (
    "method", "model", "labels", "engine", "status", "error", "rounds", "stages", "batched_rounds",
    "param_abs_diff_first", "param_rel_diff_first", "metric_abs_diff_first",
    "param_abs_diff_last", "param_rel_diff_last", "metric_abs_diff_all", "flagged", "device_s", "cpu_s",
)
METHOD_SHOWN = ("method", "model", "labels", "engine", "status", "param_abs_diff_first", "param_rel_diff_first",
                "metric_abs_diff_first", "param_rel_diff_last", "metric_abs_diff_all", "flagged", "error")
SYNC_COLUMNS = (
    "method", "model", "engine", "device", "status", "steps_marked", "optimizer_steps", "syncs_in_steps", "syncs_run",
    "marked_in_steps", "syncs_per_step", "per_step_basis", "where",
)
SYNC_SHOWN = ("method", "model", "engine", "steps_marked", "optimizer_steps", "syncs_in_steps", "syncs_run",
              "marked_in_steps", "syncs_per_step", "per_step_basis")


def tiny_arrays(run: TinyRun, multi: bool, seed: int = 0) -> dict[str, Any]:
    """The run's data as numpy arrays (built once; the device run and the CPU run take the same)."""
    rs = np.random.RandomState(seed)
    n, h = run.clients * run.per_client, run.size
    colours = rs.randint(0, 256, (10, 1, 1, 3))

    def images(labels):  # a class colour under noise: learnable, so a round moves the metrics
        noise = rs.randint(0, 256, (len(labels), h, h, 3))
        return ((colours[labels] + noise) // 2).astype(np.uint8)

    y, y_test = rs.randint(0, 10, n), rs.randint(0, 10, run.test)
    x, x_test = images(y), images(y_test)
    clients = [np.arange(k * run.per_client, (k + 1) * run.per_client) for k in range(run.clients)]
    noisy = np.concatenate(clients[:2])
    noisy = noisy[rs.rand(len(noisy)) < 0.5]
    if not multi:
        given = y.copy()
        given[noisy] = (given[noisy] + 1 + rs.randint(0, 9, len(noisy))) % 10
        return {"x": x, "y": y, "given": given, "x_test": x_test, "y_test": y_test, "active": None,
                "clients": clients, "classes": 10}
    bits = lambda v: ((v[:, None] >> np.arange(ML_CLASSES)) & 1).astype(np.float32)  # noqa: E731
    yb = bits(y)
    given = yb.copy()
    given[noisy, 0] = 1.0 - given[noisy, 0]
    active = np.zeros_like(yb)  # client k annotates every class but (k mod C) (FedMLP's partial labels)
    for k, idx in enumerate(clients):
        active[np.ix_(idx, [c for c in range(ML_CLASSES) if c != k % ML_CLASSES])] = 1.0
    return {"x": x, "y": yb, "given": given * active, "x_test": x_test, "y_test": bits(y_test), "active": active,
            "clients": clients, "classes": ML_CLASSES}


def tiny_data(a: dict[str, Any], device: torch.device):
    from ..fl.data import FederatedData, ImageSource

    t = lambda v: torch.tensor(v, device=device)  # noqa: E731  (a copy: a method relabels in place)
    return FederatedData(
        ImageSource(device, images=a["x"]), ImageSource(device, images=a["x_test"]), t(a["y"]), t(a["given"]),
        t(a["y_test"]), [torch.tensor(c, dtype=torch.int64) for c in a["clients"]], a["classes"],
        multi_label=a["active"] is not None, active=None if a["active"] is None else t(a["active"]),
        class_names=tuple(f"c{i}" for i in range(a["classes"])),
    )


def _required_value(f: dataclasses.Field) -> Any:
    """A valid value for a required hyper-parameter (Co-teaching's ``tau``): from its bounds or choices."""
    m = f.metadata
    if m.get("choices"):
        return m["choices"][0]
    kind = str(f.type)
    lo = m.get("ge", m.get("gt"))
    hi = m.get("le", m.get("lt"))
    if "bool" in kind:
        return False
    if "int" in kind:
        return int(m["ge"]) if "ge" in m else int(m["gt"]) + 1 if "gt" in m else 1
    if lo is not None and hi is not None:
        return (float(lo) + float(hi)) / 2
    return float(lo) + 0.5 if lo is not None else 0.5


def tiny_params(cls, settings):
    """(params, settings): the method's defaults (required ones filled), round-valued ones scaled to the
    run's rounds as the smoke scale does (every stage entered), passes over every client before the
    rounds cut to one, in two groups where the method allows it (as a rehearsal does). A method whose
    scaled boundaries collide (FedNoRo-ML's ramp) gets a round more, up to two."""
    from ..errors import ConfigError
    from ..spec import pass_fields
    from .papers import rescale_rounds

    p_cls = cls.Params
    required = {f.name: _required_value(f) for f in dataclasses.fields(p_cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    cut = {"frac1": 0.5} if "frac1" in {f.name for f in dataclasses.fields(p_cls)} else {}
    problem = None
    for rounds in (settings.rounds, settings.rounds + 1, settings.rounds + 2):
        trial = dataclasses.replace(settings, rounds=rounds)
        try:
            params = rescale_rounds(p_cls(**required), 100, rounds)
            passes = {f: min(getattr(params, f), 1) for f in pass_fields(p_cls) if getattr(params, f) is not None}
            params = dataclasses.replace(params, **passes, **cut)
            params.check_training(trial)
            return params, trial
        except ConfigError as err:
            problem = err
    raise problem


@dataclass
class Tally:
    """Synchronisations counted during one run (section (c))."""

    counter: Any  # fnlcore.syncs.SyncCounter
    cuda_in_steps: int = 0
    cuda_run: int = 0
    where: list[str] = field(default_factory=list)
    optimizer_steps: int = 0
    steps: int = 0  # local steps the engines marked during the run


def _in_step() -> bool:
    """Whether the engine is inside a marked local step now."""
    from ..syncs import in_step

    return in_step()


@contextlib.contextmanager
def counting_syncs(device: torch.device):
    """Count host-device synchronisations: the project's counter everywhere (its marks), and on CUDA
    every warning of ``torch.cuda.set_sync_debug_mode("warn")``, inside a marked step or not. The
    debug mode is back at 0 afterwards, whatever happens."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from ..syncs import SyncCounter

    tally = Tally(SyncCounter())

    def stepped(*_):
        tally.optimizer_steps += 1

    hook = register_optimizer_step_post_hook(stepped)
    try:
        with contextlib.ExitStack() as stack:
            if device.type == "cuda":
                stack.enter_context(warnings.catch_warnings(record=True))
                warnings.simplefilter("always")  # every sync, not the first one of each line

                def show(message, category, filename, lineno, file=None, line=None):
                    if "synchroniz" not in str(message):
                        return
                    tally.cuda_run += 1
                    if _in_step():
                        tally.cuda_in_steps += 1
                        if len(tally.where) < 3:
                            tally.where.append(f"{Path(filename).name}:{lineno}")

                warnings.showwarning = show  # restored by catch_warnings; classifies each as it comes
                torch.cuda.set_sync_debug_mode("warn")
                stack.callback(torch.cuda.set_sync_debug_mode, 0)
            stack.enter_context(tally.counter)
            try:
                yield tally
            finally:  # the counter's steps are a global count read live: keep this run's
                tally.steps = tally.counter.steps
    finally:
        hook.remove()


@dataclass
class TinyResult:
    first: dict[str, torch.Tensor]
    last: dict[str, torch.Tensor]
    metrics: Any  # DataFrame, one row per round
    stages: list[str]
    batched_rounds: int
    seconds: float
    tally: Tally | None = None


def _globals_copy(method) -> dict[str, torch.Tensor]:
    """The global networks' tensors, copied where they are (a copy to the host now would be one more
    synchronisation in the counts of (c))."""
    return {f"{n}.{k}": v.detach().clone() for n, net in method.globals.items() for k, v in net.state_dict().items()}


def _on_cpu(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.cpu() for k, v in state.items()}


def tiny_method(name: str, engine: str, arrays: dict, run: TinyRun, device: torch.device,
                overrides: dict | None = None):
    """(method, simulation) of the short run of method ``name`` on ``device`` (:func:`tiny_params`'
    hyper-parameters, then ``overrides``), ready to run."""
    from ..fl.simulation import Simulation
    from ..methods import METHODS
    from .train import build_context

    cls = METHODS[name]
    multi = arrays["active"] is not None
    params, settings = tiny_params(cls, run.settings(engine, multi))
    if overrides:
        params = dataclasses.replace(params, **overrides)
    ctx = build_context(tiny_data(arrays, device), "device-check", (run.size, run.size), 3, settings, 0, device,
                        log=lambda m: None)
    method = cls(params, ctx)
    return method, Simulation(method, ctx, progress=lambda m: None)


def run_tiny(name: str, engine: str, arrays: dict, run: TinyRun, device: torch.device,
             count: bool = False) -> TinyResult:
    """One short run of method ``name`` on ``device``: the global models after the first and the
    last round, the per-round metrics, the stages entered and how many rounds the batched engine ran."""
    method, sim = tiny_method(name, engine, arrays, run, device)
    kept: dict[int, dict] = {}
    seen = {"stages": [], "batched": 0}
    end_round, last = method.end_round, method.num_rounds() - 1

    def watched(r: int) -> None:
        end_round(r)
        if r in (0, last):
            kept[r] = _globals_copy(method)
        stage = method.current_stage(r)
        seen["batched"] += int(sim.engine.batched and stage.batchable)
        if method.stage(r) not in seen["stages"]:
            seen["stages"].append(method.stage(r))

    method.end_round = watched
    t0 = time.perf_counter()
    with counting_syncs(device) if count else contextlib.nullcontext() as tally:
        metrics = sim.run()
    seconds = time.perf_counter() - t0
    return TinyResult(_on_cpu(kept[0]), _on_cpu(kept[last]), metrics.drop(columns=["seconds"], errors="ignore"),
                      seen["stages"], seen["batched"], seconds, tally)


def state_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, float]:
    """(largest absolute difference, largest per-tensor relative one: |a - b|max / |b|max) of two states."""
    if set(a) != set(b):
        return math.inf, math.inf
    worst_abs = worst_rel = 0.0
    for k, va in a.items():
        x, y = va.double(), b[k].double()
        d = float((x - y).abs().max()) if x.numel() else 0.0
        worst_abs = max(worst_abs, d)
        worst_rel = max(worst_rel, d / max(float(y.abs().max()) if y.numel() else 0.0, 1e-12))
    return worst_abs, worst_rel


def metrics_diff(a, b, rows: int | None = None) -> float:
    """Largest absolute difference of the numeric metrics of two runs (of their first ``rows``);
    NaN on both sides (a round not evaluated) counts as equal, NaN on one as infinite."""
    from pandas.api.types import is_bool_dtype, is_numeric_dtype

    if list(a.columns) != list(b.columns) or len(a) != len(b):
        return math.inf
    worst = 0.0
    for c in a.columns:
        x, y = a[c].iloc[:rows], b[c].iloc[:rows]
        if not (is_numeric_dtype(x.dtype) and is_numeric_dtype(y.dtype)) or is_bool_dtype(x.dtype):
            if not x.equals(y):
                return math.inf
            continue
        xv, yv = x.to_numpy(dtype=float), y.to_numpy(dtype=float)
        both = np.isnan(xv) & np.isnan(yv)
        if (np.isnan(xv) ^ np.isnan(yv)).any():
            return math.inf
        worst = max(worst, float(np.max(np.abs(xv - yv)[~both], initial=0.0)))
    return worst


def _num(v: float, digits: int = 3) -> str:
    return "" if v is None else "inf" if math.isinf(v) else f"{v:.{digits}e}"


def compare_method(name: str, engine: str, arrays: dict, run: TinyRun, device: torch.device) -> tuple[dict, dict]:
    """(a)'s row and (c)'s row of one method on one engine."""
    cpu = torch.device("cpu")
    dev = run_tiny(name, engine, arrays, run, device, count=True)
    ref = run_tiny(name, engine, arrays, run, cpu)
    p1, r1 = state_diff(dev.first, ref.first)
    pl, rl = state_diff(dev.last, ref.last)
    m1, ma = metrics_diff(dev.metrics, ref.metrics, 1), metrics_diff(dev.metrics, ref.metrics)
    scores = ref.metrics.drop(columns=["round", "clients"], errors="ignore").select_dtypes("number").iloc[0]
    metric_scale = max([1.0, *(abs(float(v)) for v in scores.dropna())])
    flags = [what for what, far in (("params", r1 > FLAG_RELATIVE), ("metrics", m1 > FLAG_RELATIVE * metric_scale))
             if far]
    row = {
        "method": name, "labels": "multi" if arrays["active"] is not None else "single", "engine": engine,
        "status": "ok", "rounds": len(ref.metrics), "stages": ";".join(ref.stages),
        "batched_rounds": dev.batched_rounds, "param_abs_diff_first": _num(p1), "param_rel_diff_first": _num(r1),
        "metric_abs_diff_first": _num(m1), "param_abs_diff_last": _num(pl), "param_rel_diff_last": _num(rl),
        "metric_abs_diff_all": _num(ma), "flagged": "+".join(flags),
        "device_s": round(dev.seconds, 2), "cpu_s": round(ref.seconds, 2),
    }
    return row, sync_row(name, engine, device, dev.tally)


def sync_row(name: str, engine: str, device: torch.device, t: Tally) -> dict:
    """Per local step: the syncs inside marked steps over the marked steps; where the engines mark no
    step (SyncCounter.steps stays 0), the run's syncs over its optimiser steps, said so."""
    steps = t.steps
    in_steps = t.cuda_in_steps if device.type == "cuda" else t.counter.total
    if steps:
        per_step, basis = in_steps / steps, "syncs in marked steps / marked steps"
    elif device.type == "cuda":
        per_step = t.cuda_run / max(t.optimizer_steps, 1)
        basis = "no step marked: all syncs of the run / optimiser steps"
    else:
        per_step, basis = None, "no step marked: the engines do not mark steps yet, nothing to count on a CPU"
    where = t.where if device.type == "cuda" else t.counter.where
    return {
        "method": name, "engine": engine, "device": str(device), "status": "ok", "steps_marked": steps,
        "optimizer_steps": t.optimizer_steps, "syncs_in_steps": t.cuda_in_steps if device.type == "cuda" else "",
        "syncs_run": t.cuda_run if device.type == "cuda" else "", "marked_in_steps": t.counter.total,
        "syncs_per_step": "" if per_step is None else round(per_step, 3), "per_step_basis": basis,
        "where": " ; ".join(where[:3]),
    }


def engines_of(cls) -> tuple[list[str], str | None]:
    """The engines (a) runs a method class on, and why not the batched one (None: it runs)."""
    from ..fl.rounds import batched_support

    why = batched_support(cls)
    return (["sequential"] if why else ["sequential", "batched"]), why


@section_function("methods")
def check_methods(check: Check, section: Section, deadline: float) -> None:
    from ..methods import METHODS

    run = QUICK_RUN if check.quick else FULL_RUN
    section.table = methods = Table(check.out / "methods.csv", METHOD_COLUMNS)
    section.shown = METHOD_SHOWN
    syncs = Table(check.out / "syncs.csv", SYNC_COLUMNS)
    sync_section = check.report.section("syncs", "(c) host-device synchronisations per local step (during (a))")
    sync_section.table, sync_section.shown = syncs, SYNC_SHOWN
    section.notes.append(
        f"A short run of every registered method ({_describe(run)}; round-valued hyper-parameters scaled to "
        "the run, passes before the rounds cut to one), on both engines where a stage has a batched loss, on "
        f"`{check.device}` and, with the same seed, on the CPU. Differences: the global models after the "
        "first and after the last round (absolute; relative = per tensor |a - b|max / |cpu|max) and the "
        f"per-round metrics. `flagged`: the first round differs by more than {FLAG_RELATIVE:g} relative in the "
        "parameters (any tensor) or the metrics (over the largest metric, at least 1; one test prediction "
        "flipped is 1/64 of the accuracy); later rounds may part further where a decision (a GMM, a "
        "threshold) flips. TF32 (see the environment) alone makes a GPU's convolutions differ from a CPU's "
        "at about 1e-3.")
    if not check.quick:
        section.notes.append(f"Then the BatchNorm pass: {', '.join(BN_METHODS)} again on {_describe(BN_RUN)} "
                             "(stacked BatchNorm statistics, cuDNN convolutions), rows `model` = "
                             f"{BN_RUN.model}.")
    if check.device.type == "cpu":
        section.notes.append("On a CPU both runs are the same computation: the differences check determinism.")
    sync_section.notes.append(_sync_note(check.device))
    sync_section.status = "written during (a): see its status"
    passes = [(run, sorted(METHODS))] + ([] if check.quick else [(BN_RUN, [m for m in BN_METHODS if m in METHODS])])
    for tiny, names in passes:
        arrays = {m: tiny_arrays(tiny, m) for m in (False, True)}
        for name in names:
            for row_a, row_c in method_rows(check, tiny, name, arrays, deadline):
                methods.add(row_a)
                if row_c is not None:
                    syncs.add(row_c)
    sync_section.status = "done"
    flagged = [f"{r['method']} ({r['engine']}, {r['model']})" for r in methods.rows if r["flagged"]]
    section.notes.append(f"Flagged: {', '.join(flagged)}." if flagged else "Nothing flagged.")


def _describe(run: TinyRun) -> str:
    return (f"{run.model}, 3x{run.size}x{run.size}, {run.clients} clients x {run.per_client} samples, batch "
            f"{run.batch}, every client every round, {run.rounds} rounds")


def method_rows(check: Check, run: TinyRun, name: str, arrays: dict, deadline: float):
    """(a)'s and (c)'s rows of one method, one pair per engine (a sequential-only method's batched
    row says why); a failure is its row's error."""
    from ..methods import METHODS

    cls = METHODS[name]
    multi = "single" not in cls.label_kinds
    engines, why = engines_of(cls)
    for engine in engines:
        base = {"method": name, "model": run.model, "labels": "multi" if multi else "single", "engine": engine}
        if time.monotonic() > deadline:
            yield {**base, "status": "skipped", "error": "time box spent"}, {**base, "status": "skipped"}
            continue
        try:
            a_row, c_row = compare_method(name, engine, arrays[multi], run, check.device)
        except TimeBoxExceeded:
            yield {**base, "status": "cut", "error": "time box spent during this run"}, None
            raise
        except Exception as err:  # noqa: BLE001 (one method's failure is its row)
            msg = f"{type(err).__name__}: {' '.join(str(err).split())}"[:400]
            check.log(f"   {name} {engine}: failed: {msg}")
            yield {**base, "status": "failed", "error": msg}, {**base, "status": "failed"}
            continue
        check.log(f"   {name:18s} {engine:10s} {run.model:14s} params first {a_row['param_rel_diff_first']:>10s} "
                  f"rel, metrics {a_row['metric_abs_diff_first']:>10s}; syncs/step {c_row['syncs_per_step']} "
                  f"{a_row['flagged']}")
        yield {**base, **a_row}, {**base, **c_row}
    if why:
        yield {"method": name, "model": run.model, "labels": "multi" if multi else "single", "engine": "batched",
               "status": "n/a", "error": f"sequential only: {why}"}, None


def _sync_note(device: torch.device) -> str:
    if device.type == "cuda":
        return ("Counted during (a)'s device runs. `syncs_in_steps`: warnings of "
                "`torch.cuda.set_sync_debug_mode(\"warn\")` raised inside a local step as the engines mark it "
                "(`fnlcore.syncs.step_region`); `syncs_run`: all of the run (server steps, evaluation, "
                "detection passes included); `marked_in_steps`: what the project's CPU counter (`SyncCounter`) "
                "saw in the same steps, to compare it with the real count. `where`: the first places in a step.")
    return ("Counted during (a)'s runs with the project's CPU counter (`fnlcore.syncs.SyncCounter`): calls "
            "that would synchronise on a GPU, inside a marked local step and outside `host_side()`. "
            "`steps_marked` 0 means the engines do not mark their steps yet; on a GPU the real count is "
            "taken from `torch.cuda.set_sync_debug_mode`.")


# -- (b): timing at the papers' shapes ------------------------------------------------------------------


TIMING_SHOWN = ("case", "engine", "layout", "precision", "s_per_round", "s_per_step", "speedup_vs_sequential",
                "efficiency_vs_bare", "diff_vs_batched", "reps", "status")


@section_function("timing")
def check_timing(check: Check, section: Section, deadline: float) -> None:
    from . import benchmark

    section.table = table = Table(check.out / "timing.csv", benchmark.ROW_COLUMNS)
    section.shown = TIMING_SHOWN
    cases = [c.quick() if check.quick else c for c in benchmark.PAPER_CASES]
    section.notes += [
        "Seconds per round (the round's local training of every client and the server step, no evaluation), "
        "median over interleaved repetitions after one warm-up round per variant. `speedup_vs_sequential` = "
        "t(sequential) / t(variant), `efficiency_vs_bare` = t(bare loop) / t(variant) (> 1: faster than the "
        "bare loop), both per repetition at the same layout and precision, then the median. On CUDA, "
        "`batched_graphs` is the batched engine with `training.cuda_graphs: true` (its steps captured and "
        "replayed as CUDA graphs); `diff_vs_batched` the largest absolute difference of its global model from "
        "the batched engine's after the same first round (equal up to float rounding: then graphs can be "
        "turned on where they are faster).",
        *[f"- `{c.name}`: {c.label}; {c.model}, {c.channels}x{c.size}x{c.size}, {c.clients} clients x "
          f"{c.per_client} samples, batch {c.batch}, {c.method} rounds" for c in cases],
    ]
    reps = 2 if check.quick else 3  # 36 variants: three rounds each after the warm-up fit the share
    for i, case in enumerate(cases):
        # each case its share of what is left, so a slow first case cannot starve the others
        case_deadline = time.monotonic() + (deadline - time.monotonic()) / (len(cases) - i)
        check.log(f"   {case.name} ...")
        for row in benchmark.time_case(case, check.device, reps, case_deadline, log=check.log):
            table.add(row)
        gc.collect()  # the case's runners (models, stacked copies, stores) before the next case
        if check.device.type == "cuda":
            torch.cuda.empty_cache()


# -- (d): step costs ------------------------------------------------------------------------------------


STEP_COST_COLUMNS = ("shape", "train_s", "eval_ms_per_sample", "took_s", "shipped_gpu_train_s", "shipped_gpu",
                     "status", "error")


def parse_shape_key(key: str):
    """The :class:`~fnlcore.app.cost.StepShape` of a key as ``StepShape.key()`` writes it."""
    from .cost import StepShape

    parts = key.split("|")
    model, dims, classes, batch, aug, opt, precision = parts[:7]
    rest = parts[7:]
    c, h, w = (int(v) for v in dims.split("x"))
    cl = "cl" in rest
    eb = next(int(p[2:]) for p in rest if p.startswith("eb"))
    return StepShape(model=model, channels=c, image_size=(h, w), num_classes=int(classes[1:].removesuffix("ml")),
                     multi_label=classes.endswith("ml"), batch_size=int(batch[1:]), augmentation=aug, optimizer=opt,
                     precision=precision, channels_last=cl, eval_batch_size=eb)


def shipped_shapes() -> dict[str, dict[str, dict]]:
    """shape key -> {device description: entry} of the project's shipped step costs."""
    from .resources import SHIPPED_DIR, SHIPPED_STEP_COSTS

    raw = json.loads((SHIPPED_DIR / SHIPPED_STEP_COSTS).read_text())
    out: dict[str, dict[str, dict]] = {}
    for device, entries in raw["devices"].items():
        for key, entry in entries.items():
            out.setdefault(key, {})[device] = entry
    return out


def _cpu_cost(entries: dict[str, dict]) -> float:
    return max((float(e["train_s"]) for d, e in entries.items() if d.startswith("cpu")), default=math.inf)


def step_cost_file(entries: dict, description: str, provenance: str, batched: list | None = None,
                   memory_mb: int | None = None) -> dict:
    """``fnl plan``'s calibration format (fnlcore.app.cost.Calibration), with the shipped file's provenance,
    and what prices the batched engine on the device (fnlcore/app/gpu_cost.py): its measured batched
    rounds (``batched``, :func:`batched_rows`) and its memory."""
    from .cost import CALIBRATION_VERSION

    out = {"about": "Step costs measured by `fnl device-check`; `fnl plan --calibration` reads this file as is, "
                    "and `fnl device-check --ship-step-costs` adds it to benchmarks/step_costs.json.",
           "devices": {description: entries}, "provenance": {description: provenance},
           "version": CALIBRATION_VERSION}
    if batched:
        out["batched"] = {description: batched}
    if memory_mb:
        out["memory_mb"] = {description: int(memory_mb)}
    return out


def batched_rows(timing_csv: str | os.PathLike) -> list[dict]:
    """The FedAvg cases of (b) timed on both engines (contiguous fp32, the batched engine having run), as
    the step-cost file's ``batched`` rows: the case's step shape, its clients, seconds a round of each."""
    from .benchmark import PAPER_CASES

    try:
        with open(timing_csv, newline="") as f:
            rows = [r for r in csv.DictReader(f) if r.get("status") == "ok" and r.get("layout") == "nchw"
                    and r.get("precision") == "fp32"]
    except OSError:
        return []
    cases = {c.name: c for c in PAPER_CASES if c.method == "fedavg" and c.view == "train"}
    out = []
    for name, case in cases.items():
        seq = next((r for r in rows if r["case"] == name and r["engine"] == "sequential"), None)
        bat = next((r for r in rows if r["case"] == name and r["engine"] == "batched"
                    and str(r.get("batched_ran")) == "True"), None)
        if seq is None or bat is None or case.model != seq.get("model"):  # quick mode times other models
            continue
        shape = {"model": case.model, "channels": case.channels, "image_size": [case.size, case.size],
                 "num_classes": 10, "multi_label": False, "batch_size": case.batch, "augmentation": case.augmentation,
                 "optimizer": "sgd", "precision": "fp32", "channels_last": False, "eval_batch_size": 1024}
        out.append({"case": f"{case.label} (fnl device-check, {name})", "shape": shape, "clients": case.clients,
                    "sequential_s": float(seq["s_per_round"]), "batched_s": float(bat["s_per_round"])})
    return out


@section_function("step_costs")
def check_step_costs(check: Check, section: Section, deadline: float) -> None:
    from ..io import write_json
    from ..provenance import code_version
    from .cost import device_description, load_per_core, measure_step

    section.table = table = Table(check.out / "step_costs.csv", STEP_COST_COLUMNS)
    shipped = shipped_shapes()
    keys = sorted(shipped, key=lambda k: _cpu_cost(shipped[k]))  # cheapest first: a cut keeps the most shapes
    if check.quick:
        keys = [k for k in keys if _cpu_cost(shipped[k]) < 0.05][:2]
    description = device_description(check.device)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    provenance = (f"measured {when} by `fnl device-check` on {description.split('|')[0].removeprefix('cuda:')} "
                  f"({_device_words(check.device)}), code {code_version()}")
    path = check.out / "step_costs.json"
    entries: dict[str, dict] = {}
    section.notes += [
        f"The step costs of every shape in the project's shipped `benchmarks/step_costs.json` "
        f"({len(keys)} of {len(shipped)}{' in quick mode' if check.quick else ''}), measured as "
        "`fnl plan --recalibrate` does (`fnlcore.app.cost.measure_step`: median of 5 steps after 2, on "
        f"random data; test evaluation at its batch). `{path.name}` is a calibration file: "
        f"`fnl plan --calibration {path}` uses it as is. To ship it with the project (the workflow and "
        f"`fnl plan` then use it for every GPU job without a measurement of its own): "
        f"`fnl device-check --ship-step-costs {path}` (adds this device to benchmarks/step_costs.json, "
        "with where and when it was measured), then commit that file.",
    ]
    steps = 2 if check.quick else 5
    for key in keys:
        d, e = next(((d, e) for d, e in shipped[key].items() if d.startswith("cuda")), (None, None))
        base = {"shape": key, "shipped_gpu_train_s": e["train_s"] if e else "",
                "shipped_gpu": d.split("|")[0] if d else ""}
        if time.monotonic() > deadline:
            table.add({**base, "status": "skipped", "error": "time box spent"})
            continue
        try:
            load = load_per_core(0)
            t0 = time.perf_counter()
            cost = measure_step(parse_shape_key(key), check.device, steps=steps)
            took = time.perf_counter() - t0
        except TimeBoxExceeded:
            table.add({**base, "status": "cut", "error": "time box spent during this shape"})
            raise
        except Exception as err:  # noqa: BLE001 (an out-of-memory shape is its row)
            msg = f"{type(err).__name__}: {' '.join(str(err).split())}"[:300]
            table.add({**base, "status": "failed", "error": msg})
            if check.device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        entries[key] = {"train_s": round(cost.train_s, 7), "eval_s": float(f"{cost.eval_s:.4g}"),
                        "load": None if load is None else round(load, 3), "took_s": round(took, 2)}
        memory = torch.cuda.get_device_properties(check.device).total_memory // 2**20 if check.device.type == "cuda" else None
        write_json(step_cost_file(entries, description, provenance, batched_rows(check.out / "timing.csv"), memory), path)
        table.add({**base, "train_s": round(cost.train_s, 5), "eval_ms_per_sample": round(1000 * cost.eval_s, 5),
                   "took_s": round(took, 1), "status": "ok"})


def _device_words(device: torch.device) -> str:
    if device.type != "cuda":
        return f"{os.cpu_count()} CPU cores, {torch.get_num_threads()} threads, torch {torch.__version__}"
    props = torch.cuda.get_device_properties(device)
    return (f"{props.total_memory // 2**20:,} MiB, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
            f"torch {torch.__version__}")


def ship_step_costs(src: str | os.PathLike, dest: str | os.PathLike | None = None) -> list[str]:
    """Add the devices of a step-cost file (``fnl device-check``'s or ``fnl plan``'s) to the shipped
    ``benchmarks/step_costs.json``: per device, its entries replace the shipped ones shape by shape,
    and its provenance the shipped one. Returns the devices added."""
    from ..errors import ConfigError
    from ..io import write_json
    from .resources import SHIPPED_DIR, SHIPPED_STEP_COSTS

    dest = Path(dest or SHIPPED_DIR / SHIPPED_STEP_COSTS)
    try:
        raw = json.loads(Path(src).read_text())
        devices, provenance = dict(raw["devices"]), dict(raw.get("provenance") or {})
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"{src}: not a step-cost file ({type(err).__name__}: {err})") from None
    if not devices:
        raise ConfigError(f"{src}: no device's step costs in it")
    shipped = json.loads(dest.read_text())
    for device, entries in devices.items():
        if not provenance.get(device):
            raise ConfigError(f"{src}: no provenance for {device!r} (where and when it was measured); "
                              "write one under \"provenance\" first")
        shipped["devices"].setdefault(device, {}).update(entries)
        shipped.setdefault("provenance", {})[device] = provenance[device]
        for key in ("batched", "memory_mb"):  # what prices the device's batched engine (fnlcore/app/gpu_cost.py)
            if device in (raw.get(key) or {}):
                shipped.setdefault(key, {})[device] = raw[key][device]
    write_json(shipped, dest)
    return list(devices)


# -- (e): rehearsal of the costliest configurations -----------------------------------------------------


REHEARSAL_COLUMNS = ("rank", "config", "estimate_h", "status", "error", "peak_device_mb", "peak_rss_mb",
                     "checkpoint_mb", "s_per_step", "steps", "wall_s")
REHEARSAL_SHOWN = ("rank", "config", "estimate_h", "status", "peak_device_mb", "peak_rss_mb", "s_per_step", "wall_s",
                   "error")


@contextlib.contextmanager
def shipped_papers_trusted():
    """Read the shipped paper and scale files without their JSON Schema pass: GPU nodes lack
    jsonschema, and these very files are validated by the test suite (tests/test_config.py); every
    spec is still built through its checking constructor."""
    from .. import schemas

    check = schemas.check
    schemas.check = lambda doc, *args, **kwargs: doc
    try:
        yield
    finally:
        schemas.check = check


def ranked_configs(results_dir: Path) -> list[tuple[Any, float]]:
    """Every distinct training configuration of every paper table at scale paper, costliest first:
    (Rehearsed, estimated device-seconds of one run by the shipped CPU step costs, the one device that
    measured every shape, so the ranking compares like with like)."""
    from .cost import run_work, step_shape
    from .plan import build_plan
    from .rehearse import distinct_configs
    from .resources import shipped_step_costs
    from .runs import PAPERS_DIR

    papers = [p.stem for p in sorted(PAPERS_DIR.glob("*.yaml"))]
    with shipped_papers_trusted():
        plan = build_plan({"tables": papers, "scale": "paper", "data_grid": [], "device": "cpu",
                           "results_dir": str(results_dir)})
    costs = shipped_step_costs("cpu")
    ranked = []
    for r in distinct_configs(plan).values():
        steps, tested, _ = run_work(r.run, r.dataset_options)
        entry = costs.get(step_shape(r.run, r.dataset_options).key())
        seconds = steps * float(entry[0]["train_s"]) + tested * float(entry[0]["eval_s"]) if entry else 0.0
        ranked.append((r, seconds))
    return sorted(ranked, key=lambda x: -x[1])


def without_weights(r):
    """The configuration's run with random initialisation: the check downloads nothing (the same tensors,
    so the same memory; its row then says ``no_weights``, as a rehearsal without the weights does)."""
    run = r.run
    if not run.training.pretrained:
        return r
    training = dataclasses.replace(run.training, pretrained=False)
    return dataclasses.replace(r, run=dataclasses.replace(run, training=training))


@section_function("rehearsal")
def check_rehearsal(check: Check, section: Section, deadline: float) -> None:
    from .rehearse import Options, rehearse_one, write_rehearsal

    section.table = table = Table(check.out / "rehearsal.csv", REHEARSAL_COLUMNS)
    section.shown = REHEARSAL_SHOWN
    folder = check.out / "rehearsal"
    ranked = ranked_configs(folder)
    picks = list(enumerate(ranked[-1:] if check.quick else ranked[:COSTLIEST], 1))
    jobs = max(1, check.rehearse_jobs)
    threads = check.threads or max(1, (os.cpu_count() or 2) // (2 * jobs))
    base = Options(steps=1, per_round=0, pass_clients=2, rounds=2, eval_samples=16, device=str(check.device),
                   threads=threads)
    section.notes += [
        f"{'The cheapest configuration (quick mode)' if check.quick else f'The {COSTLIEST} costliest configurations'}"
        f" of the {len(ranked)} of every paper table at scale paper, by one run's estimate from the shipped CPU "
        f"step costs (`estimate_h`, for ranking), each started, checkpointed, killed (SIGKILL), resumed and "
        f"finished on a stand-in of its data (`fnl rehearse`: {base.label}), {jobs} at a time, on "
        f"`{check.device}`; pretrained models with random initialisation (nothing is downloaded: "
        "`no_weights`). `peak_device_mb`: `torch.cuda.max_memory_allocated`, the larger of the two processes. "
        f"`{folder.name}/rehearsal.csv` is in the project's rehearsal format: copy it to "
        "`benchmarks/rehearsal_<gpu>.csv` to ship these peaks with the project. Logs: "
        f"`{folder.name}/rehearsal_logs/`.",
    ]
    done: list[dict] = []
    lock = threading.Lock()

    def one(item) -> None:
        rank, (r, seconds) = item
        head = {"rank": rank, "config": r.config.key, "estimate_h": round(seconds / 3600, 1)}
        left = deadline - time.monotonic()
        if left < 20:
            table.add({**head, "status": "skipped", "error": "time box spent"})
            return
        # both phases must end by the deadline: the resumed phase gets what the first leaves
        opts = dataclasses.replace(base, timeout_s=max(10.0, left / 2))
        t0 = time.monotonic()
        try:
            row = rehearse_one(without_weights(r), opts, folder / "rehearsal_work" / r.config.key,
                               folder / "rehearsal_logs")
        except Exception as err:  # noqa: BLE001
            table.add({**head, "status": "failed", "error": f"{type(err).__name__}: {err}"[:400]})
            return
        if r.config.pretrained and row["status"] == "pass":
            note = "random initialisation: device-check downloads nothing"
            row = {**row, "status": "no_weights", "error": "; ".join(filter(None, [row["error"], note]))}
        table.add({**head, **{k: row.get(k, "") for k in REHEARSAL_COLUMNS if k in row},
                   "wall_s": round(time.monotonic() - t0, 1)})
        check.log(f"   [{rank}] {row['status']:10s} {r.config.key}: peak device {row['peak_device_mb'] or '-'} MB "
                  f"({time.monotonic() - t0:.0f} s){': ' + row['error'] if row['error'] else ''}")
        with lock:
            done.append(row)
            write_rehearsal(sorted(done, key=lambda x: x["config"]), folder,
                            f"Rehearsal by fnl device-check on {check.device}: {base.label}")

    (folder / "rehearsal_logs").mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, picks))
    with contextlib.suppress(OSError):  # each configuration removed its own work folder
        (folder / "rehearsal_work").rmdir()
    table.rows.sort(key=lambda x: x["rank"])
    table.flush()
