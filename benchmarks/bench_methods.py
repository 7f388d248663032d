"""Per-round cost of every method relative to FedAvg, and Best accuracy on digits under FedCorr noise.

    python benchmarks/bench_methods.py                                   # every registered method
    python benchmarks/bench_methods.py --methods fedavg fedcorr feddiv --rounds 30 --seeds 1 2 3
    python benchmarks/bench_methods.py --method-args '{"fedcorr": {"iterations1": 2, "rounds1": 10}}'
    python benchmarks/bench_methods.py --methods fedfixer dividemix --engines sequential batched

Data: scikit-learn's digits (8x8 grey; 1,297 training / 500 test images), FedCorr's IID
partition (``iid``) over K clients and FedCorr's noise model (``fedcorr``, rho, tau; the
label space is 0..9 = every class here), partition and noise seeded with the training
seed as FedCorr does. Model: the digits MLP, SGD momentum 0.5 (FedCorr's optimiser),
batch 10, local epochs from ``--local-epochs``, all of it the same for every method.

Cost: every method runs ``--rounds`` main rounds (plus its own pre-processing rounds) per
seed; the seconds of each round come from the engine's metrics (``seconds``), grouped by
stage. The ratio is the median seconds per round of a stage over FedAvg's median seconds
per round in the same process; methods run interleaved seed by seed, so machine load
shifts all of them alike. Accuracy: Best = max test accuracy over the rounds the method's
``reported_stages`` count (FedCorr: stages 2-3; FedDiv: main phase), mean over seeds.

``--engines``: each method on each training engine (default: sequential, as the CPU time ratios in
benchmarks/method_costs.json were
measured), interleaved in one process; the ratio is always over FedAvg's sequential round.

Not a test: prints markdown and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from fnlcore.app.papers import rescale_rounds
from fnlcore.app.train import build_context
from fnlcore.fl.data import FederatedData, ImageSource
from fnlcore.fl.settings import TrainSettings
from fnlcore.fl.simulation import Simulation
from fnlcore.methods import METHODS, method_from_dict
from fnlcore.noise import noise_spec_from_dict
from fnlcore.partition import partition_spec_from_dict


def digits_split(test_size: int = 500):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = np.rint(d.images * 255 / 16).astype(np.uint8)[..., None]  # (N, 8, 8, 1), as ImageSource takes
    y = d.target.astype(np.int64)
    perm = np.random.RandomState(0).permutation(len(y))  # a fixed train/test split
    te, tr = perm[:test_size], perm[test_size:]
    return x[tr], y[tr], x[te], y[te]


def make_run(method: str, params: dict, seed: int, args, engine: str = "sequential") -> Simulation:
    xtr, ytr, xte, yte = digits_split()
    part = partition_spec_from_dict({"name": "iid", "num_clients": args.clients}).run(ytr, seed)
    noise = noise_spec_from_dict(json.loads(args.noise) if args.noise else {"name": "fedcorr", "rho": args.rho, "tau": args.tau})
    given = noise.run(ytr, part, 10, seed).given
    dev = torch.device("cpu")
    data = FederatedData(
        ImageSource(dev, images=xtr), ImageSource(dev, images=xte), torch.as_tensor(ytr), torch.as_tensor(given),
        torch.as_tensor(yte), [torch.as_tensor(np.asarray(c, dtype=np.int64)) for c in part.clients], 10,
    )
    settings = TrainSettings(
        model="mlp", rounds=args.rounds, local_epochs=args.local_epochs, batch_size=10, optimizer="sgd",
        lr=args.lr, momentum=args.momentum, client_fraction=args.fraction, augmentation="none", normalize="data",
        checkpoint_every=10**6, engine=engine,
    )
    ctx = build_context(data, "digits", (8, 8), 1, settings, seed, dev, log=lambda m: None)
    spec = method_from_dict({"name": method, **params})
    # round-valued defaults (FedNoRo's 10 warm-up rounds of 100...) follow the shorter run, as a scale does
    spec = rescale_rounds(spec, args.paper_rounds, args.rounds) if not params else spec
    spec.check_training(settings)
    return Simulation(METHODS[method](spec, ctx), ctx, progress=lambda m: None)


def score(metrics, method_cls, metric: str) -> float:
    """Best (max over the reported stages' rounds) or last10 (mean of the last 10 evaluated rounds)."""
    stages = method_cls.reported_stages
    rows = metrics if stages is None else metrics[metrics["stage"].isin(stages)]
    acc = rows["acc"].dropna()
    return float(acc.max() if metric == "best" else acc.tail(10).mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", nargs="*", default=None, help="default: every registered method")
    ap.add_argument("--method-args", default="{}", help="JSON {method: {field: value}} (round budgets etc.)")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--paper-rounds", type=int, default=100,
                    help="rounds the methods' round-valued defaults are meant for (rescaled to --rounds)")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--fraction", type=float, default=1.0, help="clients per main round (omega)")
    ap.add_argument("--local-epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--rho", type=float, default=0.6)
    ap.add_argument("--tau", type=float, default=0.5)
    ap.add_argument("--noise", default="", help='noise spec as JSON (default: fedcorr with --rho/--tau), '
                    'e.g. \'{"name": "fedncl_bernoulli", "p": 0.6}\'')
    ap.add_argument("--momentum", type=float, default=0.5)
    ap.add_argument("--metric", choices=("best", "last10"), default="best")
    ap.add_argument("--seeds", type=int, nargs="*", default=[1])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--engines", nargs="*", default=["sequential"], choices=("sequential", "batched", "auto"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    extra = json.loads(args.method_args)
    names = args.methods or sorted(METHODS.builtin())
    if "fedavg" not in names:
        names = ["fedavg", *names]
    runs = [(n, e) for n in names for e in args.engines]
    secs: dict[tuple, dict[str, list[float]]] = {r: {} for r in runs}
    bests: dict[tuple, list[float]] = {r: [] for r in runs}
    load = __import__("os").getloadavg()[0]
    t0 = time.time()
    for i, seed in enumerate(args.seeds):
        order = runs if i % 2 == 0 else runs[::-1]  # alternate the order: load drifts cancel
        for n, e in order:
            m = make_run(n, extra.get(n, {}), seed, args, e).run()
            for stage, s in m.groupby("stage", sort=False)["seconds"]:
                secs[(n, e)].setdefault(stage, []).extend(s.tolist())
            bests[(n, e)].append(score(m, METHODS[n], args.metric))
    fedavg = ("fedavg", "sequential") if ("fedavg", "sequential") in secs else ("fedavg", args.engines[0])
    ref = statistics.median(v for s in secs[fedavg].values() for v in s)
    noise = args.noise or f"FedCorr noise rho={args.rho} tau={args.tau}"
    print(f"digits, K={args.clients}, {noise}, {args.rounds} main rounds, "
          f"E={args.local_epochs}, seeds {args.seeds}; load {load:.1f}; {time.time() - t0:.0f} s in all\n")
    print(f"| method | engine | {args.metric} acc (mean over seeds) | stage: median s/round (x {fedavg[1]} FedAvg round) |")
    print("|---|---|---|---|")
    for n, e in runs:
        stages = ", ".join(f"{st}: {statistics.median(v):.3f} s ({statistics.median(v) / ref:.2f}x)"
                           for st, v in secs[(n, e)].items())
        accs = ", ".join(f"{100 * b:.1f}" for b in bests[(n, e)])
        print(f"| {n} | {e} | {100 * statistics.mean(bests[(n, e)]):.2f} ({accs}) | {stages} |")


if __name__ == "__main__":
    main()
