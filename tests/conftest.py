"""Shared pytest fixtures.

Public label/index files from the official repositories live in
``../shared/spec/data`` beside the checkout (or wherever ``FNL_SHARED_DIR``
points). Tests read them in place; they are never copied into the repository.
"""

from __future__ import annotations

import os

# The test-only plug-ins (one method, noise model, partitioner and dataset) join the
# registries the way a user's own module would; set before fnlcore is imported.
# Subprocesses (Snakemake and its jobs, the fnl command) inherit FNL_PLUGINS, so they must
# find the module too: the checkout goes on their PYTHONPATH.
os.environ.setdefault("FNL_PLUGINS", "tests.support.plugins")
_checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_checkout, os.environ.get("PYTHONPATH", "")) if p)
# The suite's scontrol first on PATH (tests/support/bin/scontrol): the real one where a Slurm controller
# runs here, an immediate "unreachable" elsewhere, so a Snakemake start (whose Slurm plugin asks
# `scontrol show config` at import) does not wait 10 s on an installed but stopped Slurm.
_bin = os.path.join(_checkout, "tests", "support", "bin")
if os.environ.get("PATH", "").split(os.pathsep)[0] != _bin:
    os.environ["PATH"] = os.pathsep.join(p for p in (_bin, os.environ.get("PATH", "")) if p)
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
STOP_SLURM = "stop-slurm"  # in FNL_TEST_SESSION_DIR: a worker started Slurm, the controller stops it


def xdist_worker() -> bool:
    """Whether this process is a pytest-xdist worker (pyproject's ``-n auto``)."""
    return "PYTEST_XDIST_WORKER" in os.environ


def pytest_configure(config):
    if xdist_worker():
        # each worker its share of the cores for torch's threads: two workers of two threads
        # each on two cores would oversubscribe them
        import torch

        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // workers))
    else:
        # the controller's folder for what workers leave to it (they inherit the environment)
        os.environ["FNL_TEST_SESSION_DIR"] = tempfile.mkdtemp(prefix="fnl-tests-")


def pytest_unconfigure(config):
    """The controller stops the Slurm a worker started, once every worker is done: a worker that
    finished its files early must not stop it under the others (see tests/test_slurm.py)."""
    if xdist_worker() or "FNL_TEST_SESSION_DIR" not in os.environ:
        return
    folder = Path(os.environ.pop("FNL_TEST_SESSION_DIR"))
    if (folder / STOP_SLURM).exists():
        subprocess.run(["bash", str(REPO_ROOT / "scripts" / "local-slurm.sh"), "stop"], cwd=REPO_ROOT,
                       capture_output=True, timeout=120)
    shutil.rmtree(folder, ignore_errors=True)


# The slowest files, slowest first (worker-seconds of a loaded --durations=0 run). With --dist
# loadfile a worker takes a whole file and the next free worker the next file: a slow file
# collected last runs alone at the end while the other worker idles. Keep the longest here;
# a file left off only runs later, in its usual (alphabetical) place.
SLOW_FILES_FIRST = (
    "test_slurm.py",  # first: see pytest_collection_modifyitems
    "test_run_identity.py",
    "test_staleness.py",
    "test_workflow.py",
    "test_one_writer.py",
    "test_paper_tables.py",
    "test_run_group_workflow.py",
    "test_recovery.py",
    "test_op_counts.py",
    "test_run_group.py",
    "test_device_check.py",
    "test_rehearse.py",
    "test_user_path.py",
    "test_bad_input.py",
    "test_resources.py",
    "test_golden.py",
    "test_user_path_logs.py",
    "test_batched_contract.py",
)


def pytest_collection_modifyitems(session, config, items):
    """tests/test_slurm.py first, then the other SLOW_FILES_FIRST in their order, then the rest
    (their order unchanged). pyproject's --no-loadscope-reorder makes xdist keep this order.

    Slurm first: its session fixture starts a local Slurm that stays up until the session ends,
    and it is the longest file. (Where Slurm is installed but not running, the Slurm executor
    plugin's `scontrol show config` at each Snakemake start would wait 10 s for the absent
    controller: the suite's scontrol, tests/support/bin, answers at once instead.)
    """
    rank = {name: i for i, name in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


def _shared_dir() -> Path:
    from .spec_data import shared_dir

    return shared_dir()


@pytest.fixture(scope="session")
def spec_data_dir() -> Path:
    """Folder of the official label/index files used as regression fixtures.

    The shared copies where present (CI); else the fixtures rebuilt from the papers' pinned
    published files in the test cache (tests/spec_data.py). Session scope: one attempt, and
    pytest reuses its skip or failure for every later test.
    """
    from fnlcore.errors import ChecksumError, DataError

    from .spec_data import cache_dir, fetch_spec_data, offline_reason

    d = _shared_dir() / "spec" / "data"
    if d.is_dir():
        return d
    cache = cache_dir()
    try:
        return fetch_spec_data(cache, timeout=20)  # short: a blocked network should not stall the suite
    except ChecksumError as exc:  # bytes that are not the published ones: a real problem
        pytest.fail(f"spec-data fixtures did not verify:\n{exc}")
    except DataError:  # no URL delivered (no network): the fixtures are unavailable here, not wrong
        pytest.skip(offline_reason(d, cache))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


# -- workflows shared by several test files ------------------------------------------------------
# Each costs a minute or more of both cores, so it runs once per session: the data side
# (data_side.yaml) and the demo table (demo_table.yaml + scale_quick.yaml), at the same time.
# tests/test_workflow.py checks both and builds the report of the demo table.
# Tests only read these folders (a `snakemake --report` writes its HTML elsewhere).


@pytest.fixture(scope="session")
def workflows(tmp_path_factory):
    from .workflow_support import run_shared_workflows

    return run_shared_workflows(tmp_path_factory)


@pytest.fixture(scope="session")
def data_side(workflows):
    return workflows["data_side"]


@pytest.fixture(scope="session")
def demo_table(workflows):
    return workflows["demo_table"]
