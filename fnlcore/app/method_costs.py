"""What a method's round costs over a FedAvg round, per stretch of its schedule and per device kind.

Read from ``benchmarks/method_costs.json`` (``python benchmarks/count_method_costs.py`` writes it):
for each method (and variant: hyper-parameters whose rounds cost otherwise, FedGR's
``strong_aug: false``) and each stretch of its schedule (:meth:`FLMethod.schedule`)

* ``cpu``: a round's seconds over a FedAvg round's, measured by ``benchmarks/bench_methods.py``
  on the digits MLP on a CPU (the source says which); what a CPU plan applies;
* ``counted``: its dispatched ops and matrix FLOPs, counted on the CPU at the reference runs
  (:mod:`fnlcore.app.round_counts`) and split into what a round costs besides its local steps
  (``*_fixed``) and what each local step adds (``*_step``), in FedAvg local steps; what a GPU
  plan applies.

A stretch whose clients take S local steps a round then dispatches
``(ops_fixed + S x ops_step) / (FedAvg's ops_fixed + S)`` times FedAvg's ops (likewise FLOPs), and
as a GPU's step time is ``a x ops + b x FLOPs`` (:mod:`fnlcore.app.gpu_cost`) its factor there is
``(t_ops x ops ratio + t_flops x FLOPs ratio) / (t_ops + t_flops)`` with ``t_ops``, ``t_flops``
the priced shape's step split by the GPU's fitted model. Without a model (a GPU with under two
measured shapes) the ops ratio alone (the step is host-bound). A GPU figure never takes a CPU's
time ratio.

A method or stretch the file lacks (a plug-in method) counts 1.0 and is flagged unmeasured in
the plan's text, which names the command that counts it: counting takes seconds to minutes a
method on a CPU, too long for a plan of every table.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from ..errors import ConfigError

METHOD_COSTS_VERSION = 1
SHIPPED_METHOD_COSTS = Path(__file__).resolve().parents[2] / "benchmarks" / "method_costs.json"
COUNT_COMMAND = "python benchmarks/count_method_costs.py --methods {name}"


@dataclass(frozen=True)
class Factor:
    """A stretch's round cost over a FedAvg round on the same clients, and where it came from
    (``kind``: ``cpu time``, ``counted`` or ``unmeasured``)."""

    value: float
    kind: str
    source: str

    @property
    def measured(self) -> bool:
        return self.kind != "unmeasured"


def _read(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: not a method-cost file ({err}); restore it from the repository or run "
                          "`python benchmarks/count_method_costs.py`") from None
    if not isinstance(raw, dict) or raw.get("version") != METHOD_COSTS_VERSION or not isinstance(raw.get("methods"), dict):
        raise ConfigError(f"{path}: not a method-cost file of version {METHOD_COSTS_VERSION}; restore it from the "
                          "repository or run `python benchmarks/count_method_costs.py`")
    return raw


@lru_cache(maxsize=4)
def _load(path: str) -> dict[str, Any]:
    p = Path(path)
    return _read(p) if p.exists() else {"version": METHOD_COSTS_VERSION, "methods": {}}


class MethodCosts:
    """The factors of ``path`` (default the shipped file)."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path or SHIPPED_METHOD_COSTS)
        self.raw = _load(str(self.path))
        self.methods: Mapping[str, Any] = self.raw["methods"]

    def entry(self, name: str, params=None) -> Mapping[str, Any] | None:
        """The method's entry: the variant whose ``params`` the run's hyper-parameters all match
        (the most specific), else the method's own; None where the file lacks the method."""
        e = self.methods.get(name)
        if e is None:
            return None
        best, most = e, 0
        for v in e.get("variants", []):
            want = v["params"]
            if params is not None and len(want) > most and all(
                    getattr(params, k, dataclasses.MISSING) == val for k, val in want.items()):
                best, most = v, len(want)
        return best

    def reference(self) -> str:
        return self.raw.get("reference", "")

    def ratios(self, name: str, params, stretch: str, steps: float) -> tuple[float, float] | None:
        """(ops, FLOPs) of a round of ``stretch`` over FedAvg's at ``steps`` local steps a client; None uncounted."""
        e = self.entry(name, params)
        c = ((e or {}).get("counted") or {}).get("stretches", {}).get(stretch)
        fedavg = ((self.methods.get("fedavg") or {}).get("counted") or {}).get("stretches", {}).get("main")
        if c is None or fedavg is None:
            return None
        s = max(float(steps), 1.0)
        return ((c["ops_fixed"] + s * c["ops_step"]) / (fedavg["ops_fixed"] + s),
                (c["flops_fixed"] + s * c["flops_step"]) / (fedavg["flops_fixed"] + s))

    def factor(self, name: str, params, stretch: str, device_type: str,
               split: tuple[float, float] | None = None, steps: float = 1.0) -> Factor:
        """Stretch ``stretch`` of method ``name`` (run with ``params``) on a ``device_type`` ("cpu"
        or "cuda") device, its clients taking ``steps`` local steps a round; ``split``: (dispatch s,
        arithmetic s) of the priced shape's FedAvg step on that GPU (module docstring)."""
        e = self.entry(name, params)
        how = COUNT_COMMAND.format(name=name)
        if device_type != "cuda":
            cpu = (e or {}).get("cpu") or {}
            v = (cpu.get("stretches") or {}).get(stretch)
            if v is None:
                return Factor(1.0, "unmeasured", "no CPU time ratio: benchmarks/bench_methods.py measures one")
            return Factor(float(v), "cpu time", cpu.get("source", "benchmarks/bench_methods.py"))
        counted = self.ratios(name, params, stretch, steps)
        if counted is None:
            return Factor(1.0, "unmeasured", f"not counted: `{how}`")
        r_ops, r_flops = counted
        if split is None or sum(split) <= 0:
            return Factor(r_ops, "counted", "counted ops ratio (no device model: a host-bound step)")
        t_ops, t_flops = split
        return Factor((t_ops * r_ops + t_flops * r_flops) / (t_ops + t_flops), "counted",
                      "counted ops and FLOPs ratios, weighted by the shape's dispatch/arithmetic split")

    def missing(self, names) -> list[str]:
        """Of method names ``names``, those without counts in the file."""
        return [n for n in names if not ((self.methods.get(n) or {}).get("counted") or {}).get("stretches")]
