"""The server loop: rounds, evaluation, per-round metrics, checkpoints and resume.

A run checkpoints every ``checkpoint_every`` rounds to a file that is not a
declared workflow output. Rerun after a kill (SIGKILL, pre-emption, scancel),
it resumes from the last checkpoint; since the checkpoint holds the method's
full state, the working labels and every random stream, the resumed run
produces exactly the numbers of an uninterrupted one (on the CPU; cuDNN
kernels may not be bit-deterministic on a GPU).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Callable

import pandas as pd
import torch

from ..io import atomic_path
from .context import RunContext
from .local import evaluate
from .persist import load_method_state, method_state
from .rounds import RoundEngine

CHECKPOINT_VERSION = 3  # 2: the relabel log; 3: declared method state, per-client stores on disk


class Simulation:
    def __init__(
        self,
        method,
        ctx: RunContext,
        checkpoint_path: str | Path | None = None,
        progress: Callable[[str], None] | None = None,
        stop_after: int | None = None,
    ):
        self.method = method
        self.ctx = ctx
        self.checkpoint_path = Path(checkpoint_path) if checkpoint_path else None
        self.progress = progress or (lambda s: print(s, file=sys.stderr, flush=True))
        self.stop_after = stop_after  # for tests: stop (as if killed) after this many rounds
        self.rows: list[dict] = []
        self.engine = RoundEngine(method)
        self.stores = method.stores()
        for st in self.stores:  # per-client state beside the checkpoint (a temporary folder without one)
            st.attach(self._store_folder(st.name))

    def _store_folder(self, name: str) -> Path | None:
        if self.checkpoint_path is None:
            return None
        return Path(str(self.checkpoint_path) + ".clients") / name

    # -- checkpoints -----------------------------------------------------------------------
    def _save(self, next_round: int) -> None:
        if self.checkpoint_path is None:
            return
        payload = {
            "version": CHECKPOINT_VERSION,
            "next_round": next_round,
            "method": method_state(self.method, files=True),
            "given": self.ctx.data.given.detach().cpu().clone(),
            "relabels": self.ctx.data.relabels.state_dict(),
            "rng": self.ctx.rng_state(),
            "rows": self.rows,
        }
        with atomic_path(self.checkpoint_path, suffix=".pt") as tmp:
            torch.save(payload, tmp)
        for st in self.stores:
            st.committed()

    def _restore(self) -> int:
        if self.checkpoint_path is None or not self.checkpoint_path.exists():
            return 0
        payload = torch.load(self.checkpoint_path, map_location="cpu", weights_only=False)
        if payload.get("version") != CHECKPOINT_VERSION:
            self.progress(f"ignoring checkpoint {self.checkpoint_path}: incompatible version")
            return 0
        load_method_state(self.method, payload["method"])
        self.ctx.data.given.copy_(payload["given"].to(self.ctx.data.given.device))
        self.ctx.data.relabels.load_state_dict(payload["relabels"])
        self.ctx.load_rng_state(payload["rng"])
        self.rows = list(payload["rows"])
        self.progress(f"resumed from {self.checkpoint_path} at round {payload['next_round']}")
        return int(payload["next_round"])

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> pd.DataFrame:
        m, ctx = self.method, self.ctx
        total = m.num_rounds()
        start = self._restore()
        every = ctx.settings.checkpoint_every
        for r in range(start, total):
            t0 = time.perf_counter()
            for st in self.stores:
                st.begin_round(r)
            m.begin_round(r)
            clients = m.select_clients(r)
            m.aggregate(r, self.engine.updates(r, clients))
            m.end_round(r)
            for st in self.stores:  # what this round wrote goes to disk, out of memory
                st.end_round()
            row = {"round": r, "stage": m.stage(r), "clients": len(clients)}
            if m.should_evaluate(r):
                row.update(evaluate(ctx, m.eval_model()))
            row.update(m.round_info)
            row["seconds"] = time.perf_counter() - t0
            self.rows.append(row)
            main = "bacc" if "bacc" in row else "acc"
            score = f"{main}={row[main]:.4f}" if main in row else "not evaluated"
            # rounds count from 0, as in metrics.parquet and the curves: "round 0/29" is the first of 30
            self.progress(f"round {r}/{total - 1} [{row['stage']}] {score} ({row['seconds']:.1f}s)")
            done = r + 1
            if done % every == 0 or done == total:
                self._save(done)
            if self.stop_after is not None and done >= self.stop_after:
                break
        return self.metrics()

    def metrics(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)

    def remove_checkpoint(self) -> None:
        if self.checkpoint_path is not None and self.checkpoint_path.exists():
            os.remove(self.checkpoint_path)
        for st in self.stores:
            st.clear()
