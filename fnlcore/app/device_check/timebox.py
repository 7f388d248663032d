"""Time boxes: the check's clock and budget (:class:`Check`), and the alarm that holds an in-process
section to its share of it (:func:`time_box`)."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from .report import Report

class TimeBoxExceeded(BaseException):
    """An in-process section ran past its share of the budget (raised by its alarm). A BaseException,
    as KeyboardInterrupt is: the ``except Exception`` of the code it interrupts lets it through."""


@contextlib.contextmanager
def time_box(seconds: float):
    """Raise :class:`TimeBoxExceeded` in the block after ``seconds`` (SIGALRM; main thread only,
    elsewhere the block runs unbounded). A kernel already queued finishes first: the alarm is
    handled when Python regains control."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def alarm(signum, frame):
        raise TimeBoxExceeded(f"stopped by its time box ({seconds:.0f} s)")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Check:
    """One device check: its options, the device, the report and the clock."""

    device: torch.device
    out: Path
    quick: bool
    budget_s: float
    threads: int
    rehearse_jobs: int
    report: Report
    log: Callable[[str], None] = print
    started: float = field(default_factory=time.monotonic)

    @property
    def ends(self) -> float:
        return self.started + self.budget_s

    def left(self) -> float:
        return self.ends - time.monotonic()
