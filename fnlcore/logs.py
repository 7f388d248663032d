"""Logging for workflow jobs: one log file per job, plus stderr for the console/batch log."""

from __future__ import annotations

import contextlib
import errno
import logging
import sys
import warnings
from pathlib import Path
from typing import Iterator

from .safe_files import open_regular
from .progress import console_filter

LOG = logging.getLogger("fnl")


@contextlib.contextmanager
def job_log(path: str | Path | None, tag: str | None = None, journal: str | Path | None = None,
            continued: bool = False) -> Iterator[logging.Logger]:
    """Send fnl's log records to ``path`` and stderr for the duration of a job.

    The log file keeps every line. ``journal``: a file that outlives the job (beside a run's
    checkpoint) and collects the lines of every job of one run. Snakemake deletes a job's log
    before each attempt, so when ``continued`` (the run goes on from its checkpoint: a cluster's
    time limit, a cancelled job, a rerun) the log starts with the journal's lines of the earlier
    jobs and one run split over several jobs keeps one whole log; otherwise the journal starts
    anew. The console (Snakemake's output, where
    parallel jobs interleave) gets each line prefixed with ``[tag]`` (the job's
    identity, e.g. :func:`fnlcore.progress.run_tag`) and at most about ten
    per-round lines per job (:func:`fnlcore.progress.round_on_console`).
    An exception is logged with its message before it propagates, so the job's
    log says why it failed. Python warnings raised meanwhile (a library's
    ConvergenceWarning) are log records too: every one in the file, the first of
    each kind on the console with the tag, then a count of the rest.
    """

    console = logging.StreamHandler(sys.stderr)
    console.addFilter(console_filter())
    handlers: list[logging.Handler] = [console]
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        earlier = Path(journal).read_text() if continued and journal and Path(journal).is_file() else ""
        with open_regular(path, "w") as fh:
            fh.write(earlier)
        handlers.append(RegularFileHandler(path, mode="a"))
    if journal:
        Path(journal).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(RegularFileHandler(journal, mode="a" if continued else "w"))
    prefix = f"[{tag}] " if tag else ""
    console.setFormatter(logging.Formatter(f"%(asctime)s {prefix}%(levelname)s %(message)s", "%H:%M:%S"))
    for h in handlers[1:]:
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    for h in handlers:
        LOG.addHandler(h)
    LOG.setLevel(logging.INFO)
    once = _FirstWarningOfEachKind()
    console.addFilter(once)
    previous_showwarning = warnings.showwarning
    warnings.showwarning = _warning_to_log
    try:
        yield LOG
    except Exception as err:
        LOG.error("%s: %s", type(err).__name__, err)
        raise
    finally:
        warnings.showwarning = previous_showwarning
        if once.repeats:
            # only the console saw fewer lines: say where the rest are
            console.handle(logging.makeLogRecord({
                "name": LOG.name, "levelno": logging.WARNING, "levelname": "WARNING",
                "msg": f"{once.repeats} more library warning(s) of the same kind(s) in {path or 'the job log'}",
            }))
        for h in handlers:
            LOG.removeHandler(h)
            h.close()


class RegularFileHandler(logging.FileHandler):
    """A log file opened by :func:`~fnlcore.safe_files.open_regular` (a link at its name is refused,
    never followed). A full disk is said once on stderr, and the file gets no more lines, instead of
    logging's "--- Logging error ---" traceback for every line: the job's own check of the disk
    (before a checkpoint, or the failed write) then stops it with a StorageError that says what to do."""

    def __init__(self, filename: str | Path, mode: str = "a") -> None:
        self.full = False
        super().__init__(filename, mode=mode, encoding="utf-8")

    def _open(self):
        return open_regular(self.baseFilename, self.mode, encoding=self.encoding)

    def emit(self, record: logging.LogRecord) -> None:
        if not self.full:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:
        err = sys.exc_info()[1]
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            self.full = True
            sys.stderr.write(f"fnl: no space left on the disk holding the log {self.baseFilename} ({err.strerror}); "
                             "its later lines go to the console only\n")
            return
        super().handleError(record)

    def close(self) -> None:
        try:
            super().close()
        except OSError as err:  # the buffered lines of a full disk: already said
            if not (self.full and err.errno in (errno.ENOSPC, errno.EDQUOT)):
                raise


def _warning_to_log(message, category, filename, lineno, file=None, line=None) -> None:
    """Library warnings (scikit-learn's ConvergenceWarning...) go to the job's log, not to bare stderr."""
    LOG.warning("%s: %s (%s:%s)", category.__name__, message, Path(filename).name, lineno,
                extra={"library_warning": (category.__name__, filename, lineno)})


class _FirstWarningOfEachKind(logging.Filter):
    """On the console, the first library warning of each kind (category and place) per job; the log keeps all."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set = set()
        self.repeats = 0

    def filter(self, record: logging.LogRecord) -> bool:
        key = getattr(record, "library_warning", None)
        if key is None:
            return True
        if key in self.seen:
            self.repeats += 1
            return False
        self.seen.add(key)
        return True


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
        # lazy: Snakemake (humanfriendly is its dependency) is absent from envs/labels.yaml and device checks
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
