"""Batched prediction and test evaluation, shared by the engine and the methods' detection passes.

The training loop is the engine's (:mod:`fnlcore.fl.sequential`).

An evaluation or detection pass builds its inputs in chunks of ``training.eval_batch_size``
(the unit of its augmentation draws, which must not change); the model's forward of a chunk
is bounded by bytes, not by the count (:func:`forward_bounded`): a chunk whose estimated
activations exceed the budget (:data:`EVAL_MEMORY_MB`, or ``$FNL_EVAL_MEMORY_MB``) runs as
equal sub-batches that fit it, their outputs concatenated. Eval-mode outputs are per sample,
so a split changes no prediction, at most the float rounding of some logits, and only where it
happens: at the default budget, 224- and 512-pixel inputs on ResNets at the papers' 1,024, never
32 x 32 or smaller ones. The budget is read where a pass runs and is no part of a run's identity.
"""

from __future__ import annotations

import math
import os
import weakref
from typing import Any, Callable

import torch

from ..errors import ConfigError
from .context import RunContext
from .. import metrics

# Default budget of one evaluation forward, MiB of estimated activations (:func:`activation_bytes`,
# the sum of every leaf module's output for one sample times the sub-batch). That sum is an
# upper bound of what a no-grad forward holds at once, 4.5-10x the measured peak (CPU, VmHWM:
# ResNet-18 at 512 x 512 149 MiB a sample summed, 33 MiB measured; ResNet-50 at 224 x 224 122 /
# 14; ResNet-34 (CIFAR) at 32 x 32 13 / 1.3). 16 GiB keeps every 32 x 32 configuration of the
# papers whole at eval_batch_size 1,024 (largest: ResNet-34, 13 GiB summed) and the tests'
# small models and inputs far below it (1.3 MiB a chunk of 1,024 for the digits MLP, 48 MiB
# for 'tiny' at 32 x 32, 0.3 GiB for 'cnn'), so they never split;
# it splits 224-pixel ResNet-18/50 chunks into 2 and 8 sub-batches and 512-pixel ResNet-18
# ones into 10 of about 100 samples (about 3.5 GB at once instead of 33 GB).
EVAL_MEMORY_MB = 16384
EVAL_MEMORY_ENV = "FNL_EVAL_MEMORY_MB"

# model -> {(callable, input shape, dtype, memory format, device, autocast): bytes a sample}
_ESTIMATES: "weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple, int]]" = weakref.WeakKeyDictionary()


def eval_memory_bytes() -> int:
    """The budget of one evaluation forward in bytes: ``$FNL_EVAL_MEMORY_MB`` (MiB, an integer >= 1)
    where set, else :data:`EVAL_MEMORY_MB`. It changes no run's identity or path (like the device,
    it changes at most float rounding), so it may differ between machines."""
    raw = os.environ.get(EVAL_MEMORY_ENV, "").strip()
    if not raw:
        return EVAL_MEMORY_MB * 2**20
    try:
        mb = int(raw)
    except ValueError:
        mb = 0
    if mb < 1:
        raise ConfigError(f"${EVAL_MEMORY_ENV}={raw!r}: must be an integer number of MiB >= 1 "
                          f"(the activation budget of one evaluation forward; default {EVAL_MEMORY_MB})")
    return mb * 2**20


def _nbytes(out: Any) -> int:
    if torch.is_tensor(out):
        return out.nbytes
    if isinstance(out, (tuple, list)):
        return sum(_nbytes(o) for o in out)
    if isinstance(out, dict):
        return sum(_nbytes(o) for o in out.values())
    return 0


def _autocast_state(device_type: str) -> tuple:
    if device_type not in ("cpu", "cuda") or not torch.is_autocast_enabled(device_type):
        return (False,)
    return (True, torch.get_autocast_dtype(device_type))


@torch.no_grad()
def activation_bytes(model: torch.nn.Module, x: torch.Tensor, fn: Callable | None = None) -> int:
    """Estimated activation bytes of one sample of ``x`` through ``fn`` (default ``model``): the
    outputs of ``model``'s leaf modules summed over a forward of ``x[:1]``, under the autocast in
    force. Measured once per model, callable, input shape, dtype, memory format, device and
    autocast, then cached. The model must be in eval mode (its forward then changes no state)."""
    fn = model if fn is None else fn
    key = (getattr(fn, "__name__", type(fn).__name__), tuple(x.shape[1:]), x.dtype,
           x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last),
           x.device.type, _autocast_state(x.device.type))
    cache = _ESTIMATES.setdefault(model, {})
    if key not in cache:
        total = [0]

        def hook(_module, _inputs, out) -> None:
            total[0] += _nbytes(out)

        leaves = [m for m in model.modules() if next(m.children(), None) is None]
        handles = [m.register_forward_hook(hook) for m in leaves]
        try:
            fn(x[:1])
        finally:
            for h in handles:
                h.remove()
        cache[key] = total[0]
    return cache[key]


