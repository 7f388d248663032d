"""A rehearsal of the paper scale: every distinct training configuration started, checkpointed,
killed, resumed and finished once, with what it used measured.

Two runs share a :class:`TrainingConfig` when they cost the same memory and time per step:
the same dataset (shape, classes, size, on disk or in memory), model, clients, clients a
round, batch size, local epochs, method (with its stage table), precision, optimiser and
engine. Noise settings, seeds and most method hyper-parameters change the numbers, not
the resources, so a table of 300 runs rehearses a handful of configurations.

``results/plan/rehearsal.csv`` (columns :data:`fnlcore.app.measurements.CSV_COLUMNS`) is what the workflow's
resource model reads back, through :func:`training_config` ``(run).key``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

from ..errors import ConfigError
from ..safe_files import open_regular
from ..provenance import code_version
from .measurements import MEASURED, read_rehearsal_rows, write_rehearsal_csv
from ..fl import sampling
from ..fl.settings import TrainSettings
from ..io import atomic_path
from ..noise import noise_spec_from_dict
from ..partition import partition_spec_from_dict
from .runs import RunSpec

REPO = Path(__file__).resolve().parents[2]

STATUSES = ("pass", "fail", "no_weights")


@dataclass(frozen=True)
class TrainingConfig:
    """What a run's memory and time per step depend on (see the module docstring)."""

    dataset: str
    model: str
    pretrained: bool
    input_shape: tuple[int, int, int]  # (C, H, W) the network sees
    num_classes: int
    multi_label: bool
    train_samples: int
    clients: int
    per_round: int  # clients of a round
    batch_size: int
    local_epochs: int
    method: str
    stages: tuple[str, ...]  # the method's stage table, in order
    precision: str
    optimizer: str
    engine: str
    channels_last: bool

    @property
    def input(self) -> str:
        return "x".join(str(s) for s in self.input_shape)

    @property
    def key(self) -> str:
        """Stable, readable and safe as a file name, e.g.
        ``cifar10-resnet18-3x32x32-c10-n50000-k100-m10-b32-e5-fedgr-sgd-fp32``."""
        parts = [
            self.dataset, self.model + ("-pt" if self.pretrained else ""), self.input,
            f"c{self.num_classes}{'ml' if self.multi_label else ''}", f"n{self.train_samples}",
            f"k{self.clients}", f"m{self.per_round}", f"b{self.batch_size}", f"e{self.local_epochs}",
            self.method, self.optimizer, self.precision,
        ]
        if self.engine not in ("default", "sequential"):  # the default was sequential: keys stay
            parts.append(self.engine)
        if self.channels_last:
            parts.append("cl")
        return re.sub(r"[^A-Za-z0-9_.-]", "_", "-".join(parts))


def training_config(run, dataset_options: Mapping[str, Any] | None = None) -> TrainingConfig:
    """The :class:`TrainingConfig` of a run of the plan (``Plan.runs()``); ``dataset_options``:
    the plan's options of the run's dataset (``plan.datasets[run.dataset].options``)."""
    # lazy: imports torch; fnlcore.app.rehearse imports without it (envs/labels.yaml)
    from ..methods import METHODS
    # lazy: imports torch; fnlcore.app.rehearse imports without it (envs/labels.yaml)
    from .cost import _data_shape, _step_shape

    ds = _data_shape(run, dataset_options)
    shape = _step_shape(run, ds)
    t = run.training
    k = run.partition.num_clients
    cls = METHODS[run.method.name]
    return TrainingConfig(
        dataset=run.dataset, model=shape.model, pretrained=bool(t.pretrained),
        input_shape=(shape.channels, *shape.image_size), num_classes=shape.num_classes,
        multi_label=shape.multi_label, train_samples=int(run.partition.expected_samples(ds.n_train)),
        clients=k, per_round=sampling.clients_per_round(k, t.client_fraction), batch_size=t.batch_size,
        local_epochs=t.local_epochs, method=run.method.name, stages=tuple(cls.stages),
        precision=t.precision, optimizer=t.optimizer, engine=t.engine, channels_last=t.channels_last,
    )


# -- the rehearsal -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """How much of each configuration is run (``fnl rehearse`` flags)."""

    steps: int = 1  # local steps of a client update
    per_round: int = 0  # most clients trained a round (0: the run's own)
    # most clients trained a round of a pass over every client before the rounds (FedCorr's
    # pre-processing, FedDiv's warm-up), each pass then in two groups; 0: every client, one a round
    pass_clients: int = 0
    rounds: int = 4  # training.rounds of the rehearsal (stage boundaries scaled along)
    eval_samples: int = 32  # test samples scored a round
    device: str = "cpu"
    threads: int = 2
    timeout_s: float = 3600.0  # per phase

    @property
    def label(self) -> str:
        """What a row was measured with (``rehearsed_with``): rows of other options are not reused."""
        return (f"steps={self.steps} per_round={self.per_round or 'all'} rounds={self.rounds} "
                f"eval_samples={self.eval_samples} device={self.device}"
                + (f" pass_clients={self.pass_clients}" if self.pass_clients else ""))


