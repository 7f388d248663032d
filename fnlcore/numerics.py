"""Elementary functions that give the same bits on every x86-64 CPU: use these, not torch's, on CPU floats.

On the CPU torch computes ``sqrt``, ``exp``, ``log``, ``sin``, ``cos`` (and ``tanh``, ``erf``,
``atan``, ...) of float32/float64 through MKL's vector math (VML), which chooses its kernel by the
CPU's maker and instruction set and ignores every environment setting: on an AMD EPYC,
``torch.sqrt`` of float32 is 1 ulp off the correctly rounded result for about one value in six,
on Intel it is not, so a recorded run (tests/golden.py) could not be reproduced on the other maker.
Here the CPU path goes through NumPy instead: its square root is the IEEE instruction (correctly
rounded on every CPU, as CUDA's is), and its exp/log/sin/cos are NumPy's own loops or the C
library's, which the portable test environment pins to one code path (tests/portable.py). On any
other device these are torch's own functions. Gradients are torch's formulas (the same backward
as torch.log etc.), with the derivative's own elementary function taken from here too.

tests/vml_guard.py fails a recorded run that calls a VML-backed torch function on CPU floats.
"""

from __future__ import annotations

import numpy as np
import torch

from .syncs import host_side

_NUMPY_FLOATS = (torch.float32, torch.float64)


def _on_numpy(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype in _NUMPY_FLOATS


def _apply(ufunc, x: torch.Tensor) -> torch.Tensor:
    """ufunc(x) computed by NumPy on the tensor's memory (no copy in; a new tensor out). Only ever a
    CPU tensor: reading it waits for no device (host_side, for the sync counter)."""
    with np.errstate(all="ignore"), host_side():  # log(0) = -inf, sqrt(-1) = nan, as torch gives them
        return torch.from_numpy(np.asarray(ufunc(x.detach().numpy())))


def _portable(ufunc, torch_fn, grad):
    """torch_fn computed by NumPy's ``ufunc`` on CPU floats, with ``grad(x, y, dy)`` as its backward."""

    class Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = _apply(ufunc, x)
            ctx.save_for_backward(x, y)
            return y

        @staticmethod
        def backward(ctx, dy):
            return grad(*ctx.saved_tensors, dy)

    def call(x: torch.Tensor) -> torch.Tensor:
        if not _on_numpy(x):
            return torch_fn(x)
        if x.requires_grad and torch.is_grad_enabled():
            return Function.apply(x)
        return _apply(ufunc, x)

    call.__name__ = torch_fn.__name__
    call.__doc__ = f"torch.{torch_fn.__name__}, the same bits on every CPU (fnlcore.numerics)."
    return call


# torch's own backward formulas, with this module's functions where they need one
sqrt = _portable(np.sqrt, torch.sqrt, lambda x, y, dy: dy / (2 * y))
exp = _portable(np.exp, torch.exp, lambda x, y, dy: dy * y)
log = _portable(np.log, torch.log, lambda x, y, dy: dy / x)
sin = _portable(np.sin, torch.sin, lambda x, y, dy: dy * cos(x))
cos = _portable(np.cos, torch.cos, lambda x, y, dy: -dy * sin(x))


def foreach_sqrt(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """torch._foreach_sqrt (one fused kernel on CUDA), exact on every CPU (one NumPy call a tensor)."""
    if tensors and tensors[0].device.type != "cpu":
        return list(torch._foreach_sqrt(tensors))
    return [sqrt(t) for t in tensors]
