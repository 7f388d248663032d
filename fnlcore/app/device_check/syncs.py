"""(c) Host-device synchronisations per local step, counted during (a)'s device runs: on CUDA every
``torch.cuda.set_sync_debug_mode("warn")`` warning, split by whether it came inside a step
(:func:`fnlcore.syncs.step_region`); everywhere the project's own counter (:class:`fnlcore.syncs.SyncCounter`)."""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from ...syncs import SyncCounter, in_step

SYNC_COLUMNS = (
    "method", "model", "engine", "device", "status", "steps_marked", "optimizer_steps", "syncs_in_steps", "syncs_run",
    "marked_in_steps", "syncs_per_step", "per_step_basis", "where",
)
SYNC_SHOWN = ("method", "model", "engine", "steps_marked", "optimizer_steps", "syncs_in_steps", "syncs_run",
              "marked_in_steps", "syncs_per_step", "per_step_basis")


@dataclass
class Tally:
    """Synchronisations counted during one run (section (c))."""

    counter: Any  # fnlcore.syncs.SyncCounter
    cuda_in_steps: int = 0
    cuda_run: int = 0
    where: list[str] = field(default_factory=list)
    optimizer_steps: int = 0
    steps: int = 0  # local steps the engines marked during the run


@contextlib.contextmanager
def counting_syncs(device: torch.device):
    """Count host-device synchronisations: the project's counter everywhere (its marks), and on CUDA
    every warning of ``torch.cuda.set_sync_debug_mode("warn")``, inside a marked step or not. The
    debug mode is back at 0 afterwards, whatever happens."""
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
                    if in_step():
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


def sync_note(device: torch.device) -> str:
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
