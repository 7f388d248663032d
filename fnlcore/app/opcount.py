"""Ops dispatched per local step: what a step costs the host, counted on any device.

A GPU step at the papers' sizes is host-bound: its time follows the number of ops the host
dispatches (Python, dispatcher and autograd work per op), not their arithmetic. :class:`OpCounter`
counts the aten ops dispatched inside the engines' local steps (:func:`fnlcore.syncs.step_region`),
forward, loss, backward and optimiser step, one tally per step, by kind:

* ``kernel``: arithmetic (an op that launches device work);
* ``create``: a new tensor made in the step (``zeros``, ``full``, ``scalar_tensor``, ``lift_fresh`` of
  ``torch.tensor``, ...): per-step tensors a step could keep from the last one;
* ``copy``: conversions and copies between tensors (``_to_copy``, ``copy_``);
* ``view``: aliasing ops and profiler marks (no device work, but a dispatch each);
* ``host``: ops on host tensors inside :func:`fnlcore.syncs.host_side` (draws and what is decided
  from them; on a GPU they never reach it);
* ``to_device``: moves to a device in the step (``Tensor.to(device)``, ``torch.tensor(..., device=)``) of
  a tensor that no op of the step made (host data: a draw, a Python value, a host tensor made before
  the step): on a GPU a host-to-device copy each. A CPU run cannot tell a host tensor from a device
  one, so a tensor moved to the device before the step and moved again in it counts too.

``device`` = kernel + create + copy: the ops that reach the device, the issue's "kernel ops".
:func:`count_steps` runs a short FedAvg round at a :class:`~fnlcore.app.cost.StepShape` on either
engine under the counter. ``gpu_paths=True`` takes the code paths a CUDA run takes where the
engine chooses by device (the batched engine splits wide convolutions per client on the CPU, and
its optimisers work per tensor there, over concatenations on a GPU), so a CPU counts a GPU's ops.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import Counter
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from .. import syncs
from .gpu_cost import shape_from_key
from .measurements import shipped_shapes
from ..fl import stacked
from ..fl.data import FederatedData, ImageSource
from ..fl.settings import TrainSettings
from ..fl.simulation import Simulation
from ..methods import METHODS
from .train import build_context

KINDS = ("kernel", "create", "copy", "view", "host", "to_device")
DEVICE_KINDS = ("kernel", "create", "copy")

# Factory ops: a tensor made anew (from sizes, a scalar or host data).
_CREATE = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "new_zeros",
    "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "scalar_tensor", "arange", "linspace",
    "lift_fresh", "lift_fresh_copy", "eye", "tensor",
})
_HOST_DATA = frozenset({"lift_fresh", "lift_fresh_copy"})  # torch.tensor(data): made from host values
_COPY = frozenset({"_to_copy", "copy_", "copy", "_copy_from", "_copy_from_and_resize", "to"})
# Aliases and the profiler's record_function marks (torch.optim's step): a dispatch, no device work.
_ALIAS = frozenset({"detach", "alias", "lift", "_unsafe_view", "view_as", "_record_function_enter",
                    "_record_function_enter_new", "_record_function_exit"})


def kind_of(func) -> str:
    """The kind (see the module doc) of an aten op overload outside a host mark."""
    name = func.overloadpacket.__name__
    if name in _CREATE:
        return "create"
    if name in _COPY:
        return "copy"
    if getattr(func, "is_view", False) or name in _ALIAS:
        return "view"
    return "kernel"


class _Moves(TorchFunctionMode):
    """Counts explicit moves to a device inside a step and outside a host mark (the ``to_device`` kind)."""

    def __init__(self, counter: "OpCounter"):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if syncs._state["step"] > 0 and syncs._state["host"] == 0:
            if func is torch.Tensor.to:
                target = [a for a in args[1:] if isinstance(a, (str, torch.device))] + [kwargs.get("device")]
                if any(t is not None for t in target) and not self.counter.made_in_step(args[0]):
                    self.counter._add("to_device", "Tensor.to")
            elif func in (torch.tensor, torch.as_tensor) and kwargs.get("device") is not None:
                self.counter._add("to_device", func.__name__)
        return func(*args, **kwargs)


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched inside local steps, one :class:`~collections.Counter` of kinds per step.

    ``per_step``: step number (fnlcore.syncs' running count) -> kind -> ops; ``ops``: op name -> count
    over every counted step (what to look at when a pinned count moves)."""

    def __init__(self):
        super().__init__()
        self.per_step: dict[int, Counter] = {}
        self.ops: Counter = Counter()
        self._moves = _Moves(self)
        self._made: dict[int, weakref.ref] = {}  # outputs of the steps' device ops (not host data)

    def __enter__(self):
        self._moves.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        out = super().__exit__(*exc)
        self._moves.__exit__(*exc)
        return out

    def _add(self, kind: str, name: str) -> None:
        self.per_step.setdefault(syncs._state["steps"], Counter())[kind] += 1
        self.ops[f"{kind}:{name}"] += 1

    def made_in_step(self, t) -> bool:
        """Whether a device op of a step made ``t`` (then a move of it is no copy on a GPU)."""
        ref = self._made.get(id(t))
        return ref is not None and ref() is t

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if syncs._state["step"] > 0:
            kind = "host" if syncs._state["host"] > 0 else kind_of(func)
            self._add(kind, func.overloadpacket.__name__)
            if kind != "host" and func.overloadpacket.__name__ not in _HOST_DATA:
                for t in out if isinstance(out, (tuple, list)) else (out,):
                    if isinstance(t, torch.Tensor):
                        self._made[id(t)] = weakref.ref(t)
        return out

    def steps(self) -> list[Counter]:
        """Each counted step's tally, in order."""
        return [self.per_step[s] for s in sorted(self.per_step)]


