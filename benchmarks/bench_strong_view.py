"""How FedGR's strong view treats a plain MLP on digits, at 8x8 and upsampled to 32x32.

    python benchmarks/bench_strong_view.py --seeds 1 13 42

Question: does the strong view (the run's weak view, here none, then RandAugment 'fixmatch_uniform'
with 3 ops and a Cutout of side U[0, 0.5) x width, reflect padding: exactly FedGR's
``pipeline.view("strong", ...)``) wipe out 8x8 digits more than larger images, or is it a
learnable, if harder, view? Centralised training on the clean labels of the digits split that
``bench_methods.py`` uses (1,297 training / 500 test images), no federation, no label noise:

* ``plain``: the MLP trained on the un-augmented images; evaluated on the clean test images
  and on strong views of them (the harm of the view to a model that never saw one);
* ``strong``: the same MLP trained on strong views only (as FedGR's student), evaluated the
  same way (is the view learnable, and how fast).

Sizes: the 8x8 images and the same images upsampled bilinearly to 32x32 (CIFAR's side; the MLP
grows its input layer, 64 -> 1024). SGD momentum 0.5, batch 10 (bench_methods.py's digits
settings), ``--lr`` values, accuracy after each epoch in ``--report``; strong-view test
accuracy is the mean over ``--draws`` draws. Not a test: prints markdown and asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

from bench_methods import digits_split  # same folder: the digits split of bench_methods.py
from fnlcore.fl.pipeline import InputPipeline
from fnlcore.models import build_model
from fnlcore.randaugment import RandAugmentSpec


def images(x: np.ndarray, size: int) -> torch.Tensor:
    """(N, 8, 8, 1) uint8 -> (N, 1, size, size) uint8, upsampled bilinearly when size > 8."""
    t = torch.as_tensor(x).permute(0, 3, 1, 2).contiguous()
    if size == t.shape[-1]:
        return t
    up = F.interpolate(t.float(), size=(size, size), mode="bilinear", align_corners=False)
    return up.round().clamp(0, 255).to(torch.uint8)


@torch.no_grad()
def accuracy(model, pipe: InputPipeline, x: torch.Tensor, y: torch.Tensor, view: str, draws: int, seed: int) -> float:
    model.eval()
    gen = torch.Generator().manual_seed(10_000 + seed)
    accs = [(model(pipe.view(view, x, gen)).argmax(1) == y).float().mean().item() for _ in range(draws if view == "strong" else 1)]
    model.train()
    return statistics.mean(accs)


def train(size: int, train_view: str, lr: float, seed: int, args) -> dict[int, tuple[float, float]]:
    """{epoch: (clean test acc, strong-view test acc)} at the epochs in --report."""
    xtr, ytr, xte, yte = digits_split()
    xtr, xte = images(xtr, size), images(xte, size)
    ytr, yte = torch.as_tensor(ytr), torch.as_tensor(yte)
    s = xtr.float() / 255.0
    pipe = InputPipeline(
        mean=(s.mean().item(),), std=(s.std().item(),), augmentation="none",
        strong=RandAugmentSpec(kind="fixmatch_uniform", n=3), strong_padding="reflect",
    )
    torch.manual_seed(seed)
    model = build_model("mlp", 10, 1, (size, size))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.5)
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for epoch in range(1, max(args.report) + 1):
        perm = torch.randperm(len(ytr), generator=gen)
        for i in range(0, len(perm), args.batch):
            idx = perm[i:i + args.batch]
            loss = F.cross_entropy(model(pipe.view(train_view, xtr[idx], gen)), ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        if epoch in args.report:
            out[epoch] = (accuracy(model, pipe, xte, yte, "eval", 1, seed),
                          accuracy(model, pipe, xte, yte, "strong", args.draws, seed))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[8, 32])
    ap.add_argument("--lrs", type=float, nargs="*", default=[0.01, 0.05])
    ap.add_argument("--report", type=int, nargs="*", default=[2, 10, 30], help="epochs to report")
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--draws", type=int, default=5)
    ap.add_argument("--seeds", type=int, nargs="*", default=[1])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.time()
    print(f"digits, centralised, clean labels; SGD momentum 0.5, batch {args.batch}; seeds {args.seeds}; "
          f"strong-view accuracy over {args.draws} draws\n")
    print("| side | lr | trained on | epoch | clean test acc | strong-view test acc |")
    print("|---|---|---|---|---|---|")
    for size in args.sizes:
        for lr in args.lrs:
            for view, name in (("eval", "plain"), ("strong", "strong")):
                runs = [train(size, view, lr, s, args) for s in args.seeds]
                for e in args.report:
                    clean = [100 * r[e][0] for r in runs]
                    strong = [100 * r[e][1] for r in runs]
                    print(f"| {size} | {lr} | {name} | {e} | {statistics.mean(clean):.1f} "
                          f"({', '.join(f'{v:.1f}' for v in clean)}) | {statistics.mean(strong):.1f} "
                          f"({', '.join(f'{v:.1f}' for v in strong)}) |")
    print(f"\n{time.time() - t0:.0f} s in all")


if __name__ == "__main__":
    main()
