"""Everything a method needs during a run: data on the device, the input pipeline,
model factory, optimiser factory, random streams and evaluation; and the device itself:
``auto`` (CUDA when available), ``cpu`` or ``cuda:N``, checked before a run starts, and its math."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from ..errors import ConfigError
from ..models import Classifier, build_model
from ..models.builder import default_model_for
from .data import FederatedData
from .pipeline import InputPipeline
from .settings import TrainSettings


# -- the device ----------------------------------------------------------------------------
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


def check_cuda_graphs(settings, device: torch.device) -> None:
    """``training.cuda_graphs`` needs a CUDA device: refused elsewhere (a CPU has no graphs to replay,
    and a run that asked for them should not silently run without)."""
    if getattr(settings, "cuda_graphs", False) and torch.device(device).type != "cuda":
        raise ConfigError(
            f"training.cuda_graphs: true captures the batched engine's steps as CUDA graphs and needs a CUDA "
            f"device; this run's device is {torch.device(device).type}. Set training.cuda_graphs: false (the "
            "default) to run here")


@dataclass
class RunContext:
    settings: TrainSettings
    data: FederatedData
    pipeline: InputPipeline
    device: torch.device
    model_name: str
    image_size: tuple[int, int]
    channels: int
    seed: int
    # Random streams, all derived from the training seed and checkpointed. Every one is a CPU
    # stream, whatever the device: a run draws the same on a GPU as on a CPU, a checkpoint
    # resumes on either, and what is decided from draws is decided on the host without a
    # device sync (fnlcore.syncs); the draws reach the device by non-blocking copies.
    rng: np.random.RandomState = field(init=False)  # client sampling, method-level numpy draws
    shuffle_gen: torch.Generator = field(init=False)  # mini-batch order
    aug_gen: torch.Generator = field(init=False)  # augmentation parameters, mixup and other per-batch draws
    log: Callable[[str], None] = print

    def __post_init__(self) -> None:
        if self.settings.channels_last and not self.pipeline.channels_last:
            self.pipeline = dataclasses.replace(self.pipeline, channels_last=True)
        self.rng = np.random.RandomState(self.seed)
        self.shuffle_gen = torch.Generator(device="cpu").manual_seed(self.seed)
        self.aug_gen = torch.Generator(device="cpu").manual_seed(self.seed + 1)
        check_cuda_graphs(self.settings, self.device)
        if self.device.type == "cuda":
            set_math_policy(self.settings.precision)

    def new_model(self) -> Classifier:
        model = build_model(
            self.model_name, self.data.num_classes, self.channels, self.image_size, pretrained=self.settings.pretrained
        ).to(self.device)
        return model.to(memory_format=torch.channels_last) if self.settings.channels_last else model

    def autocast(self):
        """The forward-pass precision context: bf16 autocast when ``training.precision`` is bf16, else nothing."""
        if self.settings.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def optimizer(self, params, round_index: int, lr: float | None = None) -> torch.optim.Optimizer:
        """The run's optimiser (settings' kind, momentum, weight decay) at round ``round_index``'s
        scheduled learning rate, or at ``lr`` when given (a network with its own schedule)."""
        s = self.settings
        lr = s.lr_at(round_index) if lr is None else lr
        if s.optimizer == "adam":
            # The fused kernel: one kernel a step (torch's default, eight a parameter on the CPU, a handful of
            # multi-tensor ones on a GPU); on the CPU its square root is exact where the default path's (MKL's
            # vector math) gives other bits on another CPU maker (fnlcore.numerics)
            return torch.optim.Adam(params, lr=lr, betas=(s.beta1, s.beta2), weight_decay=s.weight_decay, fused=True)
        return torch.optim.SGD(params, lr=lr, momentum=s.momentum, weight_decay=s.weight_decay)

    # -- random state (for checkpoints) --------------------------------------------------
    def rng_state(self) -> dict:
        return {
            "numpy": self.rng.get_state(),
            "shuffle": self.shuffle_gen.get_state(),
            "aug": self.aug_gen.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        }

    def load_rng_state(self, st: dict) -> None:
        aug = st["aug"]
        if aug.numel() != self.aug_gen.get_state().numel():
            raise ConfigError(
                "this checkpoint's augmentation stream was written by a version that drew augmentations on "
                f"the GPU ({aug.numel()}-byte generator state); this version draws every augmentation on "
                "the CPU, so the run cannot resume from it: delete the checkpoint (and its metrics) to "
                "start the run again")
        self.rng.set_state(st["numpy"])
        self.shuffle_gen.set_state(st["shuffle"])
        self.aug_gen.set_state(aug)
        torch.set_rng_state(st["torch"])
        # The CUDA streams (dropout's, on a GPU) of the devices this node has, written or not:
        # a node may see fewer or more GPUs than the writer, or none.
        cuda = st.get("cuda") or []
        if torch.cuda.is_available():
            for i, state in enumerate(cuda[: torch.cuda.device_count()]):
                torch.cuda.set_rng_state(state, i)


def resolve_model_name(name: str, channels: int, image_size: tuple[int, int]) -> str:
    return default_model_for(channels, image_size) if name == "auto" else name