@dataclass
class Rehearsed:
    """A configuration of the plan with the cells that use it."""

    config: TrainingConfig
    run: Any  # its first run in the plan (RunSpec), the one rehearsed
    dataset_options: Mapping[str, Any]
    cells: list


def distinct_configs(plan) -> dict[str, Rehearsed]:
    """Every distinct :class:`TrainingConfig` of the plan's tables, with the cells using it, in table order."""
    options = {n: d.options for n, d in plan.datasets.items()}
    out: dict[str, Rehearsed] = {}
    for t in plan.tables:
        for tr in t.runs:
            cfg = training_config(tr.run, options.get(tr.run.dataset))
            r = out.setdefault(cfg.key, Rehearsed(cfg, tr.run, options.get(tr.run.dataset) or {}, []))
            cell = f"{t.name}:{tr.row}/{tr.column}"
            if cell not in r.cells:
                r.cells.append(cell)
    return out


def _events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _phase(cmd: list[str], log: Path, events: Path, phase: int, timeout_s: float) -> tuple[str, float]:
    """Run one phase; phase 1 is killed (SIGKILL) once its first checkpoint is recorded.
    Returns (how it ended, peak RSS of the process in MB as the kernel saw it)."""
    with open_regular(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    t0, peak = time.monotonic(), 0.0
    while proc.poll() is None:
        peak = max(peak, _vm_hwm_mb(proc.pid))
        if phase == 1 and any(e["event"] == "checkpoint" and e["phase"] == 1 for e in _events(events)):
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            return "killed", peak
        if time.monotonic() - t0 > timeout_s:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            return f"timed out after {timeout_s:.0f}s", peak
        time.sleep(0.2)
    return f"exit {proc.returncode}", peak


def _vm_hwm_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:")), 0.0)
    except OSError:
        return 0.0


def rehearse_one(r: Rehearsed, opts: Options, workdir: Path, logdir: Path) -> dict:
    """Start, checkpoint, kill, resume and finish one configuration; its row of the table."""
    cfg = r.config
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    spec = {"run": r.run, "dataset_options": dict(r.dataset_options), "workdir": str(workdir), **asdict(opts)}
    spec_path = write_spec(workdir / "spec.json", spec)
    log = logdir / f"{cfg.key}.log"
    log.unlink(missing_ok=True)
    events_path = workdir / "events.jsonl"
    cmd = [sys.executable, "-m", "fnlcore.app.rehearse_job", str(spec_path)]
    ended1, rss1 = _phase(cmd + ["1"], log, events_path, 1, opts.timeout_s)
    ended2, rss2 = ("not run", 0.0)
    if ended1 == "killed":
        ended2, rss2 = _phase(cmd + ["2"], log, events_path, 2, opts.timeout_s)
    ev = _events(events_path)
    row = _row(cfg, r.cells, opts, ev, ended1, ended2, max(rss1, rss2))
    shutil.rmtree(workdir, ignore_errors=True)  # checkpoints of paper-scale models: gigabytes
    return row


# -- the job's spec: JSON, rebuilt through the config's own constructors (nothing in it can run code) ----

_RUN_FIELDS = ("dataset", "partition", "partition_seed", "noise", "noise_seed", "training", "method", "seed")


def run_to_dict(run) -> dict:
    """A :class:`~fnlcore.app.runs.RunSpec` as JSON-able config entries (:func:`run_from_dict` rebuilds it)."""
    return {"dataset": run.dataset, "partition": run.partition.to_dict(), "partition_seed": run.partition_seed,
            "noise": run.noise.to_dict(), "noise_seed": run.noise_seed, "training": asdict(run.training),
            "method": run.method.to_dict(), "seed": run.seed}


def run_from_dict(d: Mapping[str, Any]):
    """The RunSpec of :func:`run_to_dict`'s entries, through the validating spec constructors."""
    # lazy: imports torch; fnlcore.app.rehearse imports without it (envs/labels.yaml)
    from ..methods import method_from_dict

    if not isinstance(d, Mapping) or sorted(d) != sorted(_RUN_FIELDS):
        raise ConfigError(f"a run needs exactly the keys {list(_RUN_FIELDS)}")
    for k in ("partition_seed", "noise_seed", "seed"):
        if type(d[k]) is not int:
            raise ConfigError(f"run: {k}={d[k]!r} is not an integer")
    if not isinstance(d["dataset"], str) or not isinstance(d["training"], Mapping):
        raise ConfigError("run: dataset must be a name and training a mapping")
    return RunSpec(dataset=d["dataset"], partition=partition_spec_from_dict(d["partition"]),
                   partition_seed=d["partition_seed"], noise=noise_spec_from_dict(d["noise"]),
                   noise_seed=d["noise_seed"], training=TrainSettings.from_dict(dict(d["training"])),
                   method=method_from_dict(d["method"]), seed=d["seed"])


def write_spec(path: Path, spec: Mapping[str, Any]) -> Path:
    """The job's spec as JSON: ``run`` as its config entries, the rest (options, folders) as they are."""
    text = json.dumps({**spec, "run": run_to_dict(spec["run"])}, indent=1)
    path.write_text(text + "\n")
    return path


def read_spec(path: Path) -> dict:
    """What :func:`write_spec` wrote, its run rebuilt; a file that is not such JSON is a ConfigError
    (read as text and parsed as JSON: no pickle, no code is ever loaded from it)."""
    try:
        spec = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(spec, dict):
            raise ValueError(f"a JSON {type(spec).__name__}, not an object")
        want = {"run", "dataset_options", "workdir", *Options.__dataclass_fields__}
        if set(spec) != want:
            raise ValueError(f"keys {sorted(spec)}, expected {sorted(want)}")
        if not isinstance(spec["dataset_options"], dict) or not isinstance(spec["workdir"], str):
            raise ValueError("dataset_options must be an object and workdir a string")
        for f in Options.__dataclass_fields__.values():  # each option of its default's type (an int for a float)
            kinds = (int, float) if isinstance(f.default, float) else (type(f.default),)
            if type(spec[f.name]) not in kinds:
                raise ValueError(f"{f.name}={spec[f.name]!r} is not a {kinds[0].__name__}")
        spec["run"] = run_from_dict(spec["run"])
    except (UnicodeDecodeError, ValueError, TypeError, ConfigError) as err:
        raise ConfigError(f"{path}: not a rehearsal spec written by fnl rehearse ({err}); refused, "
                          "nothing in it was run") from None
    return spec


def _row(cfg: TrainingConfig, cells: list, opts: Options, ev: list[dict], ended1: str, ended2: str,
         rss: float) -> dict:
    checkpoints = [e for e in ev if e["event"] == "checkpoint"]
    done = next((e for e in ev if e["event"] == "done"), None)
    errors = [e["error"] for e in ev if e["event"] == "error"]
    no_weights = next((e["reason"] for e in ev if e["event"] == "no_weights"), None)
    if not errors and ended1 != "killed":
        errors.append(f"phase 1 ended ({ended1}) before its first checkpoint")
    elif not errors and done is None:
        errors.append(f"the resumed run ended ({ended2}) without finishing")
    elif not errors and not done.get("resumed"):
        errors.append("the second process did not resume from the first one's checkpoint")
    status = "fail" if errors else "no_weights" if no_weights else "pass"
    notes = list(errors)
    if no_weights:
        notes.append(f"{no_weights} -> measured with random initialisation")
    later = [c["written_bytes"] for c in checkpoints[1:]]
    mb = 2 ** 20
    device_peaks = [e.get("peak_device_mb") for e in ev if e.get("peak_device_mb") is not None]
    steps = done["client_updates"] * done["steps"] if done else 0
    return {
        "config": cfg.key, "model": cfg.model + (" (pretrained)" if cfg.pretrained else ""), "input": cfg.input,
        "samples": cfg.train_samples, "clients": cfg.clients, "per_round": cfg.per_round, "batch": cfg.batch_size,
        "method": cfg.method, "stages": ";".join(cfg.stages), "precision": cfg.precision, "device": opts.device,
        "status": status, "error": " | ".join(notes),
        "peak_rss_mb": round(max([rss] + [e.get("peak_rss_mb") or 0.0 for e in ev]), 1),
        "peak_device_mb": round(max(device_peaks), 1) if device_peaks else "",
        "checkpoint_mb": round(max((c["checkpoint_bytes"] for c in checkpoints), default=0) / mb, 2),
        "written_per_checkpoint_mb": round(max(later) / mb, 2) if later else "",
        "s_per_step": round(done["client_s"] / steps, 4) if steps else "",
        "steps": steps,
        "cells": ";".join(cells),
        "rehearsed_with": opts.label,
        "code": code_version(),
    }


def write_rehearsal(rows: list[dict], out: Path, header: str) -> tuple[Path, Path]:
    """``rehearsal.csv`` and ``rehearsal.md`` under ``out`` (atomically; rows in plan order)."""

    out.mkdir(parents=True, exist_ok=True)
    csv = write_rehearsal_csv(rows, out)
    md = out / "rehearsal.md"
    with atomic_path(md, suffix=".md") as tmp:
        Path(tmp).write_text(format_markdown(rows, header))
    return csv, md


MD_COLUMNS = ("config", "status", "peak_rss_mb", "peak_device_mb", "checkpoint_mb", "written_per_checkpoint_mb",
              "s_per_step", "steps", "code")


def format_markdown(rows: list[dict], header: str) -> str:
    lines = [header, "", "| " + " | ".join(MD_COLUMNS) + " |", "|" + "---|" * len(MD_COLUMNS)]
    lines += ["| " + " | ".join(str(r[c]) for c in MD_COLUMNS) + " |" for r in rows]
    failed = [r for r in rows if r["status"] != "pass"]
    if failed:
        lines += ["", "Not passed (configuration: reason; cells that use it):", ""]
        lines += [f"- `{r['config']}` **{r['status']}**: {r['error']}; cells: {r['cells'].replace(';', ', ')}"
                  for r in failed]
    return "\n".join(lines) + "\n"


def earlier_rows(csv_path: Path, opts: Options) -> dict[str, dict]:
    """config key -> row of an earlier ``rehearsal.csv`` that ``--resume`` keeps: status pass or
    no_weights, measured with the same options (``rehearsed_with``). Its ``code`` may differ: it says
    which source measured it."""
    if not csv_path.exists():
        return {}
    rows = read_rehearsal_rows(csv_path)
    return {r["config"]: r for r in rows if r["status"] in MEASURED and r["rehearsed_with"] == opts.label}


def merge_tables(plan, paths: list[Path], log=print) -> list[dict]:
    """One table from the tables of several rehearsals (shards run with ``--only`` on several machines,
    or side by side): per configuration of ``plan`` the row of the last table that measured it (pass
    or no_weights), else its last failure; in plan order, with today's cells. Rows of configurations
    the plan does not have are left out, and said so."""
    configs = distinct_configs(plan)
    best: dict[str, dict] = {}
    foreign: set[str] = set()
    for path in paths:
        if not Path(path).exists():
            raise ConfigError(f"--merge: {path} does not exist")
        for row in read_rehearsal_rows(Path(path), fix="merge only tables written by this version of fnl rehearse"):
            key = row["config"]
            if key not in configs:
                foreign.add(key)
            elif row["status"] in MEASURED or best.get(key, {}).get("status") not in MEASURED:
                best[key] = row
    if foreign:
        log(f"--merge: left out {len(foreign)} configuration(s) not among the selected tables': {', '.join(sorted(foreign))}")
    return [{**best[k], "cells": ";".join(r.cells)} for k, r in configs.items() if k in best]


def rehearse(plan, opts: Options, out: Path, only: list[str] | None = None, log=print, on_row=None,
             earlier: Mapping[str, dict] | None = None) -> list[dict]:
    """Rehearse every distinct configuration of ``plan`` (or those keyed in ``only``), one at a time;
    ``on_row(rows)`` after each (the command writes the rows so far: a long rehearsal loses nothing).
    ``earlier``: rows of configurations already rehearsed (:func:`earlier_rows`), kept in plan order
    (with ``only`` too) and not run again, so a rehearsal longer than one sitting goes on where it stopped.
    A device that cannot run here (``cuda`` without one) is refused before any work (a ConfigError)."""
    # lazy: imports torch; fnlcore.app.rehearse imports without it (envs/labels.yaml)
    from ..fl.context import check_device

    check_device(opts.device, where="--device")
    configs = distinct_configs(plan)
    earlier = earlier or {}
    if only:
        unknown = sorted(set(only) - set(configs))
        if unknown:
            raise ConfigError(f"--only: {', '.join(unknown)} is not a configuration of the selected tables; "
                              f"valid: {', '.join(configs)}")
        # earlier rows of the other configurations stay in the table (--resume --only adds to it)
        configs = {k: v for k, v in configs.items() if k in only or k in earlier}
    logdir = out / "rehearsal_logs"
    logdir.mkdir(parents=True, exist_ok=True)
    # config -> row, in plan order; the kept rows from the start (with today's cells), so a table
    # written after any configuration holds them all, also those the loop has not reached
    rows = {k: {**earlier[k], "cells": ";".join(r.cells)} if k in earlier else None for k, r in configs.items()}
    for i, (key, r) in enumerate(configs.items(), 1):
        if key in earlier:
            log(f"[{i}/{len(configs)}] {rows[key]['status']:10s} {key} (kept: {rows[key]['code']})")
            continue
        t0 = time.monotonic()
        row = rows[key] = rehearse_one(r, opts, out / "rehearsal_work" / key, logdir)
        log(f"[{i}/{len(configs)}] {row['status']:10s} {key} ({time.monotonic() - t0:.0f}s)"
            + (f": {row['error']}" if row["error"] else ""))
        if on_row is not None:
            on_row([v for v in rows.values() if v is not None])
    return [v for v in rows.values() if v is not None]
