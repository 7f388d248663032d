"""No host-device synchronisation in a local step, for every registered method on both engines.

The counter (fnlcore.syncs.SyncCounter) counts, inside each local step and outside the code's
host-side marks, the calls that would wait for a GPU: reads of a tensor's values on the host (item,
tolist, bool/float/int of a tensor, nonzero, boolean-mask indexing, ...) and blocking copies to a
device. On a GPU, ``fnl device-check`` counts them with ``torch.cuda.set_sync_debug_mode``.

Every method is counted in the two runs of tests/test_batched_contract.py (the golden set's longer
digits run on each engine; :func:`assert_sync_free`); each stage that never batches also runs here,
on the sequential engine, with the switch that reaches it. The batched engine: 0 per step for every method.
The sequential engine: 0, except the steps DECLARED below (none at present), each with why.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fnlcore.errors import ConfigError
from fnlcore.fl.contract import Stage
from fnlcore.fl.simulation import Simulation
from fnlcore.syncs import SyncCounter, host_side, step_region
from fnlcore.methods import METHODS

from .engine_helpers import make_ctx
from .golden import _settings, golden_cases
from .test_contracts import _fitting_params

# method -> (most synchronising calls per sequential step, why): a Python branch of the official code
# on a count in the batch, in a loss the sequential engine runs for one client. None is needed since
# FedFixer's twin step became a one loss form (both branches computed and selected on the device).
DECLARED: dict[str, tuple[int, str]] = {}


# Every stage that never batches (Stage.batches=False; at present DivideMix's co-divide and FedDiv's
# per-epoch PCS, whose training sets, and so their draws' sizes, come from the previous local epoch),
# on the sequential engine: the contract's runs enter such a stage only where the golden parameters
# reach it, so each is run here with the switch that selects it (REACH) and must be entered.
REACH = {"main_epoch_pcs": {"pcs_reference": "local_epoch"}}  # FedDiv's PCS before every local epoch
CASES = [(n, m, key) for n, m, v in golden_cases() if v == "long"
         for key, st in METHODS[n].stages.items() if not st.batchable]


def assert_sync_free(name: str, engine: str, counter: SyncCounter) -> None:
    """A run's local steps made no more synchronising calls per step than allowed."""
    assert counter.steps > 0, "the run trained no step: the engine's step marks are missing"
    allowed = DECLARED.get(name, (0, ""))[0] if engine == "sequential" else 0
    per_step = counter.per_step()
    assert per_step <= allowed, (
        f"{name} on the {engine} engine: {per_step:.2f} synchronising calls per step (allowed {allowed}): "
        f"{dict(counter.counts)}; first at: {counter.where}")


def _count(name: str, multi: bool, engine: str, extra: dict | None = None, entered: set | None = None) -> SyncCounter:
    """The run's synchronising calls; ``extra`` hyper-parameters over the golden ones, ``entered`` filled
    with the stage keys of its rounds."""
    settings = dataclasses.replace(_settings("long"), engine=engine)
    ctx = make_ctx(settings, seed=0, multi_label=multi)
    params = dataclasses.replace(_fitting_params(name), **(extra or {}))
    try:
        params.check_training(settings)
        method = METHODS[name](params, ctx)
    except ConfigError:  # as the golden set: a method that needs every client a round
        settings = dataclasses.replace(settings, client_fraction=1.0)
        ctx = make_ctx(settings, seed=0, multi_label=multi)
        method = METHODS[name](params, ctx)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with SyncCounter() as counter:
            Simulation(method, ctx, progress=lambda s: None).run()
    finally:
        torch.set_num_threads(threads)
    if entered is not None:
        entered.update(method.stage_key(r) for r in range(method.num_rounds()))
    return counter


@pytest.mark.parametrize("name, multi, stage", CASES, ids=[f"{n}{'-multi' if m else ''}-{k}" for n, m, k in CASES])
def test_a_local_step_of_a_sequential_only_stage_makes_no_host_device_sync(name, multi, stage):
    entered: set = set()
    assert_sync_free(name, "sequential", _count(name, multi, "sequential", REACH.get(stage), entered))
    assert stage in entered, f"{name}: the run never entered stage {stage!r}; add the switch that reaches it to REACH"


def test_every_declared_count_is_of_a_registered_method_that_needs_it():
    assert set(DECLARED) <= set(METHODS)
    for name, (most, why) in DECLARED.items():
        assert most > 0 and why


@pytest.mark.parametrize("call, name", [
    (lambda t: t.sum().item(), "item"), (lambda t: bool(t.any()), "bool"), (lambda t: t[t > 0], "bool_mask_index"),
    (lambda t: torch.nonzero(t), "nonzero"), (lambda t: t.tolist(), "tolist"), (lambda t: float(t.sum()), "float"),
    (lambda t: t.to("cpu"), "blocking_copy"), (lambda t: torch.as_tensor([1.0], device=t.device), "blocking_copy"),
])
def test_the_counter_sees_each_kind_of_sync_inside_a_step_only(call, name):
    t = torch.randn(8)
    with SyncCounter() as counter:
        call(t)  # outside a step: not counted
        with step_region():
            call(t)
            with host_side():
                call(t)  # marked as host work: not counted
            t.to("cpu", non_blocking=True)  # a non-blocking move never counts
    assert dict(counter.counts) == {name: 1} and counter.steps == 1


def test_a_plug_in_loss_that_reads_a_value_back_is_caught():
    """A loss with ``.item()`` in it fails the test above: the counter is wired into the engine's step."""
    ctx = make_ctx(dataclasses.replace(_settings("short"), rounds=1), seed=0)
    fedavg = METHODS["fedavg"]

    class Reader(fedavg):
        def loss(self, sb):
            out = fedavg.loss(self, sb)
            out.detach().item()
            return out

        stages = {"main": Stage(loss=loss)}
    with SyncCounter() as counter:
        Simulation(Reader(_fitting_params("fedavg"), ctx), ctx, progress=lambda s: None).run()
    assert counter.steps > 0 and counter.counts["item"] == counter.steps


def test_in_step_says_whether_a_step_runs_now():
    from fnlcore.syncs import in_step

    assert not in_step()
    with step_region():
        assert in_step()
    assert not in_step()
