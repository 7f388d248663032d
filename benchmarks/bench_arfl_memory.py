"""Peak host memory of ARFL's server step against FedAvg's, on the same client states.

    python benchmarks/bench_arfl_memory.py                     # ResNet-18 (CIFAR) x 10 clients
    python benchmarks/bench_arfl_memory.py --model resnet34_cifar --clients 10

Each aggregation runs in a fresh process (peak RSS is a process's high-water mark): the
clients' states are built (the global model plus small noise, as after local training),
then FedAvg's weighted average or ARFL's robust fit (``fnlcore.methods.arfl.arfl_aggregate``)
runs on them. Printed: the peak RSS before the step (states held) and during it, and the
ratio of the two steps' own memory (peak minus the states' baseline). A paper-scale
rehearsal (``fnl rehearse``) measured ARFL's whole run at 3.1 GB against FedAvg's 1.1 GB;
this isolates the server step. Not a test: prints markdown.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, resource, sys, time
import torch
from fnlcore.models import build_model
from fnlcore.fl.state import weighted_average
from fnlcore.methods.arfl import arfl_aggregate

model, clients, which = sys.argv[1], int(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
torch.set_num_threads(1)
base = build_model(model, 10, 3, (32, 32)).state_dict()
states = [{k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v.clone() for k, v in base.items()}
          for _ in range(clients)]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
t0 = time.perf_counter()
if which == "fedavg":
    weighted_average(states, [1.0 / clients] * clients)
else:
    arfl_aggregate(states, 2.0, 0.1)
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
    args = ap.parse_args()
    rows = {w: measure(args.model, args.clients, w) for w in ("fedavg", "arfl")}
    print(f"| step ({args.model}, {args.clients} clients) | RSS with the states (MB) | peak (MB) | step's own (MB) | s |")
    print("|---|---|---|---|---|")
    for w, m in rows.items():
        print(f"| {w} | {m['before']:.0f} | {m['peak']:.0f} | {m['peak'] - m['before']:.0f} | {m['seconds']:.1f} |")
    own = {w: max(m["peak"] - m["before"], 1.0) for w, m in rows.items()}
    print(f"\nARFL's server step uses {own['arfl'] / own['fedavg']:.1f}x FedAvg's own memory "
          f"({own['arfl']:.0f} vs {own['fedavg']:.0f} MB above the held states).")


if __name__ == "__main__":
    main()
