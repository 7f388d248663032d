"""One writer per training run, and lock and status messages that tell the truth.

A training job holds an flock on ``<checkpoint>.lock`` for its whole life; the kernel
releases it when the process dies. Here a process holding that lock stands for a training
job that outlived its killed Snakemake (parent 1):

* the train job's script, started a second time for the run, refuses at once: it names the
  holder's host and pid and leaves the checkpoint, the run's journal and the log alone (and
  loads nothing: no torch);
* the workflow, asked for that run, stops before any job, naming the holder;
* once the holder is dead, the run's lock is free again.

And the real case, end to end: `kill -9` of Snakemake alone while its train job runs (held
after its first checkpoint by tests/test_recovery.py's hook); `--unlock` and the same
command stop, naming that job, and leave its checkpoint, log and journal alone; killed as
the message says, the run resumes from its checkpoint with the same command.

Then the messages: `fnl cell` while another workflow holds the results folder (Snakemake
would say --unlock, unsafe there), the results lock on a full disk (a StorageError, not a
bare OSError), and `fnl status --config` with who writes each started run.
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fnlcore import cli
from fnlcore.app import results_lock

from .conftest import REPO_ROOT
from .workflow_support import RUN_TIMEOUT_S, expected_plan, load_test_config, output_of, run_snakemake, write_config

# A process holding a lock file the way a training job (or a workflow) does: flock, then its
# host and pid in the file. It prints "held" once it holds it and sleeps until killed.
HOLDER = textwrap.dedent("""\
    import fcntl, os, socket, sys, time
    path = sys.argv[1]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fh = open(path, "a+")
    fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    fh.truncate(0)
    fh.write(f"host {socket.gethostname()}, pid {os.getpid()}, working directory {os.getcwd()}, since now\\n")
    fh.flush()
    print("held", flush=True)
    time.sleep(600)
""")

# workflow_scripts/train.py run as Snakemake runs it, with a stand-in of Snakemake's object.
RUN_SCRIPT = textwrap.dedent("""\
    import json, runpy, sys, types

    class Named(dict):  # Snakemake's named lists: items and attributes
        __getattr__ = dict.__getitem__

    a = json.loads(sys.argv[1])
    sm = types.SimpleNamespace(
        scriptdir=a["scriptdir"], log=[a["log"]], config={"device": "cpu"},
        params=Named(checkpoint=a["checkpoint"], data_dir=a["data_dir"], settings=None, method=None, num_clients=3),
        wildcards=Named(method="fedavg", noise="clean", seed="0"),
        resources=Named(runtime=60, attempt=1),
        input=Named(noise=a["noise"]),
        output=Named(**{k: a["out"] + "/" + k for k in ("metrics", "clients", "model", "relabels")}),
    )
    try:
        runpy.run_path(a["script"], init_globals={"snakemake": sm}, run_name="__main__")
        code = 0
    except SystemExit as stop:
        code = stop.code
    except BaseException as err:
        code = repr(err)
    print(json.dumps({"code": code, "torch": "torch" in sys.modules}))
