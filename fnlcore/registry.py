"""Shared plumbing of the typed registries (partitioners, noise models, methods).

Each registry maps a config name to a frozen dataclass. A config entry
``{"name": ..., **params}`` becomes an instance through :func:`spec_from_dict`,
which names what is wrong: an unknown name (listing the valid ones), an
unknown key (listing the valid keys), a missing required key. Value checks
live in each dataclass's ``__post_init__``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from .errors import ConfigError


def spec_from_dict(kind: str, registry: Mapping[str, type], d: Any) -> Any:
    """Instantiate ``registry[d["name"]]`` with the other keys of ``d``; ``kind`` names it in errors."""
    if not isinstance(d, Mapping):
        raise ConfigError(f"a {kind} must be a mapping with a 'name' key, got {type(d).__name__}")
    if "name" not in d:
        raise ConfigError(f"a {kind} needs a 'name' key; valid names: {sorted(registry)}")
    name = d["name"]
    cls = registry.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ConfigError(f"unknown {kind} name {name!r}; valid names: {sorted(registry)}")
    params = {k: v for k, v in d.items() if k != "name"}
    fields = dataclasses.fields(cls)
    valid = [f.name for f in fields]
    unknown = [k for k in params if k not in valid]
    if unknown:
        raise ConfigError(f"{kind} {name!r}: unknown key(s) {unknown}; valid keys: {valid or '(none)'}")
    missing = [
        f.name
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in params
    ]
    if missing:
        raise ConfigError(f"{kind} {name!r}: missing required key(s) {missing}")
    return cls(**params)


def param_text(f: dataclasses.Field) -> str:
    if f.default is dataclasses.MISSING:
        return f"`{f.name}` (required)"
    return f"`{f.name}={f.default!r}`"


def markdown_table(header: tuple[str, str, str, str], rows: list[tuple[str, type, str, Mapping[str, str]]]) -> str:
    """| name | parameters (defaults) | source | code≠paper switches | for (name, dataclass, source, switches) rows."""
    lines = ["| " + " | ".join(header) + " |", "|---|---|---|---|"]
    for name, cls, source, switches in rows:
        params = ", ".join(param_text(f) for f in dataclasses.fields(cls)) or "—"
        sw = "; ".join(f"`{k}`: {v}" for k, v in switches.items()) or "—"
        cells = (f"`{name}`", params, source, sw)
        lines.append("| " + " | ".join(c.replace("\n", " ").replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"
