"""Logging for workflow jobs: one log file per job, plus stderr for the console/batch log."""

from __future__ import annotations

import contextlib
import logging
import sys
from pathlib import Path
from typing import Iterator

LOG = logging.getLogger("fnl")


@contextlib.contextmanager
def job_log(path: str | Path | None) -> Iterator[logging.Logger]:
    """Send fnl's log records to ``path`` and stderr for the duration of a job.

    An exception is logged with its message before it propagates, so the job's
    log says why it failed.
    """
    console = logging.StreamHandler(sys.stderr)
    if sys.stderr.isatty():
        # On a terminal the per-round lines become a progress bar (fnlcore.progress); the log file keeps them.
        from .progress import ROUND_LINE

        console.addFilter(lambda rec: not ROUND_LINE.match(rec.getMessage()))
    handlers: list[logging.Handler] = [console]
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(path, mode="w"))
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S")
    for h in handlers:
        h.setFormatter(fmt)
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
