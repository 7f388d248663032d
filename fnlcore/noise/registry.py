"""Config name -> noise-model spec class; building specs from config dicts; the README table."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from ..errors import ConfigError
from .specs import (
    AsymmetricNoise,
    CleanNoise,
    FedCorrNoise,
    FedGRNoise,
    FedMLPPartial,
    FedNCLBernoulli,
    FedNCLGaussian,
    FedNoRoHIDN,
    NoiseSpec,
    SymmetricNoise,
)

NOISE_MODELS: dict[str, type[NoiseSpec]] = {
    cls.name: cls
    for cls in (
        CleanNoise,
        FedCorrNoise,
        FedNoRoHIDN,
        FedNCLBernoulli,
        FedNCLGaussian,
        FedGRNoise,
        SymmetricNoise,
        AsymmetricNoise,
        FedMLPPartial,
    )
}


def noise_spec_from_dict(
    d: Mapping[str, Any], num_classes: int | None = None, num_clients: int | None = None
) -> NoiseSpec:
    """Build the spec for ``{"name": ..., **params}``.

    Unknown names and keys, missing required keys and bad values raise
    ConfigError naming them. With ``num_classes`` (and ``num_clients``) the
    dataset-dependent checks run too (map length, num_missing < C, ...).
    """
    if not isinstance(d, Mapping):
        raise ConfigError(f"a noise model must be a mapping with a 'name' key, got {type(d).__name__}")
    if "name" not in d:
        raise ConfigError(f"a noise model needs a 'name' key; valid names: {sorted(NOISE_MODELS)}")
    name = d["name"]
    cls = NOISE_MODELS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ConfigError(f"unknown noise model name {name!r}; valid names: {sorted(NOISE_MODELS)}")
    params = {k: v for k, v in d.items() if k != "name"}
    fields = dataclasses.fields(cls)
    valid = [f.name for f in fields]
    unknown = [k for k in params if k not in valid]
    if unknown:
        raise ConfigError(
            f"noise model {name!r}: unknown key(s) {unknown}; valid keys: {valid or '(none)'}"
        )
    missing = [
        f.name
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in params
    ]
    if missing:
        raise ConfigError(f"noise model {name!r}: missing required key(s) {missing}")
    spec = cls(**params)
    if num_classes is not None:
        spec.check_dataset(num_classes, num_clients)
    return spec


def _param_text(f: dataclasses.Field) -> str:
    if f.default is dataclasses.MISSING:
        return f"`{f.name}` (required)"
    return f"`{f.name}={f.default!r}`"


def _cell(text: str) -> str:
    """Escape what would break a markdown table cell."""
    return text.replace("\n", " ").replace("|", "\\|")


def noise_models_markdown() -> str:
    """A markdown table of every registered noise model for the README."""
    lines = [
        "| name | parameters (defaults) | paper | code≠paper switches |",
        "|---|---|---|---|",
    ]
    for name, cls in NOISE_MODELS.items():
        params = ", ".join(_param_text(f) for f in dataclasses.fields(cls)) or "—"
        switches = "; ".join(f"`{k}`: {v}" for k, v in cls.switches.items()) or "—"
        cells = (f"`{name}`", params, cls.paper, switches)
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"
