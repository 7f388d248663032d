"""Every method's short run reproduces the golden record exactly (tests/golden.py says how it is made).

The runs happen in one child process under portable numerics (tests/portable.py), the
conditions the record was made in, so the comparison holds on any x86-64 CPU.

A failure names the method and the first field that moved; a change that is meant to alter
results re-records with ``python -m tests.golden <method>`` and says why in its commit.
"""

from __future__ import annotations

import pytest

from .golden import case_id, first_difference, golden_cases, load_golden
from .portable import PortableWorker

CASES = golden_cases()
GOLDEN = load_golden()


def test_every_registered_method_has_a_golden_record():
    missing = [case_id(*c) for c in CASES if case_id(*c) not in GOLDEN]
    assert not missing, f"no golden record for {missing}: record with `python -m tests.golden <name>`"


@pytest.fixture(scope="module")
def portable_runs():
    worker = PortableWorker("tests.golden:run_case")
    yield worker
    worker.close()


@pytest.mark.slow
@pytest.mark.parametrize("name,multi,variant", CASES, ids=[case_id(*c) for c in CASES])
def test_run_equals_the_golden_record(name, multi, variant, portable_runs):
    cid = case_id(name, multi, variant)
    if cid not in GOLDEN:
        pytest.fail(f"no golden record for {cid}")
    diff = first_difference(GOLDEN[cid], portable_runs.call(name, multi, variant))
    assert diff is None, f"{cid} changed: {diff}"


def test_the_worker_runs_under_portable_numerics():
    worker = PortableWorker("tests.portable:numerics_report")
    try:
        got = worker.call()
    finally:
        worker.close()
    assert got["portable"] and got["aten"] == "DEFAULT" and got["torch_threads"] == 1, got
    assert got["blas"] in ([], ["Nehalem"]), got  # OpenBLAS loads with scikit-learn, if at all


def test_the_comparison_sees_a_changed_float():
    a = {"metrics": {"rows": [[0, (0.5).hex()]]}}
    b = {"metrics": {"rows": [[0, (0.5000000000000001).hex()]]}}
    assert first_difference(a, b) is not None and first_difference(a, a) is None
