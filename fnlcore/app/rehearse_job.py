"""One rehearsal job: a configuration trained on its stand-in in this process (``fnl rehearse`` starts it).

    python -m fnlcore.app.rehearse_job SPEC.json PHASE

The spec is JSON (:func:`fnlcore.app.rehearse.read_spec`), never a pickle: reading it runs no code.

Phase 1 trains up to the first checkpoint and waits there to be killed (SIGKILL, by the
parent); phase 2 resumes from that checkpoint and finishes. Each phase appends its
measurements as JSON lines to ``events.jsonl`` beside the spec: ``checkpoint`` (sizes,
bytes written, peak RSS so far), ``done`` (timings, peaks) or ``error`` (one line).

The run (the spec's) is the configuration's first run in the plan, shortened but with every stage entered:
``training.rounds`` set to ``rounds`` with the method's round-valued hyper-parameters scaled
along (:func:`fnlcore.app.papers.rescale_rounds`, as the smoke scale does), passes over every
client before the rounds (``param(..., passes=True)``) cut to :data:`MAX_PASSES`, one local epoch
of ``steps`` batches a client, and a test set of ``eval_samples``. With ``per_round`` set,
a round trains at most that many of its clients and a one-client-a-round pass over all
clients (FedCorr's pre-processing, FedDiv's warm-up) runs in two groups. With ``pass_clients``
set, only such a pass is cut so (two groups, that many clients trained in each) and the
rounds keep every client: what a pass holds is one client and the per-client state sized
by all clients, so the rounds' peak is still measured, in a fraction of the time.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

from ..safe_files import open_regular
from ..errors import FNLError
from ..fl import simulation as simulation_module
from ..fl.context import resolve_model_name
from ..fl.context import resolve_device
from ..fl.simulation import Simulation
from ..methods import METHODS
from ..models import build_model
from ..spec import pass_fields
from .cost import _data_shape
from .papers import rescale_rounds
from .rehearse import read_spec
from .standin import standin_data
from .train import build_context

WEIGHTS_ERROR = "pretrained weights"  # how fnlcore.models' download errors begin
# Passes over every client before training.rounds (FedCorr's pre-processing, FedDiv's warm-up), at
# most: the first pass and one that follows a pass enter every code path, and what a pass holds
# in memory or writes does not grow with their count (per-client state is sized by the clients).
# Five or ten passes over 100-500 clients are most of such a rehearsal's time otherwise.
MAX_PASSES = 2


def peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM), in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def folder_bytes(path: Path, since: float = 0.0) -> int:
    """Bytes of the files under ``path`` (those modified at or after ``since``)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            st = os.stat(os.path.join(root, name))
            if st.st_mtime >= since:
                total += st.st_size
    return total


class Events:
    def __init__(self, path: Path, phase: int):
        self.path, self.phase = path, phase

    def emit(self, kind: str, **fields) -> None:
        with open_regular(self.path, "a") as f:
            f.write(json.dumps({"event": kind, "phase": self.phase, **fields}) + "\n")
            f.flush()
            os.fsync(f.fileno())


def weights_problem(model: str, num_classes: int, channels: int, image_size) -> str | None:
    """Why the model's pretrained weights cannot be had here (None: they can)."""

    try:
        build_model(model, num_classes, channels, tuple(image_size), pretrained=True)
    except FNLError as err:
        if WEIGHTS_ERROR in str(err):
            return str(err).splitlines()[0]
        raise
    return None


