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
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def _shared_dir() -> Path:
    return Path(os.environ.get("FNL_SHARED_DIR", REPO_ROOT.parent / "shared")).resolve()


@pytest.fixture(scope="session")
def spec_data_dir() -> Path:
    """Folder of the official label/index files used as regression fixtures."""
    d = _shared_dir() / "spec" / "data"
    if not d.is_dir():
        pytest.fail(
            f"regression fixtures not found at {d}; set FNL_SHARED_DIR to the folder holding spec/data"
        )
    return d


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT
