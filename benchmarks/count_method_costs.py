"""Count every method's round in FedAvg rounds (ops and FLOPs): writes benchmarks/method_costs.json.

    python benchmarks/count_method_costs.py                     # every registered method (about 15 min, one thread)
    python benchmarks/count_method_costs.py --methods fedgr my_method
    python benchmarks/count_method_costs.py --out results/plan/method_costs.json

What is counted and why: fnlcore/app/round_counts.py; how `fnl plan` uses it:
fnlcore/app/method_costs.py. The file's CPU time ratios (``cpu``, measured by
benchmarks/bench_methods.py) and variants (``variants``: hyper-parameters counted apart, each
with its ``params``) are kept; each method's ``counted`` entry is replaced, with the commit and
torch version it was counted with. The file is written after each method, so an interrupted run
keeps what it counted. Counting runs on the CPU, one thread (the counts do not depend on it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fnlcore.app.method_costs import METHOD_COSTS_VERSION, SHIPPED_METHOD_COSTS  # noqa: E402
from fnlcore.app.round_counts import components, count_pair, describe, ratios  # noqa: E402
from fnlcore.methods import METHODS  # noqa: E402
from fnlcore.provenance import git_describe  # noqa: E402


def _load(path: Path) -> dict:
    if not path.exists():
        return {"version": METHOD_COSTS_VERSION, "methods": {}}
    raw = json.loads(path.read_text())
    if raw.get("version") != METHOD_COSTS_VERSION:
        sys.exit(f"{path}: version {raw.get('version')!r}, not {METHOD_COSTS_VERSION}: move it away to start anew")
    return raw


def _save(path: Path, raw: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(raw, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="*", help="method names (default: every registered method)")
    ap.add_argument("--out", default=str(SHIPPED_METHOD_COSTS))
    args = ap.parse_args()
    torch.set_num_threads(1)
    names = args.methods or sorted(METHODS)
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        sys.exit(f"unknown method(s) {', '.join(unknown)}; registered: {', '.join(sorted(METHODS))}")
    path = Path(args.out)
    raw = _load(path)
    reference = describe()
    others = [n for n, e in raw["methods"].items() if "counted" in e and n not in names]
    if raw.get("reference", reference) != reference and others:
        sys.exit(f"{path} was counted at another reference run ({raw['reference']}); count every method "
                 "again (leave out --methods) so all ratios share one")
    raw["reference"] = reference
    stamp = {"commit": git_describe() or "unknown", "torch": torch.__version__}
    fedavg = {}
    for name in names:
        t0 = time.perf_counter()
        multi = "single" not in METHODS[name].label_kinds
        if multi not in fedavg:
            fedavg[multi] = count_pair("fedavg", multi=multi)  # the unit: FedAvg on the same labels
        entry = raw["methods"].setdefault(name, {})
        for e in [entry, *entry.get("variants", [])]:
            pair = count_pair(name, e.get("params"))
            # stretches: what the plan prices; stages: each stage's ratios at two steps a client, for reference
            e["counted"] = {"stretches": components(pair, fedavg[multi]),
                            "stages": ratios(pair[1], fedavg[multi][1])["stages"], **stamp}
        _save(path, raw)
        shown = ", ".join(f"{k} ops {r['ops']:.2f} FLOPs {r['flops']:.2f}" for k, r in entry["counted"]["stages"].items())
        kept = "".join(f"  ({k}: {c['steps_taken']:.0%} of its steps taken)"
                       for k, c in entry["counted"]["stretches"].items() if c["steps_taken"] < 1)
        print(f"{name:18s} {time.perf_counter() - t0:6.1f} s  {shown}{kept}", flush=True)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
