"""Recovery after a kill, as README says: `snakemake --unlock`, then the same command.

Each test kills Snakemake and its jobs (SIGKILL to the process group, as a closed terminal or
a lost node would) while one partition, noise or table job has renamed its first output into
place and not yet the others: a test hook (a ``sitecustomize`` on the jobs' PYTHONPATH, made
in a scratch folder) holds that job there. Snakemake has marked the job's outputs incomplete,
so without the workflow profile's ``rerun-incomplete`` (profiles/default/) the same command
stops with IncompleteFilesException; with it, the command completes. A table meanwhile must
not look finished: its csv comes last (fnlcore.app.build_table).

The partition and noise cases run the data side of one small label set (digits, 3 clients:
prepare, partition, noise); the table case builds the demo table from stand-in metrics of
every one of its runs, Snakemake restricted to the table (``--allowed-rules table all``, in both
commands), so no run is trained.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from fnlcore import paths
from fnlcore.app.runs import TABLE_FILES
from fnlcore.io import write_parquet

from .workflow_support import (
    RUN_TIMEOUT_S,
    expected_plan,
    job_counts,
    kill_group,
    output_of,
    snakemake_command,
    write_config,
)

pytestmark = pytest.mark.slow

DATA_SIDE = {
    "results_dir": "results",
    "device": "cpu",
    "tables": [],
    "data_grid": [{
        "dataset": "digits",
        "partitions": [{"name": "iid", "num_clients": 3}],
        "partition_seeds": [0],
        "noises": [{"name": "fedcorr", "rho": 0.4, "tau": 0.5}],
        "noise_seeds": [0],
    }],
}
DEMO_TABLE = {"results_dir": "results", "device": "cpu", "tables": ["demo"], "data_grid": []}
TABLE_ONLY = ("--allowed-rules", "table", "all")

# Jobs hold here: after the first of their outputs (not a temporary name, not a log; with
# FNL_TEST_HANG_AT, that file only) is renamed into place, the job touches a flag file and
# sleeps until it is killed. Only the job whose script is FNL_TEST_HANG_SCRIPT.
HOOK = textwrap.dedent('''\
    import os, sys
    _script = os.environ.get("FNL_TEST_HANG_SCRIPT")
    if _script and sys.argv and sys.argv[0].endswith("." + _script):
        _replace = os.replace
        _at = os.environ.get("FNL_TEST_HANG_AT")

        def _held_replace(src, dst, *args, **kwargs):
            _replace(src, dst, *args, **kwargs)
            dst = os.fspath(dst)
            if _at and os.path.abspath(dst) != _at:
                return
            if not os.path.basename(dst).startswith(".") and "/logs/" not in dst:
                with open(os.environ["FNL_TEST_HANG_FLAG"], "w") as fh:
                    fh.write(dst)
                import time
                while True:
                    time.sleep(60)

        os.replace = _held_replace
''')


def hook_env(hook: Path, hang: str | None = None, flag: Path | None = None, at: Path | None = None) -> dict[str, str]:
    """The environment of a Snakemake whose ``hang`` jobs hold (see HOOK); none with ``hang`` None."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FNL_TEST_HANG")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)
    if hang:
        env.update(FNL_TEST_HANG_SCRIPT=hang, FNL_TEST_HANG_FLAG=str(flag))
        if at is not None:
            env["FNL_TEST_HANG_AT"] = str(at)
    return env


def make_hook(folder: Path) -> Path:
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(HOOK)
    return folder


def _stand_in_metrics(workdir: Path, configfile: Path) -> None:
    """A metrics file for every run of the table (what test_table_labels renders), no other output."""
    from fnlcore.methods import METHODS

    plan = expected_plan(configfile)
    for i, run in enumerate(plan.runs()):
        stage = (getattr(METHODS[run.method.name], "reported_stages", None) or ["main"])[-1]
        acc = [0.5 + 0.01 * r + 0.001 * i for r in range(3)]
        write_parquet(pd.DataFrame({"round": range(3), "stage": stage, "bacc": acc, "acc": acc}),
                      workdir / run.files(plan.results_dir)["metrics"])


def _outputs(workdir: Path, kind: str) -> list[Path]:
    """Every declared output of the one job of ``kind`` (fnlcore.paths: its folder, stem and suffixes)."""
    results = workdir / "results"
    if kind == "table":
        return [Path(f"{results}/tables/paper/demo/demo{s}") for s in TABLE_FILES.values()]
    stem = "pseed0" if kind == "partition" else "nseed0"
    folder = results / ("partitions" if kind == "partition" else "noise")
    found = [p for p in folder.rglob(stem + ".*") if not p.name.startswith(".")]
    assert found, f"no {kind} output under {folder}"
    suffixes = paths.PARTITION_SUFFIXES if kind == "partition" else paths.NOISE_SUFFIXES
    return [found[0].parent / f"{stem}{s}" for s in suffixes.values()]


@pytest.mark.parametrize("kind, script", [("partition", "make_partition.py"), ("noise", "make_noise.py"),
                                          ("table", "make_table.py")])
def test_after_a_kill_during_a_job_unlock_then_the_same_command_completes(tmp_path, kind, script):
    workdir = tmp_path / "work"
    configfile = write_config(workdir, DEMO_TABLE if kind == "table" else DATA_SIDE)
    args = TABLE_ONLY if kind == "table" else ()
    if kind == "table":
        _stand_in_metrics(workdir, configfile)
    hook = make_hook(tmp_path / "hook")
    flag, out = tmp_path / "held", tmp_path / "killed.out"
    with open(out, "w") as fh:
        proc = subprocess.Popen(snakemake_command(workdir, configfile, *args), cwd=workdir,
                                env=hook_env(hook, script, flag), stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not flag.exists():
            assert proc.poll() is None, out.read_text()[-5000:]
            assert time.monotonic() < deadline, out.read_text()[-5000:]
            time.sleep(0.1)
    finally:
        kill_group(proc)
    outputs = _outputs(workdir, kind)
    present = [p.name for p in outputs if p.exists()]
    assert len(present) == 1 and len(outputs) > 1, present  # killed half-way through the job's outputs
    if kind == "table":
        assert not outputs[0].exists(), f"a half-written table must not look finished: {present}"

    env = hook_env(hook)
    unlock = subprocess.run(snakemake_command(workdir, configfile, "--unlock"), cwd=workdir, env=env,
                            capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert unlock.returncode == 0, output_of(unlock)[-3000:]
    again = subprocess.run(snakemake_command(workdir, configfile, *args), cwd=workdir, env=env,
                           capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    text = output_of(again)
    assert again.returncode == 0 and "IncompleteFilesException" not in text, text[-5000:]
    assert job_counts(text).get(kind) == 1, text[-3000:]  # the killed job ran again, from the start
    assert all(p.is_file() and p.stat().st_size > 0 for p in _outputs(workdir, kind))
