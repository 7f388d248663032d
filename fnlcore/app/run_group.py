"""Run groups: one job trains several runs side by side on its one device (config key ``run_groups``).

Snakemake's Slurm executor runs the jobs of a packed group one after another (its issue #469,
docs/cluster.md), so a group is this project's own job: :func:`train_group` starts one child
process per unfinished run (each its own CUDA context on the shared GPU, its own torch threads),
waits for all of them and returns one exit status. Each child is exactly a train job
(:func:`run_member`): the run's lock, its log, its checkpoint, its time budget, so every method
groups and no number changes (a grouped run's metrics equal the run trained alone).

A run's outputs are written first to its *staging folder* beside the checkpoint
(:func:`staged_dir`, not a Snakemake output, so Snakemake never deletes it), marked complete by
``identity.json`` (the run's settings identity, written last); the run's own ``train`` job then
links them into place (:func:`publish_staged`). So a finished run is never trained again: a group
job that is killed, cancelled, cut by its time limit (exit 75) or retried skips every run whose
staging is complete and resumes the others from their checkpoints; a ``train`` job of a run that a
group already trained (``fnl cell``, which trains ungrouped, or grouping turned off) publishes the
staged outputs instead of training.

Runs are grouped in plan order by (dataset, training settings): the same model shape, so their
memory needs are alike; ``fnl cell`` trains its own runs ungrouped."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence
import dataclasses

from ..errors import EXIT_CONTINUE, ConfigError, FNLError
from .runs import RUN_FILES
from ..fl.settings import TrainSettings
from ..io import write_json
from .results_lock import lock_run, note_refused_start, RunBusy

GROUP_RECORD = "{results}/groups/{group}.json"
IDENTITY_FILE = "identity.json"
LOG_FILE = "run.log"  # the run's log as its group's child wrote it (Snakemake deletes a job's log before it runs)
_PR_SET_PDEATHSIG = 1  # prctl(2)


@dataclass(frozen=True)
class RunGroup:
    """Runs trained by one job: ``gid`` names it (a digest of its runs: other runs, another group)."""

    gid: str
    runs: tuple  # fnlcore.app.runs.RunSpec, in plan order

    def record(self, results: str) -> str:
        return GROUP_RECORD.format(results=results, group=self.gid)


def form_run_groups(runs: Sequence[Any], size: int, results: str) -> list[RunGroup]:
    """``runs`` (plan order) in groups of at most ``size`` runs of the same dataset and training
    settings; ``size`` 1 groups nothing (an empty list)."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ConfigError(f"run_groups: {size!r} must be an integer >= 1 (1: each run its own job)")
    if size == 1:
        return []
    by_shape: dict[tuple[str, str], list] = {}
    for run in runs:
        fields = run.fields()
        by_shape.setdefault((fields["dataset"], fields["train"]), []).append(run)
    groups = []
    for members in by_shape.values():
        for i in range(0, len(members), size):
            chunk = tuple(members[i:i + size])
            digest = hashlib.sha1("\n".join(r.files(results)["metrics"] for r in chunk).encode()).hexdigest()
            groups.append(RunGroup(f"{chunk[0].fields()['dataset']}-{digest[:12]}", chunk))
    return groups


def group_request(runs: Sequence[tuple[int, int, int]], max_mem_mb: int | None, max_runtime: int) -> dict[str, int]:
    """A group job's request from its runs' (mem_mb, disk_mb, runtime): side by side on one device
    their memory and disk add up, and so (at worst, a saturated device) does their time; each at most
    the site's cap. A group cut by the time cap stops with checkpoints (exit 75) and continues."""
    mem = sum(r[0] for r in runs)
    return {"mem_mb": mem if max_mem_mb is None else min(mem, max_mem_mb),
            "disk_mb": sum(r[1] for r in runs), "runtime": min(sum(r[2] for r in runs), max_runtime)}


# -- a run's staged outputs ----------------------------------------------------------------------


def staged_dir(checkpoint: str | os.PathLike) -> Path:
    """Where a grouped run's outputs are written before its ``train`` job links them into place."""
    return Path(str(checkpoint) + ".outputs")


def staged_spec(spec):
    """``spec`` (fnlcore.app.train.RunSpec) with its outputs in its staging folder."""
    d = staged_dir(spec.checkpoint)
    return replace(spec, metrics=str(d / RUN_FILES["metrics"].lstrip("/")),
                   clients=str(d / RUN_FILES["clients"].lstrip("/")), model=str(d / RUN_FILES["model"].lstrip("/")),
                   relabels=None if spec.relabels is None else str(d / RUN_FILES["relabels"].lstrip("/")))


def _outputs(spec) -> list[tuple[str, str]]:
    """(staged, published) path of each output of ``spec``."""
    staged = staged_spec(spec)
    pairs = [(staged.metrics, spec.metrics), (staged.clients, spec.clients), (staged.model, spec.model)]
    if spec.relabels is not None:
        pairs.append((staged.relabels, spec.relabels))
    return pairs


