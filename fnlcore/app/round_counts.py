"""A method's round in FedAvg rounds, counted: the ops it dispatches and its matrix FLOPs, per stage.

A GPU round at these sizes is host-bound, its time following the ops dispatched (fnlcore.app.gpu_cost),
so a method's round cost on a GPU is a count, not a CPU's time ratio. :func:`count_method` runs the
device check's short run of a method (:func:`fnlcore.app.device_check.tiny.tiny_method`, at
:data:`COUNT_RUN`) on the CPU, the sequential engine, under two counters entered around the whole
run: kernel-launching ATen ops (:class:`fnlcore.fl.simulation.OpCounter`, the ``ops`` the step-time
model is fitted on) and ``torch.utils.flop_counter.FlopCounterMode``. Each round is counted from
the method's ``begin_round`` to its ``end_round``: the local steps and every extra pass of the
method (detection and evaluation passes over the training data, co-divide forwards, server steps),
not the test-set evaluation the plan prices apart. Host work outside torch (numpy, scikit-learn:
FedCorr's LID, GMM fits) is not counted.

Rounds are summed per stretch of the method's schedule (:meth:`FLMethod.schedule`: what the plan
prices) and per stage (its label in the metrics, shown for reference), and divided by the clients
they trained; :func:`ratios` divides each by FedAvg's per-client round at the same run: a stage's
ops and FLOPs over a FedAvg round on the same clients.

The local steps are counted apart (the engine's :func:`fnlcore.syncs.step_region`, each step's ops
and FLOPs, observed from outside the engine): a method that trains on the samples its filter keeps
(FedDiv's gated set, DivideMix's labelled lead stream) takes fewer steps than its clients' samples
make, by a share that at the reference runs' few samples a client is neither the papers' share nor
the same in both runs. :func:`components` therefore prices a local step from the steps actually
taken, and counts as many of them per local step of the run as the method's phases would take over
all the client's samples (:attr:`Steps.full`): each step of the plan is priced as a step on
every sample, an upper bound for a filtering method whose kept share the plan does not know.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from torch.utils.flop_counter import FlopCounterMode

from ..fl import sequential
from ..fl.data import trim_last_batch
from ..fl.simulation import OpCounter
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
class Steps:
    """The clients' local steps of a stretch of rounds (summed over its rounds and client updates):
    ``taken`` and their ``ops`` and ``flops``; ``later``, ``later_ops``: those that are not the first
    of their phase (a phase's first step also makes lazy optimiser state); ``batches``: the samples
    they trained in full batches (a short last batch is a part of one); ``full``: the steps their
    phases would have taken over all of the clients' samples; ``trained``: client updates that ran a phase."""

    taken: int = 0
    ops: int = 0
    flops: float = 0.0
    later: int = 0
    later_ops: int = 0
    batches: float = 0.0
    full: int = 0
    trained: int = 0

    def add(self, other: "Steps") -> None:
        for f in self.__dataclass_fields__:
            setattr(self, f, getattr(self, f) + getattr(other, f))

    def step_ops(self) -> float:
        """Ops of a local step: a later one's where there are any, else any one's."""
        return self.later_ops / self.later if self.later else self.ops / max(self.taken, 1)

    def step_flops(self) -> float:
        """FLOPs of a local step of a full batch (FLOPs follow the samples, ops do not)."""
        return self.flops / self.batches if self.batches else 0.0


@dataclass
class Tally:
    """Ops, FLOPs, rounds and clients trained of a stretch of rounds, and its local steps."""

    ops: int = 0
    flops: float = 0.0
    rounds: int = 0
    clients: int = 0
    steps: Steps = field(default_factory=Steps)

    def add(self, ops: int, flops: float, clients: int, steps: Steps | None = None) -> None:
        self.ops += ops
        self.flops += flops
        self.rounds += 1
        self.clients += clients
        if steps is not None:
            self.steps.add(steps)

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
    local_steps: int = 0  # a client's local steps a round over all its samples at the run's batch size


def _stretch_of(schedule, r: int) -> str:
    """The name of the schedule's stretch that holds round ``r`` (stretches follow one another)."""
    end = 0
    for st in schedule:
        end += st.rounds
        if r < end:
            return st.name
    return schedule[-1].name


def _epoch_steps(n: int, batch_size: int, drop_last: bool) -> int:
    """Local steps of one epoch over ``n`` samples at ``batch_size``, as the engine batches them."""
    return -(-len(trim_last_batch(torch.arange(n), batch_size, drop_last)) // batch_size)


class _StepWatch:
    """The clients' local steps of the sequential engine, observed from outside it: while entered, its
    module's ``run_phase`` and ``step_region`` are wrapped (restored on exit) to add each client
    phase's steps, their ops and FLOPs (read from ``ops`` and ``flops``) and the steps the phase would
    take over all the client's samples to :attr:`round`. Steps outside a client's phase (a server's
    training) are left to the round's other work."""

    def __init__(self, ops: OpCounter, flops: FlopCounterMode):
        self.ops, self.flops = ops, flops
        self.round, self._job = Steps(), None  # _job: the client update whose phases run now
        self._phase: dict | None = None  # the running client phase: {"first": its first step is next}

    def take(self) -> Steps:
        """The steps since the last call (a round's)."""
        out, self.round, self._job = self.round, Steps(), None
        return out

    def __enter__(self):
        self._run_phase, self._step_region = sequential.run_phase, sequential.step_region
        sequential.run_phase, sequential.step_region = self._counted_phase, self._counted_step
        return self

    def __exit__(self, *exc):
        sequential.run_phase, sequential.step_region = self._run_phase, self._step_region
        return False

    def _counted_phase(self, ctx, job, phase, nets, optimizers, default_loss, idx, r, k, form=None):
        outer, self._phase = self._phase, None  # k < 0: a loop outside a client's update (not a local step)
        if k >= 0 and (phase.streams is None or phase.streams):  # a client's phase (an empty one fails in the engine)
            s = ctx.settings
            lead, lead_bs = (idx, s.batch_size) if phase.streams is None else next(iter(phase.streams.values()))
            lead_bs = int(lead_bs)
            epochs = s.local_epochs if phase.epochs is None else phase.epochs
            self.round.full += epochs * _epoch_steps(len(ctx.data.clients[k]), lead_bs, s.drop_last)
            self.round.batches += epochs * len(trim_last_batch(lead, lead_bs, s.drop_last)) / lead_bs
            if job is not self._job:  # a client update's first phase (a client may update twice a round)
                self.round.trained, self._job = self.round.trained + 1, job
            self._phase = {"first": True}
        try:
            return self._run_phase(ctx, job, phase, nets, optimizers, default_loss, idx, r, k, form)
        finally:
            self._phase = outer

    @contextlib.contextmanager
    def _counted_step(self):
        ops0, flops0 = self.ops.ops, self.flops.get_total_flops()
        with self._step_region():
            yield
        if self._phase is None:
            return
        d_ops, d_flops = self.ops.ops - ops0, float(self.flops.get_total_flops() - flops0)
        st = self.round
        st.taken, st.ops, st.flops = st.taken + 1, st.ops + d_ops, st.flops + d_flops
        if not self._phase["first"]:
            st.later, st.later_ops = st.later + 1, st.later_ops + d_ops
        self._phase["first"] = False


def count_method(name: str, run: TinyRun = COUNT_RUN, overrides: dict | None = None,
                 multi: bool | None = None) -> MethodCount:
    """Count method ``name``'s rounds (module docstring) at ``run`` on the CPU; ``overrides``: hyper-parameters
    set after the run's defaults (a variant whose rounds cost otherwise, FedGR's ``strong_aug: false``);
    ``multi``: on multi-label data (default: where the method trains on nothing else)."""
    cls = METHODS[name]
    multi = "single" not in cls.label_kinds if multi is None else multi
    method, sim = tiny_method(name, "sequential", tiny_arrays(run, multi), run, torch.device("cpu"), overrides)
    ctx = method.ctx
    s = ctx.settings
    schedule = cls.schedule(method.params, s, ctx.data.num_clients)
    out = MethodCount(name, local_steps=s.local_epochs * _epoch_steps(run.per_client, s.batch_size, s.drop_last))
    ops, flops = OpCounter(), FlopCounterMode(display=False)
    watch = _StepWatch(ops, flops)
    begin, select, end = method.begin_round, method.select_clients, method.end_round
    at: dict[str, float] = {}

    def begin_round(r: int) -> None:
        at.update(ops=ops.ops, flops=flops.get_total_flops(), clients=0)
        watch.take()
        begin(r)

    def select_clients(r: int) -> list[int]:
        chosen = select(r)
        at["clients"] = len(chosen)
        return chosen

    def end_round(r: int) -> None:
        end(r)
        n_ops, n_flops = ops.ops - at["ops"], float(flops.get_total_flops() - at["flops"])
        steps = watch.take()
        for key, table in ((_stretch_of(schedule, r), out.stretches), (method.stage_name(r), out.stages)):
            table.setdefault(key, Tally()).add(n_ops, n_flops, int(at["clients"]), steps)

    method.begin_round, method.select_clients, method.end_round = begin_round, select_clients, end_round
    with gpu_paths(), ops, flops, watch:
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
    besides its local steps and what each local step adds, in units of a FedAvg local step (a fixed
    part below 0, counting noise, is 0). A stretch of S local steps a client then costs
    (fixed + S x step) / (FedAvg's fixed + S) FedAvg rounds; ``steps_taken``: :func:`_taken_share`.

    The work outside the local steps (detection and evaluation passes, server steps) splits by the
    difference of the two runs' counts over the difference of their local steps. The local steps
    are priced from the steps taken (:meth:`Steps.step_ops`, :meth:`Steps.step_flops`) and counted
    at the steps the method's phases take over all of a client's samples per local step of the run
    (module docstring); a method that takes every step (FedAvg, or two phases over every sample:
    DivideMix's warm-up) splits as the plain difference of the two runs' counts."""
    _, f_ops, _, f_flops = _split(fedavg, None)
    out = {}
    for key in method[1].stretches:
        ops_fixed, ops_step, flops_fixed, flops_step = _split(method, key)
        out[key] = {"ops_fixed": round(max(ops_fixed, 0.0) / f_ops, 4), "ops_step": round(ops_step / f_ops, 4),
                    "flops_fixed": round(max(flops_fixed, 0.0) / f_flops, 4),
                    "flops_step": round(flops_step / f_flops, 4), "rounds": method[1].stretches[key].rounds,
                    "steps_taken": _taken_share(method, key)}
    return out


def _taken_share(pair: tuple[MethodCount, MethodCount], key: str) -> float:
    """The share of the local steps its client updates would take over all their samples that they
    took in both runs (below 1: a method that trains on the samples it keeps, or skips training)."""
    (n1, t1), (n2, t2) = ((c.local_steps, c.stretches[key]) for c in pair)
    full = _steps_per_step(t1, t2, n1, n2) * (t1.clients * n1 + t2.clients * n2)
    return round((t1.steps.taken + t2.steps.taken) / full, 3) if full else 1.0


def _steps_per_step(t1: Tally, t2: Tally, n1: int, n2: int) -> float:
    """Steps a client update takes per local step of the run where its phases walk all its samples
    (observed on the updates that ran a phase; 0 where none did)."""
    return (t1.steps.full + t2.steps.full) / max(t1.steps.trained * n1 + t2.steps.trained * n2, 1)


def _split(pair: tuple[MethodCount, MethodCount], key: str | None) -> tuple[float, float, float, float]:
    """(ops fixed, ops a local step, FLOPs fixed, FLOPs a local step) of a client's round of stretch
    ``key`` (None: every round) at the two runs ``pair`` (:func:`components`)."""
    (n1, t1), (n2, t2) = ((c.local_steps, _total(c) if key is None else c.stretches[key]) for c in pair)
    if n2 <= n1:
        raise ValueError(f"{pair[0].name}: the second count needs more local steps a client than the first "
                         f"({n2} vs {n1}); count at two runs of different samples a client")
    c1, c2 = max(t1.clients, 1), max(t2.clients, 1)
    steps = Steps()
    steps.add(t1.steps)
    steps.add(t2.steps)
    per_step = _steps_per_step(t1, t2, n1, n2)
    split = []
    for total1, total2, in1, in2, price, priced1 in (
            (t1.ops, t2.ops, t1.steps.ops, t2.steps.ops, steps.step_ops(), t1.steps.taken),
            (t1.flops, t2.flops, t1.steps.flops, t2.steps.flops, steps.step_flops(), t1.steps.batches)):
        other1, other2 = (total1 - in1) / c1, (total2 - in2) / c2  # a client-round's work besides its local steps
        other_step = (other2 - other1) / (n2 - n1)
        fixed = other1 - other_step * n1 + (in1 - price * priced1) / c1  # + the first steps' extra ops
        split += [fixed, other_step + price * per_step]
    return split[0], split[1], split[2], split[3]


def _total(count: MethodCount) -> Tally:
    out = Tally()
    for t in count.stretches.values():
        out.ops, out.flops, out.clients = out.ops + t.ops, out.flops + t.flops, out.clients + t.clients
        out.steps.add(t.steps)
    return out
