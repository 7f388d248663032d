"""A method's round cost over FedAvg's, per device kind: counted (fnlcore/app/round_counts.py), shipped as
data (benchmarks/method_costs.json, fnlcore/app/method_costs.py), applied by `fnl plan` (fnlcore/app/cost.py).

* the counter: a plug-in whose rounds add forward passes over the training set counts FedAvg's
  round exactly where it adds none, and one more pass's FLOPs and ops for each pass it adds; a
  plug-in that trains on a share of its samples prices each local step as FedAvg's, not at the share;
* the shipped file counts every stretch of every method of the package (the test names the method
  and the command that counts it);
* a GPU's factor is always a counted one, a CPU's the measured time ratio; a method the file lacks
  counts 1.0 and the plan's text flags it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from fnlcore.app import method_costs
from fnlcore.app.cost import CostEstimate, RunCost, StepShape, method_factor_lines
from fnlcore.app.device_check.tiny import TinyRun, tiny_params
from fnlcore.app.round_counts import (COUNT_RUN, MethodCount, Tally, components, count_method, count_pair, describe,
                                      ratios)
from fnlcore.fl import sampling
from fnlcore.fl.local import predict
from fnlcore.methods import METHODS, FLMethod, LocalJob, MethodParams, Phase, Stage, Stretch, method_from_dict
from fnlcore.registry import param

SMALL = TinyRun("tiny", 8, 8, 4, 4, 3)  # 6 clients of two steps, three rounds: seconds


@dataclass(frozen=True)
class PassesParams(MethodParams):
    name = "test_passes"
    passes: int = param(0, ge=0, doc="forward passes over the training set after each round but the first")


class Passes(FLMethod):
    """FedAvg; from round 1 on (stretch ``extra``) its ``end_round`` predicts the whole training set ``passes`` times."""

    Params = PassesParams

    @classmethod
    def schedule(cls, params, settings, num_clients):
        m = sampling.clients_per_round(num_clients, settings.client_fraction)
        return [Stretch("first", 1, m), Stretch("extra", settings.rounds - 1, m)]

    def stage_name(self, r: int) -> str:
        return "main"

    def end_round(self, r: int) -> None:
        super().end_round(r)
        for _ in range(self.params.passes if r > 0 else 0):
            predict(self.ctx, self.global_model, self.ctx.data.train)


@pytest.fixture
def passes_method(monkeypatch):
    assert "fedavg" in METHODS  # discovery first: the plug-in joins a full registry
    monkeypatch.setitem(METHODS._entries, "test_passes", Passes)
    return "test_passes"


def test_each_forward_pass_a_round_adds_its_ops_and_flops(passes_method):
    fedavg = count_method("fedavg", SMALL)
    c0, c1, c2 = (count_method(passes_method, SMALL, {"passes": n}) for n in (0, 1, 2))
    total = lambda c: (sum(t.ops for t in c.stretches.values()), sum(t.flops for t in c.stretches.values()))  # noqa: E731
    # no pass: FedAvg's rounds (an op or two of one-time caches aside), split into the schedule's stretches
    assert total(c0)[1] == total(fedavg)[1] and total(c0)[0] == pytest.approx(total(fedavg)[0], abs=3)
    assert [c0.stretches[k].rounds for k in ("first", "extra")] == [1, 2] and c0.stages["main"].rounds == 3
    assert ratios(c1, fedavg)["stretches"]["first"]["flops"] == pytest.approx(1.0)
    # each pass adds the same ops and FLOPs, to the stretch it runs in only
    d1 = (c1.stretches["extra"].ops - c0.stretches["extra"].ops, c1.stretches["extra"].flops - c0.stretches["extra"].flops)
    d2 = (c2.stretches["extra"].ops - c1.stretches["extra"].ops, c2.stretches["extra"].flops - c1.stretches["extra"].flops)
    assert d1[0] > 0 and d1[1] > 0 and d2[1] == pytest.approx(d1[1]) and d2[0] == pytest.approx(d1[0], abs=3)
    # a forward pass over every training sample against a round of one epoch of forward and backward
    # (backward about twice the forward): about a third more FLOPs
    assert 0.2 < d1[1] / c0.stretches["extra"].flops < 0.6


@dataclass(frozen=True)
class ShareParams(MethodParams):
    name = "test_share"
    keep: float = param(0.5, gt=0, le=1, doc="share of its samples a client trains on")


class Share(FLMethod):
    """FedAvg on the first ``keep`` share of each client's samples (as a filter that keeps them would)."""

    Params = ShareParams

    def prepare(self, r: int, k: int, nets: dict) -> LocalJob:
        idx = self.ctx.data.clients[k]
        kept = idx[:max(int(len(idx) * self.params.keep), 1)]
        return LocalJob(phases=[Phase(streams={"data": (kept, self.ctx.settings.batch_size)})])

    stages = {"main": Stage(prepare=prepare, loss=FLMethod.loss)}


