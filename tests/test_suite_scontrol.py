"""The suite's scontrol (tests/support/bin/scontrol, first on PATH from tests/conftest.py): the real
one where a Slurm controller runs here or where FNL_TESTS_REAL_SCONTROL is set, an immediate
"unreachable controller" otherwise (an installed but stopped Slurm makes the real one wait 10 s
at every Snakemake start)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path


SHIM = Path(__file__).resolve().parent / "support" / "bin" / "scontrol"


def _real_scontrol(folder: Path) -> Path:
    folder.mkdir()
    real = folder / "scontrol"
    real.write_text('#!/bin/sh\necho "real scontrol: $*"\n')
    real.chmod(0o755)
    return folder


# The controller the shim looks for goes by a name of this test's own, so a real Slurm running on
# this machine (tests/test_slurm.py's) does not decide the outcome.
CTLD = f"fnlctld{os.getpid() % 100000}"


def _run(path: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([str(SHIM), "show", "config"], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PATH": path, "FNL_TESTS_SLURMCTLD_NAME": CTLD, **env})


def test_the_suite_puts_its_scontrol_first_on_path():
    assert os.environ["PATH"].split(os.pathsep)[0] == str(SHIM.parent)


def test_without_a_controller_it_answers_unreachable_and_never_calls_the_real_one(tmp_path):
    bin_dir = _real_scontrol(tmp_path / "bin")
    done = _run(f"{SHIM.parent}{os.pathsep}{bin_dir}{os.pathsep}/usr/bin:/bin")
    assert done.returncode == 1 and "Unable to contact slurm controller" in done.stderr
    assert "real scontrol" not in done.stdout


def test_it_hands_over_to_the_real_one_when_told_or_when_a_controller_runs(tmp_path):
    bin_dir = _real_scontrol(tmp_path / "bin")
    path = f"{SHIM.parent}{os.pathsep}{bin_dir}{os.pathsep}/usr/bin:/bin"
    told = _run(path, FNL_TESTS_REAL_SCONTROL="1")
    assert told.returncode == 0 and told.stdout.strip() == "real scontrol: show config"
    # a controller process: a copy of sleep under the name the shim looks for
    ctld = tmp_path / CTLD
    shutil.copy(shutil.which("sleep"), ctld)
    proc = subprocess.Popen([str(ctld), "60"])
    try:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{proc.pid}/comm").read_text().strip() != CTLD and time.monotonic() < deadline:
            time.sleep(0.05)
        running = _run(path)
        assert running.returncode == 0 and running.stdout.strip() == "real scontrol: show config"
    finally:
        proc.kill()
        proc.wait()


def test_without_any_scontrol_it_is_not_found(tmp_path):
    done = _run(f"{SHIM.parent}{os.pathsep}{tmp_path}")
    assert done.returncode == 127 and "not found" in done.stderr
