"""One workflow at a time per results folder, and one writer at a time per training run.

Snakemake locks the outputs it writes in its *working directory* (``.snakemake/locks``):
two checkouts sharing one ``results_dir`` do not see each other's lock and would both
run every job. The workflow therefore also takes an exclusive ``flock`` on
``<results_dir>/.fnl-lock`` when it starts executing jobs (the Snakefile's ``onstart``),
held by the Snakemake process until it exits. The kernel releases the lock with the
process, so a killed run (``kill -9``, a lost node) leaves no stale lock behind; the
file itself stays and names the last holder.

That lock dies with the Snakemake process, but its jobs need not: after a ``kill -9`` of
Snakemake alone, its training jobs go on (their parent is then init). So every training
job also holds a lock of its own run, ``<checkpoint>.lock``, for its whole life
(:func:`lock_run`): a second job of the same run refuses to start (:class:`RunBusy`,
naming the holder's host and pid) without touching the run's checkpoint, journal or
log, and the workflow itself stops before any job while such a job lives
(:func:`busy_runs`, the Snakefile's ``onstart``).

Only the standard library is imported here: a refused training job exits before it
loads anything else.
"""

from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import os
import re
import socket
import time
from pathlib import Path
from typing import IO, Iterable

from ..errors import FNLError, StorageError
from ..safe_files import open_regular

LOCK_NAME = ".fnl-lock"
RUN_LOCK_SUFFIX = ".lock"

# errno of a file system that cannot lock files (then nothing is guarded: callers say so)
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
# A probe (lock_holder: `fnl status`, `fnl cell`, the workflow's check of its runs) holds a
# shared lock for an instant; a writer meeting it tries again for a while instead of refusing.
_TRIES = 20
_TRY_WAIT_S = 0.05

_held: dict[str, IO[str]] = {}  # results folder -> open lock file (kept open: closing releases the lock)


class ResultsFolderLocked(FNLError):
    """Another running workflow holds the results folder."""


class RunBusy(FNLError):
    """Another live process holds a training run's lock: it writes the run's checkpoint and log."""

    def __init__(self, message: str, holder: str):
        super().__init__(message)
        self.holder = holder


def holder_line(workdir: str | os.PathLike) -> str:
    """Who holds the lock, as written into the lock file (host, process, working directory, start time)."""
    started = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    return f"host {socket.gethostname()}, pid {os.getpid()}, working directory {Path(workdir).resolve()}, since {started}"


def lock_results(results: str | os.PathLike, workdir: str | os.PathLike = ".") -> Path | None:
    """Take the results folder's lock for this process; raise :class:`ResultsFolderLocked` if another holds it.

    Returns the lock file, or ``None`` where the file system cannot lock (then nothing is
    guarded: the caller should say so). Taking it again in the same process is a no-op.
    A disk too full to record the holder raises :class:`~fnlcore.errors.StorageError`.
    """
    folder = Path(results)
    key = str(folder.resolve())
    if key in _held:
        return folder / LOCK_NAME
    path = folder / LOCK_NAME
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        _raise_if_disk_full(err, folder, "the workflow's lock file")
        raise
    fh, taken = _open_locked(path, "the workflow's lock file")
    if fh is None:
        return None
    if not taken:
        holder = _recorded(fh)
        fh.close()
        raise ResultsFolderLocked(
            f"results folder {str(folder)!r} is in use by another running workflow ({holder}; lock file {path}). "
            "Wait until it ends, or give this run its own folder: --config results_dir=<another folder>"
        )
    _record(fh, holder_line(workdir), folder, "the workflow's lock file")
    _held[key] = fh
    return path


def release_results(results: str | os.PathLike) -> None:
    """Release this process's lock on ``results`` (the process's exit does the same)."""
    fh = _held.pop(str(Path(results).resolve()), None)
    if fh is not None:
        fh.close()


def results_holder(results: str | os.PathLike) -> str | None:
    """The workflow that holds ``results`` now (its recorded line), or None when none does."""
    return lock_holder(Path(results) / LOCK_NAME)


# -- one writer per training run ----------------------------------------------------------------


def run_lock_path(checkpoint: str | os.PathLike) -> Path:
    """A run's lock file, beside its checkpoint (like the journal and the failure marker)."""
    return Path(str(checkpoint) + RUN_LOCK_SUFFIX)


