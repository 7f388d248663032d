"""Peak host memory of a robust server step (ARFL's fit, the trimmed mean) against FedAvg's, on the same client states.

    python benchmarks/bench_server_memory.py                                   # ResNet-18 (CIFAR) x 10: fedavg, arfl
    python benchmarks/bench_server_memory.py --model vgg16 --clients 20 --steps fedavg trimmed_mean trimmed_mean_unchunked
    python benchmarks/bench_server_memory.py --model resnet50 --clients 10 --steps fedfixer fedfixer_listed

Each aggregation runs in a fresh process (peak RSS is a process's high-water mark): the
clients' states are built (the global model plus small noise, as after local training),
then the step runs on them: FedAvg's weighted average, ARFL's robust fit
(``fnlcore.methods.arfl.arfl_aggregate``), the trimmed mean of Fed-NCL's code
(``fnlcore.methods.trimmed_mean.trimmed_mean``, keep = int(K x 0.5) - 1) a chunk of
coordinates at a time, or the same with one chunk an entry (``trimmed_mean_unchunked``: every
client's whole entry stacked, as before the chunking), FedFixer's mix (``fedfixer``: the states
made one at a time as the engine trains them and summed as they come, ``fedfixer_listed``: the
round's states all held first, as before the streaming). Printed: the peak RSS before the step
(states held) and during it, and each step's own memory (peak minus the states' baseline).
The paper-scale rehearsal (``fnl rehearse``) found both robust steps (ARFL on CIFAR ResNet-18,
the trimmed mean on Fed-NCL's VGG-16) far above FedAvg; this isolates the server step. Not a
test: prints markdown.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

STEPS = ("fedavg", "arfl", "trimmed_mean", "trimmed_mean_unchunked", "fedfixer", "fedfixer_listed")

CHILD = r"""
import json, resource, sys, time
import torch
from fnlcore.models import build_model
from fnlcore.fl.state import weighted_average

model, clients, which = sys.argv[1], int(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
torch.set_num_threads(1)
base = build_model(model, 10, 3, (32, 32)).state_dict()
trained = lambda: {k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v.clone() for k, v in base.items()}
states = None if which == "fedfixer" else [trained() for _ in range(clients)]  # fedfixer: made as consumed
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
t0 = time.perf_counter()
if which.startswith("fedfixer"):
    from fnlcore.methods.fedfixer import mix_aggregate
    weighted = ((trained(), 1.0) for _ in range(clients)) if states is None else ((s, 1.0) for s in states)
    mix_aggregate(base, weighted, 1.0)
elif which == "fedavg":
    weighted_average(states, [1.0 / clients] * clients)
elif which == "arfl":
    from fnlcore.methods.arfl import arfl_aggregate
    arfl_aggregate(states, 2.0, 0.1)
else:
    import fnlcore.methods.trimmed_mean as tm
    if which == "trimmed_mean_unchunked":
        tm.CHUNK_VALUES = 2**62
    tm.trimmed_mean(states, tm.keep_count(clients, 0.5, 1.0))
print(json.dumps({"before": before, "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "seconds": time.perf_counter() - t0}))
"""


def measure(model: str, clients: int, which: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, model, str(clients), which], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="resnet18_cifar")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--steps", nargs="+", choices=STEPS, default=["fedavg", "arfl"])
    args = ap.parse_args()
    rows = {w: measure(args.model, args.clients, w) for w in args.steps}
    print(f"| step ({args.model}, {args.clients} clients) | RSS with the states (MB) | peak (MB) | step's own (MB) | s |")
    print("|---|---|---|---|---|")
    for w, m in rows.items():
        print(f"| {w} | {m['before']:.0f} | {m['peak']:.0f} | {m['peak'] - m['before']:.0f} | {m['seconds']:.1f} |")
    if "fedavg" in rows:
        base = max(rows["fedavg"]["peak"] - rows["fedavg"]["before"], 1.0)
        for w, m in rows.items():
            if w != "fedavg" and not w.startswith("fedfixer"):  # the streamed step makes its states inside
                print(f"\n{w}: {max(m['peak'] - m['before'], 1.0) / base:.1f}x FedAvg's own memory")
    if {"fedfixer", "fedfixer_listed"} <= set(rows):
        streamed, listed = rows["fedfixer"]["peak"], rows["fedfixer_listed"]["peak"]
        print(f"\nfedfixer: peak {streamed:.0f} MB streamed vs {listed:.0f} MB with the round's states held "
              f"({listed - streamed:.0f} MB less)")


if __name__ == "__main__":
    main()