def staged_complete(spec, identity: str) -> bool:
    """The run's staged outputs are all there and were trained with ``identity`` (its settings)."""
    mark = staged_dir(spec.checkpoint) / IDENTITY_FILE
    try:
        recorded = json.loads(mark.read_text())["identity"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return recorded == identity and all(Path(s).is_file() for s, _ in _outputs(spec))


def mark_staged(spec, identity: str) -> None:
    """Written last, after every staged output: the staging is complete."""

    write_json({"identity": identity}, staged_dir(spec.checkpoint) / IDENTITY_FILE)


def publish_staged(spec, identity: str, log: str | os.PathLike | None = None) -> bool:
    """Link (copy, across file systems) the run's complete staged outputs onto its outputs, and its
    staged log onto ``log``; False (nothing written) when its staging is not complete for ``identity``."""
    if not staged_complete(spec, identity):
        return False
    staged_log = staged_dir(spec.checkpoint) / LOG_FILE
    if log is not None and staged_log.is_file():
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(staged_log, log)
    for src, dst in _outputs(spec):
        Path(dst).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(f"{dst}.publishing")
        tmp.unlink(missing_ok=True)
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)  # metrics first: the table reads only complete runs, and Snakemake checks all four
    return True


class GroupedRunNotTrained(FNLError):
    """A grouped run's train job found no complete staged outputs of its group's job."""


def publish_for_train_job(spec, identity: str, grouped: bool, log: str | os.PathLike) -> bool:
    """What a ``train`` job does first: publish the run's staged outputs where a group trained it
    (True: nothing to train). A grouped run without them is an error naming the fix; an ungrouped
    one (False) trains as usual."""
    if publish_staged(spec, identity, log):
        return True
    if grouped:
        raise GroupedRunNotTrained(
            f"run {Path(spec.metrics).parent} has no complete outputs from its run group's job in "
            f"{staged_dir(spec.checkpoint)} (trained with other settings, or deleted): run the workflow again "
            "with --forcerun train_group (its group's job trains it), or set run_groups: 1 to train it by itself")
    return False


# -- one run of a group (a child process) --------------------------------------------------------


@dataclass(frozen=True)
class Member:
    """One run of a group, as its child process needs it: what the ``train`` rule's job would get."""

    spec: Any  # fnlcore.app.train.RunSpec (its published outputs; training writes to its staging)
    identity: str  # rules/train.smk's ``identity`` param: the settings with every default filled in
    log: str  # the run's job log (results/logs/runs/...)
    tag: str  # the run's console tag (fnlcore.progress.run_tag)


def run_member(member: Member, attempt: int, deadline: float | None, threads: int) -> int:
    """Train one run of a group as its ``train`` job would, into its staging folder: the exit status
    (0 done, EXIT_CONTINUE stopped before ``deadline`` (epoch seconds) with a checkpoint; a run
    another live process holds is refused with 1, as a train job is)."""
    # lazy: imports torch; fnlcore.app.run_group imports without it (envs/labels.yaml)
    from .train import run_journal

    try:
        run_lock = lock_run(member.spec.checkpoint)
    except RunBusy as busy:
        note_refused_start(member.log, busy, journal=str(run_journal(member.spec.checkpoint)))
        sys.stderr.write(f"\nRun not started: {busy}\n\n")
        return 1
    try:
        import torch  # lazy: imports torch; fnlcore.app.run_group imports without it (envs/labels.yaml)

        # lazy: imports torch; fnlcore.app.run_group imports without it (envs/labels.yaml)
        from ..progress import round_reporter
        # lazy: imports torch; fnlcore.app.run_group imports without it (envs/labels.yaml)
        from .train import train_job, train_job_log

        torch.set_num_threads(threads)  # what the run's own job would use (rule train's threads)
        if staged_complete(member.spec, member.identity):
            return 0  # finished while this child waited for the lock
        staged_dir(member.spec.checkpoint).mkdir(parents=True, exist_ok=True)
        budget = None if deadline is None else max(0.0, deadline - time.time())
        with train_job_log(member.log, member.spec.checkpoint, attempt, tag=member.tag) as log:
            log.info("run %s, attempt %d, in a run group", Path(member.spec.metrics).parent, attempt)
            status = train_job(staged_spec(member.spec), progress=round_reporter(log.info), attempt=attempt,
                               time_budget_s=budget)
        if status == 0:
            shutil.copyfile(member.log, staged_dir(member.spec.checkpoint) / LOG_FILE)
            mark_staged(member.spec, member.identity)
        return status
    finally:
        if run_lock is not None:
            run_lock.release()


def _die_with_parent(parent: int) -> None:
    """A child killed with its group (kill -9 of the group's process): else it trains on, holding its run."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return  # not Linux: Slurm's scancel still ends the job's whole cgroup
    if os.getppid() != parent:  # the parent died before prctl
        os._exit(1)


def _child_main() -> int:
    """``python -m fnlcore.app.run_group``: one member, as JSON from its group's process on stdin."""
    job = json.loads(sys.stdin.buffer.read())  # plain data: nothing read can run code
    _die_with_parent(job["parent"])
    return run_member(member_from_json(job["member"]), job["attempt"], job["deadline"], job["threads"])


