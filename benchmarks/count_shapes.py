"""Count ops and FLOPs of every step shape of the tables at a scale: writes benchmarks/shape_counts.json.

    python benchmarks/count_shapes.py                       # paper scale, every table (about 35 s)
    python benchmarks/count_shapes.py --scale smoke         # add the smoke and paper_fast shapes (the file holds all three)
    python benchmarks/count_shapes.py --scale paper_fast --out results/plan/shape_counts.json

What is counted and why: fnlcore/app/counts.py. Besides the tables' shapes, the shapes of the
batched-engine measurements in benchmarks/step_costs.json (``batched``), whose ratios
`fnl plan` prices the batched engine with. Counting runs on the CPU, one thread.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fnlcore.app.cost import step_shape  # noqa: E402
from fnlcore.app.counts import SHIPPED_COUNTS, ShapeCounts, count_shape  # noqa: E402
from fnlcore.app.gpu_cost import batched_measurements  # noqa: E402
from fnlcore.app.plan import build_plan, validate_schema  # noqa: E402
from fnlcore.app.runs import PAPERS_DIR  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", default="paper")
    ap.add_argument("--out", default=str(SHIPPED_COUNTS))
    args = ap.parse_args()
    torch.set_num_threads(1)
    tables = [p.stem for p in sorted(PAPERS_DIR.glob("*.yaml"))]
    plan = build_plan(validate_schema({"tables": tables, "scale": args.scale, "data_grid": []}))
    options = {name: ds.options for name, ds in plan.datasets.items()}
    shapes = {s.key(): s for s in (step_shape(run, options.get(run.dataset)) for run in plan.runs())}
    for rows in batched_measurements().values():
        for row in rows:
            shapes.setdefault(row.shape.key(), row.shape)
    out = {}
    for i, (key, shape) in enumerate(sorted(shapes.items()), 1):
        t0 = time.perf_counter()
        out[key] = count_shape(shape)
        print(f"[{i}/{len(shapes)}] {key}: {out[key]['ops']} ops, {out[key]['flops'] / 1e9:.2f} GFLOP a step "
              f"({time.perf_counter() - t0:.1f} s)", flush=True)
    old = {}
    if Path(args.out).exists():
        old = json.loads(Path(args.out).read_text()).get("shapes", {})
    ShapeCounts.save(args.out, {**old, **out})
    print(f"wrote {args.out}: {len(out)} shapes counted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