@dataclass(frozen=True)
class StepOps:
    """Ops of one engine's local steps at one shape: ``first`` (a local update's first step, which
    also makes lazy optimiser state) and ``steady`` (a later full step), each kind -> ops;
    ``samples`` the samples one step trains (clients in the step x batch)."""

    engine: str
    first: dict[str, int]
    steady: dict[str, int]
    samples: int
    ops: dict[str, int]

    def device(self, which: str = "steady") -> int:
        tally = getattr(self, which)
        return sum(tally.get(k, 0) for k in DEVICE_KINDS)

    def row(self) -> dict:
        s = self.steady
        return {"engine": self.engine, **{k: s.get(k, 0) for k in KINDS}, "device": self.device(),
                "device_first": self.device("first"), "samples": self.samples,
                "device_per_sample": round(self.device() / self.samples, 4)}


@contextlib.contextmanager
def gpu_paths():
    """The batched engine's CUDA code paths on any device (:mod:`fnlcore.fl.stacked`'s device choices)."""

    old = stacked.DEVICE_PATHS
    stacked.DEVICE_PATHS = "cuda"
    try:
        yield
    finally:
        stacked.DEVICE_PATHS = old


def shape_data(shape, clients: int, per_client: int, device: torch.device, seed: int = 0):
    """Random uint8 images and labels of a StepShape, ``per_client`` samples for each of ``clients``."""

    gen = torch.Generator().manual_seed(seed)
    n = clients * per_client
    h, w = shape.image_size
    x = torch.randint(0, 256, (n, h, w, shape.channels), generator=gen, dtype=torch.uint8).numpy()
    if shape.multi_label:
        y = torch.randint(0, 2, (n, shape.num_classes), generator=gen).float()
    else:
        y = torch.randint(0, shape.num_classes, (n,), generator=gen)
    parts = [torch.arange(k * per_client, (k + 1) * per_client) for k in range(clients)]
    return FederatedData(ImageSource(device, images=x), ImageSource(device, images=x[:4]), y.to(device),
                         y.clone().to(device), y[:4].to(device), parts, shape.num_classes,
                         multi_label=shape.multi_label)


def count_steps(shape, engine: str, device: torch.device | str = "cpu", clients: int = 2, steps: int = 2,
                batch_size: int | None = None, gpu: bool = False) -> StepOps:
    """Ops per local step of one FedAvg round (the second: see below) at ``shape`` (a :class:`~fnlcore.app.cost.StepShape`) on
    ``engine``: ``clients`` clients of ``steps`` full batches each, at ``batch_size`` (default the
    shape's: the counts do not depend on it, tests/test_op_counts.py checks so). ``gpu``: the
    batched engine's CUDA paths (:func:`gpu_paths`)."""

    device = torch.device(device)
    b = batch_size or shape.batch_size
    settings = TrainSettings(
        model=shape.model, rounds=10, local_epochs=1, batch_size=b, optimizer=shape.optimizer, lr=0.01,
        momentum=0.5 if shape.optimizer == "sgd" else 0.0, augmentation=shape.augmentation,
        normalize="imagenet" if shape.channels == 3 else "half", precision=shape.precision,
        channels_last=shape.channels_last, engine=engine)
    data = shape_data(shape, clients, steps * b, device)
    ctx = build_context(data, "ops", tuple(shape.image_size), shape.channels, settings, 0, device, log=lambda m: None)
    method = METHODS["fedavg"](METHODS["fedavg"].Params(), ctx)
    sim = Simulation(method, ctx, progress=lambda m: None)
    counter = OpCounter()
    with gpu_paths() if gpu else contextlib.nullcontext():
        # round 0 fills the process's one-time caches (normalisation constants, index tensors): counting
        # round 1 gives every update's first step as a running process makes it, in any test order
        for r, counting in ((0, contextlib.nullcontext()), (1, counter)):
            with counting:
                method.begin_round(r)
                method.aggregate(r, sim.engine.updates(r, method.select_clients(r)))
    tallies = counter.steps()
    if not tallies:
        raise RuntimeError(f"count_steps: no local step ran ({engine} engine at {shape.key()})")
    batched = engine == "batched"
    return StepOps(engine, dict(tallies[0]), dict(tallies[-1]), b * (clients if batched else 1),
                   dict(counter.ops))


def paper_shapes() -> list:
    """The StepShapes of every paper training shape the project ships step costs for (fnl plan's)."""
    return [shape_from_key(k) for k in sorted(shipped_shapes())]