""")


def _lock_file(checkpoint: Path) -> Path:
    """The contract: a run's lock is an flock on ``<checkpoint>.lock`` (written here, not imported,
    so that the tests fail on code without run locks instead of erring)."""
    return Path(f"{checkpoint}.lock")


def _holder_of(path: Path) -> str | None:
    """The recorded holder of a lock file that a live process holds; None when none does."""
    import fcntl

    try:
        fh = open(path)
    except FileNotFoundError:
        return None
    with fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return fh.read().strip()
        return None


def _hold(path: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _kill(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()


def _start_train_script(tmp_path: Path, checkpoint: Path, log: Path) -> tuple[dict, str]:
    scripts = REPO_ROOT / "workflow_scripts"
    args = {"script": str(scripts / "train.py"), "scriptdir": str(scripts),
            "checkpoint": str(checkpoint), "log": str(log), "data_dir": str(tmp_path / "no-data"),
            "noise": str(tmp_path / "no-noise.parquet"), "out": str(tmp_path / "run")}
    res = subprocess.run([sys.executable, "-c", RUN_SCRIPT, json.dumps(args)], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert res.stdout.strip(), res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1]), res.stderr


def test_a_second_start_of_a_run_refuses_and_touches_nothing_of_the_run(tmp_path):
    checkpoint = tmp_path / "checkpoints" / "seed0.pt"
    journal, log = Path(f"{checkpoint}.log"), tmp_path / "logs" / "seed0.log"
    holder = _hold(_lock_file(checkpoint))
    try:
        # what the live writer has so far: a checkpoint, its journal, its log
        checkpoint.write_bytes(b"checkpoint of round 4")
        journal.write_text("10:00:00 INFO round 4/16\n")
        log.parent.mkdir()
        log.write_text("10:00:00 INFO run ..., attempt 1\n10:00:00 INFO round 4/16\n")
        before = {p: p.read_bytes() for p in (checkpoint, journal, log)}

        got, err = _start_train_script(tmp_path, checkpoint, log)
        assert got["code"] not in (0, None), (got, err[-3000:])
        assert f"pid {holder.pid}" in err and f"host {socket.gethostname()}" in err, err[-3000:]
        assert "did not start" in err and "resumes from its checkpoint" in err  # the two ways on
        assert {p: p.read_bytes() for p in before} == before  # checkpoint, journal and log untouched
        assert not Path(f"{checkpoint}.failed.json").exists()  # no marker: a retry checks the lock again
        assert not got["torch"]  # refused before loading anything
        assert not (tmp_path / "run").exists()

        # Snakemake deletes a job's log before the job starts: the refused job leaves its reason
        # there, not as an ERROR (`fnl status` must not call the run failed: it is being written)
        log.unlink()
        got, err = _start_train_script(tmp_path, checkpoint, log)
        note = log.read_text()
        assert got["code"] not in (0, None) and f"pid {holder.pid}" in note and str(journal) in note, note
        assert " ERROR " not in note
        assert {p: p.read_bytes() for p in (checkpoint, journal)} == {p: before[p] for p in (checkpoint, journal)}
        assert f"pid {holder.pid}" in _holder_of(_lock_file(checkpoint))
    finally:
        _kill(holder)
    # the holder died: the kernel released its lock; the next writer takes it over
    assert _holder_of(_lock_file(checkpoint)) is None
    lock = results_lock.lock_run(checkpoint)
    assert lock is not None and f"pid {os.getpid()}" in lock.path.read_text()
    other = subprocess.run([sys.executable, "-c", "import sys; from fnlcore.app.results_lock import lock_run; "
                            "lock_run(sys.argv[1])", str(checkpoint)], capture_output=True, text=True, timeout=60)
    assert other.returncode != 0 and "RunBusy" in other.stderr and f"pid {os.getpid()}" in other.stderr
    lock.release()
    assert not lock.path.exists() and _holder_of(_lock_file(checkpoint)) is None


@pytest.mark.slow  # one Snakemake DAG (about 10 s); today's code ran every job of the run instead
def test_the_workflow_does_not_start_a_run_that_a_live_process_writes(tmp_path):
    config = load_test_config("kill_resume")
    configfile = write_config(tmp_path, config)
    plan = expected_plan(configfile)
    run = plan.runs()[0]
    target = run.files(plan.results_dir)["metrics"]
    checkpoint = tmp_path / run.checkpoint(plan.results_dir)
    holder = _hold(_lock_file(checkpoint))
    try:
        checkpoint.write_bytes(b"checkpoint of round 4")
        res = run_snakemake(tmp_path, configfile, "--", target)
        out = output_of(res)
        assert res.returncode != 0, out[-5000:]
        assert "This workflow did not start" in out and f"pid {holder.pid}" in out, out[-5000:]
        assert str(checkpoint.relative_to(tmp_path)) in out
        # no job ran: no prepared data, no log of the run (Snakemake deletes a job's log first)
        assert not (tmp_path / plan.results_dir / "data").exists()
        assert not (tmp_path / plan.results_dir / "logs").exists()
        assert checkpoint.read_bytes() == b"checkpoint of round 4"
    finally:
        _kill(holder)


@pytest.mark.slow  # a workflow of 4 jobs, then 3 short Snakemake commands: ~35 s of CPU, a minute on 2 idle cores
def test_after_a_kill_of_snakemake_alone_its_live_train_job_stays_the_only_writer(tmp_path):
    """The issue's case: `kill -9` of Snakemake while its train job runs, which goes on (parent 1);
    `--unlock` and the same command must not start the run a second time, nor delete its log;
    once that job is gone, the same command resumes the run from its checkpoint."""
    import signal
    import time

    from .test_recovery import hook_env, make_hook
    from .workflow_support import job_counts, snakemake_command

    config = load_test_config("kill_resume")
    configfile = write_config(tmp_path, config)
    plan = expected_plan(configfile)
    run = plan.runs()[0]
    target = run.files(plan.results_dir)["metrics"]
    checkpoint = tmp_path / run.checkpoint(plan.results_dir)
    hook, flag = make_hook(tmp_path / "hook"), tmp_path / "held"
    command = snakemake_command(tmp_path, configfile, "--set-threads", "train=1", "--", target)
    with open(tmp_path / "first.out", "w") as fh:  # its train job holds after its first checkpoint
        first = subprocess.Popen(command, cwd=tmp_path, env=hook_env(hook, "train.py", flag, at=checkpoint),
                                 stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not flag.exists():
            assert first.poll() is None and time.monotonic() < deadline, (tmp_path / "first.out").read_text()[-5000:]
            time.sleep(0.1)
        os.kill(first.pid, signal.SIGKILL)  # Snakemake alone
        first.wait()
        holder = _holder_of(_lock_file(checkpoint))
        assert holder is not None, "the train job holds its run's lock"
        pid = int(holder.split("pid ")[1].split(",")[0])
        (log,) = (tmp_path / plan.results_dir / "logs" / "runs").rglob("*.log")
        before = {p: p.read_bytes() for p in (checkpoint, log, Path(f"{checkpoint}.log"))}

        env = hook_env(hook)
        unlock = subprocess.run(snakemake_command(tmp_path, configfile, "--unlock"), cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        assert unlock.returncode == 0, output_of(unlock)[-3000:]
        again = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        out = output_of(again)
        assert again.returncode != 0 and "This workflow did not start" in out and f"pid {pid}" in out, out[-5000:]
        assert {p: p.read_bytes() for p in before} == before  # the live writer's checkpoint, log and journal
        assert _holder_of(_lock_file(checkpoint)) == holder  # it still runs, alone

        os.kill(pid, signal.SIGKILL)  # stopped, as the message says; the run resumes
        deadline = time.monotonic() + 60
        while _holder_of(_lock_file(checkpoint)) is not None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        resumed = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                                 timeout=RUN_TIMEOUT_S)
        out = output_of(resumed)
        assert resumed.returncode == 0 and job_counts(out) == {"train": 1}, out[-5000:]
        assert "resum" in log.read_text().lower() and (tmp_path / target).is_file()
        assert not _lock_file(checkpoint).exists()  # released and removed at the end
    finally:
        try:
            os.killpg(first.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_fnl_cell_does_not_start_snakemake_while_a_workflow_holds_the_results_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    results = tmp_path / "results"
    holder = _hold(results / results_lock.LOCK_NAME)
    try:
        rc = cli.main(["cell", "demo", "demo", "--row", "FedAvg", "--col", "clean", "--results", str(results)])
        err = capsys.readouterr().err
    finally:
        _kill(holder)
    assert rc == 1 and f"pid {holder.pid}" in err and "Do not run `snakemake --unlock`" in err, err
    assert not (tmp_path / ".snakemake").exists()  # Snakemake was not started


class _FullDisk:
    """A lock file on a full disk: it opens and locks, writing the holder's line fails (ENOSPC)."""

    def __init__(self, fh):
        self._fh = fh

    def __getattr__(self, name):
        return getattr(self._fh, name)

    def flush(self):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


