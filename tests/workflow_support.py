"""Helpers for workflow-level tests: a config in a scratch directory, Snakemake run on it.

Snakemake runs as ``sys.executable -m snakemake`` (the test interpreter, so its
jobs import the fnlcore under test) with ``--directory`` set to a scratch folder:
every artifact, log, lock and ``.snakemake`` record lands there, never in the
checkout. The Snakefile loads ``config/config.yaml`` first and ``--configfile``
values override it key by key (lists are replaced, mappings merged), so a test
config states ``results_dir``, ``tables`` and ``data_grid`` explicitly;
:func:`effective_config` applies the same merge for building the expected plan.

Config files live in ``tests/configs/``. A config whose ``scale`` names a
``*.yaml`` file gets that scale file (also from ``tests/configs/``) copied into
the scratch folder and its key rewritten to the copy's absolute path, so the
plan resolves it whatever the current directory.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
SNAKEFILE = REPO_ROOT / "Snakefile"
DEFAULT_CONFIG = REPO_ROOT / "config" / "config.yaml"
CONFIGS = Path(__file__).resolve().parent / "configs"
RUN_TIMEOUT_S = 900  # a hung workflow fails the test instead of hanging CI


def load_test_config(name: str) -> dict:
    """A config of tests/configs/ as a dict (``name`` with or without .yaml)."""
    path = CONFIGS / (name if name.endswith(".yaml") else f"{name}.yaml")
    with open(path) as fh:
        return yaml.safe_load(fh) or {}


def deep_update(base: dict, override: Mapping[str, Any]) -> dict:
    """Snakemake's ``--configfile`` merge: mappings merged recursively, anything else replaced."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = deep_update(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def write_config(workdir: Path, config: Mapping[str, Any], name: str = "config.yaml") -> Path:
    """Write ``config`` into ``workdir`` (created), copying a referenced scale file beside it.

    A ``scale`` ending in .yaml that is not absolute is taken from tests/configs/
    and rewritten to the absolute path of its copy in ``workdir``.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = copy.deepcopy(dict(config))
    scale = cfg.get("scale")
    if isinstance(scale, str) and scale.endswith((".yaml", ".yml")) and not os.path.isabs(scale):
        target = workdir / Path(scale).name
        shutil.copyfile(CONFIGS / scale, target)
        cfg["scale"] = str(target)
    path = workdir / name
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def effective_config(configfile: Path) -> dict:
    """What the Snakefile sees: config/config.yaml overridden by ``configfile``."""
    with open(DEFAULT_CONFIG) as fh:
        base = yaml.safe_load(fh) or {}
    with open(configfile) as fh:
        return deep_update(base, yaml.safe_load(fh) or {})


def expected_plan(configfile: Path):
    """fnlcore's plan for the merged config (schema defaults applied), as the Snakefile builds it."""
    from fnlcore.app.plan import build_plan, validate_schema

    return build_plan(validate_schema(effective_config(configfile)))


def snakemake_command(workdir: Path, configfile: Path, *args: str, cores: int = 2) -> list[str]:
    """The command line; ``args`` are extra options, then targets after a ``--``."""
    return [
        sys.executable, "-m", "snakemake",
        "--snakefile", str(SNAKEFILE),
        "--directory", str(workdir),
        "--configfile", str(configfile),
        "--cores", str(cores),
        *args,
    ]


def _env() -> dict[str, str]:
    # Jobs run scripts from the checkout: keep them from writing __pycache__ there.
    return {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}


def run_snakemake(workdir: Path, configfile: Path, *args: str, cores: int = 2) -> subprocess.CompletedProcess:
    """Run Snakemake to completion; stdout/stderr captured as text."""
    return subprocess.run(
        snakemake_command(workdir, configfile, *args, cores=cores),
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=_env(), cwd=workdir,
    )


def start_snakemake(workdir: Path, configfile: Path, *args: str, output: Path, cores: int = 2) -> subprocess.Popen:
    """Start Snakemake in its own process group (so it and its jobs can be killed together).

    stdout and stderr go to ``output``.
    """
    with open(output, "w") as fh:
        return subprocess.Popen(
            snakemake_command(workdir, configfile, *args, cores=cores),
            stdout=fh, stderr=subprocess.STDOUT, env=_env(), cwd=workdir, start_new_session=True,
        )


