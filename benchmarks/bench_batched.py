"""Batched vs sequential clients, bf16 vs fp32, channels-last vs contiguous: seconds per FedAvg round.

    python benchmarks/bench_batched.py                    # both cases, 2 timed rounds each
    python benchmarks/bench_batched.py --cases fedncl_lenet5 --rounds 3 --threads 2
    python benchmarks/bench_batched.py --variants sequential,batched

Cases (random uint8 images and labels of the papers' shapes; the numbers do not depend on
the pixel values, only on shapes and settings):

- ``fedncl_lenet5``: Fed-NCL's MNIST setting: LeNet-5 on 1x28x28, K = 20 clients, all every
  round, batch 60, SGD lr 0.01 momentum 0.9, no augmentation; 600 samples per client
  (the paper's 3,000 at 1/5, and 1 local epoch instead of 10: a round's time scales linearly
  in both, the ratios do not move);
- ``fedcorr_resnet18``: FedCorr's CIFAR-10 setting: ResNet-18 (CIFAR stem) on 3x32x32,
  10 clients a round (100 x 0.1), batch 10, SGD lr 0.01 momentum 0.5, RandomCrop(4) + flip;
  50 samples per client (the paper's 500 at 1/10, 1 local epoch instead of 5).

Variants: ``sequential`` (the default engine), ``batched`` (training.engine: batched),
``sequential_cl`` / ``batched_cl`` (training.channels_last), ``sequential_bf16`` /
``batched_bf16`` (training.precision: bf16). One repetition runs one round of every variant
back to back (the order rotating), after one untimed warm-up round each; the table gives the
median seconds per round (local training + aggregation, no evaluation) and the ratio to
``sequential`` of the same repetitions. Not a test: prints a markdown table, asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fnlcore.app.train import build_context  # noqa: E402
from fnlcore.fl.data import FederatedData, ImageSource  # noqa: E402
from fnlcore.fl.settings import TrainSettings  # noqa: E402
from fnlcore.fl.simulation import RoundEngine  # noqa: E402
from fnlcore.methods.base import METHODS  # noqa: E402

CASES = {
    "fedncl_lenet5": dict(
        clients=20, per_client=600, channels=1, size=28,
        settings=dict(model="lenet5", batch_size=60, lr=0.01, momentum=0.9, augmentation="none", weighting="uniform",
                      normalize={"mean": [0.1307], "std": [0.3081]}),
    ),
    "fedcorr_resnet18": dict(
        clients=10, per_client=50, channels=3, size=32,
        settings=dict(model="resnet18_cifar", batch_size=10, lr=0.01, momentum=0.5, augmentation="crop_flip",
                      normalize="imagenet"),
    ),
}
VARIANTS = {
    "sequential": {},
    "batched": {"engine": "batched"},
    "sequential_cl": {"channels_last": True},
    "batched_cl": {"engine": "batched", "channels_last": True},
    "sequential_bf16": {"precision": "bf16"},
    "batched_bf16": {"engine": "batched", "precision": "bf16"},
}


class Runner:
    """One FedAvg method on a synthetic federated set, driven round by round as Simulation.run does."""

    def __init__(self, case: dict, variant: dict, device: torch.device):
        rs = np.random.RandomState(0)
        k, n, c, h = case["clients"], case["per_client"], case["channels"], case["size"]
        x = rs.randint(0, 256, (k * n, h, h, c)).astype(np.uint8)
        y = torch.as_tensor(rs.randint(0, 10, k * n))
        data = FederatedData(
            ImageSource(device, images=x), ImageSource(device, images=x[:256]), y.to(device), y.to(device),
            y[:256].to(device), [torch.arange(i * n, (i + 1) * n) for i in range(k)], 10,
        )
        s = TrainSettings(rounds=1000, local_epochs=1, **case["settings"], **variant)
        self.ctx = build_context(data, "bench", (h, h), c, s, 0, device, log=lambda m: None)
        self.method = METHODS["fedavg"](METHODS["fedavg"].Params(), self.ctx)
        self.engine = RoundEngine(self.method)  # sequential or batched, as Simulation picks it
        self.r = 0

    def round(self) -> float:
        m, r = self.method, self.r
        sync = torch.cuda.synchronize if self.ctx.device.type == "cuda" else (lambda: None)
        sync()
        t0 = time.perf_counter()
        m.begin_round(r)
        m.aggregate(r, self.engine.updates(r, m.select_clients(r)))
        m.end_round(r)
        sync()
        self.r += 1
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--rounds", type=int, default=2, help="timed rounds per variant")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--device", default="auto")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device("cuda" if a.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if a.device == "auto" else a.device))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"device: {name}; torch {torch.__version__}\n")
    print("| case | variant | s/round (median) | ratio vs sequential (median) |")
    print("|---|---|---|---|")
    for case_name in a.cases.split(","):
        variants = a.variants.split(",")
        runners = {v: Runner(CASES[case_name], VARIANTS[v], device) for v in variants}
        for r in runners.values():
            r.round()  # warm-up: allocations, first-touch, kernel choice
        times = {v: [] for v in variants}
        for rep in range(a.rounds):
            order = variants[rep % len(variants):] + variants[: rep % len(variants)]
            for v in order:
                times[v].append(runners[v].round())
        for v in variants:
            ratio = ""
            if "sequential" in times:
                ratio = f"{statistics.median(s / t for s, t in zip(times['sequential'], times[v])):.2f}x"
            print(f"| {case_name} | {v} | {statistics.median(times[v]):.3f} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
