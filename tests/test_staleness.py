"""A plain rerun is never stale: what Snakemake reruns agrees with what a table shows and with `fnl status`.

One tiny table (digits, 3 clients, 2 rounds, one run: 5 jobs) is built once in a copy of
the workflow (papers are read from config/papers/ beside fnlcore, so the test table needs
its own copy); each test then changes one thing and asks Snakemake, mostly with a dry run,
what a plain rerun would do:

* the table's metric summary changes in the paper YAML -> the table is rebuilt, with the new numbers;
* a run's outputs are deleted, or its job failed -> the run and its table are rebuilt, and
  `fnl status` said so before and says done after;
* `device` changes -> nothing reruns (it is not part of a run's path);
* another scale -> the table goes to another folder, the paper-scale table stays;
* another workflow holds the results folder -> this one stops before any job, naming it.

Tests restore what they change, so they run in any order.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from .workflow_support import RUN_TIMEOUT_S, job_counts, nothing_to_do, output_of

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
WORKFLOW_PARTS = ("Snakefile", "rules", "workflow_scripts", "config", "fnlcore", "report", "envs")
PAPER = "stalenesstest"
TABLE_DOC = {
    "paper": PAPER,
    "title": "Staleness test: one run",
    "defaults": {
        "dataset": "digits",
        "partition": {"name": "iid", "num_clients": 3},
        "partition_seed": 0,
        "noise_seed": 0,
        "seeds": [0],
        "training": {"model": "mlp", "rounds": 2, "local_epochs": 1, "batch_size": 64, "optimizer": "adam",
                     "lr": 0.003},
    },
    "tables": [{
        "id": "t",
        "title": "Balanced accuracy (%) on digits",
        "metrics": [{"name": "bacc", "label": "BACC", "source": "bacc", "summary": {"kind": "best"}}],
        "columns": [{"label": "clean", "noise": {"name": "clean"}}],
        "rows": [{"label": "FedAvg", "method": {"name": "fedavg"}}],
    }],
}


class Tiny:
    """The built copy: where it is and how to run Snakemake and `fnl` there."""

    def __init__(self, root: Path):
        self.copy = root / "workflow"
        self.workdir = root / "work"
        self.paper = self.copy / "config" / "papers" / f"{PAPER}.yaml"
        self.configfile = self.workdir / "config.yaml"

    def env(self) -> dict[str, str]:
        path = os.pathsep.join(p for p in (str(self.copy), os.environ.get("PYTHONPATH", "")) if p)
        return {**os.environ, "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1"}

    def snakemake(self, *args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(self.copy / "Snakefile"),
               "--configfile", str(self.configfile), "--cores", "2", *args]
        return subprocess.run(cmd, cwd=self.workdir, env=self.env(), capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_S)

    def fnl_status(self) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "fnlcore.cli", "status", "--configfile", str(self.configfile)]
        return subprocess.run(cmd, cwd=self.workdir, env=self.env(), capture_output=True, text=True, timeout=300)

    def run_dir(self) -> Path:
        """The table's one run (found once built: the copy's papers are not this process's)."""
        if not hasattr(self, "_run_dir"):
            (metrics,) = (self.workdir / "results" / "runs").rglob("metrics.parquet")
            self._run_dir = metrics.parent
        return self._run_dir

    def table(self, scale: str = "paper") -> dict[str, Path]:
        """results/tables/<scale>/<paper>/<table>.* (fnlcore.app.runs.TABLE)."""
        from fnlcore.app.runs import TABLE, TABLE_FILES

        base = TABLE.format(results=self.workdir / "results", scale=scale, paper=PAPER, table="t")
        return {k: Path(base + suffix) for k, suffix in TABLE_FILES.items()}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Tiny:
    t = Tiny(tmp_path_factory.mktemp("staleness"))
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    t.copy.mkdir()
    for part in WORKFLOW_PARTS:
        src = REPO / part
        (shutil.copytree(src, t.copy / part, ignore=ignore) if src.is_dir() else shutil.copy2(src, t.copy / part))
    t.paper.write_text(yaml.safe_dump(TABLE_DOC, sort_keys=False))
    t.workdir.mkdir()
    t.configfile.write_text(yaml.safe_dump(
        {"results_dir": "results", "device": "cpu", "tables": [PAPER], "data_grid": [], "scale": "paper"}))
    res = t.snakemake()
    assert res.returncode == 0, output_of(res)[-5000:]
    t.first_output = output_of(res)
    t.run_dir()
    return t


def _values(csv: Path) -> list[float]:
    return pd.read_csv(csv)["reproduced_mean"].tolist()


def test_a_changed_metric_summary_rebuilds_the_table_on_a_plain_rerun(tiny):
    """{kind: best} -> {kind: last_mean, n: 1}: a param digest of the table's spec is tracked."""
    from fnlcore.io import read_parquet

    original = tiny.paper.read_text()
    doc = yaml.safe_load(original)
    doc["tables"][0]["metrics"][0]["summary"] = {"kind": "last_mean", "n": 1}
    try:
        tiny.paper.write_text(yaml.safe_dump(doc, sort_keys=False))
        dry = tiny.snakemake("-n")
        assert job_counts(output_of(dry)) == {"table": 1, "all": 1}, output_of(dry)[-3000:]
        assert "Params have changed" in output_of(dry)
        res = tiny.snakemake()
        assert res.returncode == 0, output_of(res)[-3000:]
        last = read_parquet(str(tiny.run_dir() / "metrics.parquet"))["bacc"].dropna().iloc[-1]
        assert _values(tiny.table()["csv"]) == pytest.approx([100 * last])
        # the job log's summary is the table's status line
        status = tiny.table()["md"].read_text().split("**Status.** ")[1].splitlines()[0]
        assert status in (tiny.workdir / "results" / "logs" / "tables" / "paper" / PAPER / "t.log").read_text()
    finally:
        tiny.paper.write_text(original)
    res = tiny.snakemake()  # back to {kind: best}: rebuilt again, then nothing to do
    assert res.returncode == 0 and job_counts(output_of(res)) == {"table": 1, "all": 1}, output_of(res)[-3000:]
    assert nothing_to_do(tiny.snakemake("-n"))


