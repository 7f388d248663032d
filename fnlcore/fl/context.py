"""Everything a method needs during a run: data on the device, the input pipeline,
model factory, optimiser factory, random streams and evaluation."""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from ..errors import ConfigError
from ..models import Classifier, build_model
from ..models.builder import default_model_for
from .data import FederatedData
from .device import set_math_policy
from .graphs import check_device as check_graphs_device
from .pipeline import InputPipeline
from .settings import TrainSettings


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
        check_graphs_device(self.settings, self.device)
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
