"""Does `fnl plan`'s cost model predict a round? Predicted vs measured seconds per FedAvg round.

    python benchmarks/bench_plan.py --rounds 3 --threads 1

For each case, the cost model's prediction of a round's local training, clients x local
steps x t_step with t_step measured by ``fnlcore.app.cost.measure_step`` (random data, the
case's model, input shape, batch size, augmentation and optimiser), is set against the
median measured time of the same round run by the engine (benchmarks/bench_batched.py's
``Runner``: the sequential engine, local training + aggregation, no evaluation), in the same
process. Cases: bench_batched.py's two (Fed-NCL's LeNet-5 setting, FedCorr's CIFAR ResNet-18
at batch 10) and the digits MLP (K = 10, 130 samples a client, batch 10), where fixed per-step
costs weigh most. Prints markdown; asserts nothing.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_batched import CASES, Runner  # noqa: E402

from fnlcore.app.cost import StepShape, measure_step  # noqa: E402

ALL_CASES = {
    **CASES,
    "digits_mlp": dict(
        clients=10, per_client=130, channels=1, size=8,
        settings=dict(model="mlp", batch_size=10, lr=0.05, momentum=0.5, augmentation="none", normalize="data"),
    ),
}


def predicted_round(case: dict, device: torch.device) -> tuple[float, float]:
    """(predicted seconds of a round's local training, measured t_step)."""
    s = case["settings"]
    shape = StepShape(
        model=s["model"], channels=case["channels"], image_size=(case["size"], case["size"]), num_classes=10,
        multi_label=False, batch_size=s["batch_size"], augmentation=s["augmentation"], optimizer="sgd",
        precision="fp32", channels_last=False, eval_batch_size=256,
    )
    t_step = measure_step(shape, device).train_s
    return case["clients"] * math.ceil(case["per_client"] / s["batch_size"]) * t_step, t_step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(ALL_CASES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {a.threads} threads"
    print(f"device: {name}; torch {torch.__version__}\n")
    print("| case | t_step (s) | predicted s/round | measured s/round (median) | measured / predicted |")
    print("|---|---|---|---|---|")
    for case_name in a.cases.split(","):
        case = ALL_CASES[case_name]
        runner = Runner(case, {}, device)
        runner.round()  # warm-up
        measured = statistics.median(runner.round() for _ in range(a.rounds))
        pred, t_step = predicted_round(case, device)
        print(f"| {case_name} | {t_step:.5f} | {pred:.3f} | {measured:.3f} | {measured / pred:.2f} |", flush=True)


if __name__ == "__main__":
    main()
