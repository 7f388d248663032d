"""A method's round in FedAvg rounds, counted: the ops it dispatches and its matrix FLOPs, per stage.

A GPU round at these sizes is host-bound, its time following the ops dispatched (fnlcore.app.gpu_cost),
so a method's round cost on a GPU is a count, not a CPU's time ratio. :func:`count_method` runs the
device check's short run of a method (:func:`fnlcore.app.device_check.tiny.tiny_method`, at
:data:`COUNT_RUN`) on the CPU, the sequential engine, under two counters entered around the whole
run: kernel-launching ATen ops (:class:`fnlcore.fl.footprint.OpCounter`, the ``ops`` the step-time
model is fitted on) and ``torch.utils.flop_counter.FlopCounterMode``. Each round is counted from
the method's ``begin_round`` to its ``end_round``: the local steps and every extra pass of the
method (detection and evaluation passes over the training data, co-divide forwards, server steps),
not the test-set evaluation the plan prices apart. Host work outside torch (numpy, scikit-learn:
FedCorr's LID, GMM fits) is not counted.

Rounds are summed per stretch of the method's schedule (:meth:`FLMethod.schedule`: what the plan
prices) and per stage (its label in the metrics, shown for reference), and divided by the clients
they trained; :func:`ratios` divides each by FedAvg's per-client round at the same run: a stage's
ops and FLOPs over a FedAvg round on the same clients.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils.flop_counter import FlopCounterMode

from ..fl.footprint import OpCounter
from ..methods import METHODS
from .device_check.tiny import TinyRun, tiny_arrays, tiny_method
from .opcount import gpu_paths

# The reference runs: ResNet-18 (the CIFAR papers' backbone: its ops a step are the paper runs'; ops do
# not depend on the image size, FLOPs scale alike for a method and FedAvg) at 10 pixels (its last blocks
# 2x2: BatchNorm trains on a one-sample batch, DivideMix's last unlabelled one), six clients, three
# rounds (every stage entered), one and two local steps a client: their difference splits a round
# into what each local step adds and what the round costs besides (:func:`components`).
# About 20 s a method on one CPU thread.
COUNT_RUNS = (TinyRun("resnet18_cifar", 10, 8, 8, 8, 3), TinyRun("resnet18_cifar", 10, 16, 8, 8, 3))
COUNT_RUN = COUNT_RUNS[-1]


def describe(runs: tuple[TinyRun, ...] = COUNT_RUNS) -> str:
    run = runs[-1]
    per = " and ".join(str(r.per_client // r.batch) for r in runs)
    return (f"{run.model}, 3x{run.size}x{run.size}, {run.clients} clients x {per} local steps of batch "
            f"{run.batch}, {run.rounds} rounds, sequential engine, CPU")


@dataclass
class Tally:
    """Ops, FLOPs, rounds and clients trained of a stretch of rounds."""

    ops: int = 0
    flops: float = 0.0
    rounds: int = 0
    clients: int = 0

    def add(self, ops: int, flops: float, clients: int) -> None:
        self.ops += ops
        self.flops += flops
        self.rounds += 1
        self.clients += clients

    def per_client(self) -> tuple[float, float]:
        """(ops, FLOPs) of a round per client it trained."""
        n = max(self.clients, 1)
        return self.ops / n, self.flops / n


@dataclass
class MethodCount:
    """A method's counted rounds: ``stretches`` by its schedule's stretch name, ``stages`` by its stage."""

    name: str
    stretches: dict[str, Tally] = field(default_factory=dict)
    stages: dict[str, Tally] = field(default_factory=dict)


def _stretch_of(schedule, r: int) -> str:
    """The name of the schedule's stretch that holds round ``r`` (stretches follow one another)."""
    end = 0
    for st in schedule:
        end += st.rounds
        if r < end:
            return st.name
    return schedule[-1].name


