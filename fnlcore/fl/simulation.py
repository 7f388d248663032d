"""The server loop: rounds, evaluation, per-round metrics, checkpoints and resume.

A run checkpoints every ``checkpoint_every`` rounds to a file that is not a
declared workflow output. Rerun after a kill (SIGKILL, pre-emption, scancel),
it resumes from the last checkpoint; since the checkpoint holds the method's
full state, the working labels and every random stream, the resumed run
produces exactly the numbers of an uninterrupted one (on the CPU; cuDNN
kernels may not be bit-deterministic on a GPU).

A checkpoint records what made it (:class:`~fnlcore.provenance.Provenance`: the code's
version and a digest of the run's settings). A checkpoint of other code or other settings
is never resumed: the run restarts from round 0 and the log says so, naming both. Reading a
checkpoint never runs code (``torch.load(weights_only=True)`` of tensors and plain data, see
:mod:`~fnlcore.fl.persist`). An unreadable checkpoint (truncated by a full disk or a kill during a
copy, written by an older version in the pickle format, crafted, or not of a checkpoint's shape) is
moved aside to ``<checkpoint>.corrupt`` (``.corrupt.1``, ... when that exists: nothing is overwritten)
and the run restarts, saying so. Before each checkpoint the free
space is checked against the state's size, so a full disk stops the run with the folder,
the needed and the free bytes instead of a library message.

Given a time budget (:class:`~fnlcore.fl.time_budget.TimeBudget`: the seconds its job may
still run), the loop stops before the job's time limit instead of being killed at it: after
a round, when one more round and a checkpoint would not fit, it checkpoints (unless that
round was just checkpointed) and raises :class:`~fnlcore.errors.RunIncomplete`; the next job
resumes there. Every job runs at least one round, so a run always advances. The checkpoint
cadence counts rounds from the start of the run (``round % checkpoint_every``), so an extra
checkpoint at a stop shifts no later one, and the numbers equal an uninterrupted run's.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd
import torch

from ..errors import ConfigError, DataError, RunIncomplete
from ..io import atomic_path, ensure_free_space
from ..provenance import Provenance, plugin_digest
from ..progress import round_line
from .context import RunContext
from .local import evaluate
from .persist import load_method_state, load_safely, method_state, missing_store_files, refusal, to_safe_form
from .rounds import RoundEngine
from .time_budget import TimeBudget

# 2: the relabel log; 3: declared method state, per-client stores on disk; 4: what made it (code, settings);
# 5: tensors and plain data only, read with weights_only=True (persist.to_safe_form)
CHECKPOINT_VERSION = 5

# Training settings that never change a run's numbers (kept out of its identity, as out of its path).
_NOT_IDENTITY = ("checkpoint_every",)


def run_identity(method, ctx: RunContext, extra: Mapping[str, Any] | None = None) -> dict:
    """Everything that determines a run's numbers, as the engine sees it; ``extra`` adds what it
    cannot see (the dataset, a digest of the noisy labels). The device is left out: a checkpoint
    resumes on another device."""
    training = {f.name: getattr(ctx.settings, f.name) for f in dataclasses.fields(ctx.settings)
                if f.name not in _NOT_IDENTITY}
    return {"training": training, "method": method.params, "seed": ctx.seed, "model": ctx.model_name,
            "clients": len(ctx.data.clients), "plugin_code": plugin_digest(type(method)), **(extra or {})}


class Simulation:
    def __init__(
        self,
        method,
        ctx: RunContext,
        checkpoint_path: str | Path | None = None,
        progress: Callable[[str], None] | None = None,
        stop_after: int | None = None,
        identity: Mapping[str, Any] | None = None,
        time_budget: TimeBudget | None = None,
    ):
        """``identity``: what, besides the engine's settings, makes this run (see :func:`run_identity`).
        ``time_budget``: stop before it runs out, with a checkpoint (the module's docstring)."""
        if time_budget is not None and not checkpoint_path:
            raise ConfigError("a time budget needs a checkpoint path: a run stopped at its budget continues "
                              "from its checkpoint; give checkpoint_path or no budget")
        self.method = method
        self.ctx = ctx
        self.checkpoint_path = Path(checkpoint_path) if checkpoint_path else None
        self.progress = progress or (lambda s: print(s, file=sys.stderr, flush=True))
        self.stop_after = stop_after  # for tests: stop (as if killed) after this many rounds
        self.time_budget = time_budget
        self.rows: list[dict] = []
        self.engine = RoundEngine(method)
        self.stores = method.stores()
        for st in self.stores:  # per-client state beside the checkpoint (a temporary folder without one)
            st.attach(self._store_folder(st.name))
        self.provenance = Provenance.of(run_identity(method, ctx, identity))

    def _store_folder(self, name: str) -> Path | None:
        if self.checkpoint_path is None:
            return None
        return Path(str(self.checkpoint_path) + ".clients") / name

    # -- checkpoints -----------------------------------------------------------------------
    def _save(self, next_round: int) -> None:
        if self.checkpoint_path is None:
            return
        started = self.time_budget.clock() if self.time_budget is not None else 0.0  # the stores' writes count
        payload = {
            "version": CHECKPOINT_VERSION,
            "made_by": self.provenance.to_dict(),
            "next_round": next_round,
            "method": method_state(self.method, files=True),
            "given": self.ctx.data.given.detach().cpu().clone(),
            "relabels": self.ctx.data.relabels.state_dict(),
            "rng": self.ctx.rng_state(),
            "rows": self.rows,
        }
        ensure_free_space(self.checkpoint_path.parent, estimated_size(payload), f"checkpoint {self.checkpoint_path.name}")
        safe = to_safe_form(payload, "checkpoint")  # before the write: a type it cannot hold fails here, naming it
        with atomic_path(self.checkpoint_path, suffix=".pt") as tmp:
            torch.save(safe, tmp)
        for st in self.stores:
            st.committed()
        if self.time_budget is not None:
            self.time_budget.checkpoint_took(self.time_budget.clock() - started)

    def _restore(self) -> int:
        path = self.checkpoint_path
        if path is None or not path.exists():
            return 0
        started = self.time_budget.clock() if self.time_budget is not None else 0.0
        try:
            payload = load_safely(path)  # tensors and plain data only: the folder may be writable by others
        except PermissionError as err:
            raise DataError(f"{path}: cannot read the run's checkpoint ({err}); make it readable and rerun") from None
        except Exception as err:  # truncated or corrupt (zip, EOF errors), older format or crafted (refused)
            return self._restart(f"checkpoint {path} is unreadable ({refusal(err)})", aside=True)
        if not isinstance(payload, dict) or not isinstance(payload.get("version"), int):
            return self._restart(f"checkpoint {path} is unreadable (not a checkpoint: no format version)", aside=True)
        made_by = Provenance.from_dict(payload.get("made_by"))
        if payload.get("version") != CHECKPOINT_VERSION or not self.provenance.same_as(made_by):
            old = made_by.describe() if made_by is not None else (
                f"checkpoint format {payload.get('version')!r}, which does not record its code and settings")
            return self._restart(f"checkpoint {path} was written by {old}; this run is {self.provenance.describe()}")
        try:
            _check_payload(payload, self.ctx, self.method)
            missing = missing_store_files(self.method, payload["method"])
        except (TypeError, ValueError, KeyError, AttributeError) as err:  # before anything is loaded into the run
            return self._restart(f"checkpoint {path} is unreadable (not a checkpoint of this run: {err})", aside=True)
        if missing:
            return self._restart(f"checkpoint {path} names per-client files that are gone ({', '.join(missing[:3])})",
                                 aside=True)
        load_method_state(self.method, payload["method"])
        self.ctx.data.given.copy_(payload["given"].to(self.ctx.data.given.device))
        self.ctx.data.relabels.load_state_dict(payload["relabels"])
        self.ctx.load_rng_state(payload["rng"])
        self.rows = list(payload["rows"])
        if self.time_budget is not None:  # until this job writes one, reading is the estimate of a write
            self.time_budget.checkpoint_took(self.time_budget.clock() - started)
        self.progress(f"resumed from {path} at round {payload['next_round']} ({self.provenance.describe()})")
        return int(payload["next_round"])

    def _restart(self, why: str, aside: bool = False) -> int:
        """Start from round 0: the checkpoint is moved to ``<checkpoint>.corrupt`` (``aside``: one that does
        not load, kept for a look) or removed (a readable one of other code or settings), its per-client
        files go, and the log says why."""
        assert self.checkpoint_path is not None
        if aside:
            kept = _free_name(Path(str(self.checkpoint_path) + ".corrupt"))
            os.rename(self.checkpoint_path, kept)
            done = f"moved it to {kept}"
        else:
            os.remove(self.checkpoint_path)
            done = "removed it"
        for st in self.stores:
            st.reset()
        self.progress(f"{why}: {done}; restarting the run from round 0")
        return 0

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> pd.DataFrame:
        m, ctx = self.method, self.ctx
        total = m.num_rounds()
        start = self._restore()
        every = ctx.settings.checkpoint_every
        budget = self.time_budget
        for r in range(start, total):
            t0 = time.perf_counter()
            round_started = budget.clock() if budget is not None else 0.0
            for st in self.stores:
                st.begin_round(r)
            m.begin_round(r)
            clients = m.select_clients(r)
            engine, at_once = self.engine.mode(r, clients)
            m.aggregate(r, self.engine.updates(r, clients))
            m.end_round(r)
            for st in self.stores:  # what this round wrote goes to disk, out of memory
                st.end_round()
            row = {"round": r, "stage": m.stage_name(r), "clients": len(clients)}
            if m.should_evaluate(r):
                row.update(evaluate(ctx, m.eval_model()))
            row.update(m.round_info)
            # how the round ran (execution, like its seconds: no part of the results)
            row["engine"], row["clients_at_once"] = engine, at_once
            row["seconds"] = time.perf_counter() - t0
            self.rows.append(row)
            main = "bacc" if "bacc" in row else "acc"
            score = f"{main}={row[main]:.4f}" if main in row else "not evaluated"
            how = f"{engine}, {at_once} at once" if engine == "batched" else engine
            self.progress(round_line(r, total, f"[{row['stage']}] {score} ({row['seconds']:.1f}s, {how})"))
            done = r + 1
            if budget is not None:
                budget.round_took(budget.clock() - round_started)
            saved = done % every == 0 or done == total
            if saved:
                self._save(done)
            if self.stop_after is not None and done >= self.stop_after:
                break
            if budget is not None and done < total and not budget.another_round_fits():
                self._stop_for_time(done, total, saved)
        return self.metrics()

    def _stop_for_time(self, done: int, total: int, saved: bool) -> None:
        """Checkpoint (unless this round just did) and end the job: its time would run out in the next round."""
        if not saved:
            self._save(done)
        assert self.time_budget is not None
        raise RunIncomplete(
            f"stopped after round {done - 1} of 0..{total - 1} before the job's time limit "
            f"({self.time_budget.describe()}); checkpoint {self.checkpoint_path}: the next job continues from it",
            next_round=done, total_rounds=total)

    def metrics(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)

    def remove_checkpoint(self) -> None:
        if self.checkpoint_path is not None and self.checkpoint_path.exists():
            os.remove(self.checkpoint_path)
        for st in self.stores:
            st.clear()


def estimated_size(obj: Any) -> int:
    """Bytes a checkpoint of ``obj`` takes on disk, about: its tensors and arrays, plus 5% and 1 MiB
    for the pickled structure (the rows, the random states' small parts)."""
    return int(_nbytes(obj) * 1.05) + (1 << 20)


def _nbytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    inner = getattr(obj, "t", None)  # persist's marker of a device tensor
    return _nbytes(inner) if isinstance(inner, torch.Tensor) else 64


def _free_name(path: Path) -> Path:
    """``path``, or ``path.1``, ``path.2``, ... the first that does not exist (a file moved aside earlier stays)."""
    n, out = 0, path
    while out.exists():
        n += 1
        out = Path(f"{path}.{n}")
    return out


def _check_payload(p: dict, ctx: RunContext, method) -> None:
    """Raise (TypeError, ValueError, KeyError) when a checkpoint's payload is not shaped as this run's,
    before any of it is loaded: a wrong one is moved aside instead of half-loaded."""
    for key, kind in (("next_round", int), ("method", dict), ("given", torch.Tensor), ("relabels", list),
                      ("rng", dict), ("rows", list)):
        if not isinstance(p.get(key), kind):
            raise TypeError(f"{key!r} is a {type(p.get(key)).__name__}, not a {kind.__name__}")
    given = ctx.data.given
    if p["given"].shape != given.shape or p["given"].dtype != given.dtype:
        raise ValueError(f"labels {tuple(p['given'].shape)} {p['given'].dtype}, "
                         f"the run's {tuple(given.shape)} {given.dtype}")
    if not 0 <= p["next_round"] <= method.num_rounds():
        raise ValueError(f"next round {p['next_round']} of 0..{method.num_rounds()}")
    if not all(isinstance(r, dict) for r in p["rows"]) or not all(isinstance(c, dict) for c in p["relabels"]):
        raise TypeError("rows or relabels are not records")
    saved = p["method"].get("globals")
    if not isinstance(saved, dict) or set(saved) != set(method.globals):
        raise ValueError(f"networks {sorted(map(str, saved or {}))}, the run's {sorted(method.globals)}")
    for name, net in method.globals.items():
        want = net.state_dict()
        st = saved[name]
        if not isinstance(st, dict) or set(st) != set(want) or any(
                not isinstance(st[k], torch.Tensor) or st[k].shape != v.shape for k, v in want.items()):
            raise ValueError(f"network {name!r} does not have the run's parameters")
