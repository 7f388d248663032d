"""Whether another round fits in a job's time.

A cluster ends a job at its wall-time limit, whatever it is doing; a run killed there loses
every round since its last checkpoint. Given the seconds a job may still use, the
simulation asks after each round whether one more round and the checkpoint after it still
fit (:meth:`TimeBudget.another_round_fits`); when they do not, it checkpoints and stops, and
the next job continues from there.

The next round is assumed to take as long as the longest round of this job so far, and a
checkpoint as long as the longest one written in this job (before the first: as long as
reading the checkpoint this job resumed from took). A round longer than every earlier one
(a heavier stage) can still overrun: the job's margin (fnlcore/app/resources.py) is for that.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from ..errors import ConfigError


class TimeBudget:
    """``seconds`` of a job counted from ``started_at`` (a reading of ``clock``; default: now)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic, started_at: float | None = None):
        if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds >= 0):
            raise ConfigError(f"time budget {seconds!r}: give the seconds a job may run, a number >= 0")
        self.seconds = float(seconds)
        self.clock = clock
        self.started_at = clock() if started_at is None else started_at
        self.longest_round = 0.0
        self.longest_checkpoint = 0.0

    def elapsed(self) -> float:
        return self.clock() - self.started_at

    def round_took(self, seconds: float) -> None:
        self.longest_round = max(self.longest_round, seconds)

    def checkpoint_took(self, seconds: float) -> None:
        """A checkpoint's write (or, before the first write, the read of the one resumed from)."""
        self.longest_checkpoint = max(self.longest_checkpoint, seconds)

    def another_round_fits(self) -> bool:
        return self.elapsed() + self.longest_round + self.longest_checkpoint <= self.seconds

    def describe(self) -> str:
        return (f"{self.elapsed():.0f} s of {self.seconds:.0f} s used; a round takes up to {self.longest_round:.1f} s, "
                f"a checkpoint {self.longest_checkpoint:.1f} s")
