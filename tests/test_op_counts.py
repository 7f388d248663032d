"""Ops dispatched per local step (fnlcore.app.opcount), pinned per paper shape and engine.

A GPU step's time follows the number of ops the host dispatches, so an op added to a step is a
slow-down on a GPU that no CPU timing shows: each paper shape's steady-step counts, by kind, must
equal tests/pins/op_counts.json. A change that means to move them re-records the file (see
tests/op_pins.py: ``.venv/bin/python -m tests.op_pins``) and says why in its commit.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from fnlcore.app.opcount import OpCounter, count_steps, kind_of
from fnlcore.syncs import host_side, step_region

from .op_pins import ENGINES, PINS_FILE, RECORD_COMMAND, count, pin_shapes

PINS = json.loads(PINS_FILE.read_text())["counts"]


def test_every_paper_shape_is_pinned():
    assert sorted(pin_shapes()) == sorted(PINS), f"paper shapes changed: re-record with {RECORD_COMMAND}"


@pytest.mark.parametrize("key", sorted(PINS))
def test_ops_per_step_are_pinned(key):
    shape = pin_shapes()[key]
    for label in ENGINES:
        want = PINS[key][label]
        r = count(shape, label)
        if want is None:
            assert r is None, f"{key} {label}: the model stacks now; re-record with {RECORD_COMMAND}"
            continue
        got = {"first": dict(sorted(r.first.items())), "steady": dict(sorted(r.steady.items()))}
        top = sorted(r.ops.items(), key=lambda kv: -kv[1])[:12]
        assert got == want, (
            f"{key} on {label}: ops per step {got} != pinned {want}. A step that gained ops is slower on a "
            f"GPU; if the change is meant, re-record with {RECORD_COMMAND} and say why in the commit. "
            f"Most dispatched ops over the counted steps: {top}")


def test_counts_do_not_depend_on_the_batch_size():
    """What lets the pins (and the benchmark's per-sample column) use a small batch."""
    shape = pin_shapes()["lenet5|1x28x28|C2|b2|none|sgd|fp32|eb2"]
    for engine in ("sequential", "batched"):
        a = count_steps(shape, engine, clients=2, steps=2)
        b = count_steps(dataclasses.replace(shape, batch_size=5), engine, clients=2, steps=2)
        assert a.steady == b.steady and a.first == b.first, engine
        assert a.samples * 5 == b.samples * 2


def test_the_counter_sorts_ops_by_kind_and_counts_only_steps():
    x = torch.ones(3)
    with OpCounter() as c:
        x + 1  # outside a step: not counted
        with step_region():
            y = x * 2  # kernel
            y.view(-1)  # view
            torch.zeros(3)  # create
            y.double()  # copy
            with host_side():
                x - 1  # host
            torch.tensor([1.0]).to("cpu")  # a host value moved: to_device (and a create)
            y.to("cpu")  # y was made in the step: a device tensor, no copy
    (step,) = c.steps()
    assert dict(step) == {"kernel": 1, "view": 1, "create": 2, "copy": 1, "host": 1, "to_device": 1}
    assert kind_of(torch.ops.aten.add.Tensor) == "kernel"
    assert kind_of(torch.ops.aten.transpose.int) == "view"
