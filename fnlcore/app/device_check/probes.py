"""The environment the numbers depend on: versions, the device, the flags that change float results."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import warnings
from typing import Any, Callable

import numpy as np
import torch

from ...provenance import code_version


def _get(fn: Callable[[], Any]) -> Any:
    """A value, or why it could not be read (an old or new torch may lack an attribute)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecated flags still read
            return fn()
    except Exception as err:  # noqa: BLE001
        return f"n/a ({type(err).__name__})"


def environment(device: torch.device) -> dict[str, Any]:
    """What the numbers depend on: versions, the device, the flags that change float results."""
    env: dict[str, Any] = {
        "python": sys.version.split()[0], "platform": platform.platform(), "cpu_count": os.cpu_count(),
        "torch": torch.__version__, "torch_threads": torch.get_num_threads(), "numpy": np.__version__,
        "fnlcore": _get(code_version), "device": str(device),
        "cuda_available": torch.cuda.is_available(), "torch.version.cuda": torch.version.cuda,
        "cudnn_version": _get(torch.backends.cudnn.version),
        "cudnn.enabled": torch.backends.cudnn.enabled, "cudnn.benchmark": torch.backends.cudnn.benchmark,
        "cudnn.deterministic": torch.backends.cudnn.deterministic,
        "cudnn.allow_tf32": _get(lambda: torch.backends.cudnn.allow_tf32),
        "cuda.matmul.allow_tf32": _get(lambda: torch.backends.cuda.matmul.allow_tf32),
        "float32_matmul_precision": _get(torch.get_float32_matmul_precision),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
    }
    if device.type == "cuda":
        props = _get(lambda: torch.cuda.get_device_properties(device))
        env.update({
            "device_name": _get(lambda: props.name), "device_memory_mib": _get(lambda: props.total_memory // 2**20),
            "device_capability": _get(lambda: f"{props.major}.{props.minor}"),
            "multiprocessors": _get(lambda: props.multi_processor_count), "driver": nvidia_driver(),
            "cuda.matmul.fp32_precision": _get(lambda: torch.backends.cuda.matmul.fp32_precision),
            "cudnn.conv.fp32_precision": _get(lambda: torch.backends.cudnn.conv.fp32_precision),
        })
    return env


def nvidia_driver() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=15)
        return out.stdout.strip() or out.stderr.strip()[:100]
    except (OSError, subprocess.SubprocessError) as err:
        return f"n/a ({type(err).__name__})"


def device_words(device: torch.device) -> str:
    if device.type != "cuda":
        return f"{os.cpu_count()} CPU cores, {torch.get_num_threads()} threads, torch {torch.__version__}"
    props = torch.cuda.get_device_properties(device)
    return (f"{props.total_memory // 2**20:,} MiB, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
            f"torch {torch.__version__}")
