"""Per-client models held in memory and cloned at every checkpoint vs the engine's ClientStore.

    python benchmarks/bench_client_store.py                       # CIFAR ResNet-18, 40 clients, 10 a round
    python benchmarks/bench_client_store.py --clients 100 --rounds 10 --every 5

FedGR keeps one EMA model per client (FedFixer a personalised model, FedIRM and RSCFed a
teacher). Before contract v3 a method held them in a dict and its ``state_dict`` cloned the
whole dict at every checkpoint; now they live in a :class:`fnlcore.fl.persist.ClientStore`.
Each variant runs in its own process (so its peak RSS is its own) through the same schedule:
every round the selected clients' models are read, changed and written back; every
``--every`` rounds a checkpoint is written. Reported: peak RSS, bytes written per checkpoint
and the seconds of the whole schedule.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _model_state(model: str) -> dict[str, torch.Tensor]:
    from fnlcore.models import build_model

    return {k: v.detach().clone() for k, v in build_model(model, 10, 3, (32, 32)).state_dict().items()}


def _schedule(clients: int, per_round: int, rounds: int, seed: int = 0) -> list[list[int]]:
    rs = np.random.RandomState(seed)
    return [sorted(rs.choice(clients, per_round, replace=False).tolist()) for _ in range(rounds)]


def _touch(state: dict[str, torch.Tensor], r: int) -> dict[str, torch.Tensor]:
    """A client's model after its round: a cheap in-place change of every float tensor."""
    return {k: (v + (r + 1) * 1e-3) if v.is_floating_point() else v for k, v in state.items()}


def _dir_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def run_variant(variant: str, args) -> dict:
    from fnlcore.fl.persist import ClientStore
    from fnlcore.io import atomic_path

    init = _model_state(args.model)
    plan = _schedule(args.clients, args.per_round, args.rounds)
    out = Path(tempfile.mkdtemp(prefix=f"bench-store-{variant}-"))
    ckpt = out / "run.ckpt.pt"
    written: list[int] = []
    t0 = time.perf_counter()
    if variant == "dict":  # before v3: every client's model in memory, the whole dict cloned per checkpoint
        held: dict[int, dict[str, torch.Tensor]] = {}
        for r, chosen in enumerate(plan):
            for k in chosen:
                held[k] = _touch(held.get(k, init), r)
            if (r + 1) % args.every == 0:
                payload = {"ema": {k: {n: v.clone() for n, v in st.items()} for k, st in held.items()}}
                with atomic_path(ckpt, suffix=".pt") as tmp:
                    torch.save(payload, tmp)
                written.append(ckpt.stat().st_size)
                del payload
    else:  # v3: ClientStore beside the checkpoint
        store = ClientStore("ema")
        store.attach(Path(str(ckpt) + ".clients") / "ema")
        since = 0
        for r, chosen in enumerate(plan):
            store.begin_round(r)
            for k in chosen:
                prev = store.get(k)
                store.put(k, _touch(prev if prev is not None else init, r))
            store.end_round()  # the round's entries go to disk (files are named by the round that wrote them)
            since += sum(p.stat().st_size for p in store.folder.glob(f"client*.r{r}.pt"))
            if (r + 1) % args.every == 0:
                with atomic_path(ckpt, suffix=".pt") as tmp:
                    torch.save({"ema": store.checkpoint()}, tmp)
                store.committed()
                # what a checkpoint interval wrote: every entry written since the last one, and the manifest
                written.append(since + ckpt.stat().st_size)
                since = 0
    seconds = time.perf_counter() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    on_disk = _dir_bytes(out)
    subprocess.run(["rm", "-rf", str(out)], check=False)
    return {"variant": variant, "peak_rss_mb": peak_mb, "checkpoint_mb": [w / 2**20 for w in written],
            "on_disk_mb": on_disk / 2**20, "seconds": seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet18_cifar")
    ap.add_argument("--clients", type=int, default=40)
    ap.add_argument("--per-round", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--every", type=int, default=5, help="checkpoint every N rounds")
    ap.add_argument("--variant", choices=("dict", "store"), help=argparse.SUPPRESS)  # one child process
    args = ap.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args.variant, args)))
        return
    mb = sum(v.numel() * v.element_size() for v in _model_state(args.model).values()) / 2**20
    print(f"{args.model}: {mb:.1f} MB a model; {args.clients} clients, {args.per_round} a round, "
          f"{args.rounds} rounds, a checkpoint every {args.every}; one process a variant\n")
    print("| variant | peak RSS (MB) | written per checkpoint interval (MB) | on disk at the end (MB) | seconds |")
    print("|---|---:|---|---:|---:|")
    for variant in ("dict", "store"):
        cmd = [sys.executable, __file__, "--variant", variant] + [
            a for a in sys.argv[1:] if a != "--variant"]
        res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True,
                                        env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout.strip().splitlines()[-1])
        label = "in memory, cloned per checkpoint (before)" if variant == "dict" else "ClientStore (contract v3)"
        ckpts = ", ".join(f"{c:.0f}" for c in res["checkpoint_mb"])
        print(f"| {label} | {res['peak_rss_mb']:.0f} | {ckpts} | {res['on_disk_mb']:.0f} | {res['seconds']:.1f} |")


if __name__ == "__main__":
    main()