# two and four local steps a client of batch 4: a half share takes one and two, a 0.4 share one
# and two as well, each with a short last batch
SHARE_RUNS = (TinyRun("tiny", 8, 8, 4, 4, 3), TinyRun("tiny", 8, 16, 4, 4, 3))


@pytest.mark.parametrize("keep", [0.5, 0.4])
def test_a_method_that_trains_on_a_share_of_its_samples_prices_each_local_step_as_fedavg(monkeypatch, keep):
    monkeypatch.setitem(METHODS._entries, "test_share", Share)
    fedavg = count_pair("fedavg", runs=SHARE_RUNS)
    c = components(count_pair("test_share", {"keep": keep}, runs=SHARE_RUNS), fedavg)["main"]
    # its steps are FedAvg's (ops of a step; FLOPs of a full batch, a short last one a part), and
    # the plan counts as many a round as over every sample: the runs' own differ by less (the
    # difference of the two runs' counts alone made the step keep x FedAvg's or less)
    assert c["ops_step"] == pytest.approx(1.0, abs=0.02) and c["flops_step"] == pytest.approx(1.0, abs=0.02)
    assert c["steps_taken"] == pytest.approx(0.5)
    unit = components(fedavg, fedavg)["main"]
    assert c["ops_fixed"] == pytest.approx(unit["ops_fixed"], abs=0.05) and c["flops_fixed"] == pytest.approx(0.0, abs=0.02)
    assert unit["steps_taken"] == 1.0 and (unit["ops_step"], unit["flops_step"]) == (1.0, 1.0)


def _package_methods() -> list[str]:
    return sorted(n for n, cls in METHODS.items() if cls.__module__.startswith("fnlcore.methods."))


@pytest.mark.parametrize("name", _package_methods())
def test_the_shipped_file_counts_every_stretch_of_every_method(name):
    costs = method_costs.MethodCosts()
    assert costs.reference() == describe(), (
        f"{costs.path.name} was counted at another reference run: `python benchmarks/count_method_costs.py`")
    cls = METHODS[name]
    params, settings = tiny_params(cls, COUNT_RUN.settings("sequential", "single" not in cls.label_kinds))
    entry = costs.methods.get(name) or {}
    for e in [entry, *entry.get("variants", [])]:
        counted = (e.get("counted") or {}).get("stretches", {})
        p = dataclasses.replace(params, **e.get("params", {}))
        missing = [st.name for st in cls.schedule(p, settings, COUNT_RUN.clients) if st.name not in counted]
        assert not missing, (f"{name}{e.get('params', '')}: {costs.path.name} has no counts of stretch(es) "
                             f"{missing}: run `{method_costs.COUNT_COMMAND.format(name=name)}`")
        assert e["counted"]["torch"] and e["counted"]["commit"]


def _run(name: str, **params):
    return SimpleNamespace(method=method_from_dict({"name": name, **params}))


@pytest.mark.parametrize("name", _package_methods())
def test_a_gpu_factor_is_counted_and_a_cpu_factor_a_measured_time_ratio(name):
    from fnlcore.app.cost import Pricing

    costs = method_costs.MethodCosts()
    run = _run(name, **({"tau": 0.5} if name == "coteaching" else {}))
    shape = StepShape("resnet18_cifar", 3, (32, 32), 10, False, 32, "crop_flip", "sgd", "fp32", False, 1024)
    cls = METHODS[name]
    for st in cls.schedule(run.method, SimpleNamespace(rounds=10, client_fraction=1.0), 10):
        gpu = Pricing("cuda").factor(run, st.name, shape)
        assert gpu.kind == "counted", (name, st.name, gpu)
        assert gpu.value == pytest.approx(costs.ratios(name, run.method, st.name, 1.0)[0])  # no model: the ops ratio
        cpu = Pricing("cpu").factor(run, st.name, shape)
        assert cpu.kind in ("cpu time", "unmeasured")
        expected = ((costs.entry(name, run.method).get("cpu") or {}).get("stretches") or {}).get(st.name)
        assert cpu.value == (1.0 if expected is None else expected)


