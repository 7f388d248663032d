"""The one store of measured costs: step-cost files and rehearsal tables, the ones the project ships
and the ones measured on the user's machines. Nothing else in fnlcore opens, parses or writes them
(tests/test_layers.py checks that their file names appear nowhere else).

The files
---------

* step costs, JSON (:func:`read_step_costs`, :func:`write_calibration`, :func:`step_cost_file`)::

      {"version": 1,
       "devices": {description: {shape key: {"train_s", "eval_s", "load"?, "took_s"?}}},
       "provenance"?: {description: where and when it was measured},
       "batched"?: {description: [measured batched rounds]}, "memory_mb"?: {description: MiB}}

  ``RESULTS/plan/step_costs.json`` (``fnl plan``'s calibration, :func:`own_step_costs`; ``--calibration F``
  another), ``benchmarks/step_costs.json`` (shipped, :func:`shipped_step_costs_path`; a device check's
  file is added to it by :func:`ship_step_costs`) and a device check's ``OUT/step_costs.json``.
  A description names a device and its torch version (:func:`short_device` drops the version).
* rehearsals, CSV of :data:`CSV_COLUMNS` (:func:`write_rehearsal_csv`, :func:`read_rehearsal_rows`):
  ``RESULTS/plan/rehearsal.csv`` (``fnl rehearse``, :func:`own_rehearsal`), ``benchmarks/rehearsal_*.csv``
  (shipped) and a device check's ``OUT/rehearsal/rehearsal.csv``.

The precedence rule
-------------------

For one key (a step shape, or a training configuration) every reader ranks the measurements by

1. the device: one of the device that asks comes first. Closest first: this very device (its exact
   description: ``fnl plan`` on this machine), then the same GPU model under any torch version (a GPU
   priced by its own measurements), then the same kind (CPU or GPU: a workflow job), then the other kind;
2. at the same closeness, the place: a measurement in the results folder (``RESULTS/plan/``) before a
   shipped one (``benchmarks/``; shipped rehearsals in file-name order);
3. ties, several devices at the same closeness in one file: the slowest (the largest seconds per step,
   the largest test-sample time, the largest peaks: a request too large is a wasted hour, one too small
   a killed job); one GPU model under several torch versions: the first listed;
4. missing: the reader's default, named as the source (``fnl plan`` measures the shape here or estimates
   it from the GPU's measured shapes; a train job asks for the default memory or the site's whole job length).

Each reader asks the levels of 1 its question allows, in that order:

* ``fnl plan`` on this machine (:class:`fnlcore.app.cost.Calibration`): this very device's entries of the
  results folder's file, else what the next bullet gives a GPU or, on a CPU, :func:`shipped_step_costs` of
  its kind, else it measures the shape;
* ``fnl plan`` of a GPU (:func:`measured_on`, then :func:`fnlcore.app.cost.gpu_step_costs`): the same GPU
  model, results folder first, else the estimate from that model's measured shapes; never a CPU's;
* a train job's step costs (:func:`step_costs_with_sources`): its kind, results folder first; the other
  kind only from the results folder, marked (a CPU's for a GPU job: an overestimate), never a shipped one
  of the other kind (a shipped CPU step of a 512-pixel shape would make a GPU job ask for days). The
  workflow's GPU jobs (:class:`fnlcore.app.resources.TrainResources`) drop even the results folder's CPU
  ones for the estimate of a measured GPU model, as ``fnl plan`` of a GPU does;
* a train job's memory and disk (:func:`rehearsal_with_sources`): its kind, results folder first, then the
  other kind from either place (a CPU rehearsal's peak plus a CUDA context sizes a GPU job's host memory).

Every reader returns with each value where it came from, which ``fnl plan`` prints.
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from ..errors import ConfigError
from ..io import write_csv, write_json

#: Measurements shipped with the project: a user's own (``RESULTS/plan/``) override them per key.
SHIPPED_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
STEP_COSTS_FILE = "step_costs.json"
REHEARSAL_FILE = "rehearsal.csv"
SHIPPED_REHEARSALS = "rehearsal_*.csv"
CALIBRATION_VERSION = 1

#: The rehearsal table's columns, in order.
CSV_COLUMNS = (
    "config", "model", "input", "samples", "clients", "per_round", "batch", "method", "stages", "precision",
    "device", "status", "error", "peak_rss_mb", "peak_device_mb", "checkpoint_mb", "written_per_checkpoint_mb",
    "s_per_step", "steps", "cells", "rehearsed_with", "code",
)
# Statuses of a row that measured its configuration (no_weights: with random initialisation, the same
# tensors): --resume and --merge keep them, the resource model reads them; a failed row is rehearsed again.
MEASURED = ("pass", "no_weights")

OWN = "measured here"  # the source label of a measurement in the results folder
DEFAULT = "default"  # the source label of no measurement


def short_device(device: str) -> str:
    """A device description without its torch version (``cpu:Xeon|1 threads``)."""
    return str(device).split("|torch")[0]


def _kind(device: str) -> str:
    return "gpu" if str(device).startswith("cuda") else "cpu"


# -- where the files are ---------------------------------------------------------------------------


def own_step_costs(results_dir: str | os.PathLike) -> Path:
    """The results folder's step costs (``fnl plan``'s calibration cache)."""
    return Path(results_dir) / "plan" / STEP_COSTS_FILE


def own_rehearsal(results_dir: str | os.PathLike) -> Path:
    """The results folder's rehearsal table (``fnl rehearse``'s)."""
    return Path(results_dir) / "plan" / REHEARSAL_FILE


def rehearsal_csv(folder: str | os.PathLike) -> Path:
    """The rehearsal table in ``folder`` (``fnl rehearse --out``, a device check's ``rehearsal/``)."""
    return Path(folder) / REHEARSAL_FILE


def step_costs_in(folder: str | os.PathLike) -> Path:
    """The step-cost file in ``folder`` (a device check's ``--out``)."""
    return Path(folder) / STEP_COSTS_FILE


def shipped_step_costs_path(shipped_dir: str | os.PathLike | None = None) -> Path:
    return Path(shipped_dir or SHIPPED_DIR) / STEP_COSTS_FILE


def shipped_rehearsals(shipped_dir: str | os.PathLike | None = None) -> list[Path]:
    return sorted(Path(shipped_dir or SHIPPED_DIR).glob(SHIPPED_REHEARSALS))


# -- step-cost files: reading and writing -----------------------------------------------------------


def read_step_costs(path: str | os.PathLike | None) -> dict:
    """The whole step-cost file at ``path`` (default: the shipped one), {} where there is none."""
    path = Path(path or shipped_step_costs_path())
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except ValueError as err:
        raise ConfigError(f"{path}: not a step-cost file ({err})") from None


def _devices_and_provenance(path: Path, fix: str = "") -> tuple[dict, dict]:
    """(devices, provenance) of a step-cost file; ConfigError if it is not one."""
    try:
        raw = json.loads(path.read_text())
        return raw["devices"], raw.get("provenance", {}) or {}
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"{path}: not a step-cost file of `fnl plan` ({err}){fix}") from None


