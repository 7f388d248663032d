"""The user's path on the console: attributable lines of parallel jobs, short table/all job
messages, and `--until noise` on a table (README's command, run as a dry run)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fnlcore.logs import LOG, job_log, shorten_reason
from fnlcore.progress import round_on_console, round_reporter, run_tag

from .test_paper_tables import job_counts

REPO = Path(__file__).resolve().parents[1]


def _two_jobs(tmp_path, capfd, rounds: int):
    """Two training jobs' console output (on Snakemake's console their lines interleave)."""
    for name, method, seed in (("a", "fedavg", 0), ("b", "fednoro-warmuprounds1", 1)):
        with job_log(tmp_path / f"{name}.log", tag=run_tag(method, "clean", seed)) as log:
            report = round_reporter(log.info)
            for r in range(rounds):
                report(f"round {r}/{rounds - 1} [main] bacc=0.5000 (0.1s)")
    return capfd.readouterr().err


def test_console_lines_name_their_job_and_logs_keep_every_round(tmp_path, capfd):
    err = _two_jobs(tmp_path, capfd, rounds=4)
    lines = [ln for ln in err.splitlines() if "round" in ln]
    assert len(lines) == 8
    assert sum("[fedavg | clean | seed0] INFO round" in ln for ln in lines) == 4
    assert sum("[fednoro-warmuprounds1 | clean | seed1] INFO round" in ln for ln in lines) == 4
    assert "seed0]" not in (tmp_path / "a.log").read_text()  # the file is the job's own: no tag needed


def test_long_runs_print_about_ten_rounds_on_the_console(tmp_path, capfd):
    err = _two_jobs(tmp_path, capfd, rounds=100)
    fedavg = [ln for ln in err.splitlines() if "[fedavg | clean | seed0]" in ln]
    assert len(fedavg) == 11 and fedavg[0].split("INFO ")[1].startswith("round 0/99")
    assert fedavg[-1].split("INFO ")[1].startswith("round 99/99")
    log_rounds = [ln for ln in (tmp_path / "a.log").read_text().splitlines() if " round " in ln]
    assert len(log_rounds) == 100


def test_round_on_console_keeps_first_last_and_every_tenth():
    assert [r for r in range(4) if round_on_console(r, 3)] == [0, 1, 2, 3]
    assert [r for r in range(100) if round_on_console(r, 99)] == [0, 9, 19, 29, 39, 49, 59, 69, 79, 89, 99]
    assert [r for r in range(25) if round_on_console(r, 24)] == [0, 2, 5, 8, 11, 14, 17, 20, 23, 24]


def test_other_messages_always_reach_the_console(tmp_path, capfd):
    with job_log(tmp_path / "x.log", tag="t") as log:
        log.info("resumed from x at round 3")
    assert "[t] INFO resumed from x at round 3" in capfd.readouterr().err
    assert not LOG.handlers


def test_a_continued_run_keeps_its_earlier_jobs_lines_and_a_fresh_run_starts_its_journal_anew(tmp_path):
    log, journal = tmp_path / "run.log", tmp_path / "checkpoints" / "run.pt.log"

    def job(line: str, continued: bool) -> list[str]:
        log.unlink(missing_ok=True)  # Snakemake deletes a job's log before each attempt
        with job_log(log, journal=journal, continued=continued) as lg:
            lg.info(line)
        return [ln.split(" INFO ", 1)[1] for ln in log.read_text().splitlines()]

    assert job("round 0", continued=False) == ["round 0"]
    assert job("round 1", continued=True) == ["round 0", "round 1"]
    assert job("round 2", continued=True) == ["round 0", "round 1", "round 2"]
    assert job("again round 0", continued=False) == ["again round 0"]  # a new run: the old lines are not its own
    assert job("round 1", continued=True) == ["again round 0", "round 1"]


def test_shorten_reason_cuts_long_file_lists_only():
    files = ", ".join(f"r{i}/metrics.parquet" for i in range(36))
    text = f"Missing output files: a.csv, a.md, a.html, a.png; Input files updated by another job: {files}"
    assert shorten_reason(text) == (
        "Missing output files: a.csv, a.md, a.html, a.png; "
        "Input files updated by another job: r0/metrics.parquet, r1/metrics.parquet, ... (36 files)"
    )
    assert shorten_reason("Forced execution") == "Forced execution"


def _snakemake(tmp_path, *args: str) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "snakemake", "-n", "--cores", "2", "--snakefile", str(REPO / "Snakefile"),
           "--directory", str(tmp_path), "--config", 'tables=["fednoro/1"]', "scale=smoke",
           f"results_dir={tmp_path / 'results'}", *args]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    return res.returncode, res.stdout + res.stderr


@pytest.fixture(scope="module")
def table_dry_run(tmp_path_factory):
    return _snakemake(tmp_path_factory.mktemp("dry"))


def test_table_and_all_jobs_print_a_count_not_their_inputs(table_dry_run):
    rc, out = table_dry_run
    assert rc == 0, out[-3000:]
    assert "table fednoro/1: 81 runs' metrics -> " in out  # 9 rows x 9 columns, one seed
    assert "all: 41 files (1 table(s): fednoro/1; 7 noisy label set(s) of the data grid)" in out
    assert "... (81 files)" in out  # the table's reason: two files and a count
    assert max(len(ln) for ln in out.splitlines()) < 2000, "a job still prints every input"


def test_until_noise_on_a_table_plans_labels_only(tmp_path):
    rc, out = _snakemake(tmp_path, "--until", "noise")
    assert rc == 0, out[-3000:]
    counts = job_counts(out)
    assert counts.get("noise", 0) > 0 and not {"train", "table", "all"} & set(counts), counts
    assert "BUG" not in out


def test_finished_message_after_until_says_the_table_is_not_built(tmp_path):
    from fnlcore.app.plan import build_plan, validate_schema
    from fnlcore.app.summary import finished_message

    plan = build_plan(validate_schema({"tables": ["demo"], "data_grid": [], "results_dir": str(tmp_path)}))
    assert "(1 configured table(s) not built yet)" in finished_message(plan)
    empty = build_plan(validate_schema({"tables": [], "data_grid": [], "results_dir": str(tmp_path)}))
    assert "(no table configured)" in finished_message(empty)
