"""(e) A rehearsal (:mod:`fnlcore.app.rehearse`: start, checkpoint, kill, resume) of the costliest paper
configurations, ranked by the shipped step costs, with peak device memory (``rehearsal.csv``, and
``rehearsal/`` a rehearsal table in the project's format)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ... import schemas
from ..cost import run_work, step_shape
from ..measurements import shipped_step_costs
from ..plan import build_plan
from ..rehearse import Options, distinct_configs, rehearse_one, write_rehearsal
from ..runs import PAPERS_DIR
from .report import Section
from .timebox import Check

COSTLIEST = 6  # configurations rehearsed

REHEARSAL_COLUMNS = ("rank", "config", "estimate_h", "status", "error", "peak_device_mb", "peak_rss_mb",
                     "checkpoint_mb", "s_per_step", "steps", "wall_s")
REHEARSAL_SHOWN = ("rank", "config", "estimate_h", "status", "peak_device_mb", "peak_rss_mb", "s_per_step", "wall_s",
                   "error")


@contextlib.contextmanager
def shipped_papers_trusted():
    """Read the shipped paper and scale files without their JSON Schema pass: GPU nodes lack
    jsonschema, and these very files are validated by the test suite (tests/test_config.py); every
    spec is still built through its checking constructor."""
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


def check_rehearsal(check: Check, section: Section, deadline: float) -> None:
    table = check.report.table(section, REHEARSAL_COLUMNS, REHEARSAL_SHOWN)
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
