"""Progress of long jobs: one line per round in the job's log (batch logs), a bar on a terminal."""

from __future__ import annotations

import re
import sys
from typing import Callable, TextIO

# "round r/last ...": rounds count from 0 (as in metrics and curves), so r = last is the final one
ROUND_LINE = re.compile(r"^round (\d+)/(\d+) (.*)$")


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
    """Send every engine message to ``log_line``; round messages also move the bar."""
    bar = bar or ProgressBar()

    def report(msg: str) -> None:
        log_line(msg)
        m = ROUND_LINE.match(msg)
        if m:
            bar.update(int(m.group(1)) + 1, int(m.group(2)) + 1, m.group(3))

    return report
