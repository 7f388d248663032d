"""Pricing a GPU from that GPU's measurements only: the step-time model, the batched engine, the floor.

A GPU's local step at these model sizes is host-bound: its time follows the ops it dispatches
more than its arithmetic (benchmarks/README.md, the H200 device check). So a device's step
time is modelled as

    t_step = a x ops + b x FLOPs

with ``ops`` and ``FLOPs`` of the step counted on the CPU (:mod:`fnlcore.app.counts`) and
``a`` (seconds per dispatched op) and ``b`` (seconds per FLOP) fitted, non-negative, on the
shapes that device measured (relative error; :meth:`DeviceModel.fit`). A shape the device never
measured is priced by the model and labelled *estimated*; a CPU's cost never prices a GPU.
A test sample's forward pass likewise: ``t_eval = a_e x eval ops / eval batch + b_e x eval FLOPs``.

The batched engine trains G clients in one stacked step. Its step dispatches the ops of one
client's step ``c`` times over (stacked layers, per-client selects) and does G clients'
arithmetic:

    t_group(G) = c x (a x ops) + G x (b x FLOPs)

``c`` is fitted per device on its measured batched-vs-sequential rounds (the ``batched`` rows of
benchmarks/step_costs.json: ``bench_batched.py --device cuda``); a device without them prices
the batched engine as sequential and says so.

The floor is the arithmetic alone: a run's training and evaluation FLOPs at
:data:`FLOOR_EFFICIENCY` of an H100's dense TF32 peak, whatever device the plan prices.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, fields
from typing import Any, Mapping

import numpy as np

from ..errors import ConfigError
from .measurements import batched_rounds, gpu_descriptions, shapes_measured, short_device
from .step_shape import StepShape

# NVIDIA H100 SXM datasheet: 989 TFLOP/s TF32 Tensor Core with sparsity, half of it dense.
H100_TF32_DENSE_FLOPS = 494.7e12
FLOOR_EFFICIENCY = 0.4  # of peak: what well-fed large matrix work reaches


def floor_seconds(flops: float) -> float:
    """Seconds of ``flops`` at the floor's rate (FLOOR_EFFICIENCY x an H100's dense TF32 peak)."""
    return flops / (FLOOR_EFFICIENCY * H100_TF32_DENSE_FLOPS)


def shape_from_key(key: str):
    """The :class:`~fnlcore.app.cost.StepShape` of a shape key (``StepShape.key``'s inverse)."""

    parts = key.split("|")
    try:
        model, chw, classes, batch, aug, opt, prec = parts[:7]
        rest = parts[7:]
        c, h, w = (int(v) for v in chw.split("x"))
        multi = classes.endswith("ml")
        eb = next(p for p in rest if p.startswith("eb"))
        return StepShape(model=model, channels=c, image_size=(h, w), num_classes=int(classes[1:].removesuffix("ml")),
                         multi_label=multi, batch_size=int(batch[1:]), augmentation=aug, optimizer=opt,
                         precision=prec, channels_last="cl" in rest, eval_batch_size=int(eb[2:]))
    except (ValueError, StopIteration):
        raise ConfigError(f"step shape {key!r} is not a shape key (model|CxHxW|C<classes>|b<batch>|"
                          "augmentation|optimiser|precision[|cl]|eb<eval batch>)") from None


@dataclass(frozen=True)
class BatchedRow:
    """One measured round of a device: ``clients`` trained batched and sequentially."""

    case: str
    shape: Any  # StepShape of the case's local step
    clients: int
    sequential_s: float  # seconds of a round, sequential engine
    batched_s: float  # seconds of the same round, batched engine, every client at once


def batched_measurements(path: str | os.PathLike | None = None) -> dict[str, list[BatchedRow]]:
    """device description -> its measured batched rounds (``batched`` of the step-cost file)."""

    names = {f.name for f in fields(StepShape)}
    out: dict[str, list[BatchedRow]] = {}
    for device, rows in batched_rounds(path).items():
        for r in rows:
            shape = {k: v for k, v in r["shape"].items() if k in names}
            shape["image_size"] = tuple(shape["image_size"])
            out.setdefault(device, []).append(BatchedRow(r["case"], StepShape(**shape), int(r["clients"]),
                                                         float(r["sequential_s"]), float(r["batched_s"])))
    return out


def _nnls(rows: list[tuple[float, float]], targets: list[float]) -> tuple[float, float]:
    """Non-negative (x, y) minimising the relative error of x*u + y*v against each target."""
    from scipy.optimize import nnls  # lazy: scipy only for this fit (fnl plan --gpu)

    a = np.array([[u / t, v / t] for (u, v), t in zip(rows, targets)])
    sol, _ = nnls(a, np.ones(len(targets)))
    return float(sol[0]), float(sol[1])


class DeviceModel:
    """A GPU's step-time model, fitted on the shapes it measured (module docstring)."""

    def __init__(self, device: str, measured: Mapping[str, tuple[float, float]], counts,
                 batched: list[BatchedRow] | None = None, memory_mb: int | None = None):
        """``measured``: shape key -> (s per step, s per test sample) of this device; ``counts``: a
        :class:`~fnlcore.app.counts.ShapeCounts` (or anything with ``of(shape)``)."""
        if len(measured) < 2:
            raise ConfigError(f"{device}: {len(measured)} measured step shape(s); estimating the others needs "
                              "at least 2: run `fnl plan --device cuda --recalibrate` on that GPU")
        self.device = device
        self.counts = counts
        self.measured = dict(measured)
        self.memory_mb = memory_mb
        cs = {k: counts.of(shape_from_key(k)) for k in self.measured}
        keys = sorted(self.measured)
        self.a, self.b = _nnls([(cs[k]["ops"], cs[k]["flops"]) for k in keys], [self.measured[k][0] for k in keys])
        self.a_eval, self.b_eval = _nnls(
            [(cs[k]["eval_ops"] / shape_from_key(k).eval_batch_size, cs[k]["eval_flops"]) for k in keys],
            [self.measured[k][1] for k in keys])
        self.fit_error = max(abs(self._train(cs[k]) / self.measured[k][0] - 1) for k in keys)
        self.batched_rows = list(batched or [])
        per_row = [c for r in self.batched_rows if (c := self._overhead(r)) is not None]
        self.c = statistics.mean(per_row) if per_row else None

    def _train(self, c: Mapping[str, Any]) -> float:
        return self.a * c["ops"] + self.b * c["flops"]

    def _overhead(self, row: BatchedRow) -> float | None:
        """The ``c`` that makes the model reproduce one measured batched round's speed-up."""
        t_ops, t_flops = self.split(row.shape, self.train_s(row.shape))
        speedup = row.sequential_s / row.batched_s
        return (row.clients / speedup * (t_ops + t_flops) - row.clients * t_flops) / t_ops if t_ops > 0 else None

    def train_s(self, shape) -> float:
        """Seconds of one local step: measured where the device measured it, else the model's."""
        m = self.measured.get(shape.key())
        return m[0] if m else self._train(self.counts.of(shape))

    def eval_s(self, shape) -> float:
        m = self.measured.get(shape.key())
        if m:
            return m[1]
        c = self.counts.of(shape)
        return self.a_eval * c["eval_ops"] / shape.eval_batch_size + self.b_eval * c["eval_flops"]

    def split(self, shape, train_s: float) -> tuple[float, float]:
        """(dispatch seconds, arithmetic seconds) of a step of ``train_s``: the model's share of FLOPs."""
        t_flops = min(train_s, self.b * self.counts.of(shape)["flops"])
        return train_s - t_flops, t_flops

    def group_step_s(self, shape, train_s: float, at_once: int) -> float:
        """Seconds of one batched step of ``at_once`` clients (a sequential step where ``c`` is unknown)."""
        if at_once <= 1 or self.c is None:
            return train_s * max(1, at_once)
        t_ops, t_flops = self.split(shape, train_s)
        return self.c * t_ops + at_once * t_flops

    def describe(self) -> str:
        batched = (f"batched step of G clients = {self.c:.2f} x its dispatch + G x its arithmetic "
                   f"(fitted on {len(self.batched_rows)} measured batched rounds)" if self.c is not None
                   else "no batched round measured on this device: the batched engine priced as sequential")
        return (f"{self.a * 1e6:.1f} us per dispatched op + {1 / self.b / 1e12 if self.b else float('inf'):.0f} "
                f"TFLOP/s of arithmetic, fitted on {len(self.measured)} measured shapes (worst fit "
                f"{100 * self.fit_error:.0f} %); {batched}")


def find_gpu(name: str, paths: list[str | os.PathLike]) -> str:
    """The description of the GPU named ``name`` (``h200``: a case-blind part of its name)."""
    found = [d for d in gpu_descriptions(paths) if name.lower() in short_device(d).lower()]
    if not found:
        known = ", ".join(sorted({short_device(d) for d in gpu_descriptions(paths)})) or "none"
        raise ConfigError(f"--gpu {name}: no step costs measured on a GPU named like {name!r}; measured GPUs: {known}. "
                          "Name one of them, or measure yours with `fnl plan --device cuda` on a node of it")
    return max(found, key=lambda d: shapes_measured(d, paths))