def sub_batch_size(n: int, per_sample: int, budget: int) -> int:
    """Rows of each sub-batch of ``n`` rows of ``per_sample`` bytes under ``budget`` bytes: ``n`` when
    they fit, else ``ceil(n / parts)`` for the fewest parts that each fit (at least 1 row)."""
    if n * per_sample <= budget:
        return n
    cap = max(1, budget // max(1, per_sample))
    return math.ceil(n / math.ceil(n / cap))


def forward_bounded(model: torch.nn.Module, x: torch.Tensor, fn: Callable | None = None,
                    budget: int | None = None):
    """``fn(x)`` (default ``model(x)``) of an eval-mode ``model``, run as sub-batches of ``x``
    whose estimated activations (:func:`activation_bytes`) fit ``budget`` bytes (default
    :func:`eval_memory_bytes`), the outputs (a tensor or a tuple of tensors, per sample along the
    first dimension) concatenated: one call of ``fn`` when ``x`` fits. Draws nothing; in
    training mode (batch statistics) ``x`` is never split."""
    fn = model if fn is None else fn
    n = len(x)
    if n <= 1 or model.training:
        return fn(x)
    size = sub_batch_size(n, activation_bytes(model, x, fn), eval_memory_bytes() if budget is None else budget)
    if size >= n:
        return fn(x)
    outs = [fn(x[at:at + size]) for at in range(0, n, size)]
    if isinstance(outs[0], tuple):
        return tuple(torch.cat(parts) for parts in zip(*outs))
    return torch.cat(outs)


@torch.no_grad()
def predict(
    ctx: RunContext,
    model: torch.nn.Module,
    source,
    idx: torch.Tensor | None = None,
    augment: bool = False,
    batch_size: int | None = None,
    drawn: list[tuple] | None = None,
) -> torch.Tensor:
    """Logits for samples ``idx`` of ``source`` (default: all), in that order, model in eval mode.

    ``augment=True`` reproduces reference codes that run detection passes on
    the *training* dataset object, i.e. with training augmentation active; ``drawn``: its
    augmentation parameters drawn ahead (:func:`draw_predict`), else drawn here.
    """
    model.eval()
    order = torch.arange(len(source)) if idx is None else idx
    bs = batch_size or ctx.settings.eval_batch_size
    outs = []
    amp = ctx.autocast()
    for i, (xb, _) in enumerate(source.batches(order, bs)):
        if not augment:
            x = ctx.pipeline.eval(xb)
        elif drawn is not None:
            x = ctx.pipeline.apply_train(xb, drawn[i])
        else:
            x = ctx.pipeline.train(xb, ctx.aug_gen)
        with amp:
            outs.append(forward_bounded(model, x).float())
    return torch.cat(outs) if outs else torch.zeros(0, ctx.data.num_classes, device=ctx.device)


def draw_predict(ctx: RunContext, n: int, batch_size: int | None = None) -> list[tuple]:
    """The augmentation parameters ``predict(..., augment=True)`` draws for ``n`` training samples,
    in its order: a stage's ``reserve`` makes them where the sequential engine's upload would."""
    bs = batch_size or ctx.settings.eval_batch_size
    size = tuple(ctx.data.train.images.shape[-2:])
    return [ctx.pipeline.draw_train(min(bs, n - at), ctx.aug_gen, ctx.device, size) for at in range(0, n, bs)]


def evaluate(ctx: RunContext, model: torch.nn.Module) -> dict[str, float]:
    """Test metrics of ``model`` (raw logits: no logit adjustment at inference)."""

    logits = predict(ctx, model, ctx.data.test)
    y = ctx.data.y_test.cpu().numpy()
    if ctx.data.multi_label:
        return metrics.evaluate_multi_label(y, torch.sigmoid(logits).cpu().numpy())
    return metrics.evaluate_single_label(y, logits.cpu().numpy())
