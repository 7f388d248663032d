"""Test-only plug-ins, one of each kind, each in the one-file form a researcher would write.

tests/conftest.py names this module in FNL_PLUGINS, so the registries discover it as
they would a module of theirs: the contract tests (tests/test_contracts.py) then cover
these entries with no other edit anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pandas as pd
import torch.nn.functional as F

from fnlcore.assignment import ClientAssignment
from fnlcore.datasets import DATASETS, DatasetInfo, PrepareContext, write_prepared
from fnlcore.fl.contract import masked_mean
from fnlcore.methods import METHODS, FLMethod, MethodParams, Stage
from fnlcore.noise.generators import symmetric_noise
from fnlcore.noise.specs import NOISE_MODELS, NoiseSpec
from fnlcore.partition.specs import PARTITIONERS, PartitionSpec
from fnlcore.registry import param
from fnlcore.rng import legacy_rng


# -- a method: FedAvg with label smoothing switched on after a warm-up ---------------------------
@dataclass(frozen=True)
class SmoothParams(MethodParams):
    name = "test_smooth"
    slug_fields = ("smoothing",)
    smoothing: float = param(0.1, ge=0, lt=1, doc="label-smoothing strength")
    start_round: int = param(2, ge=0, rounds=True, doc="rounds of plain CE first")


@METHODS.register
class Smooth(FLMethod):
    Params = SmoothParams
    paper = "test plug-in"

    def stage_name(self, r: int) -> str:
        return "plain" if r < self.params.start_round else "smooth"

    def loss(self, sb):  # each client's mean over its real rows; one form for both engines
        k, b, c = sb.logits.shape
        per = F.cross_entropy(sb.logits.reshape(k * b, c), self.labels(sb.idx.reshape(-1)),
                              label_smoothing=self.params.smoothing, reduction="none")
        return masked_mean(per.view(k, b), sb.mask)

    stages = {"plain": Stage(loss=FLMethod.loss), "smooth": Stage(loss=loss)}  # plain: FedAvg's


# -- a noise model: symmetric noise at half the given rate on every client --------------------------
@NOISE_MODELS.register
@dataclass(frozen=True)
class HalfSymmetricNoise(NoiseSpec):
    name: ClassVar[str] = "test_half_symmetric"
    paper: ClassVar[str] = "test plug-in"
    slug_head: ClassVar[str] = "test_halfsym"
    slug_fields: ClassVar[tuple] = (("rate", "r"),)
    rate: float = param(0.5, ge=0, le=1, doc="twice the fraction of each client's samples to corrupt")

    def draw(self, labels, assignment, num_classes, seed, soft_labels=None):  # run() checks, then draws
        return symmetric_noise(labels, assignment, self.rate / 2, seed, num_classes)


# -- a partitioner: contiguous blocks of a seeded permutation --------------------------------------
@PARTITIONERS.register
@dataclass(frozen=True)
class BlocksPartition(PartitionSpec):
    name: ClassVar[str] = "test_blocks"
    paper: ClassVar[str] = "test plug-in"
    slug_head: ClassVar[str] = "test_blocks"
    slug_fields: ClassVar[tuple] = (("num_clients", "K"),)
    num_clients: int = param(2, ge=1, doc="number of clients K")

    def run(self, labels: np.ndarray, seed: int) -> ClientAssignment:
        perm = legacy_rng(seed).permutation(len(labels))
        return ClientAssignment(len(labels), tuple(np.array_split(perm, self.num_clients)))


# -- a dataset: 60 random 8x8 grey images of 3 classes, made in memory ----------------------------
def _prepare(ctx: PrepareContext) -> None:
    rs = np.random.RandomState(0)
    x = rs.randint(0, 256, (60, 8, 8, 1)).astype(np.uint8)
    y = np.arange(60) % 3
    index = pd.DataFrame({"sample_id": np.r_[np.arange(40), np.arange(20)], "split": ["train"] * 40 + ["test"] * 20,
                          "label": y})
    write_prepared(ctx.out_dir, INFO, index, {"x_train": x[:40], "x_test": x[40:]}, raw_dir=ctx.raw_dir)


INFO = DATASETS.register(
    DatasetInfo(
        name="test_blobs", num_classes=3, class_names=("a", "b", "c"), multi_label=False, channels=1,
        image_size=(8, 8), in_memory=True, source="test plug-in (random images)", papers=(), prepare=_prepare,
        split_sizes=(40, 20),
    )
)