# A train job that holds after its first checkpoint until the file FNL_TEST_GO exists (then goes on).
_HOLD_UNTIL_GO = textwrap.dedent('''\
    import os, sys, time
    if sys.argv and sys.argv[0].endswith(".train.py") and os.environ.get("FNL_TEST_GO"):
        _replace = os.replace

        def _held_replace(src, dst, *args, **kwargs):
            _replace(src, dst, *args, **kwargs)
            if os.path.abspath(os.fspath(dst)) == os.environ["FNL_TEST_AT"] and not os.path.exists(os.environ["FNL_TEST_FLAG"]):
                open(os.environ["FNL_TEST_FLAG"], "w").close()
                while not os.path.exists(os.environ["FNL_TEST_GO"]):
                    time.sleep(0.05)

        os.replace = _held_replace
''')


@pytest.mark.slow
def test_a_run_that_outlived_its_killed_snakemake_and_finished_is_not_trained_again(tmp_path):
    """Issue 46, item 5: the run finished on its own (`fnl status`: done), yet its killed Snakemake had
    marked it incomplete and the next command trained it again from round 0. It now keeps its final
    checkpoint, so that rerun rewrites the same outputs from it without training."""
    import signal
    import time

    from .workflow_support import job_counts, snakemake_command

    config = load_test_config("kill_resume")
    configfile = write_config(tmp_path, config)
    plan = expected_plan(configfile)
    run = plan.runs()[0]
    metrics = tmp_path / run.files(plan.results_dir)["metrics"]
    checkpoint = tmp_path / run.checkpoint(plan.results_dir)
    hook, flag, go = tmp_path / "hook", tmp_path / "held", tmp_path / "go"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_HOLD_UNTIL_GO)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)}
    held = {**env, "FNL_TEST_GO": str(go), "FNL_TEST_FLAG": str(flag), "FNL_TEST_AT": str(checkpoint)}
    command = snakemake_command(tmp_path, configfile, "--set-threads", "train=1", "--", str(metrics.relative_to(tmp_path)))
    with open(tmp_path / "first.out", "w") as fh:
        first = subprocess.Popen(command, cwd=tmp_path, env=held, stdout=fh, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not flag.exists():
            assert first.poll() is None and time.monotonic() < deadline, (tmp_path / "first.out").read_text()[-5000:]
            time.sleep(0.1)
        os.kill(first.pid, signal.SIGKILL)  # Snakemake alone; its train job goes on
        first.wait()
        go.touch()
        while _holder_of(_lock_file(checkpoint)) is not None:  # the orphan trains to the end
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert metrics.is_file() and checkpoint.is_file(), "the finished orphan keeps its final checkpoint"
        finished = metrics.read_bytes()
        unlock = subprocess.run(snakemake_command(tmp_path, configfile, "--unlock"), cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        assert unlock.returncode == 0, output_of(unlock)[-3000:]
        again = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        out = output_of(again)
        assert again.returncode == 0 and job_counts(out) == {"train": 1}, out[-5000:]  # Snakemake reruns it...
        total = int(re.findall(r"\(\d+ of (\d+)\)", (tmp_path / "first.out").read_text())[-1])  # the orphan's rounds
        assert f"at round {total} " in out and f" of {total})" not in out, out[-5000:]  # ...from its end: no round
        assert metrics.read_bytes() == finished  # the same numbers, rows and seconds: nothing retrained
        assert not checkpoint.exists()
    finally:
        go.touch()
        try:
            os.killpg(first.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_results_lock_on_a_full_disk_says_so_and_holds_nothing(tmp_path, monkeypatch):
    from fnlcore.errors import StorageError

    real_open = results_lock.open_regular  # how the lock module opens its files (never following a link)
    monkeypatch.setattr(results_lock, "open_regular", lambda *a, **k: _FullDisk(real_open(*a, **k)))
    with pytest.raises(StorageError, match=r"no space left on the disk holding .*free some space"):
        results_lock.lock_results(tmp_path / "results")
    monkeypatch.undo()
    assert _holder_of(tmp_path / "results" / results_lock.LOCK_NAME) is None  # released with the error
    assert results_lock.lock_results(tmp_path / "results") is not None
    results_lock.release_results(tmp_path / "results")


def test_fnl_status_reads_config_overrides_and_says_who_writes_a_started_run(tmp_path, capsys):
    import yaml

    from fnlcore.app.plan import build_plan, validate_schema

    configfile = tmp_path / "c.yaml"
    configfile.write_text(f"results_dir: {tmp_path}/results\ndata_grid: []\n")
    argv = ["status", "--configfile", str(configfile), "--config", 'tables=["fednoro/1"]', "scale=smoke"]
    # what the workflow reads for the same options: config/config.yaml, the file, then --config
    config = yaml.safe_load((REPO_ROOT / "config" / "config.yaml").read_text())
    config.update(results_dir=f"{tmp_path}/results", data_grid=[], tables=["fednoro/1"], scale="smoke")
    plan = build_plan(validate_schema(config))
    assert len(plan.runs()) != 12  # not the demo of config/config.yaml

    rc = cli.main(argv)
    out, err = capsys.readouterr()
    assert rc == 0 and "fednoro/1" in err and "--config" in err and "no workflow is running" in err, err
    assert out.startswith(f"done 0  running 0  failed 0  pending {len(plan.runs())}\n"), out[:300]
    assert {l.split()[1] for l in out.splitlines()[1:]} == {
        r.files(plan.results_dir)["metrics"].rsplit("/", 1)[0] for r in plan.runs()}

    run = plan.runs()[0]
    checkpoint = Path(run.checkpoint(plan.results_dir))
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"x")
    holder = _hold(_lock_file(checkpoint))
    try:
        cli.main(argv)
        out = capsys.readouterr().out
    finally:
        _kill(holder)
    (line,) = [l for l in out.splitlines() if l.startswith("running ")]
    assert f"being written by host {socket.gethostname()}, pid {holder.pid}" in line, line
    cli.main(argv)
    (line,) = [l for l in capsys.readouterr().out.splitlines() if l.startswith("running ")]
    assert "interrupted" in line and "pid" not in line, line
