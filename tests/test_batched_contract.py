"""The batched engine reproduces the sequential one, for every registered method: a contract over the registry.

Every method (test-only plug-ins included: tests/support/plugins.py joins the registries
through FNL_PLUGINS) on every label kind it trains on (``golden_cases()``), whose stage table
has at least one stage that batches (``Stage.loss`` with ``batches``), runs the golden set's "long" setting (tests/golden.py:
SGD with momentum, 8 rounds of 2 local epochs, 3 of 4 clients a round, on the digits MLP of
tests/engine_helpers.py) on ``engine: sequential`` and on ``engine: batched``. The two runs must
agree on

* every decision, EXACTLY: the clients of each round, the stage column, every integer or
  boolean column of the metrics and of ``client_results()`` (detected noisy clients,
  relabelled counts, ...), the relabel log, the working labels ``ctx.data.given`` and the random
  generators' states after the run (the same draws, in the same order);
* every float (scores, per-client estimates, the final evaluated model's tensors) within
  ``ATOL + RTOL * |sequential|`` (see TOLERANCE below for the measurements behind them).

Every case runs in a child process under portable numerics (tests/portable.py, as the golden set;
``portable_contract`` says why): the contract decides the same on every x86-64 CPU, its
discrete metrics (accuracy) included, because every float it compares is the same bits there.

Each batching stage of the table must be entered by the batched run (its loss called on K clients):
a stage the setting never reaches is a failure that names the stage, not a silent pass. The
hyper-parameters are the golden run's, except that a round-valued field the 8 rounds never reach
(FedLSR's distillation from t_w = 20) is moved into the run (``contract_params``). A new
method joins this contract the moment it is registered; a method whose batched form computes
a loss form that is not per client (it mixes the K clients of a step) fails it (tests/support/batched_mismatch.py,
tested below).
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest
import torch

from fnlcore.errors import ConfigError
from fnlcore.fl.simulation import Simulation
from fnlcore.methods import METHODS
from fnlcore.registry import round_fields
from fnlcore.fl.one_client import OneClientBatch
from fnlcore.syncs import SyncCounter

from .engine_helpers import make_ctx
from .golden import EXECUTION_COLUMNS, _settings, case_id, golden_cases
from .portable import PortableWorker, PortableWorkerError
from .test_contracts import _fitting_params
from .test_syncs import assert_sync_free

VARIANT = "long"  # the golden setting that enters every stage (relabelling, detection, sampling)

# TOLERANCE: a float passes when |batched - sequential| <= ATOL + RTOL * |sequential|. (Measured natively,
# before the contract moved under portable numerics, where it passes unchanged.)
# On the digits MLP (no BatchNorm) the stacked network's batched matrix products round differently
# from the plain model's, and nothing else does: measured over every case (1 torch thread, x86-64),
# every metric and client_results float is bit-equal, and the final model differs by at most
# 1.5e-7 (jointopt, trimmed_mean; fedlsr 2.2e-7 with its distillation on), i.e. about one float32
# ulp at |w| ~ 1 after 8 rounds x 2 epochs of SGD with momentum; a third of the single-label
# cases are bit-equal throughout. ATOL is ~5x the worst measured (room for another CPU's kernels)
# and 1e-6 as in tests/test_batched.py; RTOL covers larger weights. A loss form that is not per
# client moves far more (tests/support/batched_mismatch.py: GCE divided by the whole step's rows,
# tested below).
ATOL, RTOL = 1e-6, 1e-5


def has_batched_stage(cls) -> bool:
    return any(st.batchable for st in cls.stages.values())


def contract_cases() -> list[tuple[str, bool]]:
    """(method, multi-label) of every golden case whose method declares a batched stage."""
    return [(n, multi) for n, multi, variant in golden_cases()
            if variant == VARIANT and has_batched_stage(METHODS[n])]


CASES = contract_cases()


def contract_params(name: str):
    """The golden run's hyper-parameters (``_fitting_params``), with each round-valued field that the run
    never reaches (>= its rounds: FedLSR's t_w 20, FedNoRo-ML's ramp 10..499, Co-teaching's t_k 25)
    moved into it (from the middle on, in field order): the branch it gates must run on both engines."""
    params = _fitting_params(name)
    rounds = _settings(VARIANT).rounds
    late = [f for f in round_fields(type(params)) if getattr(params, f) is not None and getattr(params, f) >= rounds]
    if not late:
        return params
    try:
        shrunk = dataclasses.replace(params, **{f: min(rounds // 2 + i, rounds - 1) for i, f in enumerate(late)})
        shrunk.check_training(_settings(VARIANT))
    except ConfigError:
        return params
    return shrunk


@dataclass
class EngineRun:
    """What one run lets an observer see, unreduced."""

    engine: str
    metrics: pd.DataFrame
    clients: pd.DataFrame | None
    relabels: pd.DataFrame
    given: torch.Tensor
    model: dict[str, torch.Tensor]
    selected: dict[int, list[int]]  # round -> the clients select_clients chose
    generators: dict[str, torch.Tensor]  # the random streams' states after the run
    batched_stages: dict[str, list[int]]  # stage key -> rounds whose batched loss ran
    syncs: SyncCounter | None = None  # the host-device synchronisations of its local steps (tests/test_syncs.py)


@contextlib.contextmanager
def instrumented(cls):
    """While open, ``cls`` logs what its runs do: {stage key: rounds whose batched loss ran} and
    {round: the clients it selected}, in the two dicts yielded (its class attributes restored after)."""
    batched: dict[str, set[int]] = {}
    selected: dict[int, list[int]] = {}

    def recorded(key, fn):
        def loss(m, sb):
            if not isinstance(sb, OneClientBatch):  # a step of the batched engine (the sequential one: K = 1)
                batched.setdefault(key, set()).add(int(sb.r))
            return fn(m, sb)

        return loss

    select = cls.select_clients

    def select_clients(m, r):
        clients = select(m, r)
        selected[r] = [int(k) for k in clients]
        return clients

    saved = {a: cls.__dict__[a] for a in ("stages", "select_clients") if a in cls.__dict__}
    cls.stages = {key: dataclasses.replace(st, loss=recorded(key, st.loss)) if st.batchable else st
                  for key, st in cls.stages.items()}
    cls.select_clients = select_clients
    try:
        yield batched, selected
    finally:
        for a in ("stages", "select_clients"):
            if a in saved:
                setattr(cls, a, saved[a])
            else:
                delattr(cls, a)


def _numpy_state(rs: np.random.RandomState) -> torch.Tensor:
    _, keys, pos, has_gauss, gauss = rs.get_state()
    return torch.from_numpy(np.r_[keys.astype(np.int64), pos, has_gauss, np.float64(gauss).view(np.int64)])


def run_engine(cls, params, multi: bool, engine: str) -> EngineRun:
    """The golden "long" run of method class ``cls`` with ``params`` on ``engine`` (one torch thread)."""
    settings = dataclasses.replace(_settings(VARIANT), engine=engine, model="mlp")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with instrumented(cls) as (seen, selected):
            ctx = make_ctx(settings, seed=0, multi_label=multi)
            try:
                params.check_training(settings)
                method = cls(params, ctx)
            except ConfigError:  # as tests/golden.py: e.g. trimmed mean cannot keep a client of 3
                settings = dataclasses.replace(settings, client_fraction=1.0)
                ctx = make_ctx(settings, seed=0, multi_label=multi)
                params.check_training(settings)
                method = cls(params, ctx)
            with SyncCounter() as syncs:
                metrics = Simulation(method, ctx, progress=lambda s: None).run()
    finally:
        torch.set_num_threads(threads)
    return EngineRun(
        engine=engine,
        metrics=metrics.drop(columns=list(EXECUTION_COLUMNS)).reset_index(drop=True),
        clients=method.client_results(),
        relabels=ctx.data.relabels.frame(),
        given=ctx.data.given.clone(),
        model={k: v.detach().clone() for k, v in method.eval_model().state_dict().items()},
        selected=selected,
        generators={"shuffle": ctx.shuffle_gen.get_state(), "aug": ctx.aug_gen.get_state(),
                    "rng": _numpy_state(ctx.rng)},
        batched_stages={k: sorted(v) for k, v in seen.items()},
        syncs=syncs,
    )


# -- the comparison -------------------------------------------------------------------------------------


def _float_gap(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / (ATOL + RTOL |a|) over entries (NaN where both are NaN counts as equal); <= 1 is within."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if not np.array_equal(nan_a, nan_b):
        return float("inf")
    ok = ~nan_a
    if not ok.any():
        return 0.0
    d = np.abs(a[ok] - b[ok])
    if not np.all(np.isfinite(d)):
        return 0.0 if np.array_equal(a[ok], b[ok]) else float("inf")
    return float(np.max(d / (ATOL + RTOL * np.abs(a[ok])), initial=0.0))


def _max_abs(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    ok = ~(np.isnan(a) | np.isnan(b))
    return float(np.max(np.abs(a[ok] - b[ok]), initial=0.0))


def _compare_frames(where: str, a: pd.DataFrame | None, b: pd.DataFrame | None, gaps: dict) -> None:
    if a is None or b is None:
        assert a is None and b is None, f"{where}: sequential {a is not None}, batched {b is not None}"
        return
    a, b = a.reset_index(drop=True), b.reset_index(drop=True)
    assert list(a.columns) == list(b.columns), f"{where}: columns {list(a.columns)} vs {list(b.columns)}"
    assert len(a) == len(b), f"{where}: {len(a)} rows vs {len(b)}"
    for c in a.columns:
        x, y = a[c], b[c]
        if pd.api.types.is_float_dtype(x) and pd.api.types.is_float_dtype(y):
            gap = _float_gap(x.to_numpy(), y.to_numpy())
            gaps[f"{where}.{c}"] = _max_abs(x.to_numpy(), y.to_numpy())
            assert gap <= 1, (f"{where}.{c}: sequential {x.tolist()} vs batched {y.tolist()} "
                              f"(max |difference| {gaps[f'{where}.{c}']:.3g} > {ATOL} + {RTOL} |sequential|)")
        else:  # a decision (clients, stage, counts, flags, labels): equal
            assert x.tolist() == y.tolist(), f"{where}.{c}: sequential {x.tolist()} vs batched {y.tolist()}"


def compare_runs(seq: EngineRun, bat: EngineRun) -> dict[str, float]:
    """Assert that ``bat`` reproduces ``seq`` (decisions equal, floats within tolerance); returns the
    max |difference| of each float field compared, for the record."""
    gaps: dict[str, float] = {}
    assert seq.selected == bat.selected, f"selected clients: sequential {seq.selected} vs batched {bat.selected}"
    _compare_frames("metrics", seq.metrics, bat.metrics, gaps)
    _compare_frames("client_results", seq.clients, bat.clients, gaps)
    _compare_frames("relabels", seq.relabels, bat.relabels, gaps)
    assert seq.given.dtype == bat.given.dtype and torch.equal(seq.given, bat.given), (
        f"working labels differ at {int((seq.given != bat.given).sum())} entries")
    for name in seq.generators:  # the very same random draws, in the same order
        assert torch.equal(seq.generators[name], bat.generators[name]), f"{name} generator states differ"
    assert list(seq.model) == list(bat.model), f"model keys {list(seq.model)} vs {list(bat.model)}"
    worst = 0.0
    for key, a in seq.model.items():
        b = bat.model[key]
        assert a.shape == b.shape and a.dtype == b.dtype, f"model.{key}: {a.shape}/{a.dtype} vs {b.shape}/{b.dtype}"
        if a.is_floating_point():
            gap = _float_gap(a.numpy(), b.numpy())
            d = _max_abs(a.numpy(), b.numpy())
            worst = max(worst, d)
            assert gap <= 1, f"model.{key}: max |difference| {d:.3g} > {ATOL} + {RTOL} |sequential|"
        else:
            assert torch.equal(a, b), f"model.{key} differs"
    gaps["model"] = worst
    return gaps


def check_batched_stages_entered(cls, run: EngineRun) -> None:
    declared = sorted(k for k, st in cls.stages.items() if st.batchable)
    missed = [k for k in declared if k not in run.batched_stages]
    assert not missed, (
        f"{cls.Params.name}: batched stage(s) {missed} never ran in the contract's run (entered: "
        f"{sorted(run.batched_stages)}): extend the golden 'long' setting (tests/golden.py _settings), this "
        "method's CONTEXT_FIT entry (tests/test_contracts.py), or mark the field that delays them as round-valued "
        "(param(..., rounds=True): contract_params then moves it into the run) so that its run reaches them")


def contract_runs(cls, params, multi: bool) -> tuple[EngineRun, EngineRun]:
    """The sequential and the batched run of one method class, each engine entering only its own losses."""
    seq = run_engine(cls, params, multi, "sequential")
    assert not seq.batched_stages, f"the sequential engine ran batched losses: {seq.batched_stages}"
    bat = run_engine(cls, params, multi, "batched")
    check_batched_stages_entered(cls, bat)
    return seq, bat


def assert_batched_equals_sequential(cls, params, multi: bool) -> dict[str, float]:
    """The contract for one method class: returns the max differences measured."""
    return compare_runs(*contract_runs(cls, params, multi))


def contract_case(name: str, multi: bool, plugin: str | None = None) -> dict[str, float]:
    """One case of the contract, run in the portable worker: method ``name`` of the registry, or class
    ``plugin`` of tests/support/batched_mismatch.py (never registered); returns the max differences
    measured. ... and, from the same two runs, no host-device sync in a local step (tests/test_syncs.py's
    rule: 0 per step on the batched engine, the declared counts on the sequential one)."""
    if plugin is not None:
        from .support import batched_mismatch

        cls = getattr(batched_mismatch, plugin)
        return assert_batched_equals_sequential(cls, cls.Params(), multi)
    seq, bat = contract_runs(METHODS[name], contract_params(name), multi)
    gaps = compare_runs(seq, bat)
    for run in (seq, bat):
        assert_sync_free(name, run.engine, run.syncs)
    return gaps


@pytest.fixture(scope="module")
def portable_contract():
    """The contract runs under portable numerics (tests/portable.py), as the golden set does: the
    stacked network's batched matrix products and the plain model's round differently, by how much
    depends on the BLAS kernel the CPU gets (MKL's AMD path with ATen's AVX2 kernels moved one test
    sample of 300 across the argmax, fedavg and four others), so only one code path everywhere makes
    the contract decide the same on every CPU. Its tolerances were measured there too."""
    # Without the VML guard, which doubles a run's time: the golden set runs every method's stages under
    # it, and what only this contract runs (the stacked layers, StackedSGD) calls no elementary function
    # (`python -m tests.cross_cpu` runs the contract under the guard and under other CPUs).
    worker = PortableWorker("tests.test_batched_contract:contract_case", vml_guard=False)
    yield worker
    worker.close()


@pytest.mark.parametrize("name,multi", CASES, ids=[case_id(n, m) for n, m in CASES])
def test_batched_engine_reproduces_the_sequential_engine(name, multi, portable_contract):
    portable_contract.call(name, multi)


def test_the_contract_covers_every_method_with_a_batched_stage_on_each_label_kind():
    want = {(n, kind == "multi") for n in METHODS if has_batched_stage(METHODS[n]) for kind in METHODS[n].label_kinds}
    assert set(CASES) == want
    assert ("test_smooth", False) in CASES  # the test-only plug-in joins with no edit here


# -- the contract catches a wrong batched form ----------------------------------------------------------
# tests/support/batched_mismatch.py: GCE-FedAvg written as a one-file plug-in of docs/extending.md, never registered
# (a registered one would need a golden record, pinned slugs, ...): the contract is handed the classes.


def test_a_per_client_loss_form_passes_the_contract(portable_contract):
    portable_contract.call(None, False, "GCE")


def test_a_loss_form_that_mixes_the_clients_of_a_step_fails_the_contract(portable_contract):
    with pytest.raises(PortableWorkerError, match=r"AssertionError: (metrics\.|model\.|clients\.)"):
        portable_contract.call(None, False, "GCEStackMean")  # the scores and the weights move
