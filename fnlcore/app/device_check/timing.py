"""(b) Seconds per round of a bare loop and both engines (batched vs sequential) at the papers' shapes,
NCHW and channels-last, fp32 and bf16; on CUDA also the batched engine with CUDA graphs on
(``training.cuda_graphs``, :mod:`fnlcore.fl.batched`) beside it off (:mod:`fnlcore.app.benchmark`; ``timing.csv``)."""

from __future__ import annotations

import gc
import time

import torch

from .. import benchmark
from .report import Section
from .timebox import Check

TIMING_SHOWN = ("case", "engine", "layout", "precision", "s_per_round", "s_per_step", "speedup_vs_sequential",
                "efficiency_vs_bare", "diff_vs_batched", "reps", "status")


def check_timing(check: Check, section: Section, deadline: float) -> None:
    table = check.report.table(section, benchmark.ROW_COLUMNS, TIMING_SHOWN)
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
    if benchmark.GRAPHS not in benchmark.engines(check.device):
        section.notes.append(f"CUDA graphs on/off (`{benchmark.GRAPHS}`): skipped on `{check.device}`: a CUDA graph "
                             "captures CUDA kernels, so there is nothing to capture on a CPU.")
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
