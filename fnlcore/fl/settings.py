"""Training settings shared by every method of a table (the papers state all methods share them)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields
from typing import Any, Mapping

from ..errors import ConfigError
from ..image_transforms import IMAGE_TRANSFORMS


LR_SCHEDULES = ("exponential", "constant", "step", "cosine")
ENGINES = ("default", "sequential", "batched", "auto")
PRECISIONS = ("fp32", "tf32", "bf16")
NORMALIZE_NAMES = ("auto", "imagenet", "half", "data")  # or {mean: [...], std: [...]} (fnlcore.fl.pipeline)


@dataclass(frozen=True)
class TrainSettings:
    """Backbone, optimiser, rounds and participation of a run.

    ``rounds`` counts every communication round the method runs (FedNoRo's
    warm-up included). The optimiser is built anew for every local update, as in
    all reference codes (baselines.md §0.3).
    """

    model: str = "auto"
    pretrained: bool = False
    rounds: int = 100
    local_epochs: int = 1
    batch_size: int = 32
    optimizer: str = "sgd"  # sgd | adam
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    lr_decay: float = 1.0  # multiplicative per round (Fed-NCL: 0.99)
    # Per-round learning-rate schedule, r = 0-based round: exponential (lr * lr_decay^r; lr_decay 1
    # = constant, the default of every paper but Fed-NCL's 0.99), constant (lr), step (lr *
    # lr_gamma^(milestones <= r)), cosine (lr/2 (1 + cos(pi r / rounds))). The rate is fixed
    # within a round: every reference code builds its optimiser per local update at that rate.
    lr_schedule: str = "exponential"
    lr_milestones: tuple[int, ...] = ()
    lr_gamma: float = 0.1
    client_fraction: float = 1.0  # 1.0 = every client every round
    weighting: str = "size"  # FedAvg weights: size (n_k) | uniform
    augmentation: str = "auto"  # auto | none | crop_flip | affine_flip
    normalize: str = "auto"  # auto | imagenet | half | data
    # How images read from files become batches (fnlcore/image_transforms.py, IMAGE_TRANSFORMS): resize
    # (every split straight to the network size) | resize_crop (FedCorr/FedDiv code, Clothing1M:
    # train Resize((256, 256)) + RandomCrop(224) + flip, test Resize((224, 224))) |
    # resize_crop_center (FedGR code: train as resize_crop, test Resize(256) + CenterCrop(224)).
    # In-memory sets are stored at the network size and always take resize.
    image_transform: str = "resize"
    drop_last: bool = False
    eval_batch_size: int = 1024
    checkpoint_every: int = 5
    # Speed switches (fnlcore/fl/batched.py, docs/methods.md "Speed switches"). engine: default (auto on a
    # GPU, sequential on a CPU: fnlcore.fl.simulation.effective_engine) | sequential (one client after
    # another, the reference) | batched (the round's clients as one stacked computation; the same
    # random draws, equal up to floating-point rounding; a ConfigError for a method or model it
    # cannot run) | auto (batched where it can run, else sequential).
    engine: str = "default"
    # most clients stacked at once; 0: as many as the GPU's memory holds (fnlcore.fl.simulation), on a CPU all
    batched_clients: int = 0
    precision: str = "fp32"  # fp32 | tf32 | bf16 (fnlcore.fl.context.set_math_policy)
    channels_last: bool = False  # models and input batches in channels-last memory (faster convs on GPUs)
    # The batched engine's plain steps captured as CUDA graphs and replayed (fnlcore/fl/batched.py): fixed
    # shapes (padded, masked rows), inputs in fixed buffers, a capturable optimiser. CUDA only (a run on
    # another device is refused); off until fnl device-check has measured it equal and faster on a GPU.
    cuda_graphs: bool = False

    def __post_init__(self) -> None:
        def bad(key, why):
            raise ConfigError(f"training.{key}={getattr(self, key)!r}: {why}")

        self._check_types(bad)
        for key in ("rounds", "local_epochs", "batch_size", "eval_batch_size", "checkpoint_every"):
            if int(getattr(self, key)) < 1:
                bad(key, "must be >= 1")
        if self.optimizer not in ("sgd", "adam"):
            bad("optimizer", "valid: sgd, adam")
        if not self.lr > 0:
            bad("lr", "must be > 0")
        if not 0 < self.client_fraction <= 1:
            bad("client_fraction", "must be in (0, 1]")
        if self.weighting not in ("size", "uniform"):
            bad("weighting", "valid: size, uniform")
        if self.augmentation not in ("auto", "none", "crop_flip", "affine_flip"):
            bad("augmentation", "valid: auto, none, crop_flip, affine_flip")
        if self.image_transform not in IMAGE_TRANSFORMS:
            bad("image_transform", f"valid: {', '.join(IMAGE_TRANSFORMS)}")
        if self.lr_schedule not in LR_SCHEDULES:
            bad("lr_schedule", f"valid: {', '.join(LR_SCHEDULES)}")
        object.__setattr__(self, "lr_milestones", tuple(self.lr_milestones))
        if list(self.lr_milestones) != sorted(set(self.lr_milestones)) or any(m < 1 for m in self.lr_milestones):
            bad("lr_milestones", "must be increasing round numbers >= 1")
        if not self.lr_gamma > 0:
            bad("lr_gamma", "must be > 0")
        if self.lr_schedule != "exponential" and self.lr_decay != 1.0:
            bad("lr_decay", f"applies to lr_schedule 'exponential' only (lr_schedule is {self.lr_schedule!r})")
        if self.lr_schedule != "step" and self.lr_milestones:
            bad("lr_milestones", f"apply to lr_schedule 'step' only (lr_schedule is {self.lr_schedule!r})")
        if self.engine not in ENGINES:
            bad("engine", f"valid: {', '.join(ENGINES)}")
        if self.precision not in PRECISIONS:
            bad("precision", f"valid: {', '.join(PRECISIONS)}")
        if self.cuda_graphs and self.engine == "sequential":
            bad("cuda_graphs", "captures the batched engine's steps: needs engine batched or auto (or default: auto on "
                "a GPU)")
        if int(self.batched_clients) < 0:
            bad("batched_clients", "must be >= 0 (0: as many of the round's clients as the device's memory holds)")
        if self.momentum < 0 or self.weight_decay < 0:
            bad("momentum" if self.momentum < 0 else "weight_decay", "must be >= 0")

    def _check_types(self, bad) -> None:
        """Each value of its field's type, before any range check: ``rounds: 6.5`` (or ``true``)
        must fail here, not as a TypeError in every attempt of the train job. Values are not
        converted (an int for a float stays, so the slugs stay what they are)."""
        for f in fields(self):
            v = getattr(self, f.name)
            want = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
            if f.name == "normalize":
                if not (isinstance(v, str) or _is_mean_std(v)):
                    bad(f.name, f"valid: {', '.join(NORMALIZE_NAMES)} or {{mean: [numbers], std: [numbers]}}")
            elif f.name == "lr_milestones":
                if isinstance(v, (str, bytes, Mapping)) or not hasattr(v, "__iter__") or not all(_is_int(m) for m in v):
                    bad(f.name, "must be a list of integer round numbers")
            elif want == "int" and not _is_int(v):
                bad(f.name, "must be an integer")
            elif want == "float" and not (_is_number(v) and math.isfinite(v)):
                bad(f.name, "must be a finite number")
            elif want == "bool" and not isinstance(v, bool):
                bad(f.name, "must be true or false")
            elif want == "str" and not isinstance(v, str):
                bad(f.name, "must be a string")
        if isinstance(self.normalize, str) and self.normalize not in NORMALIZE_NAMES:
            bad("normalize", f"valid: {', '.join(NORMALIZE_NAMES)} or {{mean: [numbers], std: [numbers]}}")

    @classmethod
    def from_dict(cls, d: dict) -> "TrainSettings":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"training: unknown key(s) {unknown}; valid keys: {', '.join(sorted(names))}")
        return cls(**d)

    def lr_at(self, round_index: int) -> float:
        if self.lr_schedule == "constant":
            return self.lr
        if self.lr_schedule == "step":
            return self.lr * self.lr_gamma ** sum(1 for m in self.lr_milestones if round_index >= m)
        if self.lr_schedule == "cosine":
            return 0.5 * self.lr * (1.0 + math.cos(math.pi * round_index / self.rounds))
        return self.lr * (self.lr_decay ** round_index)


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool) and type(v).__name__ != "bool_"


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and type(v).__name__ != "bool_"


def _is_mean_std(v: Any) -> bool:
    """``{mean: [...], std: [...]}``: per-channel numbers (their count is checked against the dataset later)."""
    return (isinstance(v, Mapping) and set(v) == {"mean", "std"}
            and all(isinstance(v[k], (list, tuple)) and v[k] and all(_is_number(x) for x in v[k]) for k in v))