def count_method(name: str, run: TinyRun = COUNT_RUN, overrides: dict | None = None,
                 multi: bool | None = None) -> MethodCount:
    """Count method ``name``'s rounds (module docstring) at ``run`` on the CPU; ``overrides``: hyper-parameters
    set after the run's defaults (a variant whose rounds cost otherwise, FedGR's ``strong_aug: false``);
    ``multi``: on multi-label data (default: where the method trains on nothing else)."""
    cls = METHODS[name]
    multi = "single" not in cls.label_kinds if multi is None else multi
    method, sim = tiny_method(name, "sequential", tiny_arrays(run, multi), run, torch.device("cpu"), overrides)
    ctx = method.ctx
    schedule = cls.schedule(method.params, ctx.settings, ctx.data.num_clients)
    out = MethodCount(name)
    ops, flops = OpCounter(), FlopCounterMode(display=False)
    begin, select, end = method.begin_round, method.select_clients, method.end_round
    at: dict[str, float] = {}

    def begin_round(r: int) -> None:
        at.update(ops=ops.ops, flops=flops.get_total_flops(), clients=0)
        begin(r)

    def select_clients(r: int) -> list[int]:
        chosen = select(r)
        at["clients"] = len(chosen)
        return chosen

    def end_round(r: int) -> None:
        end(r)
        n_ops, n_flops = ops.ops - at["ops"], float(flops.get_total_flops() - at["flops"])
        for key, table in ((_stretch_of(schedule, r), out.stretches), (method.stage_name(r), out.stages)):
            table.setdefault(key, Tally()).add(n_ops, n_flops, int(at["clients"]))

    method.begin_round, method.select_clients, method.end_round = begin_round, select_clients, end_round
    with gpu_paths(), ops, flops:
        sim.run()
    return out


def ratios(method: MethodCount, fedavg: MethodCount) -> dict[str, dict[str, dict[str, float]]]:
    """``{"stretches": {name: {"ops": x, "flops": y}}, "stages": ...}``: each stretch's and stage's
    ops and FLOPs per client trained over FedAvg's (its one stretch, every round)."""
    f_ops, f_flops = _total(fedavg).per_client()
    out: dict[str, dict[str, dict[str, float]]] = {}
    for kind in ("stretches", "stages"):
        out[kind] = {}
        for key, t in getattr(method, kind).items():
            m_ops, m_flops = t.per_client()
            out[kind][key] = {"ops": round(m_ops / f_ops, 3), "flops": round(m_flops / f_flops, 3),
                              "rounds": t.rounds}
    return out


def count_pair(name: str, overrides: dict | None = None, multi: bool | None = None,
               runs: tuple[TinyRun, TinyRun] = COUNT_RUNS) -> tuple[MethodCount, MethodCount]:
    """:func:`count_method` at one and at two local steps a client (``runs``)."""
    return count_method(name, runs[0], overrides, multi), count_method(name, runs[1], overrides, multi)


def components(method: tuple[MethodCount, MethodCount], fedavg: tuple[MethodCount, MethodCount]
               ) -> dict[str, dict[str, float]]:
    """Stretch name -> its round per client trained as ``{ops,flops}_{fixed,step}``: what a round costs
    besides its local steps and what each local step adds, in units of a FedAvg local step (the
    difference of the one-step and two-step counts; a fixed part below 0, counting noise, is 0).
    A stretch of S local steps a client then costs (fixed + S x step) / (FedAvg's fixed + S) FedAvg rounds."""
    def split(pair: tuple[MethodCount, MethodCount], key: str | None) -> tuple[float, float, float, float]:
        one, two = ((_total(c) if key is None else c.stretches[key]).per_client() for c in pair)
        ops_step, flops_step = two[0] - one[0], two[1] - one[1]
        return one[0] - ops_step, ops_step, one[1] - flops_step, flops_step

    _, f_ops, _, f_flops = split(fedavg, None)
    out = {}
    for key in method[1].stretches:
        ops_fixed, ops_step, flops_fixed, flops_step = split(method, key)
        out[key] = {"ops_fixed": round(max(ops_fixed, 0.0) / f_ops, 4), "ops_step": round(ops_step / f_ops, 4),
                    "flops_fixed": round(max(flops_fixed, 0.0) / f_flops, 4),
                    "flops_step": round(flops_step / f_flops, 4), "rounds": method[1].stretches[key].rounds}
    return out


def _total(count: MethodCount) -> Tally:
    out = Tally()
    for t in count.stretches.values():
        out.ops, out.flops, out.clients = out.ops + t.ops, out.flops + t.flops, out.clients + t.clients
    return out
