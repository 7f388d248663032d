"""The workflow through ``--profile slurm`` on a real (local, single-node) Slurm.

A session fixture brings up Slurm with accounting (slurmdbd, so ``sacct`` works) through
``scripts/local-slurm.sh start --with-dbd`` -- which installs Debian's packages when they
are missing and therefore needs root -- and stops at the end what it started. Where that is
impossible (not root, no apt-get) the tests FAIL with the reason: they are part of CI.
A Slurm that already runs (``local-slurm.sh status`` succeeds and ``sacct`` answers) is
used as it is and left running.

Each Slurm job costs seconds of Snakemake start-up plus the executor's polling, so the
workflows here are tiny: a 2 x 2 cut of the demo table (tests/configs/slurm_paper.yaml: 10
jobs instead of the demo's 19) on 3 clients and 3 rounds, and one training run. The plugin
waits 10 s longer after every status check that finds no finished job (2, 12, 22, ... s),
which left each step of a chain of 10-20 s jobs idle for 20-30 s after it ended; the
Snakemake processes here start with tests/support/slurm_poll/ on their PYTHONPATH, whose
sitecustomize caps that wait at 2 s (nothing else of the plugin changes).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from .conftest import STOP_SLURM, xdist_worker

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "local-slurm.sh"
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
FNL = [sys.executable, "-m", "fnlcore.cli"]

# Seconds before the executor's first status check (the profile's 20 s suits clusters).
FAST_POLL = ["--slurm-init-seconds-before-status-checks", "2"]
# On the PYTHONPATH of every Snakemake started here: caps the executor's back-off at 2 s.
POLL_HOOK = REPO / "tests" / "support" / "slurm_poll"
# job id -> "rule_<rule>" or "group_<group>_<its rules>" (a packed group job: group_pack_train)
SUBMITTED = re.compile(r"submitted with SLURM jobid (\d+) \(log: \S*/slurm_logs/((?:rule|group)_[A-Za-z0-9_]+)/")

pytestmark = pytest.mark.slow


def _run(cmd, cwd, timeout, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def _slurm_with_accounting_runs() -> bool:
    if shutil.which("sinfo") is None or shutil.which("sacct") is None:
        return False
    if _run(["bash", str(SCRIPT), "status"], REPO, 30).returncode != 0:
        return False
    return _run(["sacct", "-n", "-X", "-o", "JobID"], REPO, 30).returncode == 0


@pytest.fixture(scope="session")
def local_slurm():
    """A running single-node Slurm with accounting; stopped afterwards if this fixture started it."""
    if _slurm_with_accounting_runs():
        yield
        return
    if os.geteuid() != 0:
        pytest.fail(
            "tests/test_slurm.py needs a Slurm with accounting on this machine: none is running and "
            "scripts/local-slurm.sh must run as root to install and start one (apt-get, daemons). "
            "Run `sudo scripts/local-slurm.sh start --with-dbd` first, or run the tests as root."
        )
    started = _run(["bash", str(SCRIPT), "start", "--with-dbd"], REPO, 900)
    if started.returncode != 0:
        pytest.fail(
            "scripts/local-slurm.sh start --with-dbd could not bring up Slurm "
            f"(exit {started.returncode}):\n{started.stdout}\n{started.stderr}"
        )
    if xdist_worker():  # the controller stops it after every worker (tests/conftest.py)
        (Path(os.environ["FNL_TEST_SESSION_DIR"]) / STOP_SLURM).touch()
        yield
        return
    yield
    _run(["bash", str(SCRIPT), "stop"], REPO, 120)


WORKFLOW_PARTS = ("Snakefile", "rules", "workflow_scripts", "config", "fnlcore", "report", "envs")
TEST_PAPER = "slurmtest"


def _workflow_copy(dest: Path) -> Path:
    """The workflow and fnlcore copied to ``dest``, with tests/configs/slurm_paper.yaml as a paper.

    Papers are read from config/papers/ beside fnlcore, so a test table needs its own copy;
    jobs import the copy's fnlcore through PYTHONPATH (sbatch passes the environment on).
    """
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    dest.mkdir(parents=True)
    for part in WORKFLOW_PARTS:
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, dest / part, ignore=ignore)
        else:
            shutil.copy2(src, dest / part)
    shutil.copy2(REPO / "tests" / "configs" / "slurm_paper.yaml", dest / "config" / "papers" / f"{TEST_PAPER}.yaml")
    return dest


def _env_for(copy: Path | None = None) -> dict[str, str]:
    """The environment of a Snakemake (or fnl) process: the poll cap, then ``copy``'s fnlcore if given."""
    front = [str(POLL_HOOK)] + ([str(copy)] if copy is not None else [])
    path = os.pathsep.join(p for p in (*front, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1"}


def _workdir(tmp_path: Path, scale: str) -> Path:
    """A working directory whose ./slurm is the repository's profile, plus a scale file."""
    (tmp_path / "slurm").symlink_to(REPO / "slurm", target_is_directory=True)
    (tmp_path / "scale.yaml").write_text(scale)
    return tmp_path


def _submitted(log: str) -> dict[str, str]:
    """Slurm job id -> rule (or "group_<name>_<rules>" for a packed group job), from Snakemake's own log lines."""
    return {jid: name.removeprefix("rule_") for jid, name in SUBMITTED.findall(log)}


def _sacct(job_ids) -> pd.DataFrame:
    out = _run(
        ["sacct", "-n", "-X", "-P", "-j", ",".join(job_ids), "-o", "JobID,State,ReqTRES"], REPO, 60
    ).stdout
    rows = [line.split("|") for line in out.splitlines() if line.strip()]
    return pd.DataFrame(rows, columns=["job", "state", "tres"]).set_index("job")


def _sacct_until_recorded(job_ids, timeout=60) -> pd.DataFrame:
    """sacct, once slurmdbd has recorded every job's final state (it lags a little)."""
    deadline = time.monotonic() + timeout
    while True:
        df = _sacct(job_ids)
        done = len(df) == len(set(job_ids)) and not df["state"].isin(["PENDING", "RUNNING"]).any()
        if done or time.monotonic() > deadline:
            return df
        time.sleep(2)


def test_poll_hook_caps_the_executor_back_off_and_nothing_else(local_slurm):
    """The sitecustomize of POLL_HOOK, in a fresh interpreter: the plugin's waits end up <= 2 s.

    (With Slurm installed but not running, importing the plugin alone takes ~9 s: at import it
    runs `scontrol show config`, which retries the controller for MessageTimeout seconds.)
    """
    probe = (
        "import snakemake_executor_plugin_slurm as p\n"
        "e = p.Executor.__new__(p.Executor)\n"
        "e._next_seconds_between_status_checks = None\n"
        "out = []\n"
        "for s in (12, 180, 1.5):\n"
        "    e.next_seconds_between_status_checks = s\n"
        "    out.append(e.next_seconds_between_status_checks)\n"
        "print(out)\n"
    )
    res = _run([sys.executable, "-c", probe], REPO, 120, env=_env_for())
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split() == ["[2.0,", "2.0,", "1.5]"]
    # without the hook the plugin keeps its own back-off (the cap is a test-only change)
    res = _run([sys.executable, "-c", probe], REPO, 120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split() == ["[12,", "180,", "1.5]"]


TINY_DEMO = """\
# The demo table at a scale where each job takes seconds.
num_clients: 3
seeds: [0]
training: {rounds: 3, eval_batch_size: 512}
noises:
  fednoro_hidn: {annotator_epochs: 1}
"""


def test_literal_profile_from_the_repository_root_is_found(local_slurm, tmp_path):
    """`snakemake --profile slurm` typed in the repository root plans Slurm jobs with the GPU resource."""
    scale = tmp_path / "scale.yaml"
    scale.write_text(TINY_DEMO)
    res = _run(
        [*SNAKEMAKE, "--profile", "slurm", "-n", "--config", f"scale={scale}", "data_grid=[]",
         f"results_dir={tmp_path / 'results'}"],
        REPO, 300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout + res.stderr
    # "Using profile slurm", or "Using profiles slurm and workflow specific profile profiles/default"
    assert re.search(r"Using profiles? slurm\b", out), out[-2000:]
    assert re.search(r"rule train:.*?resources:[^\n]*gpu=1", out, re.S)
    assert re.search(r"rule annotator:.*?resources:[^\n]*gpu=1", out, re.S)
    assert not (tmp_path / "results").exists()  # a dry run writes nothing


def test_table_through_slurm(local_slurm, tmp_path):
    """data -> partition -> annotator -> noise -> 4 training runs -> table, every job a Slurm job;
    the training runs packed two to a Slurm job that asks for ONE GPU (rules/train.smk)."""
    copy = _workflow_copy(tmp_path / "workflow")
    (tmp_path / "work").mkdir()
    wd = _workdir(tmp_path / "work", TINY_DEMO)
    res = _run(
        [*SNAKEMAKE, "--snakefile", str(copy / "Snakefile"), "--profile", "slurm",
         "--config", "scale=scale.yaml", "data_grid=[]", f"tables=[{TEST_PAPER}]",
         # two runs a job on the 2-CPU, 2-fake-GPU node; the rules' gpu=1 stays
         "--set-threads", "train=1", "--set-resources", "train:mem_mb=2000",
         "--groups", "train=pack", "--group-components", "pack=2",
         *FAST_POLL],
        wd, 1500, env=_env_for(copy),
    )
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-5000:]
    for ext in ("csv", "md", "html", "curves.png"):
        assert (wd / "results" / "tables" / "scale" / TEST_PAPER / f"t.{ext}").stat().st_size > 0
    table = pd.read_csv(wd / "results" / "tables" / "scale" / TEST_PAPER / "t.csv")
    assert len(table) > 0

    jobs = _submitted(log)
    rules = sorted(jobs.values())
    assert rules.count("group_pack_train") == 2 and "train" not in rules and rules.count("table") == 1
    assert {"prepare_in_memory_dataset", "partition", "noise", "annotator"} <= set(rules)
    acct = _sacct_until_recorded(list(jobs))
    assert set(acct.index) == set(jobs)
    assert (acct["state"] == "COMPLETED").all(), acct
    for jid, rule in jobs.items():
        tres = acct.loc[jid, "tres"]
        assert ("gres/gpu=1" in tres) == (rule in ("group_pack_train", "annotator")), (jid, rule, tres)
        assert "gres/gpu=2" not in tres, (jid, rule, tres)
        if rule == "group_pack_train":  # two runs: their threads and memory add up, their GPU does not
            assert "cpu=2" in tres and "mem=4000M" in tres, tres


ROUNDS = 20  # >= 0.3 s each: the job still runs when the test sees its first checkpoint
LONG_RUN = f"""\
# One run long enough to be cancelled after its first checkpoint.
num_clients: 3
seeds: [0]
training: {{rounds: {ROUNDS}, checkpoint_every: 1, eval_batch_size: 512}}
"""


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL a process started with start_new_session=True and what it started, unless it has ended."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=60)


def _cell(wd: Path, results: str, extra: list[str]) -> list[str]:
    """`fnl cell` for the FedAvg/clean cell of the demo table, Snakemake arguments after --."""
    return [*FNL, "cell", "demo", "demo", "--row", "FedAvg", "--col", "clean",
           "--scale", str(wd / "scale.yaml"), "--results", results, "--", *extra]


def test_cancelled_training_job_is_retried_and_resumes_from_its_checkpoint(local_slurm, tmp_path):
    """scancel a training job mid-run: Snakemake resubmits it, it resumes, metrics equal a local run."""
    from fnlcore.cli import _find, _tables, cell_runs

    wd = _workdir(tmp_path, LONG_RUN)
    (run,) = cell_runs(_find(_tables(str(wd / "scale.yaml"), "demo"), "demo", "demo"), "FedAvg", "clean")
    checkpoint = wd / run.checkpoint("results")
    metrics = wd / run.files("results")["metrics"]
    job_log = Path(str(metrics.parent).replace("/results/runs/", "/results/logs/runs/", 1) + ".log")

    # The same run, uninterrupted and local, in a folder of its own: it runs while the Slurm
    # chain below (one job at a time) leaves the second core idle.
    ref = tmp_path / "reference"
    ref.mkdir()
    ref_out = ref / "snakemake.out"
    with open(ref_out, "w") as sink:
        local = subprocess.Popen(
            _cell(wd, "local", ["--cores", "1"]), cwd=ref, stdout=sink, stderr=subprocess.STDOUT, env=_env_for(),
            start_new_session=True,  # fnl and its Snakemake: stopped together by _kill_group
        )
    out_file = wd / "snakemake.out"
    try:
        with open(out_file, "w") as sink:  # a file, not a pipe: nobody reads while we wait
            proc = subprocess.Popen(
                # One thread, as the local `--cores 1` reference: float sums depend on the thread count.
                _cell(wd, "results", ["--profile", "slurm", "--set-threads", "train=1", *FAST_POLL]),
                cwd=wd, stdout=sink, stderr=subprocess.STDOUT, env=_env_for(),
            )
    except BaseException:
        _kill_group(local)
        raise
    try:
        deadline = time.monotonic() + 600
        while not checkpoint.exists():
            assert proc.poll() is None, f"workflow ended before the first checkpoint:\n{out_file.read_text()[-5000:]}"
            assert time.monotonic() < deadline, "no checkpoint after 600 s"
            time.sleep(0.2)
        running = _run(["squeue", "-h", "-t", "RUNNING", "-o", "%i %k"], wd, 30).stdout.split("\n")
        train_jobs = [line.split()[0] for line in running if "rule_train" in line]
        assert len(train_jobs) == 1, f"expected the training job to be running: {running}"
        assert _run(["scancel", train_jobs[0]], wd, 30).returncode == 0
        proc.wait(timeout=900)
        local.wait(timeout=900)
    finally:
        if proc.poll() is None:  # SIGINT: Snakemake cancels its Slurm jobs (SIGTERM does not stop it)
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        _kill_group(local)
    out = out_file.read_text()
    assert proc.returncode == 0, out[-5000:]

    jobs = _submitted(out)
    train_ids = [j for j, rule in jobs.items() if rule == "train"]
    assert len(train_ids) == 2, out[-5000:]  # the cancelled job and its retry
    acct = _sacct_until_recorded(train_ids)
    assert acct.loc[train_jobs[0], "state"].startswith("CANCELLED")
    retry = next(j for j in train_ids if j != train_jobs[0])
    assert acct.loc[retry, "state"] == "COMPLETED"
    text = job_log.read_text()
    resumed_at = re.search(r"resumed from \S+ at round (\d+)", text)
    assert resumed_at and int(resumed_at.group(1)) >= 1, text[-3000:]
    # one log for the whole run: the cancelled job's rounds, then the retry's (Snakemake deleted the file between)
    first, _, retried = text.partition(", attempt 2\n")
    assert ", attempt 1\n" in first and re.search(r"INFO round 0/", first) and "resumed from" in retried, text[-3000:]

    assert local.returncode == 0, ref_out.read_text()[-5000:]
    resumed = pd.read_parquet(metrics)
    reference = pd.read_parquet(ref / run.files("local")["metrics"])
    # the local `fnl cell` ends with the cell's value, per metric and seed, and the file it read
    said = ref_out.read_text().split("Cell demo/demo", 1)[-1]
    best = 100 * reference["bacc"].max()
    assert re.search(rf"Best, .*: {best:.2f}\n\s+seed 0: {best:.2f}  {re.escape(run.files('local')['metrics'])}", said), said
    assert len(resumed) == ROUNDS
    cols = [c for c in reference.columns if c != "seconds"]
    pd.testing.assert_frame_equal(resumed[cols], reference[cols])
