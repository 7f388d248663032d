"""The batched engine's capture-ready step, and its CUDA graphs (``training.cuda_graphs``).

A GPU step at the papers' sizes is host-bound: the host dispatches some 50 to 500 ops a step, each
costing more than its kernel. A CUDA graph replays a captured step's kernels in one launch; it
needs a step that does the same thing on the same memory every time:

* fixed shapes: every step is the full batch wide for every client, a short or missing batch padded
  and masked (padded rows leave the loss, the BatchNorm statistics and, for a client without a
  batch, the optimiser step), so a chunk's steps have at most two forms (every row real, some rows
  masked), one graph each;
* inputs staged in fixed buffers: each step's sample ids, row mask, batch numbers and augmentation
  parameters are copied (device to device) into the same tensors before the step runs on them;
* a capturable optimiser (:class:`~fnlcore.fl.stacked.StackedSGD` / ``StackedAdam`` with
  ``capturable=True``: its state updated in place).

:class:`StepRunner` runs that step; with ``graphs`` (a CUDA device) it runs each form's first step
eagerly on a side stream (a real step that also warms the allocator and kernels up), captures the
form's next step and replays it from then on. Without, the same step runs eagerly: on the CPU the
tests compare it with the engine's ordinary step (tests/test_capture_ready.py).

Only a plain chunk is captured (:func:`graphable`): the train view, one network, no per-step hooks
or rates, and a loss declared :func:`capturable` (it reads only the batch's device tensors: a host
field of :class:`~fnlcore.fl.contract.StackedBatch`, fixed at capture, would replay unchanged).
"""

from __future__ import annotations

from typing import Callable

import torch
from ..errors import ConfigError


def capturable(loss):
    """Declare a stage's loss capturable: it reads only ``sb``'s device tensors (``logits``, ``idx``,
    ``mask``, ``clients``, ``x``, ``epoch_step``, ``net``) and the method's device state, and makes
    no host decision from them."""
    loss.capturable = True
    return loss


def is_capturable(loss) -> bool:
    return bool(getattr(getattr(loss, "__func__", loss), "capturable", False))


def graphable(loss, augment: str, models, copies, before_step, after_step, epoch_lr) -> bool:
    """Whether a chunk's step can be captured: see the module doc."""
    return (augment == "train" and models is None and not copies and before_step is None
            and after_step is None and epoch_lr is None and is_capturable(loss))


def check_device(settings, device: torch.device) -> None:
    """``training.cuda_graphs`` needs a CUDA device: refused elsewhere (a CPU has no graphs to replay,
    and a run that asked for them should not silently run without)."""

    if getattr(settings, "cuda_graphs", False) and torch.device(device).type != "cuda":
        raise ConfigError(
            f"training.cuda_graphs: true captures the batched engine's steps as CUDA graphs and needs a CUDA "
            f"device; this run's device is {torch.device(device).type}. Set training.cuda_graphs: false (the "
            "default) to run here")


Body = Callable[[dict, bool], torch.Tensor]


class StepRunner:
    """Runs a chunk's capture-ready step: ``step(inputs, masked)`` copies ``inputs`` (name -> tensor, the
    same shapes every step) into the form's fixed buffers and runs ``body(buffers, masked)`` -> (K,)
    losses on them, eagerly, or (``graphs``) as the form's CUDA graph once captured."""

    def __init__(self, body: Body, graphs: bool = False):
        self.body, self.graphs = body, graphs
        self.buffers: dict[bool, dict[str, torch.Tensor]] = {}
        self.captured: dict[bool, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[bool, torch.Tensor] = {}
        self.warm: set[bool] = set()

    def step(self, inputs: dict[str, torch.Tensor], masked: bool) -> torch.Tensor:
        buf = self.buffers.get(masked)
        if buf is None:
            buf = self.buffers[masked] = {n: torch.empty_like(v) for n, v in inputs.items()}
        for n, v in inputs.items():
            buf[n].copy_(v, non_blocking=True)
        if not self.graphs:
            return self.body(buf, masked)
        graph = self.captured.get(masked)
        if graph is None:
            if masked not in self.warm:  # the form's first step: eager, on a side stream (PyTorch's recipe)
                self.warm.add(masked)
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    out = self.body(buf, masked)
                torch.cuda.current_stream().wait_stream(side)
                return out
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):  # records the kernels, runs none
                self.outputs[masked] = self.body(buf, masked)
            self.captured[masked] = graph
        graph.replay()
        return self.outputs[masked].clone()  # the graph's output is overwritten by its next replay
