"""Logging for workflow jobs: one log file per job, plus stderr for the console/batch log."""

from __future__ import annotations

import contextlib
import logging
import sys
from pathlib import Path
from typing import Iterator

LOG = logging.getLogger("fnl")


@contextlib.contextmanager
def job_log(path: str | Path | None, tag: str | None = None) -> Iterator[logging.Logger]:
    """Send fnl's log records to ``path`` and stderr for the duration of a job.

    The log file keeps every line. The console (Snakemake's output, where
    parallel jobs interleave) gets each line prefixed with ``[tag]`` (the job's
    identity, e.g. :func:`fnlcore.progress.run_tag`) and at most about ten
    per-round lines per job (:func:`fnlcore.progress.round_on_console`).
    An exception is logged with its message before it propagates, so the job's
    log says why it failed.
    """
    from .progress import console_filter

    console = logging.StreamHandler(sys.stderr)
    console.addFilter(console_filter())
    handlers: list[logging.Handler] = [console]
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(path, mode="w"))
    prefix = f"[{tag}] " if tag else ""
    console.setFormatter(logging.Formatter(f"%(asctime)s {prefix}%(levelname)s %(message)s", "%H:%M:%S"))
    for h in handlers[1:]:
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    for h in handlers:
        LOG.addHandler(h)
    LOG.setLevel(logging.INFO)
    try:
        yield LOG
    except Exception as err:
        LOG.error("%s: %s", type(err).__name__, err)
        raise
    finally:
        for h in handlers:
            LOG.removeHandler(h)
            h.close()


def shorten_reason(reason: str, keep: int = 2, longest: int = 6) -> str:
    """Snakemake's 'Reason:' text with each list of more than ``longest`` files cut to its first ``keep`` and a count.

    The reason of a table or ``all`` job names every run's metrics file ("Input files
    updated by another job: a, b, ... (hundreds)"); the job's log and ``--summary``
    still have them all.
    """
    parts = []
    for part in reason.split("; "):
        label, sep, files = part.partition(": ")
        items = files.split(", ") if sep else []
        if len(items) > longest:
            part = f"{label}: {', '.join(items[:keep])}, ... ({len(items)} files)"
        parts.append(part)
    return "; ".join(parts)


def shorten_snakemake_reasons() -> None:
    """Make Snakemake print short job reasons (see :func:`shorten_reason`); a no-op where its API differs."""
    try:
        from snakemake.jobs import Reason
    except ImportError:
        return
    full = Reason.__str__
    if getattr(full, "_fnl_short", False):
        return

    def short(self) -> str:
        return shorten_reason(full(self))

    short._fnl_short = True
    Reason.__str__ = short
