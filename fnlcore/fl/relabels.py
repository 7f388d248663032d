"""The record of every working-label change of a run (relabelling, label correction).

Methods change labels only through :meth:`RelabelLog.apply`, which writes the new
labels into ``FederatedData.given`` (so they persist across rounds and stages) and
appends one record per changed sample. The simulation checkpoints the log with the
labels; the training job writes it as the run's ``relabels.parquet``: which sample
changed, in which round and stage, from which label to which.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

COLUMNS = {"sample": "int64", "client": "int64", "round": "int64", "stage": "object", "from_label": "int64", "to_label": "int64"}


class RelabelLog:
    def __init__(self) -> None:
        self._chunks: list[dict[str, np.ndarray | str | int]] = []

    def apply(self, given: torch.Tensor, idx: torch.Tensor, labels: torch.Tensor, round_index: int, stage: str,
              client: int = -1) -> int:
        """Set ``given[idx] = labels`` and record the samples whose label changed; returns their number."""
        if given.ndim != 1:
            raise ValueError("relabelling is defined for single-label data (given is (N,))")
        idx = torch.as_tensor(idx, dtype=torch.int64).to(given.device)
        labels = torch.as_tensor(labels, dtype=given.dtype).to(given.device)
        if idx.shape != labels.shape:
            raise ValueError(f"relabel: {idx.numel()} indices but {labels.numel()} labels")
        old = given[idx]
        changed = old != labels
        given[idx] = labels
        n = int(changed.sum())
        if n:
            self._chunks.append({
                "sample": idx[changed].cpu().numpy(), "from_label": old[changed].cpu().numpy(),
                "to_label": labels[changed].cpu().numpy(), "round": int(round_index), "stage": str(stage),
                "client": int(client),
            })
        return n

    def __len__(self) -> int:
        return sum(len(c["sample"]) for c in self._chunks)

    def frame(self) -> pd.DataFrame:
        """One row per change, in the order they happened (a sample may change more than once)."""
        if not self._chunks:
            return pd.DataFrame({c: pd.Series(dtype=t) for c, t in COLUMNS.items()})
        parts = []
        for c in self._chunks:
            n = len(c["sample"])
            parts.append(pd.DataFrame({
                "sample": c["sample"].astype(np.int64), "client": np.full(n, c["client"], dtype=np.int64),
                "round": np.full(n, c["round"], dtype=np.int64), "stage": [c["stage"]] * n,
                "from_label": c["from_label"].astype(np.int64), "to_label": c["to_label"].astype(np.int64),
            }))
        return pd.concat(parts, ignore_index=True)[list(COLUMNS)]

    def state_dict(self) -> list[dict]:
        return [dict(c) for c in self._chunks]

    def load_state_dict(self, chunks: list[dict]) -> None:
        self._chunks = [dict(c) for c in chunks]
