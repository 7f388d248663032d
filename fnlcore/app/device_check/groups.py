"""(f) Run groups on one device: 1, 2, 4 and 8 identical small training runs started at once, each its own
process, the way a ``train_group`` job starts its runs (:func:`fnlcore.app.run_group.train_group`), so the
numbers are the project's run groups' own. Per group size: the wall time, runs per hour, the throughput
over one run alone, and the share of the time two or more runs were training at once
(:func:`fnlcore.app.run_group.overlap_share`); ``groups.csv``."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np
import pandas as pd

from ...assignment import ClientAssignment
from ...datasets.base import DatasetInfo, write_prepared
from ...errors import EXIT_CONTINUE
from ...io import write_parquet
from ...methods import METHODS
from ..run_group import Member, overlap_share, train_group
from ..train import RunSpec
from .report import Section
from .timebox import Check
from .tiny import QUICK_RUN, TinyRun, tiny_arrays

GROUP_SIZES = (1, 2, 4, 8)
QUICK_GROUP_SIZES = (1, 2)  # --quick: a test of the section, seconds on a CPU
# A papers' CIFAR shape (ResNet-18, batch 32) on a small federation: seconds of training a run, so the
# group's start-up (a process, torch and a CUDA context per run) weighs as it does in a short run.
GROUP_RUN = TinyRun("resnet18_cifar", 32, 128, 32, 256, 3, clients=8)
GROUP_METHOD = "fedavg"
GROUP_COLUMNS = ("runs", "status", "wall_s", "runs_per_hour", "throughput_vs_1", "overlap_share", "run_s_mean",
                 "error")


def write_stand_in(run: TinyRun, folder: Path) -> tuple[str, str]:
    """(prepared dataset folder, noisy-label parquet) of ``run``'s class-coloured images
    (:func:`.tiny.tiny_arrays`), written as a train job reads them."""
    a = tiny_arrays(run, multi=False)
    info = DatasetInfo(name="device_check_stand_in", num_classes=a["classes"],
                       class_names=tuple(f"c{i}" for i in range(a["classes"])), multi_label=False, channels=3,
                       image_size=(run.size, run.size), in_memory=True, source="fnl device-check", papers=(),
                       prepare=lambda ctx: None)
    n, n_test = len(a["y"]), len(a["y_test"])
    index = pd.DataFrame({"sample_id": np.r_[np.arange(n), np.arange(n_test)],
                          "split": ["train"] * n + ["test"] * n_test, "label": np.r_[a["y"], a["y_test"]]})
    data_dir = folder / "prepared"
    write_prepared(data_dir, info, index, arrays={"x_train": a["x"], "x_test": a["x_test"]})
    frame = ClientAssignment(n, tuple(a["clients"])).to_frame()
    frame["label_true"] = a["y"][frame["sample_id"]]
    frame["label_given"] = a["given"][frame["sample_id"]]
    frame["is_noisy"] = frame["label_true"] != frame["label_given"]
    noise = folder / "noise.parquet"
    write_parquet(frame, noise)
    return str(data_dir), str(noise)


def group_members(run: TinyRun, size: int, data_dir: str, noise: str, folder: Path, device: str) -> list[Member]:
    """``size`` identical runs (the same settings and seed), each with its own outputs under ``folder``."""
    settings = run.settings("default", multi=False)
    members = []
    for i in range(size):
        out = folder / f"run{i}"
        spec = RunSpec(data_dir, noise, run.clients, settings, METHODS[GROUP_METHOD].Params(), 0,
                       str(out / "metrics.parquet"), str(out / "clients.parquet"), str(out / "final.pt"),
                       str(out / "checkpoint.pt"), device=device)
        members.append(Member(spec, identity=f"device-check-group-{size}", log=str(out / "run.log"), tag=f"g{size}.{i}"))
    return members


def check_groups(check: Check, section: Section, deadline: float) -> None:
    table = check.report.table(section, GROUP_COLUMNS)
    run = QUICK_RUN if check.quick else GROUP_RUN
    sizes = QUICK_GROUP_SIZES if check.quick else GROUP_SIZES
    threads = check.threads or 1
    folder = check.out / "groups"
    data_dir, noise = write_stand_in(run, folder / "data")
    section.notes.append(
        f"{', '.join(map(str, sizes))} identical runs ({GROUP_METHOD}, {run.model}, 3x{run.size}x{run.size}, "
        f"{run.clients} clients x {run.per_client} samples, batch {run.batch}, {run.rounds} rounds, "
        f"`training.engine: default`) started at once on `{check.device}`, each its own process with {threads} "
        "thread(s), as a `train_group` job starts a run group (`fnlcore.app.run_group.train_group`). `wall_s`: "
        "from the group's start to its last run's end (process start-up included, as in a group job); "
        "`throughput_vs_1`: runs per hour over one run's alone; `overlap_share`: the share of the group's time "
        "with two or more of its runs running at once; `run_s_mean`: a run's own time, start to end. "
        f"Logs and outputs: `{folder.name}/`.")
    alone_per_s = None
    last_wall = 0.0
    for size in sizes:
        left = deadline - time.monotonic()
        if left < max(10.0, last_wall):  # not even a perfectly parallel group of the last one's time fits
            table.add({"runs": size, "status": "skipped", "error": "time box spent"})
            continue
        members = group_members(run, size, data_dir, noise, folder / f"size{size}", str(check.device))
        record = folder / f"size{size}" / "group.json"
        t0 = time.monotonic()
        status = train_group(members, record, time_budget_s=left, threads=threads, log=lambda m: None)
        wall = last_wall = time.monotonic() - t0
        if status != 0:
            cut = status == EXIT_CONTINUE
            why = "stopped at the time box with checkpoints" if cut else f"a run failed: see {folder.name}/size{size}/"
            table.add({"runs": size, "status": "cut" if cut else "failed", "wall_s": round(wall, 2),
                       "error": why})
            continue
        spans = [(r["start"], r["end"]) for r in json.loads(record.read_text())["runs"]]
        per_s = size / wall
        alone_per_s = alone_per_s or (per_s if size == 1 else None)
        row = {"runs": size, "status": "ok", "wall_s": round(wall, 2), "runs_per_hour": round(3600 * per_s, 1),
               "throughput_vs_1": round(per_s / alone_per_s, 3) if alone_per_s else "",
               "overlap_share": round(overlap_share(spans), 3),
               "run_s_mean": round(statistics.mean(e - s for s, e in spans), 2)}
        table.add(row)
        check.log(f"   {size} run(s) at once: {row['wall_s']} s, {row['runs_per_hour']} runs/h "
                  f"(x{row['throughput_vs_1']} of one alone), two or more at once {row['overlap_share']:.0%} of the time")
