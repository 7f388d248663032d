"""Host-device synchronisations of a local step: where they may happen, and how a CPU run counts them.

On a GPU, a call that reads a device tensor's value on the host (``item``, ``tolist``, ``bool`` of a
tensor, ``nonzero``, boolean-mask indexing, a copy to the CPU, ...) waits for every queued kernel:
one per step is enough to leave the GPU idle between launches. The engine keeps its steps free of
them: every random draw is made on the host (CPU generators, :mod:`fnlcore.fl.context`) and what
is decided from draws (which images RandAugment's ops touch, a mixup's lambda) is decided on the
host, then moved to the device in one copy.

A CPU run cannot tell a host tensor from a device tensor, so the code marks what it does on purpose
on host tensors with :func:`host_side`, the engines mark each local step with :func:`step_region`,
and :class:`SyncCounter` counts the synchronising calls made inside a step and outside the host
marks (a ``TorchFunctionMode``, as ``torch.cuda.set_sync_debug_mode`` counts them on a GPU, where
the device check (``fnl device-check``) measures them for real). Both markers cost one attribute
increment when no counter is active.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

_state = {"host": 0, "step": 0, "steps": 0}
_OPTIM = os.path.join("torch", "optim", "")

# Calls that read a tensor's values on the host (a device-to-host copy that waits for the device),
# besides blocking copies (``_which``).
_READS = {
    torch.Tensor.item: "item", torch.Tensor.tolist: "tolist", torch.Tensor.numpy: "numpy",
    torch.Tensor.__bool__: "bool", torch.Tensor.__float__: "float", torch.Tensor.__int__: "int",
    torch.Tensor.__index__: "index", torch.Tensor.nonzero: "nonzero", torch.nonzero: "nonzero",
    torch.Tensor.masked_select: "masked_select", torch.masked_select: "masked_select",
    torch.unique: "unique", torch.Tensor.unique: "unique", torch.Tensor.cpu: "cpu",
    torch.argwhere: "nonzero", torch.Tensor.argwhere: "nonzero",
    torch.repeat_interleave: "repeat_interleave", torch.Tensor.repeat_interleave: "repeat_interleave",
}


@contextlib.contextmanager
def host_side():
    """Mark work on host tensors (draws from CPU generators and what is decided from them)."""
    _state["host"] += 1
    try:
        yield
    finally:
        _state["host"] -= 1


@contextlib.contextmanager
def step_region():
    """Mark one local training step (the engines' loops wrap each step's body in it)."""
    _state["step"] += 1
    _state["steps"] += 1
    try:
        yield
    finally:
        _state["step"] -= 1


def in_step() -> bool:
    """Whether a local step is running now (inside :func:`step_region`)."""
    return _state["step"] > 0


def _is_bool_mask(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


def _which(func, args, kwargs) -> str | None:
    name = _READS.get(func)
    if name is not None:
        if name == "repeat_interleave" and not (len(args) > 1 and isinstance(args[1], torch.Tensor)):
            return None  # an int repeat count is known on the host
        return name
    if func is torch.Tensor.__getitem__ and len(args) > 1 and _is_bool_mask(args[1]):
        return "bool_mask_index"
    if func is torch.where and len(args) == 1:
        return "nonzero"
    if func is torch.Tensor.to or (func in (torch.tensor, torch.as_tensor) and "device" in kwargs):
        # A copy to a device that is not non-blocking waits for the stream (on a GPU, a host-to-device
        # copy too); a CPU run cannot tell a no-op move from a copy, so every blocking move counts.
        target = [a for a in args[1:] if isinstance(a, (str, torch.device))] + [kwargs.get("device")]
        if any(t is not None for t in target) and not kwargs.get("non_blocking", False):
            return "blocking_copy"
    return None


class SyncCounter(TorchFunctionMode):
    """Counts the synchronising calls made inside a :func:`step_region` and outside :func:`host_side`.

    ``counts``: call name -> number; ``steps``: steps entered while counting. ``where``: the
    innermost frames of the first few calls, for a failing test's message."""

    def __init__(self, keep_where: int = 5):
        super().__init__()
        self.counts: Counter = Counter()
        self.where: list[str] = []
        self._keep = keep_where
        self._steps0 = 0

    def __enter__(self):
        self._steps0 = _state["steps"]
        return super().__enter__()

    @property
    def steps(self) -> int:
        return _state["steps"] - self._steps0

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def per_step(self) -> float:
        return self.total / max(self.steps, 1)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _state["step"] > 0 and _state["host"] == 0:
            name = _which(func, args, kwargs)
            if name is not None:
                self._record(name)
        return func(*args, **kwargs)

    def _record(self, name: str) -> None:
        stack = traceback.extract_stack()[:-2]
        # torch.optim keeps its step counts on the host (not capturable): reading them waits for nothing
        if any(_OPTIM in f.filename for f in stack):
            return
        self.counts[name] += 1
        if len(self.where) < self._keep:
            ours = [f for f in stack if f"{os.sep}torch{os.sep}" not in f.filename]
            self.where.append(f"{name} at " + " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno}"
                                                          for f in ours[-3:][::-1]))
