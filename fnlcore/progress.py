"""Progress of long jobs: one line per round in the job's log, a few tagged lines on the console.

Parallel jobs share Snakemake's console, so their lines interleave there: each
console line carries the job's identity (:func:`run_tag`) and a job prints at
most about ten of its round lines (:func:`round_on_console`); the job's log
file keeps every round.
"""

from __future__ import annotations

import logging
import math
import re
import sys
from typing import Callable, TextIO

# "round r/last (k of n) ...": r counts from 0 (as in metrics and curves), so r = last is the final one;
# "(k of n)" says the same 1-based, so the last round of 30 reads "round 29/29 (30 of 30)", not unfinished
ROUND_LINE = re.compile(r"^round (\d+)/(\d+) (.*)$")


def round_line(r: int, total: int, text: str) -> str:
    """A training log's line for round ``r`` (0-based) of ``total``: ``round 29/29 (30 of 30) <text>``."""
    return f"round {r}/{total - 1} ({r + 1} of {total}) {text}"


class ProgressBar:
    """A single self-overwriting line on a terminal; silent when the stream is not a TTY."""

    def __init__(self, stream: TextIO | None = None, width: int = 30):
        self.stream = stream or sys.stderr
        self.width = width
        self.active = bool(getattr(self.stream, "isatty", lambda: False)())

    def update(self, done: int, total: int, text: str = "") -> None:
        if not self.active or total <= 0:
            return
        filled = int(self.width * done / total)
        bar = "#" * filled + "." * (self.width - filled)
        self.stream.write(f"\r[{bar}] {done}/{total} {text}"[:160])
        if done >= total:
            self.stream.write("\n")
        self.stream.flush()


def round_reporter(log_line: Callable[[str], None], bar: ProgressBar | None = None) -> Callable[[str], None]:
    """Send every engine message to ``log_line``; round messages also move ``bar`` if one is given.

    No bar by default: the bars of parallel jobs would overwrite each other on
    the shared terminal (the console's tagged round lines replace it).
    """

    def report(msg: str) -> None:
        log_line(msg)
        m = ROUND_LINE.match(msg)
        if m and bar is not None:
            bar.update(int(m.group(1)) + 1, int(m.group(2)) + 1, m.group(3))

    return report


def round_on_console(r: int, last: int, lines: int = 10) -> bool:
    """Whether round ``r`` of rounds 0..``last`` goes to the console: the first, the last and every ~1/lines."""
    step = max(1, math.ceil((last + 1) / lines))
    return r == 0 or r == last or (r + 1) % step == 0


def console_filter(lines: int = 10) -> Callable[[logging.LogRecord], bool]:
    """A logging filter that lets through every message but only :func:`round_on_console`'s round lines."""

    def keep(record: logging.LogRecord) -> bool:
        m = ROUND_LINE.match(record.getMessage())
        return m is None or round_on_console(int(m.group(1)), int(m.group(2)), lines)

    return keep


def run_tag(method: str, noise: str, seed: int | str) -> str:
    """A training job's short identity on the console: its table cell (method row, noise column) and seed.

    e.g. ``fednoro-warmuprounds1 | hidn-rho0.4-eta0.3-0.5-hebc757 | seed0``; the
    job's log file path (printed by Snakemake when the job starts) has the rest.
    """
    return f"{method} | {noise} | seed{seed}"