def read_calibration(path: str | os.PathLike) -> dict[str, dict[str, dict[str, Any]]]:
    """description -> shape key -> entry of ``fnl plan``'s calibration file, {} where there is none;
    ConfigError naming the fix where the file is not one of this version."""
    path = Path(path)
    if not path.exists():
        return {}
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path}: not a calibration file ({err}); delete it to measure again") from err
    if raw.get("version") != CALIBRATION_VERSION or not isinstance(raw.get("devices"), dict):
        raise ConfigError(f"{path}: not a calibration file of version {CALIBRATION_VERSION}; delete it")
    return raw["devices"]


def write_calibration(path: str | os.PathLike, devices: Mapping[str, Mapping[str, Any]]) -> None:
    """``fnl plan``'s calibration file, whole or not at all (an interrupted calibration keeps what it measured)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps({"version": CALIBRATION_VERSION, "devices": devices}, indent=1, sort_keys=True))
    os.replace(tmp, path)  # never a half-written file


def step_cost_file(entries: dict, description: str, provenance: str, batched: list | None = None,
                   memory_mb: int | None = None) -> dict:
    """A step-cost file of one device (a device check's), with its provenance, and what prices the batched
    engine on the device (fnlcore/app/gpu_cost.py): its measured batched rounds and its memory."""
    out = {"about": "Step costs measured by `fnl device-check`; `fnl plan --calibration` reads this file as is, "
                    "and `fnl device-check --ship-step-costs` adds it to benchmarks/step_costs.json.",
           "devices": {description: entries}, "provenance": {description: provenance},
           "version": CALIBRATION_VERSION}
    if batched:
        out["batched"] = {description: batched}
    if memory_mb:
        out["memory_mb"] = {description: int(memory_mb)}
    return out


def write_step_cost_file(doc: dict, path: str | os.PathLike) -> None:
    write_json(doc, path)


def ship_step_costs(src: str | os.PathLike, dest: str | os.PathLike | None = None) -> list[str]:
    """Add the devices of a step-cost file (``fnl device-check``'s or ``fnl plan``'s) to the shipped
    one (``dest``, default ``benchmarks/step_costs.json``): per device, its entries replace the shipped
    ones shape by shape, and its provenance the shipped one. Returns the devices added."""
    dest = Path(dest or shipped_step_costs_path())
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


def shipped_shapes(shipped_dir: str | os.PathLike | None = None) -> dict[str, dict[str, dict]]:
    """shape key -> {device description: entry} of the project's shipped step costs."""
    raw = json.loads(shipped_step_costs_path(shipped_dir).read_text())
    out: dict[str, dict[str, dict]] = {}
    for device, entries in raw["devices"].items():
        for key, entry in entries.items():
            out.setdefault(key, {})[device] = entry
    return out


def batched_rounds(path: str | os.PathLike | None = None) -> dict[str, list[dict]]:
    """device description -> its measured batched rounds as written (``batched`` of the step-cost file)."""
    return dict(read_step_costs(path).get("batched") or {})


def device_memory_mb(device: str, path: str | os.PathLike | None = None) -> int | None:
    """The recorded memory (MiB) of a GPU of ``device``'s model (any torch version), None where not recorded."""
    mem = next((v for d, v in (read_step_costs(path).get("memory_mb") or {}).items()
                if short_device(d) == short_device(device)), None)
    return int(mem) if mem else None


def gpu_descriptions(paths: list[str | os.PathLike]) -> list[str]:
    """GPU device descriptions that measured step costs in any of ``paths`` (step-cost files)."""
    out: list[str] = []
    for p in paths:
        for d in (read_step_costs(p).get("devices") or {}):
            if d.startswith("cuda") and d not in out:
                out.append(d)
    return out


def shapes_measured(device: str, paths: list[str | os.PathLike]) -> int:
    """How many step shapes ``device`` (exact description) measured in ``paths`` together."""
    return sum(len(read_step_costs(p).get("devices", {}).get(device, {})) for p in paths)


def shipped_provenance(shipped_dir: str | os.PathLike | None = None) -> dict[str, str]:
    """Short device description -> where and when the shipped step costs of that device were measured."""
    try:
        raw = json.loads(shipped_step_costs_path(shipped_dir).read_text())
        return {short_device(d): str(text) for d, text in (raw.get("provenance") or {}).items()}
    except (OSError, ValueError, AttributeError):
        return {}


# -- step costs: the precedence rule's readers ------------------------------------------------------


def measured_on(device: str, paths: list[str | os.PathLike]) -> dict[str, tuple[float, float, str]]:
    """shape key -> (s per step, s per test sample, where) measured on GPUs of ``device``'s model (closeness:
    the same model, any torch version) in ``paths``, the first path's winning (the results folder's first),
    in one file the first description listed."""
    out: dict[str, tuple[float, float, str]] = {}
    for p in paths:
        for d, entries in (read_step_costs(p).get("devices") or {}).items():
            if short_device(d) != short_device(device):
                continue
            for key, c in entries.items():
                out.setdefault(key, (float(c["train_s"]), float(c["eval_s"]), str(p)))
    return out


def is_shipped(path: str | os.PathLike) -> bool:
    """Whether ``path`` is the project's shipped step-cost file."""
    return Path(path) == shipped_step_costs_path()


def load_step_costs(path: str | os.PathLike, gpu: bool) -> dict[str, tuple[float, float]]:
    """shape key -> (s per step, s per test sample) of one step-cost file (closeness: the kind): a GPU
    job's from the GPUs' entries when there are any (the slowest), else from the CPUs'."""
    path = Path(path)
    if not path.exists():
        return {}
    devices, _ = _devices_and_provenance(path, "; delete it and run `fnl plan` again")
    gpus = {d: e for d, e in devices.items() if d.startswith("cuda")}
    chosen = gpus if gpu and gpus else ({d: e for d, e in devices.items() if d not in gpus} or devices)
    out: dict[str, tuple[float, float]] = {}
    for entries in chosen.values():
        for key, c in entries.items():
            old = out.get(key, (0.0, 0.0))
            out[key] = (max(old[0], float(c["train_s"])), max(old[1], float(c["eval_s"])))
    return out


def _cost_entries(path: Path, label) -> dict[str, dict[str, tuple[float, float, str]]]:
    """shape key -> device kind -> (s per step, s per test sample, source): the slowest device of a kind."""
    if not path.exists():
        return {}
    devices, provenance = _devices_and_provenance(path, "; delete it and run `fnl plan` again")
    out: dict[str, dict[str, tuple[float, float, str]]] = {}
    for device, entries in devices.items():
        for key, c in entries.items():
            kinds = out.setdefault(key, {})
            t, e = float(c["train_s"]), float(c["eval_s"])
            old = kinds.get(_kind(device))
            if old is None or t > old[0]:
                kinds[_kind(device)] = (t, max(e, old[1]) if old else e, label(device, provenance.get(device)))
            else:
                kinds[_kind(device)] = (old[0], max(e, old[1]), old[2])
    return out


def step_costs_with_sources(results_dir: str | os.PathLike, gpu: bool, shipped_dir: str | os.PathLike | None = None,
                            own_path: str | os.PathLike | None = None
                            ) -> tuple[dict[str, tuple[float, float]], dict[str, str]]:
    """(shape key -> (s per step, s per test sample), shape key -> where it came from) of a train job
    (closeness: the kind): the job's kind of device first (a GPU job: GPU measurements, the slowest GPU's),
    the user's own (``RESULTS/plan/step_costs.json``) before the shipped ones; the user's own CPU's for a
    GPU job when there is no GPU's (an overestimate), never a shipped one of the other kind (the default instead)."""
    own = Path(own_path) if own_path else own_step_costs(results_dir)
    shipped = shipped_step_costs_path(shipped_dir)
    layers = [
        _cost_entries(own, lambda d, _p: f"{OWN} ({own}, {short_device(d)})"),
        _cost_entries(shipped, lambda d, _p: f"shipped ({short_device(d)})"),
    ]
    order = ["gpu", "cpu"] if gpu else ["cpu", "gpu"]
    costs: dict[str, tuple[float, float]] = {}
    sources: dict[str, str] = {}
    for key in {k for layer in layers for k in layer}:
        for kind in order:
            # the other kind's only from the user's own file: a shipped CPU cost would make a GPU job's
            # round hours long (a 512 x 512 ICH round: 65 h), and the workflow refuse runs the user never timed
            hit = next((layer[key][kind] for i, layer in enumerate(layers)
                        if kind in layer.get(key, {}) and (i == 0 or kind == order[0])), None)
            if hit is not None:
                costs[key], sources[key] = (hit[0], hit[1]), hit[2]
                if kind != order[0]:
                    sources[key] += f"; a {kind.upper()}'s: {'an overestimate' if gpu else 'an underestimate'}"
                break
    return costs, sources


def shipped_step_costs(device_kind: str, shipped_dir: str | os.PathLike | None = None
                       ) -> dict[str, tuple[dict[str, Any], str]]:
    """shape key -> (entry, source) of the shipped step costs of ``device_kind`` ("cpu" | "gpu") (closeness:
    the kind), the slowest device of that kind; for a GPU, a CPU's where no GPU was measured (an
    overestimate, marked). What ``fnl plan`` uses for a shape it has not measured on this machine."""
    path = shipped_step_costs_path(shipped_dir)
    if not path.exists():
        return {}
    devices, provenance = _devices_and_provenance(path)
    out: dict[str, tuple[dict[str, Any], str]] = {}
    for kind in [device_kind] + (["cpu"] if device_kind == "gpu" else []):
        mine: dict[str, tuple[dict[str, Any], str]] = {}
        for device, entries in devices.items():
            if _kind(device) != kind:
                continue
            label = f"shipped ({short_device(device)})"
            if kind != device_kind:
                label += "; a CPU's: an overestimate"
            for key, c in entries.items():
                if key not in mine or float(c["train_s"]) > float(mine[key][0]["train_s"]):
                    mine[key] = (dict(c, device=device, provenance=provenance.get(device, "")), label)
        for key, v in mine.items():
            out.setdefault(key, v)
    return out


# -- rehearsal tables -----------------------------------------------------------------------------------


def write_rehearsal_csv(rows: list[dict], folder: str | os.PathLike) -> Path:
    """The rehearsal table of ``rows`` in ``folder`` (atomically; in the order given)."""
    path = rehearsal_csv(folder)
    write_csv(pd.DataFrame(rows, columns=list(CSV_COLUMNS)), path)
    return path


def read_rehearsal_rows(csv_path: str | os.PathLike, fix: str = "move it aside or rehearse without --resume"
                        ) -> list[dict]:
    """The rows of a rehearsal table (strings, as written); refused without :data:`CSV_COLUMNS`."""
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in CSV_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(f"{csv_path}: not a rehearsal table of this version (no column {', '.join(missing)}); "
                              f"{fix}")
        return list(reader)


@dataclass(frozen=True)
class Measured:
    """A rehearsal's measurements of one configuration (the largest over its passing rows)."""

    peak_rss_mb: float
    peak_device_mb: float | None
    checkpoint_mb: float
    written_per_checkpoint_mb: float
    on_gpu: bool
    random_init: bool = False  # only no_weights rows: measured without the pretrained weights


def _number(value) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def load_rehearsal(path: str | os.PathLike, gpu: bool) -> dict[str, Measured]:
    """config key -> :class:`Measured` of one rehearsal table, from rows of status ``pass`` or ``no_weights``
    (a failed row measured nothing); closeness: the kind (a GPU job prefers GPU rows), ties: the largest."""
    path = Path(path)
    if not path.exists():
        return {}
    rows: dict[str, list[dict]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row.get("status") in MEASURED and (_number(row.get("peak_rss_mb")) or 0) > 0:
                rows.setdefault(row["config"], []).append(row)
    out = {}
    for key, rs in rows.items():
        on_gpu = [r for r in rs if str(r.get("device", "")).startswith("cuda")]
        if gpu and on_gpu:
            rs = on_gpu
        elif not gpu:
            rs = [r for r in rs if r not in on_gpu] or rs
        device = [v for r in rs if (v := _number(r.get("peak_device_mb"))) is not None and v > 0]
        out[key] = Measured(
            peak_rss_mb=max(_number(r["peak_rss_mb"]) for r in rs),
            peak_device_mb=max(device) if device else None,
            checkpoint_mb=max(_number(r.get("checkpoint_mb")) or 0.0 for r in rs),
            written_per_checkpoint_mb=max(_number(r.get("written_per_checkpoint_mb")) or 0.0 for r in rs),
            on_gpu=any(r in on_gpu for r in rs),
            random_init=all(r["status"] == "no_weights" for r in rs),
        )
    return out


def _rehearsal_device(path: Path) -> str:
    try:
        with open(path, newline="") as f:
            devices = sorted({short_device(r.get("device") or "cpu") for r in csv.DictReader(f)})
    except OSError:
        return "?"
    return ", ".join(devices) or "?"


def rehearsal_with_sources(results_dir: str | os.PathLike, gpu: bool,
                           shipped_dir: str | os.PathLike | None = None) -> tuple[dict[str, Measured], dict[str, str]]:
    """(config key -> :class:`Measured`, config key -> where it came from) of a train job (closeness: the
    kind): the user's rehearsal (``RESULTS/plan/rehearsal.csv``), else the shipped ones; a measurement on
    the job's kind of device first, the other kind's where there is none."""
    own_path = own_rehearsal(results_dir)
    layers = [(load_rehearsal(own_path, gpu), f"{OWN} ({own_path})")]
    for path in shipped_rehearsals(shipped_dir):
        layers.append((load_rehearsal(path, gpu), f"shipped ({path.relative_to(path.parents[1])}, "
                                                  f"{_rehearsal_device(path)})"))
    out: dict[str, Measured] = {}
    sources: dict[str, str] = {}
    for key in {k for layer, _ in layers for k in layer}:
        found = [(layer[key], src) for layer, src in layers if key in layer]
        same_kind = [x for x in found if x[0].on_gpu == gpu]
        out[key], sources[key] = (same_kind or found)[0]
    return out, sources
