"""The user's path, as README shows it: one-cell reruns run literally (as dry runs)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fnlcore import cli

from .test_paper_tables import job_counts


def _cell(tmp_path, *extra: str) -> tuple[int, str]:
    """``fnl cell demo demo --row FedNoRo --col clean -- -n EXTRA`` from a scratch folder."""
    cmd = [sys.executable, "-m", "fnlcore.cli", "cell", "demo", "demo", "--row", "FedNoRo", "--col", "clean",
           "--", "-n", *extra]  # the user's options last, as typed
    res = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    return res.returncode, res.stdout + res.stderr


@pytest.mark.parametrize(
    "extra",
    [
        ("--cores", "2"),  # README: rebuild the runs behind one cell
        ("--forcerun", "train"),  # README: recompute a cell that exists (takes several values)
        ("--cores", "2", "--configfile", "f.yaml"),  # a config file of the user's
    ],
    ids=["cores", "forcerun", "configfile"],
)
def test_readme_cell_examples_plan_one_training_run(tmp_path, extra):
    (tmp_path / "f.yaml").write_text("device: cpu\n")
    rc, out = _cell(tmp_path, *extra)
    assert rc == 0, out[-3000:]
    counts = job_counts(out)
    assert counts.get("train") == 1 and "table" not in counts and "all" not in counts, counts


def test_cell_targets_come_before_any_user_option():
    class PT:
        paper, table = "demo", "demo"

    cmd = cli.cell_command(PT, "paper", "results", ["a/metrics.parquet"], ["--forcerun", "train"])
    i = cmd.index("a/metrics.parquet")
    assert cmd[i - 2] == "--snakefile" and cmd[-2:] == ["--forcerun", "train"] and "--cores" in cmd
    assert "--cores" not in cli.cell_command(PT, "paper", "results", ["t"], ["--profile", "slurm"])
