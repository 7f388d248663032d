"""Config name -> partitioner spec class; building specs from config dicts; the docs table."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from .specs import PARTITIONERS, PartitionSpec


def partition_spec_from_dict(d: Mapping[str, Any]) -> PartitionSpec:
    """Build the spec for a config entry ``{"name": ..., **params}``.

    An unknown name lists the valid names; an unknown key lists the valid keys
    of that partitioner; a missing required key, a wrong type or a bad value
    raises ConfigError naming the key.
    """
    return PARTITIONERS.from_dict(d)


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
    """A markdown table of every registered partitioner, for docs/partitioners.md."""
    return PARTITIONERS.markdown(("name", "parameters (defaults)", "from", "code≠paper switches"))


__all__ = ["PARTITIONERS", "partition_spec_from_dict", "describe_partitioners", "partitioners_markdown"]
