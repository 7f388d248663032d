"""The server loop: rounds, evaluation, per-round metrics, and when to checkpoint.

A run checkpoints every ``checkpoint_every`` rounds to a file that is not a
declared workflow output. Rerun after a kill (SIGKILL, pre-emption, scancel),
it resumes from the last checkpoint; since the checkpoint holds the method's
full state, the working labels and every random stream, the resumed run
produces exactly the numbers of an uninterrupted one (on the CPU; cuDNN
kernels may not be bit-deterministic on a GPU).

A checkpoint records what made it (:class:`~fnlcore.provenance.Provenance`: the code's
version and a digest of the run's settings). A checkpoint of other code or other settings
is never resumed: the run restarts from round 0 and the log says so, naming both. Reading a
checkpoint never runs code (``torch.load(weights_only=True)`` of tensors and plain data). How a
checkpoint is written and read is :class:`~fnlcore.fl.persist.RunCheckpoint`'s. An unreadable checkpoint (truncated by a full disk or a kill during a
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

import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import pandas as pd

from ..errors import ConfigError, RunIncomplete
from ..provenance import Provenance
from ..progress import round_line
from .context import RunContext
from .local import evaluate
from .persist import RunCheckpoint, run_identity
from .rounds import RoundEngine
from .time_budget import TimeBudget


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
        """``identity``: what, besides the engine's settings, makes this run (see :func:`~fnlcore.fl.persist.run_identity`).
        ``time_budget``: stop before it runs out, with a checkpoint (the module's docstring)."""
        if time_budget is not None and not checkpoint_path:
            raise ConfigError("a time budget needs a checkpoint path: a run stopped at its budget continues "
                              "from its checkpoint; give checkpoint_path or no budget")
        self.method = method
        self.ctx = ctx
        self.progress = progress or (lambda s: print(s, file=sys.stderr, flush=True))
        self.stop_after = stop_after  # for tests: stop (as if killed) after this many rounds
        self.time_budget = time_budget
        self.rows: list[dict] = []
        self.engine = RoundEngine(method)
        self.provenance = Provenance.of(run_identity(method, ctx, identity))
        # its lines go to whatever self.progress is when it writes them
        self.checkpoint = RunCheckpoint(checkpoint_path, method, ctx, self.provenance, lambda line: self.progress(line))

    def _save(self, next_round: int) -> None:
        if self.checkpoint.path is None:
            return
        started = self.time_budget.clock() if self.time_budget is not None else 0.0  # the stores' writes count
        self.checkpoint.save(next_round, self.rows)
        if self.time_budget is not None:
            self.time_budget.checkpoint_took(self.time_budget.clock() - started)

    def _restore(self) -> int:
        """The round to start from: the checkpoint's next round when one is resumed, else 0."""
        started = self.time_budget.clock() if self.time_budget is not None else 0.0
        resumed = self.checkpoint.restore()
        if resumed is None:
            return 0
        start, self.rows = resumed
        if self.time_budget is not None:  # until this job writes one, reading is the estimate of a write
            self.time_budget.checkpoint_took(self.time_budget.clock() - started)
        return start

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
            self.checkpoint.begin_round(r)
            m.begin_round(r)
            clients = m.select_clients(r)
            engine, at_once = self.engine.mode(r, clients)
            m.aggregate(r, self.engine.updates(r, clients))
            m.end_round(r)
            self.checkpoint.end_round()
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
            f"({self.time_budget.describe()}); checkpoint {self.checkpoint.path}: the next job continues from it",
            next_round=done, total_rounds=total)

    def metrics(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)

    def remove_checkpoint(self) -> None:
        self.checkpoint.remove()
