"""(a) Every registered method, a short run on the device on both engines (sequential; batched where a
stage declares a batched loss) beside the same run on the CPU with the same seed: the largest absolute
difference of the global models after the first round and after the last, and of the per-round metrics
(``methods.csv``); (c)'s synchronisations are counted during the device runs (:mod:`.syncs`)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from pandas.api.types import is_bool_dtype, is_numeric_dtype

from ...errors import ConfigError
from ...fl.data import FederatedData, ImageSource
from ...fl.simulation import batched_support
from ...fl.settings import TrainSettings
from ...fl.simulation import Simulation
from ...methods import METHODS
from ...spec import pass_fields
from ..papers import rescale_rounds
from ..train import build_context
from .report import Section
from .syncs import SYNC_COLUMNS, SYNC_SHOWN, Tally, counting_syncs, sync_note, sync_row
from .timebox import Check, TimeBoxExceeded

FLAG_RELATIVE = 1e-3  # a first round further apart than this (relative) is flagged in (a)


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
        if method.stage_name(r) not in seen["stages"]:
            seen["stages"].append(method.stage_name(r))

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



def engines_of(cls) -> tuple[list[str], str | None]:
    """The engines (a) runs a method class on, and why not the batched one (None: it runs)."""
    why = batched_support(cls)
    return (["sequential"] if why else ["sequential", "batched"]), why


def check_methods(check: Check, section: Section, deadline: float) -> None:
    run = QUICK_RUN if check.quick else FULL_RUN
    methods = check.report.table(section, METHOD_COLUMNS, METHOD_SHOWN)
    sync_section = check.report.section("syncs", "(c) host-device synchronisations per local step (during (a))")
    syncs = check.report.table(sync_section, SYNC_COLUMNS, SYNC_SHOWN)
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
    sync_section.notes.append(sync_note(check.device))
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
