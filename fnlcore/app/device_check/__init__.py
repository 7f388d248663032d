"""``fnl device-check``: measure a GPU node in one go, within a time budget, writing as it goes.

    fnl device-check --device cuda --out DIR [--budget-s 420]     # a GPU node (one H100/H200)
    fnl device-check --device cpu --quick --out DIR                # every section at a small size (the test)
    fnl device-check --ship-step-costs DIR/step_costs.json         # add a GPU's step costs to the shipped ones

Sections, in the order they run (each in its own ``try``: an error is written into its output and
the next section runs; each has a share of the budget, and what its share cannot hold is skipped
with a note), one module each:

* environment (:mod:`.probes`): torch, CUDA, cuDNN, the device, TF32 and cuDNN flags (``env.csv``);
* (a) every registered method, a short run on the device on both engines beside the same run on
  the CPU with the same seed (:mod:`.tiny`; ``methods.csv``). Flagged where the first round differs
  by more than 1e-3 relative;
* (c) host-device synchronisations per local step, counted during (a)'s device runs (:mod:`.syncs`;
  ``syncs.csv``);
* (b) seconds per round of a bare loop and both engines (batched vs sequential) at the papers' shapes,
  NCHW and channels-last, fp32 and bf16, on CUDA also the batched engine with CUDA graphs on beside
  off (:mod:`.timing`; ``timing.csv``);
* (d) the device's step costs for every step shape the project ships, in ``fnl plan``'s
  calibration format (:mod:`.step_costs`; ``step_costs.json``, ``step_costs.csv``);
* (f) run groups of 1, 2, 4 and 8 identical small runs started at once on the one device, as a
  ``train_group`` job starts them: wall time, runs per hour, throughput over one run alone, and
  the share of the time two or more ran at once (:mod:`.groups`; ``groups.csv``);
* (e) a rehearsal (:mod:`fnlcore.app.rehearse`: start, checkpoint, kill, resume) of the six
  costliest paper configurations by the shipped estimates, with peak device memory
  (:mod:`.rehearsal`; ``rehearsal.csv``; ``rehearsal/rehearsal.csv`` in the project's rehearsal format).

``summary.md`` holds all of it, rewritten after every section (:mod:`.report`). Nothing is downloaded
(pretrained models are rehearsed with random initialisation) and nothing is written outside
``--out``. Needs neither Snakemake nor jsonschema: the paper files it reads are the shipped ones,
which the test suite validates against their schema.
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import torch

from ...fl.context import device_problem, resolve_device
from .groups import check_groups
from .probes import environment
from .rehearsal import COSTLIEST, check_rehearsal
from .report import Report, Section
from .step_costs import check_step_costs
from .timebox import Check, TimeBoxExceeded, time_box
from .timing import check_timing
from .tiny import check_methods

DEFAULT_BUDGET_S = 420.0
GRACE_S = 10.0  # how far past its share an in-process section may run before its alarm stops it


@dataclass(frozen=True)
class SectionSpec:
    """One section of the check: ``share`` of the budget (over the shares of the sections still to run);
    ``boxed``: in-process, held to its share by an alarm (the others bound their own child processes)."""

    key: str
    title: str
    share: float
    boxed: bool
    measure: Callable[[Check, Section, float], None]


SECTIONS = (
    SectionSpec("methods", "(a) every method on the device vs the CPU, and (c) host-device synchronisations", 0.25,
                True, check_methods),
    SectionSpec("timing", "(b) seconds per round at the papers' shapes", 0.22, True, check_timing),
    SectionSpec("step_costs", "(d) step costs of this device (`fnl plan`'s calibration)", 0.13, True,
                check_step_costs),
    SectionSpec("groups", "(f) run groups: identical runs started at once on the device", 0.12, False, check_groups),
    SectionSpec("rehearsal", f"(e) rehearsal of the {COSTLIEST} costliest paper configurations", 0.40, False,
                check_rehearsal),
)


def run(device: str, out: str | os.PathLike, quick: bool = False, budget_s: float = DEFAULT_BUDGET_S,
        threads: int = 0, rehearse_jobs: int = 0, command: str = "", log: Callable[[str], None] = print) -> int:
    """The whole check (module docstring); 0 when every section ran, 1 when one failed or was cut,
    2 when the device cannot be used (the environment is written either way)."""
    if threads:
        torch.set_num_threads(threads)
    out = Path(out)
    header = [f"`{command or 'fnl device-check'}`", "",
              f"Started {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; budget {budget_s:.0f} s"
              f"{'; quick (small sizes: a test of the command, not a measurement)' if quick else ''}."]
    report = Report(out, header)
    env = environment(resolve_device(device) if device_problem(device) is None else torch.device("cpu"))
    env_section = report.section("env", "Environment")
    env_table = report.table(env_section, ("key", "value"))
    for k, v in env.items():
        env_table.add({"key": k, "value": v})
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
    for i, spec in enumerate(SECTIONS):
        ok &= run_section(check, spec, spec.share / sum(s.share for s in SECTIONS[i:]))
        if check.device.type == "cuda":
            torch.cuda.empty_cache()
    took = time.monotonic() - check.started
    header.append(f"Took {took:.0f} s.")
    path = report.write()
    log(f"fnl device-check: {'every section ran' if ok else 'some sections failed or were cut'} in {took:.0f} s; "
        f"{path}")
    return 0 if ok else 1


def run_section(check: Check, spec: SectionSpec, fraction: float) -> bool:
    """One section within ``fraction`` of the budget left; its errors go into its notes, never up."""
    section = check.report.section(spec.key, spec.title)
    left = check.left()
    if left < 5:
        section.status = "skipped: the budget is spent"
        check.log(f"== {spec.title}: skipped, the budget is spent")
        check.report.write()
        return False
    share = left * fraction
    deadline = time.monotonic() + share
    check.log(f"== {spec.title} (time box {share:.0f} s)")
    t0 = time.monotonic()
    ok = False
    try:
        with time_box(share + GRACE_S) if spec.boxed else contextlib.nullcontext():
            spec.measure(check, section, deadline)
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