def test_a_deleted_or_failed_run_is_rerun_with_its_table_and_fnl_status_agrees(tiny):
    run = tiny.run_dir()
    table_before = tiny.table()["md"].stat().st_mtime_ns
    # what a failed job leaves: Snakemake deletes its outputs; its log names the error
    (run / "metrics.parquet").unlink()
    log = tiny.workdir / "results" / "logs" / "runs" / (str(run.relative_to(tiny.workdir / "results" / "runs")) + ".log")
    log.write_text(log.read_text() + "12:00:00 ERROR RuntimeError: a failure for the test\n")
    status = tiny.fnl_status()
    assert status.returncode == 1 and "failed 1" in status.stdout, status.stdout + status.stderr
    dry = tiny.snakemake("-n")
    assert job_counts(output_of(dry)) == {"train": 1, "table": 1, "all": 1}, output_of(dry)[-3000:]
    # and deleted by hand: every output gone, no log -> pending, and the same plan
    shutil.rmtree(run)
    log.unlink()
    status = tiny.fnl_status()
    assert "pending 1" in status.stdout, status.stdout + status.stderr
    assert job_counts(output_of(tiny.snakemake("-n"))) == {"train": 1, "table": 1, "all": 1}
    res = tiny.snakemake()
    assert res.returncode == 0, output_of(res)[-3000:]
    assert tiny.table()["md"].stat().st_mtime_ns > table_before
    status = tiny.fnl_status()
    assert status.returncode == 0 and "done 1" in status.stdout, status.stdout + status.stderr
    assert nothing_to_do(tiny.snakemake("-n"))


def test_the_device_is_not_part_of_a_run_so_changing_it_reruns_nothing(tiny):
    """A run is its path; the device is not in it (equal numbers on any device up to float rounding)."""
    for device in ("auto",):  # recorded: cpu (a device this machine lacks is refused before any job)
        res = tiny.snakemake("-n", "--config", f"device={device}")
        assert nothing_to_do(res), output_of(res)[-3000:]


def test_tables_of_another_scale_get_their_own_folder(tiny, tmp_path):
    paper = tiny.table("paper")
    fast = tiny.table("paper_fast")
    smoke = tiny.table("smoke")
    assert len({paper["md"], fast["md"], smoke["md"]}) == 3
    assert paper["md"].parent.parent.name == "paper" and smoke["md"].parent.parent.name == "smoke"
    before = paper["md"].read_bytes()
    res = tiny.snakemake("-n", "--config", "scale=smoke")
    assert res.returncode == 0, output_of(res)[-3000:]
    out = output_of(res)
    assert str(smoke["md"].relative_to(tiny.workdir)) in out and str(paper["md"].relative_to(tiny.workdir)) not in out
    assert paper["md"].read_bytes() == before


def test_a_results_folder_held_by_another_workflow_stops_this_one_before_any_job(tiny):
    results = tiny.workdir / "results"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from fnlcore.app.results_lock import lock_results\n"
         "lock_results(sys.argv[1], '/another/checkout'); print('held', flush=True); time.sleep(600)",
         str(results)],
        stdout=subprocess.PIPE, text=True, env=tiny.env(),
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        table_before = tiny.table()["md"].stat().st_mtime_ns
        assert tiny.snakemake("-n", "--forcerun", "table").returncode == 0  # a dry run writes nothing: no lock
        res = tiny.snakemake("--forcerun", "table")
        out = output_of(res)
        assert res.returncode != 0, out[-3000:]
        assert "Results folder locked" in out and "/another/checkout" in out and f"pid {holder.pid}" in out, out[-3000:]
        assert "results_dir" in out  # the way out
        assert tiny.table()["md"].stat().st_mtime_ns == table_before  # no job ran
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone (killed: the kernel released its lock): the same command now runs
    res = tiny.snakemake("--forcerun", "table")
    assert res.returncode == 0, output_of(res)[-3000:]
    assert job_counts(output_of(res)) == {"table": 1, "all": 1}
    assert "working directory" in (results / ".fnl-lock").read_text()


def test_the_printed_report_command_runs_as_printed_and_opens_on_the_tables(tiny):
    m = re.search(r"^Report with every table and figure: (.+) \(then open report.html\)$", tiny.first_output, re.M)
    assert m, tiny.first_output[-3000:]
    command = shlex.split(m.group(1))
    assert command[:3] == [sys.executable, "-m", "snakemake"]  # how this test started it (python -m snakemake)
    assert command[-2:] == ["--report", "report.html"] and str(tiny.configfile) in command
    res = subprocess.run(command, cwd=tiny.workdir, env=tiny.env(), capture_output=True, text=True,
                         timeout=RUN_TIMEOUT_S)
    assert res.returncode == 0, output_of(res)[-3000:]
    page = (tiny.workdir / "report.html").read_text()
    # the landing text (report/workflow.rst) holds each table itself, under its name and scale
    assert f"{PAPER} / t (paper scale)</h1>" in page
    assert 'class=\\"fnl-table\\"' in page or 'class="fnl-table"' in page
    (tiny.workdir / "report.html").unlink()
