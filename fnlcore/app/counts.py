"""What a local step of a step shape does, counted on any machine: dispatched ops and FLOPs.

A GPU's step at these sizes is host-bound: its time tracks the number of ops the step dispatches
(each a kernel launch, some 50 us on the H200 measured in benchmarks/README.md) more than its
arithmetic. Both are properties of the step, not of the device, so they are counted here on the
CPU and priced per device by :mod:`fnlcore.app.gpu_cost`:

* ``ops``: ATen ops of one training step (input pipeline, forward, loss, backward, optimiser step
  in its multi-tensor form, as torch runs it on a GPU), counted by a ``TorchDispatchMode``;
  views and empty allocations launch no kernel and are not counted.
* ``flops``: their matrix FLOPs (``torch.utils.flop_counter.FlopCounterMode``: convolutions and
  matrix products) at the shape's batch size; ``eval_flops``: one test sample's forward pass;
  ``eval_ops``: the ops of one evaluation forward pass (a sub-batch).
* ``param_bytes``, ``activation_bytes`` (a training sample's forward outputs, an upper bound of
  what backward keeps): what a client's stacked copy takes on a device (:func:`fnlcore.fl.simulation.client_bytes`).
* ``stackable``: whether the batched engine can stack the model (:func:`fnlcore.fl.stacked.check_stackable`).

Counting runs one step at batch :data:`COUNT_BATCH` (op counts do not depend on the batch,
FLOPs scale with it) and takes up to seconds a shape; the counts of the project's tables ship in
``benchmarks/shape_counts.json`` (:func:`shipped_counts`; ``python benchmarks/count_shapes.py``
writes it), so ``fnl plan`` counts only shapes the file lacks.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

import torch
from torch.utils.flop_counter import FlopCounterMode

from ..errors import ConfigError
from ..fl.simulation import OpCounter
from ..fl.stacked import check_stackable
from .cost import build_step

COUNTS_VERSION = 1
COUNT_BATCH = 2  # BatchNorm needs more than one sample a batch in training mode
SHIPPED_COUNTS = Path(__file__).resolve().parents[2] / "benchmarks" / "shape_counts.json"


def count_shape(shape) -> dict[str, Any]:
    """The counts of one :class:`~fnlcore.app.cost.StepShape` (see the module docstring), on the CPU."""

    cpu = torch.device("cpu")
    step, model, pipeline, autocast = build_step(shape, cpu, batch_size=COUNT_BATCH, foreach=True)
    model.train()
    step()  # first-call work (optimiser state) outside the count, as a measured step after warm-up
    with OpCounter() as ops:
        step()
    sample = pipeline.eval(torch.zeros((COUNT_BATCH, shape.channels, *shape.image_size), dtype=torch.uint8))
    with OpCounter() as forward:  # what the model's forward pass writes: at most what backward keeps
        model(sample)  # as the run counts it (fnlcore.fl.simulation.clients_in_memory)
    flops = FlopCounterMode(display=False)
    with flops:
        step()
    h, w = shape.image_size
    x = torch.zeros((COUNT_BATCH, shape.channels, h, w), dtype=torch.uint8)
    model.eval()
    with torch.no_grad(), autocast:
        with OpCounter() as eval_ops:
            model(pipeline.eval(x))
        eval_flops = FlopCounterMode(display=False)
        with eval_flops:
            model(pipeline.eval(x))
    try:
        check_stackable(model)
        stackable = True
    except ConfigError:
        stackable = False
    return {
        "ops": ops.ops,
        "flops": float(flops.get_total_flops()) * shape.batch_size / COUNT_BATCH,
        "eval_ops": eval_ops.ops,
        "eval_flops": float(eval_flops.get_total_flops()) / COUNT_BATCH,
        "stackable": stackable,
        "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "activation_bytes": forward.bytes / COUNT_BATCH,  # a training sample's forward outputs
    }


def _read(path: Path) -> dict[str, dict[str, Any]]:
    try:
        raw = json.loads(path.read_text())
    except ValueError as err:
        raise ConfigError(f"{path}: not a shape-count file ({err}); delete it to count again") from None
    if not isinstance(raw, dict) or raw.get("version") != COUNTS_VERSION or not isinstance(raw.get("shapes"), dict):
        raise ConfigError(f"{path}: not a shape-count file of version {COUNTS_VERSION}; delete it to count again")
    return raw["shapes"]


def shipped_counts(path: str | os.PathLike | None = None) -> dict[str, dict[str, Any]]:
    """shape key -> counts, from the shipped file (empty where there is none)."""
    path = Path(path or SHIPPED_COUNTS)
    return _read(path) if path.exists() else {}


class ShapeCounts:
    """Counts per shape key: the shipped ones, the cache's (``path``), and counted now for the rest
    (saved to the cache unless ``write`` is off: the workflow reads it and writes nothing, as a dry run must)."""

    def __init__(self, path: str | os.PathLike | None = None, shipped: Mapping[str, Mapping[str, Any]] | None = None,
                 progress=None, write: bool = True):
        self.path = Path(path) if path else None
        self.write = write
        self.known: dict[str, dict[str, Any]] = dict(shipped_counts() if shipped is None else shipped)
        if self.path is not None and self.path.exists():
            self.known.update(_read(self.path))
        self.counted: list[str] = []
        self.progress = progress

    def of(self, shape) -> dict[str, Any]:
        key = shape.key()
        if key not in self.known:
            if self.progress is not None:
                self.progress(f"counting ops and FLOPs of {key} (not in {SHIPPED_COUNTS.name}; seconds)")
            self.known[key] = count_shape(shape)
            self.counted.append(key)
            if self.path is not None and self.write:
                self.save(self.path, {k: self.known[k] for k in self.counted} | (
                    _read(self.path) if self.path.exists() else {}))
        return self.known[key]

    @staticmethod
    def save(path: str | os.PathLike, shapes: Mapping[str, Mapping[str, Any]]) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps({"version": COUNTS_VERSION, "torch": torch.__version__,
                                   "shapes": dict(sorted(shapes.items()))}, indent=1, sort_keys=True))
        os.replace(tmp, path)
