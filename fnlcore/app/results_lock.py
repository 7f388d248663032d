"""One workflow at a time per results folder, across checkouts and machines.

Snakemake locks the outputs it writes in its *working directory* (``.snakemake/locks``):
two checkouts sharing one ``results_dir`` do not see each other's lock and would both
run every job. The workflow therefore also takes an exclusive ``flock`` on
``<results_dir>/.fnl-lock`` when it starts executing jobs (the Snakefile's ``onstart``),
held by the Snakemake process until it exits. The kernel releases the lock with the
process, so a killed run (``kill -9``, a lost node) leaves no stale lock behind; the
file itself stays and names the last holder.
"""

from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import os
import socket
from pathlib import Path
from typing import IO

from ..errors import FNLError

LOCK_NAME = ".fnl-lock"

_held: dict[str, IO[str]] = {}  # results folder -> open lock file (kept open: closing releases the lock)


class ResultsFolderLocked(FNLError):
    """Another running workflow holds the results folder."""


def holder_line(workdir: str | os.PathLike) -> str:
    """Who holds the lock, as written into the lock file (host, process, working directory, start time)."""
    started = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    return f"host {socket.gethostname()}, pid {os.getpid()}, working directory {Path(workdir).resolve()}, since {started}"


def lock_results(results: str | os.PathLike, workdir: str | os.PathLike = ".") -> Path | None:
    """Take the results folder's lock for this process; raise :class:`ResultsFolderLocked` if another holds it.

    Returns the lock file, or ``None`` where the file system cannot lock (then nothing is
    guarded: the caller should say so). Taking it again in the same process is a no-op.
    """
    folder = Path(results)
    key = str(folder.resolve())
    if key in _held:
        return folder / LOCK_NAME
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    fh = open(path, "a+", encoding="utf-8")
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        holder = fh.read().strip() or "holder unknown"
        fh.close()
        raise ResultsFolderLocked(
            f"results folder {str(folder)!r} is in use by another running workflow ({holder}; lock file {path}). "
            "Wait until it ends, or give this run its own folder: --config results_dir=<another folder>"
        ) from None
    except OSError as err:
        fh.close()
        if err.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            return None
        raise
    fh.seek(0)
    fh.truncate()
    fh.write(holder_line(workdir) + "\n")
    fh.flush()
    _held[key] = fh
    return path


def release_results(results: str | os.PathLike) -> None:
    """Release this process's lock on ``results`` (the process's exit does the same)."""
    fh = _held.pop(str(Path(results).resolve()), None)
    if fh is not None:
        fh.close()