def shortened(run, spec: dict):
    """(training settings, method params) of the rehearsal of ``run`` (module docstring)."""

    t = run.training
    rounds = int(spec["rounds"])
    params = rescale_rounds(run.method, t.rounds, rounds)
    params = dataclasses.replace(params, **{f: min(getattr(params, f), MAX_PASSES) for f in pass_fields(type(params))})
    if (spec["per_round"] or spec.get("pass_clients")) and "frac1" in {f.name for f in dataclasses.fields(params)}:
        params = dataclasses.replace(params, frac1=0.5)  # a pass in two groups, each capped
    settings = dataclasses.replace(t, rounds=rounds, local_epochs=1)
    total = sum(st.rounds for st in METHODS[params.name].schedule(params, settings, run.partition.num_clients))
    return dataclasses.replace(settings, checkpoint_every=max(1, total // 2)), params


def main(argv: list[str]) -> int:
    spec_path, phase = Path(argv[0]), int(argv[1])
    events = Events(spec_path.parent / "events.jsonl", phase)
    try:
        # JSON rebuilt through the config's constructors: a crafted file is refused, not run
        return _rehearse(read_spec(spec_path), phase, events)
    except BaseException as err:  # every failure becomes one line of the table
        kind = type(err).__name__
        msg = " ".join(str(err).split()) or kind
        if isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in msg.lower():
            kind = "out of memory"
        events.emit("error", error=f"{kind}: {msg}"[:600], peak_rss_mb=peak_rss_mb())
        return 1


def _rehearse(spec: dict, phase: int, events: Events) -> int:
    torch.set_num_threads(int(spec["threads"]))
    device = resolve_device(spec["device"])
    run, options = spec["run"], spec["dataset_options"]
    settings, params = shortened(run, spec)
    ds = _data_shape(run, options)
    if settings.pretrained:
        why = weights_problem(resolve_model_name(settings.model, ds.channels, tuple(ds.image_size)),
                              ds.num_classes, ds.channels, ds.image_size)
        if why is not None:
            events.emit("no_weights", reason=why)
            settings = dataclasses.replace(settings, pretrained=False)
    steps = int(spec["steps"])
    data = standin_data(run.dataset, ds.n_train, min(int(spec["eval_samples"]), ds.n_test),
                        run.partition.num_clients, steps * settings.batch_size, device, settings.image_transform)
    messages: list[str] = []

    def log(msg: str) -> None:
        messages.append(msg)
        print(msg, file=sys.stderr, flush=True)

    ctx = build_context(data, run.dataset, ds.image_size, ds.channels, settings, run.seed, device, log=log)
    method = METHODS[params.name](params, ctx)
    timing = {"client_s": 0.0, "client_updates": 0, "eval_s": 0.0, "trained_rounds": 0}
    _time_rounds(method, int(spec["per_round"]), int(spec.get("pass_clients") or 0), settings.rounds, timing)
    evaluate = simulation_module.evaluate

    def timed_evaluate(*a, **kw):
        t0 = time.perf_counter()
        try:
            return evaluate(*a, **kw)
        finally:
            timing["eval_s"] += time.perf_counter() - t0

    simulation_module.evaluate = timed_evaluate
    checkpoint = Path(spec["workdir"]) / "run.pt"
    sim = Simulation(method, ctx, checkpoint, progress=log)
    _watch_checkpoints(sim, checkpoint, events, phase, device, timing)
    rows = sim.run().to_dict("records")
    bad = [n for n, p in method.eval_model().named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise FloatingPointError(f"non-finite parameters after training ({', '.join(bad[:3])})")
    resumed = next((m for m in messages if m.startswith("resumed from")), None)
    events.emit("done", resumed=resumed, stages=sorted({r["stage"] for r in rows}), rounds=len(rows),
                steps=steps, peak_rss_mb=peak_rss_mb(), peak_device_mb=_device_peak_mb(device), **timing)
    return 0


def _time_rounds(method, per_round: int, pass_clients: int, rounds: int, timing: dict) -> None:
    """Cap the clients of a round (``per_round`` > 0; in a pass before the rounds ``pass_clients``
    > 0) and time the round's client work: the engine consumes the round's updates inside ``aggregate``."""
    select, aggregate = method.select_clients, method.aggregate
    passes = method.num_rounds() - rounds  # the rounds before training.rounds: passes over every client

    def select_clients(r):
        chosen = select(r)
        cap = pass_clients if pass_clients and r < passes else per_round
        return chosen[:cap] if cap else chosen

    def timed_aggregate(r, updates):
        t0 = time.perf_counter()
        counted = []

        def counting():
            for u in updates:
                counted.append(u.client)
                yield u

        aggregate(r, counting())
        timing["client_s"] += time.perf_counter() - t0
        timing["client_updates"] += len(counted)
        timing["trained_rounds"] += 1

    method.select_clients = select_clients
    method.aggregate = timed_aggregate


def _device_peak_mb(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


def _watch_checkpoints(sim, checkpoint: Path, events: Events, phase: int, device: torch.device, timing: dict) -> None:
    """Record each checkpoint's size and what it wrote; phase 1 waits after its first to be killed."""
    save = sim._save
    store_dir = Path(str(checkpoint) + ".clients")

    def watched_save(next_round: int) -> None:
        # what changed since the previous checkpoint (its file's time; a resumed process too)
        since = checkpoint.stat().st_mtime if checkpoint.exists() else 0.0
        save(next_round)
        main = checkpoint.stat().st_size if checkpoint.exists() else 0
        events.emit("checkpoint", next_round=next_round, checkpoint_bytes=main + folder_bytes(store_dir),
                    written_bytes=main + folder_bytes(store_dir, since=since), store_files=_count(store_dir),
                    peak_rss_mb=peak_rss_mb(), peak_device_mb=_device_peak_mb(device),
                    client_updates=timing["client_updates"])  # this process's so far
        if phase == 1:
            while True:  # the parent kills this process now (SIGKILL), as a pre-emption would
                time.sleep(1)

    sim._save = watched_save


def _count(path: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(path))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
