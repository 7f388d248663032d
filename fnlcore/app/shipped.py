"""Where the project's shipped measurements live, and how a device's description names it across torch
versions: what resources, the cost model and the GPU step-time model all read (one place, no cycle)."""

from __future__ import annotations

from pathlib import Path

#: Measurements shipped with the project: a user's own (``RESULTS/plan/``) override them per key.
SHIPPED_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
SHIPPED_STEP_COSTS = "step_costs.json"


def short_device(device: str) -> str:
    """A device description without its torch version (``cpu:Xeon|1 threads``)."""
    return str(device).split("|torch")[0]
