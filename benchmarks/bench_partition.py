"""Time every partitioner on a Clothing1M-sized label vector and print a markdown table.

    python benchmarks/bench_partition.py                 # n=1,000,000, 14 classes, K=500 and 100
    python benchmarks/bench_partition.py --reference     # also the literal official iid loop (slow)

Paper settings: bernoulli_dirichlet p=0.7 alpha=10 (FedCorr/FedDiv Clothing1M),
dirichlet_niidbench alpha=0.3 (FedGR), quantity_skew sigma=0.3 (Fed-NCL).
Each cell is the best of ``--repeat`` runs (wall time, one process, including
the ClientAssignment checks). Not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

import numpy as np

from fnlcore.assignment import ClientAssignment
from fnlcore.partition import (
    bernoulli_dirichlet,
    dirichlet_niidbench,
    fedmlp_equal,
    iid_fedcorr,
    iid_niidbench,
    iid_per_class_equal,
    quantity_skew_lognormal,
)


def clothing_like_labels(n: int, num_classes: int, seed: int = 0) -> np.ndarray:
    """Labels with Clothing1M-like imbalance (class shares from a Dirichlet(5) draw)."""
    rs = np.random.RandomState(seed)
    shares = rs.dirichlet(np.full(num_classes, 5.0))
    return rs.choice(num_classes, size=n, p=shares).astype(np.int64)


def official_iid_loop(n: int, k: int, seed: int) -> list[list[int]]:
    """The literal official loop with Python sets (FedCorr iid_sampling), for the speed ratio."""
    rs = np.random.RandomState(seed)
    per_client = int(n / k)
    pool, out = list(range(n)), []
    for _ in range(k):
        chosen = set(rs.choice(pool, per_client, replace=False))
        out.append(list(chosen))
        pool = list(set(pool) - chosen)
    return out


def best_of(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000, help="number of samples")
    ap.add_argument("--classes", type=int, default=14, help="number of classes")
    ap.add_argument("--clients", type=int, nargs="+", default=[500, 100], help="client counts K")
    ap.add_argument("--repeat", type=int, default=1, help="runs per cell (best is reported)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--reference", action="store_true", help="also time the literal official iid loop")
    args = ap.parse_args()

    y = clothing_like_labels(args.n, args.classes)
    n, seed = args.n, args.seed
    rows = []
    for k in args.clients:
        cases: list[tuple[str, Callable[[], ClientAssignment]]] = [
            ("iid (FedCorr iid_sampling)", lambda: iid_fedcorr(n, k, seed)),
            ("bernoulli_dirichlet p=0.7 a=10", lambda: bernoulli_dirichlet(y, k, 0.7, 10.0, seed)),
            ("iid_niidbench", lambda: iid_niidbench(n, k, seed)),
            ("dirichlet_niidbench a=0.3 min=10", lambda: dirichlet_niidbench(y, k, 0.3, seed)),
            ("quantity_skew sigma=0.3", lambda: quantity_skew_lognormal(n, k, 0.3, seed)),
            ("fedmlp_equal sub=n/(2K)", lambda: fedmlp_equal(n, k, seed, subsample=max(1, n // (2 * k)))),
            ("iid balance=per_class (paper text)", lambda: iid_per_class_equal(y, k, seed)),
        ]
        for label, fn in cases:
            seconds, result = best_of(fn, args.repeat)
            rows.append((label, k, seconds, int(result.sizes().sum())))
            print(f"  {label:38s} K={k:<4d} {seconds:8.2f} s", flush=True)
        if args.reference:
            seconds, ref = best_of(lambda: official_iid_loop(n, k, seed), 1)
            ours = iid_fedcorr(n, k, seed)
            same = all(a.tolist() == b for a, b in zip(ours.clients, ref))
            rows.append((f"official iid loop (Python sets){'' if same else ' MISMATCH'}", k, seconds, n // k * k))
            print(f"  official loop K={k}: {seconds:.2f} s, identical={same}", flush=True)

    print()
    print(f"Partitioners on n={n:,} samples, {args.classes} classes (best of {args.repeat}):")
    print()
    print("| partitioner | K | seconds | samples assigned |")
    print("|---|---:|---:|---:|")
    for label, k, seconds, assigned in rows:
        print(f"| {label} | {k} | {seconds:.2f} | {assigned:,} |")


if __name__ == "__main__":
    main()