class RunLock:
    """A training run's lock, held by this process until :meth:`release` or its exit."""

    def __init__(self, path: Path, fh: IO[str]):
        self.path = path
        self._fh: IO[str] | None = fh

    def release(self) -> None:
        """Remove the lock file and release the lock. The file goes while still locked: a process
        that opened it meanwhile finds, once it gets the lock, that its file is no longer the
        run's and starts over on a new one (:func:`lock_run`), so two can never hold one run."""
        fh, self._fh = self._fh, None
        if fh is None:
            return
        try:
            if _same_file(fh, self.path):
                self.path.unlink()
        except OSError:
            pass  # a lock file left behind is harmless: the next writer takes it over
        finally:
            fh.close()

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def lock_run(checkpoint: str | os.PathLike) -> RunLock | None:
    """Take the lock of the run checkpointed at ``checkpoint`` for this process, without waiting.

    Raises :class:`RunBusy` (naming the holder) when another live process holds it; the
    caller must then leave the run alone. Returns ``None`` where the file system cannot
    lock. Writes nothing but the lock file, and that only once the lock is taken.
    """
    path = run_lock_path(checkpoint)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        _raise_if_disk_full(err, path.parent, "the run's lock file")
        raise
    while True:
        fh, taken = _open_locked(path, "the run's lock file")
        if fh is None:
            return None
        if not taken:
            holder = _recorded(fh)
            fh.close()
            raise RunBusy(busy_message(checkpoint, holder), holder)
        if _same_file(fh, path):
            break
        fh.close()  # the last holder removed this file while we waited for it: lock the run's new one
    _record(fh, holder_line(os.getcwd()), path.parent, "the run's lock file")
    return RunLock(path, fh)


def busy_message(checkpoint: str | os.PathLike, holder: str) -> str:
    """What a refused start says: who writes the run, and the ways on."""
    host, pid = _host_pid(holder)
    stop = f"`kill {pid}` on {host}" if pid else "stop that process"
    return (
        f"run checkpointed at {checkpoint} is being written by another live process ({holder}; "
        f"lock file {run_lock_path(checkpoint)}), most likely a training job whose Snakemake was killed. "
        f"A second writer would corrupt the run, so this one did not start and changed nothing. Stop it ({stop}), "
        "then run the same command again: the run resumes from its checkpoint. " + _WAITING
    )


# What waiting for such a job costs: Snakemake marks a job's outputs incomplete when the job starts
# and clears the mark when it sees the job end; a killed Snakemake sees nothing, so
# `rerun-incomplete` (profiles/default) reruns the finished run's job. The job keeps its final
# checkpoint when the workflow that started it is gone (fnlcore.app.train), so that rerun only
# rewrites the outputs.
_WAITING = ("Waiting until such a job ends is safe too: its Snakemake, killed, left the run's outputs marked "
            "incomplete, so the next command runs its job again, which rewrites them from the run's final "
            "checkpoint without training")


def note_refused_start(log_path: str | os.PathLike, err: RunBusy, journal: str | os.PathLike | None = None) -> None:
    """Leave ``err`` in a refused job's log where there is no log: Snakemake deletes a job's log
    before the job starts, so the holder's log is already unlinked (the holder's lines go on into
    the run's journal, ``journal``). An existing file is never touched. Not an ERROR line:
    the run is not failed (``fnl status`` reads the log)."""
    stamp = _dt.datetime.now().strftime("%H:%M:%S")
    text = f"{stamp} WARNING not started: {err}\n"
    if journal is not None:
        text += f"{stamp} WARNING the writing process's lines go to {journal}\n"
    try:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "x", encoding="utf-8") as fh:
            fh.write(text)
    except OSError:
        pass  # a log that exists is another writer's; no room for a note changes nothing


def run_holder(checkpoint: str | os.PathLike) -> str | None:
    """The live process writing the run checkpointed at ``checkpoint`` (its recorded line), or None."""
    return lock_holder(run_lock_path(checkpoint))