def kill_group(proc: subprocess.Popen, timeout: float = 60) -> None:
    """SIGKILL the process group of ``proc`` (Snakemake and every job it started) and wait until it is gone.

    Does nothing to a ``proc`` that has already exited.
    """
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=timeout)
    deadline = time.monotonic() + timeout
    while _group_alive(proc.pid):  # orphaned jobs are reaped by init shortly after
        if time.monotonic() > deadline:
            raise AssertionError(f"processes of group {proc.pid} survived SIGKILL")
        time.sleep(0.05)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_until(condition: Callable[[], bool], proc: subprocess.Popen, timeout: float = RUN_TIMEOUT_S,
               interval: float = 0.05, context: Callable[[], str] = lambda: "") -> None:
    """Poll ``condition`` until true; fail if ``proc`` exits first or ``timeout`` passes.

    ``context()`` is added to the failure message (e.g. the tail of Snakemake's output).
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"snakemake exited (code {proc.returncode}) before the awaited state\n{context()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"the awaited state did not come within {timeout} s\n{context()}")
        time.sleep(interval)


def output_of(res: subprocess.CompletedProcess) -> str:
    return (res.stdout or "") + (res.stderr or "")


def job_counts(text: str) -> dict[str, int]:
    """The 'Job stats' table Snakemake prints before running: rule -> number of jobs."""
    m = re.search(r"Job stats:\njob\s+count\n-+\s+-+\n(.*?)\n\s*\n", text, re.S)
    if m is None:
        return {}
    counts = {}
    for line in m.group(1).splitlines():
        rule, n = line.split()
        if rule != "total":
            counts[rule] = int(n)
    return counts


def config_error(text: str) -> str | None:
    """The message of a rejected configuration in Snakemake's output, None if there is none.

    fnlcore's errors are printed by rules/common.smk as ``Configuration error: ...``;
    JSON-Schema errors by Snakemake's ``validate`` as ``ValidationError: ...`` (followed
    by the schema and the whole config, which name every key: hence only the message).
    """
    m = re.search(r"^Configuration error: (.+?)(?:\n\s*\n|\Z)", text, re.M | re.S)
    if m:
        return m.group(1).strip()
    m = re.search(r"^ValidationError: (.+)$", text, re.M)
    return m.group(1).strip() if m else None


def nothing_to_do(res: subprocess.CompletedProcess) -> bool:
    """A successful run that scheduled no job."""
    text = output_of(res)
    return res.returncode == 0 and "Nothing to be done" in text and not job_counts(text)



@dataclass
class Workflow:
    """A finished workflow run: where, with which config, and what Snakemake printed."""

    workdir: Path
    configfile: Path
    result: subprocess.CompletedProcess

    @property
    def output(self) -> str:
        return output_of(self.result)

    def check_ok(self) -> None:
        assert self.result.returncode == 0, self.output[-5000:]

    def plan(self):
        return expected_plan(self.configfile)


# The shared workflows (tests/conftest.py's session fixture `workflows`): config name -> extra
# Snakemake arguments. One thread per train job of the demo table (Snakemake sets
# OMP_NUM_THREADS from it): two tiny runs share the 2 cores instead of one run of two
# threads, and nothing is oversubscribed.
SHARED_WORKFLOWS = {
    "data_side": (),
    "demo_table": ("--set-threads", "train=1"),
}


def run_shared_workflows(tmp_path_factory) -> dict[str, Workflow]:
    """Every workflow of SHARED_WORKFLOWS, all at the same time (each leaves a core idle at times)."""
    started = {}
    try:
        for name, args in SHARED_WORKFLOWS.items():
            workdir = tmp_path_factory.mktemp(name)
            cfg = write_config(workdir, load_test_config(name))
            started[name] = (workdir, cfg, start_snakemake(workdir, cfg, *args, output=workdir / "snakemake.out"))
        done = {}
        for name, (workdir, cfg, proc) in started.items():
            rc = proc.wait(timeout=RUN_TIMEOUT_S)
            result = subprocess.CompletedProcess(proc.args, rc, (workdir / "snakemake.out").read_text(), "")
            done[name] = Workflow(workdir, cfg, result)
        return done
    finally:
        for _, _, proc in started.values():
            kill_group(proc)