def test_a_device_models_split_weights_the_ops_and_flops_ratios():
    costs = method_costs.MethodCosts()
    params = method_from_dict({"name": "dividemix"})
    ops, flops = costs.ratios("dividemix", params, "dividemix", 50)
    assert flops > ops > 1.0  # two networks, the co-divide forwards: more arithmetic than dispatch
    assert costs.factor("dividemix", params, "dividemix", "cuda", (1.0, 0.0), 50).value == pytest.approx(ops)
    assert costs.factor("dividemix", params, "dividemix", "cuda", (0.0, 2.0), 50).value == pytest.approx(flops)
    mixed = costs.factor("dividemix", params, "dividemix", "cuda", (3.0, 1.0), 50)
    assert mixed.value == pytest.approx(0.75 * ops + 0.25 * flops) and mixed.kind == "counted"
    # FedAvg is the unit (counted twice in one process: an op of one-time caches apart)
    assert costs.ratios("fedavg", method_from_dict({"name": "fedavg"}), "main", 7) == pytest.approx((1.0, 1.0), rel=1e-3)


def _count(name: str, per_client: tuple[float, float], local_steps: int, clients: int = 2) -> MethodCount:
    """A count of one stretch ``main``: (ops, FLOPs) a client-round at ``local_steps`` a client (no step observed)."""
    ops, flops = per_client
    t = Tally(int(ops * clients), flops * clients, 1, clients)
    return MethodCount(name, {"main": t}, {"main": t}, local_steps)


def test_a_round_splits_into_its_fixed_part_and_what_each_local_step_adds():
    # FedAvg: 100 ops and 10 FLOPs a step, 50 ops and 1 FLOP a round besides; the method: 3x a step's
    # ops and 2x its FLOPs, and 450 ops and 21 FLOPs a round besides (an extra pass)
    fedavg = (_count("fedavg", (150, 11), 1), _count("fedavg", (250, 21), 2))
    method = (_count("m", (750, 41), 1), _count("m", (1050, 61), 2))
    c = components(method, fedavg)["main"]
    assert (c["ops_step"], c["ops_fixed"], c["flops_step"], c["flops_fixed"]) == pytest.approx((3.0, 4.5, 2.0, 2.1))


def test_a_variant_prices_its_own_rounds():
    costs = method_costs.MethodCosts()
    strong, weak = method_from_dict({"name": "fedgr"}), method_from_dict({"name": "fedgr", "strong_aug": False})
    assert costs.factor("fedgr", weak, "main", "cpu").value == 1.75
    assert costs.factor("fedgr", strong, "main", "cpu").value == 9.47
    assert costs.factor("fedgr", weak, "main", "cuda").value < costs.factor("fedgr", strong, "main", "cuda").value


def test_a_method_without_counts_costs_one_and_the_plan_text_names_the_command():
    assert "test_smooth" in METHODS  # the test-only plug-in (tests/support/plugins.py): not in the file
    params = method_from_dict({"name": "test_smooth"})
    for device in ("cpu", "cuda"):
        f = method_costs.MethodCosts().factor("test_smooth", params, "main", device)
        assert (f.value, f.kind) == (1.0, "unmeasured")
    shape = StepShape("tiny", 3, (8, 8), 10, False, 8, "none", "sgd", "fp32", False, 64)
    counted = method_costs.MethodCosts().factor("dividemix", method_from_dict({"name": "dividemix"}), "dividemix", "cuda")
    unmeasured = method_costs.MethodCosts().factor("test_smooth", params, "main", "cuda")
    runs = {"a": RunCost(shape, 1.0, True, method="dividemix", factors=(("dividemix", counted),)),
            "b": RunCost(shape, 1.0, False, method="test_smooth", factors=(("main", unmeasured),))}
    from fnlcore.app.cost import Pricing

    text = "\n".join(method_factor_lines(CostEstimate([], runs, {"test_smooth": 1}, Pricing("cuda"))))
    assert f"  dividemix: dividemix {counted.value:.2f} [counted]" in text
    assert "  test_smooth: main 1.00 [unmeasured]" in text
    assert "python benchmarks/count_method_costs.py --methods NAME" in text and "[cpu time]" not in text
    on_cpu = "\n".join(method_factor_lines(CostEstimate([], runs, {"test_smooth": 1}, Pricing("cpu"))))
    assert "bench_methods.py --methods fedavg NAME" in on_cpu and "count_method_costs" not in on_cpu