def busy_runs(checkpoints: Iterable[str | os.PathLike]) -> list[tuple[str, str]]:
    """(checkpoint, holder) of each run that a live process holds."""
    out = []
    for ckpt in checkpoints:
        holder = run_holder(ckpt)
        if holder is not None:
            out.append((str(ckpt), holder))
    return out


def train_checkpoints(workflow, plan, results: str) -> list[str]:
    """The checkpoint of every train job a Snakemake ``workflow`` is about to run (its DAG's jobs
    that need to run); of every run of ``plan`` where that list cannot be read."""
    try:
        return [job.params.checkpoint for job in workflow.dag.needrun_jobs() if job.rule.name == "train"]
    except Exception:  # Snakemake's internals moved: check more runs, never fewer
        return [run.checkpoint(results) for run in plan.runs()]


def busy_runs_message(busy: list[tuple[str, str]], what: str) -> str:
    """The workflow's message for runs that live processes write (:func:`busy_runs`)."""
    lines = [f"\n{what}: {len(busy)} training run(s) are being written by live processes, most likely jobs of "
             "a Snakemake that was killed (they outlive it); a second writer would corrupt a run:"]
    lines += [f"  {ckpt}: {holder}" for ckpt, holder in busy]
    pids: dict[str, list[str]] = {}
    for _, holder in busy:
        host, pid = _host_pid(holder)
        pids.setdefault(host, []).append(pid or "PID")
    stop = "; ".join(f"`kill {' '.join(p)}` on {host}" for host, p in pids.items())
    lines.append(f"Stop them ({stop}), then run the same command again: each run resumes from its "
                 f"checkpoint. {_WAITING}. `fnl status` lists the runs and who writes them.\n\n")
    return "\n".join(lines)


# -- helpers ------------------------------------------------------------------------------------


def lock_holder(path: str | os.PathLike) -> str | None:
    """Who holds the lock file ``path`` now, as recorded in it; None when no live process does
    (or the file system cannot tell). Probes with a shared lock held for an instant."""
    try:  # a link at the name is no lock of ours: never follow it
        fh = os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), encoding="utf-8")
    except OSError:
        return None
    with fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _recorded(fh)
        except OSError:
            return None
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    return None


def _open_locked(path: Path, what: str):
    """``(open file, whether its exclusive flock was taken)``, or ``(None, False)`` where the file
    system cannot lock; a full disk is a StorageError naming ``what``."""
    try:
        fh = open_regular(path, "a+")  # a link planted at the name is refused, never followed
    except OSError as err:
        _raise_if_disk_full(err, path.parent, what)
        raise
    try:
        return fh, _flock_exclusive(fh)
    except OSError as err:
        fh.close()
        if err.errno in _NO_LOCKS:
            return None, False
        raise


def _flock_exclusive(fh: IO[str]) -> bool:
    """Take an exclusive lock on ``fh``: True when taken, False when another process holds it."""
    for i in range(_TRIES):
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if i + 1 < _TRIES:
                time.sleep(_TRY_WAIT_S)
    return False


def _same_file(fh: IO[str], path: Path) -> bool:
    try:
        a, b = os.fstat(fh.fileno()), os.stat(path)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _recorded(fh: IO[str]) -> str:
    try:
        fh.seek(0)
        return fh.read().strip() or "holder unknown"
    except OSError:
        return "holder unknown"


def _record(fh: IO[str], line: str, folder: Path, what: str) -> None:
    """Write the holder's line; a full disk releases the lock and raises StorageError."""
    try:
        fh.seek(0)
        fh.truncate()
        fh.write(line + "\n")
        fh.flush()
    except OSError as err:
        fh.close()
        _raise_if_disk_full(err, folder, what)
        raise


def _raise_if_disk_full(err: OSError, folder: Path, what: str) -> None:
    """A full disk as a StorageError that says so and what to do (not a bare OSError)."""
    if err.errno not in _DISK_FULL:
        return
    raise StorageError(
        f"no space left on the disk holding {folder} (writing {what} failed: {err.strerror}); nothing can be "
        "written there: free some space (or move results_dir to a larger disk) and run the same command again"
    ) from err


def _host_pid(holder: str) -> tuple[str, str]:
    host = re.search(r"host ([^,]+)", holder)
    pid = re.search(r"pid (\d+)", holder)
    return (host.group(1) if host else "its host"), (pid.group(1) if pid else "")
