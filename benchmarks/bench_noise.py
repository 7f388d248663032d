"""Time every noise model on 1,000,000 labels (K = 500 equal clients), 14 and 100 classes.

Usage: python benchmarks/bench_noise.py [--n 1000000] [--clients 500] [--artifacts]

Prints a markdown table of wall times (seconds, best of --repeat runs) and the
realised fraction of changed labels. Soft labels for H-IDN are random rows
(float32 to keep 1M x 100 in memory). ``--artifacts`` also times writing the
parquet + summary + figures for one model per class count.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from fnlcore.assignment import ClientAssignment
from fnlcore.noise import noise_spec_from_dict, write_noise_artifacts


def models(num_classes: int) -> list[dict]:
    asym_map = "next_in_group" if num_classes % 5 == 0 else "cyclic"
    return [
        {"name": "clean"},
        {"name": "fedcorr", "rho": 0.6, "tau": 0.5},
        {"name": "fedcorr", "rho": 0.6, "tau": 0.5, "label_space": "all"},
        {"name": "fednoro_hidn", "rho": 0.6, "eta_l": 0.5, "eta_u": 0.7},
        {"name": "fedncl_bernoulli", "p": 0.6},
        {"name": "fedncl_gaussian", "mu": 0.4, "sigma": 0.45},
        {"name": "fedncl_gaussian", "mu": 0.4, "sigma": 0.45, "truncation": "truncnorm"},
        {"name": "fedgr", "noise_type": "sym", "phi": 0.6, "rho_min": 0.5, "rho_max": 1.0},
        {"name": "fedgr", "noise_type": "mixed", "phi": 1.0, "rho_min": 0.2, "rho_max": 0.4, "asym_map": asym_map},
        {"name": "symmetric", "rate": 0.4},
        {"name": "asymmetric", "rate": 0.4, "asym_map": asym_map},
        {"name": "fedmlp_partial", "missing": 3},
    ]


def make_data(n: int, k: int, c: int, seed: int = 0):
    rs = np.random.RandomState(seed)
    y = rs.randint(0, c, n).astype(np.int64)
    perm = rs.permutation(n)
    m = n // k
    a = ClientAssignment.from_lists(n, [perm[i * m : (i + 1) * m] for i in range(k)])
    soft = rs.random_sample((n, c)).astype(np.float32)
    soft /= soft.sum(axis=1, keepdims=True)
    multi = (rs.random_sample((n, c)) < 0.2).astype(np.uint8)
    return y, a, soft, multi


def timed(fn, repeat: int):
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--clients", type=int, default=500)
    ap.add_argument("--classes", type=int, nargs="+", default=[14, 100])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--artifacts", action="store_true")
    args = ap.parse_args()

    rows: dict[str, dict[int, tuple[float, float]]] = {}
    art: dict[int, float] = {}
    for c in args.classes:
        y, a, soft, multi = make_data(args.n, args.clients, c)
        for d in models(c):
            spec = noise_spec_from_dict(d, num_classes=c, num_clients=args.clients)
            labels = multi if spec.multi_label else y
            sl = soft if spec.needs_soft_labels else None
            secs, res = timed(lambda: spec.run(labels, a, c, 0, soft_labels=sl), args.repeat)
            rows.setdefault(spec.slug(), {})[c] = (secs, float(res.is_noisy.mean()))
            if args.artifacts and d["name"] == "fedcorr" and "label_space" not in d:
                with tempfile.TemporaryDirectory() as tmp:
                    t = Path(tmp)
                    art[c], _ = timed(
                        lambda: write_noise_artifacts(
                            res, y, a, c, t / "n.parquet", t / "n.csv", t / "r.png", t / "m.png"
                        ),
                        1,
                    )
        del y, a, soft, multi

    head = " | ".join(f"C={c} s | C={c} changed" for c in args.classes)
    print(f"n = {args.n:,}, K = {args.clients} equal clients\n")
    print(f"| noise slug | {head} |")
    print("|---|" + "---|---|" * len(args.classes))
    for slug, per_c in rows.items():
        cells = " | ".join(
            f"{per_c[c][0]:.3f} | {per_c[c][1]:.3f}" if c in per_c else "- | -" for c in args.classes
        )
        print(f"| {slug} | {cells} |")
    for c, secs in art.items():
        print(f"\nwrite_noise_artifacts (fedcorr, C={c}): {secs:.2f} s")


if __name__ == "__main__":
    main()
