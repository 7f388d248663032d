"""Images per second per CPU core of the on-disk loader, decoding vs the decoded cache.

    python benchmarks/bench_loader.py                 # quick: 48 files per format (~1 min)
    python benchmarks/bench_loader.py --files 200     # steadier numbers

For every on-disk format the paper tables read, stand-in files are written with PIL in
the real format, mode and size (below), then read exactly as training reads them:
``fnlcore.imagefiles.ImageFiles`` (decode, convert to the network's channels, resize or
short-side resize + centre cut) behind a DataLoader in the main process (``num_workers=0``,
one torch thread: one core), in a shuffled order, batches of ``--batch``; rates are images
per CPU second of this process (user + system), so a loaded machine slows the run, not the rate. Then the split's
decoded cache is built (``fnlcore.datasets.decoded_cache``) and read through the same
loader; its batches are checked equal to the decoded ones.

Stand-in content: a smooth random field (bicubic upsampling of 16 x 16 noise) plus
Gaussian grain, so the files compress like photographs or scans rather than like noise
(the table lists the mean file size; real files of these sets are of the same order).

The GPU column is an ESTIMATE (no GPU was used): NVIDIA's published ResNet-50 v1.5
training throughput on one A100 80GB with mixed precision, 224 x 224, batch 256:
2,470 images/s (NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/
resnet50v1.5/README.md, "Training performance: NVIDIA DGX A100"); ResNet-18 scaled by the
FLOPs ratio (4.1 / 1.8 GFLOPs: ~5,600/s), 512 x 512 inputs by the pixel ratio
((224/512)^2). An H100 is faster still (about 1.5-2x), so these are lower bounds of what
a GPU consumes at the papers' settings. Not a test: prints markdown, asserts only equality.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from PIL import Image
from torch.utils.data import DataLoader, Subset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fnlcore.datasets.base import DatasetInfo, write_prepared
from fnlcore.datasets.decoded_cache import (
    CacheGeometry,
    build_decoded_cache,
    cache_geometries,
)
from fnlcore.imagefiles import ImageFiles

RESNET50_A100_AMP = 2470.0  # images/s, 224 x 224 (source in the module docstring)
RESNET18_A100_AMP = RESNET50_A100_AMP * 4.1 / 1.8


@dataclass(frozen=True)
class Format:
    name: str  # the dataset it stands in for
    suffix: str  # png | jpg
    mode: str  # the file's PIL mode
    sizes: tuple[tuple[int, int], tuple[int, int]]  # (W, H) range of the files: min, max
    network: tuple[int, int]  # the network input (H, W)
    transform: str  # training.image_transform of its tables
    model: str
    gpu_per_s: float  # estimated images/s a GPU trains on (ESTIMATE, see the docstring)


FORMATS = (
    # FedNoRo: ResNet-18 on the Kaggle PNGs at their own 512 x 512 (grey, converted to RGB)
    Format("ich_fednoro", "png", "L", ((512, 512), (512, 512)), (512, 512), "resize", "ResNet-18 @512",
           RESNET18_A100_AMP * (224 / 512) ** 2),
    # FedMLP: the same PNGs resized to 224 x 224
    Format("ich_fedmlp", "png", "L", ((512, 512), (512, 512)), (224, 224), "resize", "ResNet-18 @224", RESNET18_A100_AMP),
    # ISIC 2019 JPEGs: most are 1024 x 768 (the set mixes 600 x 450 up to 6000 x 4000)
    Format("isic2019", "jpg", "RGB", ((1024, 768), (1024, 768)), (224, 224), "resize", "ResNet-18 @224", RESNET18_A100_AMP),
    # ChestX-ray14: 1024 x 1024 grey PNGs, RGB 224 x 224 for the network
    Format("chestxray14", "png", "L", ((1024, 1024), (1024, 1024)), (224, 224), "resize", "ResNet-18 @224",
           RESNET18_A100_AMP),
    # Clothing1M: web JPEGs of about 256..500 px a side; FedCorr/FedDiv read Resize((256, 256)), the device crops 224
    Format("clothing1m", "jpg", "RGB", ((256, 256), (500, 500)), (224, 224), "resize_crop", "ResNet-50 @224",
           RESNET50_A100_AMP),
)


def stand_in(rng: np.random.Generator, w: int, h: int, mode: str) -> Image.Image:
    """A smooth random field plus grain, in ``mode`` (L or RGB), w x h."""
    bands = 1 if mode == "L" else 3
    coarse = rng.uniform(0, 255, size=(16, 16, bands)).astype(np.uint8)
    field = [Image.fromarray(coarse[:, :, b]).resize((w, h), Image.BICUBIC) for b in range(bands)]
    arr = np.stack([np.asarray(f, dtype=np.float32) for f in field], axis=-1)
    arr = np.clip(arr + rng.normal(0, 4, size=arr.shape), 0, 255).astype(np.uint8)
    return Image.fromarray(arr[:, :, 0] if bands == 1 else arr, mode)


def write_stand_ins(fmt: Format, folder: Path, n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    (lo_w, lo_h), (hi_w, hi_h) = fmt.sizes
    paths = []
    for i in range(n):
        w, h = int(rng.integers(lo_w, hi_w + 1)), int(rng.integers(lo_h, hi_h + 1))
        path = folder / f"{i:06d}.{fmt.suffix}"
        im = stand_in(rng, w, h, fmt.mode)
        if fmt.suffix == "jpg":
            im.save(path, quality=90)
        else:
            im.save(path)
        paths.append(str(path))
    return paths


def prepare(fmt: Format, root: Path, paths: list[str]) -> Path:
    """A prepared on-disk dataset (train = every file) the cache builder can read."""
    info = DatasetInfo(
        name=f"bench_{fmt.name}", num_classes=2, class_names=("a", "b"), multi_label=False, channels=3,
        image_size=fmt.network, in_memory=False, source="stand-in", papers=(), prepare=lambda ctx: None,
    )
    n = len(paths)
    index = pd.DataFrame({
        "sample_id": np.r_[np.arange(n), 0], "split": ["train"] * n + ["test"],
        "label": np.zeros(n + 1, dtype=np.int64), "path": [os.path.basename(p) for p in paths] + [os.path.basename(paths[0])],
    })
    out = root / "prepared"
    write_prepared(out, info, index, raw_dir=Path(paths[0]).parent)
    return out


def images_per_second(files: ImageFiles, order: list[int], batch: int, min_seconds: float) -> tuple[float, list]:
    """Images per CPU second of reading ``order`` through a DataLoader in this process (user +
    system time of this process: a core's work, whatever else loads the machine), repeated
    until ``min_seconds`` of it have passed; also the batches of the first pass."""
    loader = DataLoader(Subset(files, order), batch_size=batch, shuffle=False, num_workers=0)
    first, done, start = [], 0, time.process_time()
    while True:
        for x, _ in loader:
            if len(first) * batch < len(order):
                first.append(x)
            done += len(x)
        elapsed = time.process_time() - start
        if elapsed >= min_seconds:
            return done / elapsed, first


def bench(fmt: Format, args) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench_loader_") as tmp:
        root = Path(tmp)
        (root / "raw").mkdir()
        paths = write_stand_ins(fmt, root / "raw", args.files, args.seed)
        file_kb = np.mean([os.path.getsize(p) for p in paths]) / 1024
        geometry: CacheGeometry = cache_geometries(3, fmt.network, fmt.transform)["train"]
        order = np.random.default_rng(args.seed).permutation(len(paths)).tolist()
        files = ImageFiles(paths, geometry.size, geometry.channels, geometry.short_side)
        images_per_second(files, order[: min(8, len(order))], args.batch, 0.0)  # warm-up: imports, file cache
        decode_rate, decoded = images_per_second(files, order, args.batch, args.seconds)

        data_dir = prepare(fmt, root, paths)
        start = time.process_time()
        npy = build_decoded_cache(data_dir, "train", geometry)
        build_rate = len(paths) / (time.process_time() - start)
        cached_files = ImageFiles(paths, geometry.size, geometry.channels, geometry.short_side, cache=npy)
        cached_rate, cached = images_per_second(cached_files, order, args.batch, args.seconds)
        if not all(torch.equal(a, b) for a, b in zip(decoded, cached)):
            raise SystemExit(f"{fmt.name}: cached batches differ from decoded ones")
    h, w = geometry.size
    return {
        "format": fmt.name, "files": f"{fmt.suffix.upper()} {fmt.mode} {_sizes(fmt)}, {file_kb:.0f} KB",
        "read as": f"{geometry.channels}x{h}x{w}" + ("" if fmt.transform == "resize" else f" ({fmt.transform})"),
        "decode img/s/core": decode_rate, "cache build img/s": build_rate, "cached img/s/core": cached_rate,
        "cached / decode": cached_rate / decode_rate, "model": fmt.model, "GPU img/s (est.)": fmt.gpu_per_s,
        "cores to feed GPU: decode": fmt.gpu_per_s / decode_rate, "cached": fmt.gpu_per_s / cached_rate,
    }


def _sizes(fmt: Format) -> str:
    (a, b), (c, d) = fmt.sizes
    return f"{a}x{b}" if (a, b) == (c, d) else f"{a}x{b}..{c}x{d}"


def markdown(rows: list[dict]) -> str:
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = [f"{v:,.0f}" if isinstance(v, float) and v >= 100 else f"{v:.2f}" if isinstance(v, float) else str(v)
                 for v in r.values()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=48, help="stand-in files per format")
    ap.add_argument("--batch", type=int, default=32, help="loader batch size")
    ap.add_argument("--seconds", type=float, default=1.0, help="least time each measurement repeats over")
    ap.add_argument("--formats", nargs="*", default=[f.name for f in FORMATS], help="a subset of the formats")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    unknown = sorted(set(args.formats) - {f.name for f in FORMATS})
    if unknown:
        raise SystemExit(f"unknown format(s) {unknown}; valid: {[f.name for f in FORMATS]}")
    rows = []
    for fmt in FORMATS:
        if fmt.name in args.formats:
            rows.append(bench(fmt, args))
            print(f"{fmt.name}: decode {rows[-1]['decode img/s/core']:.0f}/s, cached {rows[-1]['cached img/s/core']:.0f}/s",
                  file=sys.stderr, flush=True)
    print(markdown(rows))


if __name__ == "__main__":
    main()
