"""The training device: ``auto`` (CUDA when available), ``cpu`` or ``cuda:N``."""

from __future__ import annotations

import re

import torch

from ..errors import ConfigError

_FORM = re.compile(r"^(auto|cpu|cuda(:[0-9]+)?)$")


def device_problem(device: str, here: bool = True) -> str | None:
    """Why ``device`` cannot run jobs (None when it can). ``here``: the jobs run on this machine, so a
    CUDA device must be visible here; otherwise (a cluster's submit node) only the PyTorch build is checked."""
    if not _FORM.match(str(device)):
        return f"{device!r} is not a device; valid: auto, cpu, cuda, cuda:N"
    if not device.startswith("cuda"):
        return None
    if not torch.backends.cuda.is_built():
        return (f"{device!r}: no CUDA device: this PyTorch is a CPU-only build; install a CUDA build of torch "
                "(requirements.txt on a GPU machine), or set device: auto or cpu")
    if not here:
        return None
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        return (f"{device!r}: no CUDA device on this machine; set device: auto (CUDA where there is one) "
                "or cpu, or run the jobs on a GPU node")
    index = int(device.split(":")[1]) if ":" in device else 0
    if index >= count:
        return (f"{device!r}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}; "
                "pick one of them (or cuda / auto)")
    return None


def check_device(device: str, here: bool = True, where: str = "device") -> None:
    """Raise ConfigError naming the problem and the fix (see :func:`device_problem`)."""
    problem = device_problem(device, here)
    if problem is not None:
        raise ConfigError(f"{where}: {problem}")


def set_math_policy(precision: str) -> None:
    """The GPU math of a run (``training.precision``), set for the whole process (a run is one process).

    fp32: IEEE float32 in every matrix product and convolution (TF32 off, unlike PyTorch's default
    for cuDNN convolutions): a GPU round equals the CPU's up to float rounding (about 1e-6
    relative per operation), which ``fnl device-check`` measures. tf32: TensorFloat-32 in both
    (10-bit mantissa products, about 1e-3 relative; faster on Ampere and later). bf16: bf16
    autocast of forward passes and losses (``RunContext.autocast``), TF32 for what stays float32.
    cuDNN's autotuner stays off and its algorithms are not forced deterministic: the autotuner
    picks algorithms by timing, so two runs could differ in rounding; forcing deterministic
    kernels would slow some backward passes, while scatter-adds (index_add_) keep their atomic
    order on a GPU anyway. So a GPU run repeats itself up to float rounding, not bit for bit; the
    CPU runs do bit for bit.
    """
    tf32 = precision in ("tf32", "bf16")
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = False


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)
