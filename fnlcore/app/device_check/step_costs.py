"""(d) The device's step costs for every step shape the project ships, measured as ``fnl plan
--recalibrate`` does, in the step-cost file format (written through :mod:`fnlcore.app.measurements`),
with the FedAvg rounds (b) timed on both engines: what prices the device's batched engine."""

from __future__ import annotations

import csv
import math
import os
import time
from datetime import datetime, timezone

import torch

from ...provenance import code_version
from ..benchmark import PAPER_CASES
from ..cost import device_description, load_per_core, measure_step
from ..gpu_cost import shape_from_key
from ..measurements import shipped_shapes, step_cost_file, step_costs_in, write_step_cost_file
from .probes import device_words
from .report import Section
from .timebox import Check, TimeBoxExceeded

STEP_COST_COLUMNS = ("shape", "train_s", "eval_ms_per_sample", "took_s", "shipped_gpu_train_s", "shipped_gpu",
                     "status", "error")


def _cpu_cost(entries: dict[str, dict]) -> float:
    return max((float(e["train_s"]) for d, e in entries.items() if d.startswith("cpu")), default=math.inf)


def batched_rows(timing_csv: str | os.PathLike) -> list[dict]:
    """The FedAvg cases of (b) timed on both engines (contiguous fp32, the batched engine having run), as
    the step-cost file's ``batched`` rows: the case's step shape, its clients, seconds a round of each."""
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


def check_step_costs(check: Check, section: Section, deadline: float) -> None:
    table = check.report.table(section, STEP_COST_COLUMNS)
    shipped = shipped_shapes()
    keys = sorted(shipped, key=lambda k: _cpu_cost(shipped[k]))  # cheapest first: a cut keeps the most shapes
    if check.quick:
        keys = [k for k in keys if _cpu_cost(shipped[k]) < 0.05][:2]
    description = device_description(check.device)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    provenance = (f"measured {when} by `fnl device-check` on {description.split('|')[0].removeprefix('cuda:')} "
                  f"({device_words(check.device)}), code {code_version()}")
    path = step_costs_in(check.out)
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
            cost = measure_step(shape_from_key(key), check.device, steps=steps)
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
        write_step_cost_file(step_cost_file(entries, description, provenance, batched_rows(check.out / "timing.csv"),
                                            memory), path)
        table.add({**base, "train_s": round(cost.train_s, 5), "eval_ms_per_sample": round(1000 * cost.eval_s, 5),
                   "took_s": round(took, 1), "status": "ok"})
