"""Ops dispatched per local step, for every paper training shape and engine (fnlcore.app.opcount).

    python benchmarks/bench_ops.py                          # every shape, both engines (batched: CPU and GPU paths)
    python benchmarks/bench_ops.py --baseline DIR           # and the fnlcore copy in DIR/fnlcore, before -> after
    python benchmarks/bench_ops.py --real-size --clients 10 # at the shapes' own image sizes, 10 stacked clients

A GPU step at the papers' sizes is host-bound: its time follows the ops the host dispatches (about
47-64 us each on an H200), not their arithmetic. This counts them, over a steady step of one FedAvg
local update (forward, loss, backward, optimiser step; the first step of an update is in
``first``): ``device`` = kernel + create + copy ops (what reaches the device), then each kind
(see fnlcore/app/opcount.py), and ``device`` per sample (one step trains clients x batch samples
on the batched engine, batch samples on the sequential one). The shapes are every shape of
benchmarks/step_costs.json; counts do not depend on the batch size (tests/test_op_counts.py), so
they are made at batch 2 and images of at most 32 x 32 (unless --real-size) and reported per
sample at the shape's batch. ``batched@gpu`` takes the batched engine's CUDA code paths on the
CPU (fnlcore.app.opcount.gpu_paths): no per-client split of wide convolutions, optimisers over
concatenations. The sequential engine's torch.optim runs its per-tensor loops on the CPU and its
multi-tensor (foreach) ones on a GPU: its CPU optimiser counts are higher than a GPU's.
Counts are exact and the same on every run: no timing, no repetitions.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINES = (("sequential", "sequential", False), ("batched", "batched", False), ("batched@gpu", "batched", True))


def _counter():
    """The working tree's fnlcore.app.opcount, in whichever fnlcore is imported (a baseline counts the same way)."""
    import importlib.util

    import fnlcore.fl  # noqa: F401 (its package, for the module's relative imports)

    spec = importlib.util.spec_from_file_location("fnlcore.app.opcount", ROOT / "fnlcore" / "app" / "opcount.py")
    opcount = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = opcount
    spec.loader.exec_module(opcount)
    return opcount


def measure(real_size: bool, clients: int, keys: list[str] | None = None) -> list[dict]:
    import torch

    from fnlcore.errors import ConfigError
    from fnlcore.fl import stacked

    opcount = _counter()
    count_steps = opcount.count_steps
    torch.set_num_threads(1)
    rows = []
    shapes = opcount.paper_shapes() if keys is None else [_shape(k) for k in keys]
    for shape in shapes:
        h, w = shape.image_size
        small = dataclasses.replace(shape, batch_size=2, image_size=(h, w) if real_size else (min(h, 32), min(w, 32)))
        for label, engine, gpu in ENGINES:
            k = clients if engine == "batched" else 1
            if gpu and not hasattr(stacked, "DEVICE_PATHS"):  # a baseline that cannot take the CUDA paths
                rows.append({"shape": shape.key(), "engine": label, "error": "no CUDA paths in this version"})
                continue
            try:
                r = count_steps(small, engine, "cpu", clients=k, steps=2, gpu=gpu)
            except ConfigError as err:
                rows.append({"shape": shape.key(), "engine": label, "error": str(err).split(";")[0]})
                continue
            per_sample = r.device() / (k * shape.batch_size)
            rows.append({**r.row(), "shape": shape.key(), "engine": label, "samples": k * shape.batch_size,
                         "first": r.device("first"), "device_per_sample": round(per_sample, 3),
                         "top": sorted(r.ops.items(), key=lambda kv: -kv[1])[:8]})
    return rows


def _shape(key: str):
    from fnlcore.app.gpu_cost import shape_from_key

    return shape_from_key(key)


def in_baseline(src: str, real_size: bool, clients: int, keys: list[str]) -> list[dict]:
    """The same shapes' counts with DIR/fnlcore imported instead of the working tree (a subprocess).
    Its moves to the device are seen only where it marks host work as the working tree does."""
    if not (Path(src) / "fnlcore" / "__init__.py").exists():
        raise SystemExit(f"--baseline {src}: no fnlcore/__init__.py there")
    cmd = [sys.executable, __file__, "--json"] + (["--real-size"] if real_size else []) + ["--clients", str(clients)]
    env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())}
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, input=json.dumps(keys)).stdout
    return json.loads(out)


def table(rows: list[dict], before: list[dict] | None) -> str:
    old = {(r["shape"], r["engine"]): r for r in before or []}
    head = ["shape", "engine", "samples/step", "device ops/step", "first step", "kernel", "create", "copy",
            "to_device", "view", "host", "device ops/sample"]
    if before is not None:
        head[4:4] = ["before", "create+copy+to_device", "before"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"| `{r['shape']}` | {r['engine']} | {r['error']} |" + " |" * (len(head) - 3))
            continue
        cells = [f"`{r['shape']}`", r["engine"], r["samples"], r["device"], r["first"], r["kernel"], r["create"],
                 r["copy"], r["to_device"], r["view"], r["host"], r["device_per_sample"]]
        if before is not None:
            b = old.get((r["shape"], r["engine"]), {})
            if "device" in b:
                nonarith = lambda t: sum(t.get(k, 0) for k in ("create", "copy", "to_device"))  # noqa: E731
                cells[4:4] = [b["device"], nonarith(r), nonarith(b)]
            else:
                cells[4:4] = ["—", "—", "—"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", metavar="DIR", help="also count DIR/fnlcore (e.g. a `git archive` of an older commit)")
    ap.add_argument("--real-size", action="store_true", help="count at the shapes' own image sizes (slower)")
    ap.add_argument("--clients", type=int, default=2, help="clients stacked in a batched step (default 2)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON (what --baseline reads)")
    args = ap.parse_args()
    if args.json:  # the shape keys on stdin (the working tree's shapes)
        print(json.dumps(measure(args.real_size, args.clients, json.loads(sys.stdin.read()))))
        return
    sys.path.insert(0, str(ROOT))
    rows = measure(args.real_size, args.clients)
    keys = list(dict.fromkeys(r["shape"] for r in rows))
    before = in_baseline(args.baseline, args.real_size, args.clients, keys) if args.baseline else None
    print(table(rows, before))
    print("\nMost dispatched ops (over the counted steps, kind:op):")
    for r in rows:
        if "top" in r:
            print(f"- `{r['shape']}` {r['engine']}: " + ", ".join(f"{n} {c}" for n, c in r["top"]))


if __name__ == "__main__":
    main()
