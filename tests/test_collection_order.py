"""The suite's file order: Slurm first, then the slowest files, and xdist keeps that order.

With ``--dist loadfile`` on two workers a slow file collected last runs alone at the end;
tests/conftest.py orders the known-slow files first. These checks catch the list going stale
(a renamed or deleted file silently falls back to its alphabetical place) and the xdist option
that keeps the order being dropped.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from types import SimpleNamespace

from .conftest import SLOW_FILES_FIRST, pytest_collection_modifyitems

TESTS = Path(__file__).resolve().parent


def test_every_listed_slow_file_exists_once_and_slurm_is_first():
    assert SLOW_FILES_FIRST[0] == "test_slurm.py"
    assert len(set(SLOW_FILES_FIRST)) == len(SLOW_FILES_FIRST)
    missing = [name for name in SLOW_FILES_FIRST if not (TESTS / name).is_file()]
    assert not missing, f"SLOW_FILES_FIRST in tests/conftest.py names files that are gone: {missing}"


def test_listed_files_come_first_in_list_order_and_the_rest_keep_theirs():
    names = ["test_a.py", "test_golden.py", "test_b.py", "test_slurm.py", "test_run_identity.py", "test_c.py"]
    items = [SimpleNamespace(path=TESTS / name, i=i) for i, name in enumerate(names)]
    pytest_collection_modifyitems(None, None, items)
    assert [item.path.name for item in items] == [
        "test_slurm.py", "test_run_identity.py", "test_golden.py", "test_a.py", "test_b.py", "test_c.py"]


def test_xdist_keeps_the_collected_file_order():
    """xdist's default for --dist loadfile reorders files by their number of tests (most first)."""
    with open(TESTS.parent / "pyproject.toml", "rb") as fh:
        addopts = tomllib.load(fh)["tool"]["pytest"]["ini_options"]["addopts"].split()
    assert "--dist" in addopts and addopts[addopts.index("--dist") + 1] == "loadfile"
    assert "--no-loadscope-reorder" in addopts
