"""Config name -> partitioner spec class; building specs from config dicts; the docs table."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from ..errors import ConfigError
from .specs import (
    BernoulliDirichletPartition,
    DirichletNiidBenchPartition,
    FedMLPEqualPartition,
    IIDNiidBenchPartition,
    IIDPartition,
    PartitionSpec,
    QuantitySkewPartition,
)

PARTITIONERS: dict[str, type[PartitionSpec]] = {
    cls.name: cls
    for cls in (
        IIDPartition,
        BernoulliDirichletPartition,
        IIDNiidBenchPartition,
        DirichletNiidBenchPartition,
        QuantitySkewPartition,
        FedMLPEqualPartition,
    )
}


def partition_spec_from_dict(d: Mapping[str, Any]) -> PartitionSpec:
    """Build the spec for a config entry ``{"name": ..., **params}``.

    An unknown name lists the valid names; an unknown key lists the valid keys
    of that partitioner; a missing required key, a wrong type or a bad value
    raises ConfigError naming the key.
    """
    if not isinstance(d, Mapping):
        raise ConfigError(f"a partition must be a mapping with a 'name' key, got {type(d).__name__}")
    if "name" not in d:
        raise ConfigError(f"a partition needs a 'name' key; valid names: {sorted(PARTITIONERS)}")
    name = d["name"]
    cls = PARTITIONERS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ConfigError(f"unknown partition name {name!r}; valid names: {sorted(PARTITIONERS)}")
    params = {k: v for k, v in d.items() if k != "name"}
    fields = dataclasses.fields(cls)
    valid = [f.name for f in fields]
    unknown = [k for k in params if k not in valid]
    if unknown:
        raise ConfigError(f"partition {name!r}: unknown key(s) {unknown}; valid keys: {valid}")
    missing = [f.name for f in fields if f.default is dataclasses.MISSING and f.name not in params]
    if missing:
        raise ConfigError(f"partition {name!r}: missing required key(s) {missing}")
    return cls(**params)


def describe_partitioners() -> list[dict[str, Any]]:
    """One record per partitioner: name, paper, class, parameters (name, type, default, doc), switches."""
    out = []
    for name, cls in PARTITIONERS.items():
        params = [
            {
                "name": f.name,
                "type": str(f.type),
                "default": None if f.default is dataclasses.MISSING else f.default,
                "required": f.default is dataclasses.MISSING,
                "doc": f.metadata.get("doc", ""),
            }
            for f in dataclasses.fields(cls)
        ]
        out.append(
            {
                "name": name,
                "paper": cls.paper,
                "class": cls.__name__,
                "uses_labels": cls.uses_labels,
                "params": params,
                "switches": dict(cls.switches),
            }
        )
    return out


def partitioners_markdown() -> str:
    """A markdown table of every registered partitioner, for the README/docs."""
    lines = [
        "| name | parameters (defaults) | from | code≠paper switches |",
        "|---|---|---|---|",
    ]
    for rec in describe_partitioners():
        params = ", ".join(
            f"`{p['name']}` (required)" if p["required"] else f"`{p['name']}={p['default']!r}`" for p in rec["params"]
        )
        switches = "; ".join(f"`{k}`: {v}" for k, v in rec["switches"].items()) or "—"
        cells = (f"`{rec['name']}`", params, rec["paper"], switches)
        lines.append("| " + " | ".join(c.replace("\n", " ").replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


__all__ = ["PARTITIONERS", "partition_spec_from_dict", "describe_partitioners", "partitioners_markdown"]
