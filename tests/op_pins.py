"""Pinned ops per local step (tests/test_op_counts.py): recorded by one command, never edited by hand.

A GPU step is host-bound (its time follows the ops the host dispatches), so a change that adds ops to
a step is a slow-down on a GPU even where a CPU cannot see it. ``tests/pins/op_counts.json`` holds,
for every paper training shape (benchmarks/step_costs.json's, at a small batch, image size and class
count: the counts depend on none of them) and engine, the ops of a steady local step by kind
(:mod:`fnlcore.app.opcount`); the test recounts and compares.

When a change MEANS to change a count (fewer ops: good; more: say why in the commit), re-record:

    .venv/bin/python -m tests.op_pins

and commit the file with the change; the test's failure message names the ops that moved.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

PINS_FILE = Path(__file__).resolve().parent / "pins" / "op_counts.json"
RECORD_COMMAND = ".venv/bin/python -m tests.op_pins"
# engine label -> (engine, the batched engine's CUDA paths)
ENGINES = {"sequential": ("sequential", False), "batched": ("batched", False), "batched_gpu": ("batched", True)}


def pin_shapes() -> dict[str, object]:
    """key -> StepShape: every paper shape at batch 2, images of at most 32 x 32 and 2 classes, once each."""
    from fnlcore.app.opcount import paper_shapes

    out = {}
    for s in paper_shapes():
        h, w = s.image_size
        small = dataclasses.replace(s, batch_size=2, image_size=(min(h, 32), min(w, 32)), eval_batch_size=2,
                                    num_classes=2)  # neither changes a count
        out.setdefault(small.key(), small)
    return out


def count(shape, label: str):
    """The shape's ops on one engine: 2 steps of 1 client (sequential) or of 2 stacked clients (batched),
    None where the batched engine cannot stack the model (VGG-16's dropout)."""
    from fnlcore.errors import ConfigError
    from fnlcore.app.opcount import count_steps

    engine, gpu = ENGINES[label]
    try:
        return count_steps(shape, engine, "cpu", clients=2 if engine == "batched" else 1, steps=2, gpu=gpu)
    except ConfigError:
        if engine != "batched":
            raise
        return None


def measure() -> dict[str, dict[str, dict[str, int]]]:
    import torch

    torch.set_num_threads(1)
    out: dict[str, dict[str, dict[str, int]]] = {}
    for key, shape in pin_shapes().items():
        for label in ENGINES:
            r = count(shape, label)
            out.setdefault(key, {})[label] = None if r is None else {"first": dict(sorted(r.first.items())),
                                                                     "steady": dict(sorted(r.steady.items()))}
    return out


def main(argv: list[str]) -> int:
    counts = measure()
    PINS_FILE.parent.mkdir(parents=True, exist_ok=True)
    PINS_FILE.write_text(json.dumps({"about": __doc__.strip().splitlines()[0], "record": RECORD_COMMAND,
                                     "counts": counts}, indent=1, sort_keys=True) + "\n")
    print(f"recorded {sum(len(v) for v in counts.values())} counts in {PINS_FILE.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
