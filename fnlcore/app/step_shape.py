"""What a local step's time depends on besides the device: the key of every step cost, measured or
estimated (fnlcore.app.cost measures and prices, fnlcore.app.gpu_cost models a GPU: both read it here)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepShape:
    """Everything a local step's time depends on (besides the device)."""

    model: str
    channels: int
    image_size: tuple[int, int]
    num_classes: int
    multi_label: bool
    batch_size: int
    augmentation: str
    optimizer: str
    precision: str
    channels_last: bool
    eval_batch_size: int

    def key(self) -> str:
        h, w = self.image_size
        return (
            f"{self.model}|{self.channels}x{h}x{w}|C{self.num_classes}{'ml' if self.multi_label else ''}|b{self.batch_size}"
            f"|{self.augmentation}|{self.optimizer}|{self.precision}{'|cl' if self.channels_last else ''}|eb{self.eval_batch_size}"
        )
