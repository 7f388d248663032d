"""Where a training run's files live, and what determines its numbers.

A run's folder is a pure function of its specs (dataset, partition slug and seed,
noise slug and seed, training slug, method slug, training seed), so equal settings
in different tables share one cached run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..fl.settings import TrainSettings
from ..slugs import fmt_float, short_hash

CONFIG_DIR = Path(__file__).resolve().parents[2] / "config"
PAPERS_DIR = CONFIG_DIR / "papers"
SCALES_DIR = CONFIG_DIR / "scales"
REPORTED_DIR = PAPERS_DIR / "reported"

RUN = "{results}/runs/{dataset}/{partition}/pseed{pseed}/{noise}/nseed{nseed}/{train}/{method}/seed{seed}"
RUN_FILES = {
    "metrics": "/metrics.parquet", "clients": "/clients.parquet", "relabels": "/relabels.parquet", "model": "/final.pt",
}
CHECKPOINT = "{results}/checkpoints/{dataset}/{partition}/pseed{pseed}/{noise}/nseed{nseed}/{train}/{method}/seed{seed}.pt"
TABLE = "{results}/tables/{scale}/{paper}/{table}"  # the scale first: a smoke table never overwrites a paper one
TABLE_FILES = {"csv": ".csv", "md": ".md", "html": ".html", "curves": ".curves.png"}


def train_slug(t: TrainSettings) -> str:
    """Readable core of the training settings plus a hash of every other non-default field."""
    core = ("model", "rounds", "local_epochs", "batch_size", "optimizer", "lr")
    head = f"{t.model}-r{t.rounds}-e{t.local_epochs}-b{t.batch_size}-{t.optimizer}{fmt_float(t.lr)}"
    rest = {
        f.name: getattr(t, f.name)
        for f in dataclasses.fields(t)
        if f.name not in core and getattr(t, f.name) != f.default and f.name != "checkpoint_every"
    }
    return head + (f"-{short_hash(rest)}" if rest else "")


@dataclass(frozen=True)
class RunSpec:
    """One training run: everything that determines its numbers."""

    dataset: str
    partition: Any  # PartitionSpec
    partition_seed: int
    noise: Any  # NoiseSpec
    noise_seed: int
    training: TrainSettings
    method: Any  # MethodParams
    seed: int

    def fields(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "partition": self.partition.slug(),
            "pseed": self.partition_seed,
            "noise": self.noise.slug(),
            "nseed": self.noise_seed,
            "train": train_slug(self.training),
            "method": self.method.slug(),
            "seed": self.seed,
        }

    def files(self, results: str) -> dict[str, str]:
        base = RUN.format(results=results, **self.fields())
        return {k: base + s for k, s in RUN_FILES.items()}

    def checkpoint(self, results: str) -> str:
        return CHECKPOINT.format(results=results, **self.fields())