def member_to_json(m: Member) -> dict[str, Any]:
    """A member as plain data: its settings and method as the config entries that rebuild them."""

    spec = {f.name: getattr(m.spec, f.name) for f in dataclasses.fields(m.spec)}
    spec["settings"] = dataclasses.asdict(m.spec.settings)
    spec["method"] = m.spec.method.to_dict()
    return {"spec": spec, "identity": m.identity, "log": m.log, "tag": m.tag}


def member_from_json(d: dict[str, Any]) -> Member:
    # lazy: imports torch; fnlcore.app.run_group imports without it (envs/labels.yaml)
    from ..methods import METHODS
    # lazy: imports torch; fnlcore.app.run_group imports without it (envs/labels.yaml)
    from .train import RunSpec

    spec = dict(d["spec"], settings=TrainSettings.from_dict(d["spec"]["settings"]),
                method=METHODS.from_dict(d["spec"]["method"]))
    return Member(RunSpec(**spec), d["identity"], d["log"], d["tag"])


# -- the group -----------------------------------------------------------------------------------


@dataclass
class MemberResult:
    run: str  # the run's folder
    status: str  # "trained", "already trained", "continues" (exit 75), "failed (exit N)"
    start: float | None = None  # epoch seconds of this job's child process
    end: float | None = None


def overlap_share(spans: Sequence[tuple[float | None, float | None]]) -> float:
    """Of the time from the first start to the last end of ``spans`` (a group's children's (start, end),
    :class:`MemberResult`), the share during which two or more ran at once: how far a group's runs really
    ran side by side (0.0 for fewer than two runs; a run without both times is left out)."""
    done = [(s, e) for s, e in spans if s is not None and e is not None and e > s]
    if len(done) < 2:
        return 0.0
    first, last = min(s for s, _ in done), max(e for _, e in done)
    events = sorted([(s, 1) for s, _ in done] + [(e, -1) for _, e in done])  # at a tie an end comes first
    active, since, together = 0, first, 0.0
    for t, change in events:
        if active >= 2:
            together += t - since
        active, since = active + change, t
    return together / (last - first)


def train_group(members: Sequence[Member], record: str | os.PathLike, attempt: int = 1,
                time_budget_s: float | None = None, threads: int = 1,
                log: Callable[[str], None] = print) -> int:
    """Train ``members`` side by side, one child process each; a run whose staging is complete is
    not trained again. Returns 0 when every run is done (and writes ``record``: each run's status and
    its child's start and end), EXIT_CONTINUE when none failed but some stopped at the time budget
    (the next attempt continues only those), 1 when some run failed (the finished ones stay staged;
    each failed run's log says why)."""
    deadline = None if time_budget_s is None else time.time() + time_budget_s
    results: list[MemberResult] = []
    children: dict[int, tuple[subprocess.Popen, MemberResult]] = {}
    for m in members:
        res = MemberResult(str(Path(m.spec.metrics).parent), "already trained")
        results.append(res)
        if staged_complete(m.spec, m.identity):
            log(f"{res.run}: already trained, not trained again")
            continue
        payload = json.dumps({"member": member_to_json(m), "attempt": attempt, "deadline": deadline,
                               "threads": threads, "parent": os.getpid()}).encode()
        res.start = time.time()
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        proc = subprocess.Popen([sys.executable, "-m", "fnlcore.app.run_group"], stdin=subprocess.PIPE, env=env)
        proc.stdin.write(payload)
        proc.stdin.close()
        children[proc.pid] = (proc, res)
        log(f"{res.run}: training (process {proc.pid})")

    def forward(signum, frame):  # scancel, Snakemake's kill: the children stop with the group
        for proc, _ in children.values():
            if proc.poll() is None:
                proc.send_signal(signum)
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, forward)
    try:
        while True:
            running = 0
            for proc, res in children.values():
                if proc.poll() is None:
                    running += 1
                elif res.end is None:
                    res.end = time.time()
            if not running:
                break
            time.sleep(0.2)
    finally:
        signal.signal(signal.SIGTERM, old)
    for proc, res in children.values():
        rc = proc.wait()
        res.end = res.end or time.time()
        res.status = "trained" if rc == 0 else "continues" if rc == EXIT_CONTINUE else f"failed (exit {rc})"
        log(f"{res.run}: {res.status}")
    failed = [r.run for r in results if r.status.startswith("failed")]
    if failed:
        log(f"{len(failed)} of {len(results)} runs failed: {', '.join(failed)} (each run's log says why); "
            "the finished ones are kept and not trained again")
        return 1
    if any(r.status == "continues" for r in results):
        return EXIT_CONTINUE

    write_json({"runs": [vars(r) for r in results]}, record)
    return 0


if __name__ == "__main__":
    sys.exit(_child_main())
