"""Failures a retry cannot fix are not retried.

A workflow retries a failed job (``retries:`` in Snakemake): right for a node that died or a
job pre-empted, wasted for a configuration error, a corrupt input or a shape error, which
fail the same way on every attempt (and fill the log with the same traceback three times).
:func:`run_attempt` runs a job's body; when it fails for such a reason
(:func:`fnlcore.errors.retry_cannot_fix`) it writes a marker beside the job's checkpoint,
and a later *attempt* of the same job (``attempt > 1``: a retry within one workflow
invocation) sees the marker and fails at once with the same message instead of running
again. A new invocation (``attempt == 1``: the user fixed something and reran) removes the
marker and runs. Scripts that exit on their own use :func:`exit_status`
(:data:`fnlcore.errors.EXIT_NOT_RETRIABLE` for such failures).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ..errors import EXIT_NOT_RETRIABLE, NotRetried, retry_cannot_fix
from ..io import write_json

T = TypeVar("T")


def failure_marker(checkpoint_path: str | os.PathLike) -> Path:
    """Where a job records a failure a retry cannot fix: beside its checkpoint (not a workflow output)."""
    return Path(str(checkpoint_path) + ".failed.json")


def run_attempt(marker: str | os.PathLike, attempt: int, body: Callable[[], T]) -> T:
    """``body()``, unless an earlier attempt (``attempt > 1``) left ``marker``: then fail at once."""
    marker = Path(marker)
    if attempt > 1 and marker.exists():
        raise NotRetried(
            f"not retried: the previous attempt failed for a reason a retry cannot fix ({_recorded(marker)}); "
            "fix it and rerun the workflow"
        )
    with contextlib.suppress(FileNotFoundError):
        os.remove(marker)
    try:
        return body()
    except Exception as err:
        if retry_cannot_fix(err) and not isinstance(err, NotRetried):
            write_json({"error": type(err).__name__, "message": str(err)}, marker)
        raise


def exit_status(err: BaseException) -> int:
    """The exit status of a command that failed with ``err``: EXIT_NOT_RETRIABLE when a retry cannot fix it, else 1."""
    return EXIT_NOT_RETRIABLE if retry_cannot_fix(err) else 1


def _recorded(marker: Path) -> str:
    try:
        rec = json.loads(marker.read_text())
        return f"{rec['error']}: {rec['message']}"
    except (OSError, ValueError, KeyError, TypeError):
        return f"see {marker}"
