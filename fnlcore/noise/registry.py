"""Config name -> noise-model spec class; building specs from config dicts; the docs/ table."""

from __future__ import annotations

from typing import Any, Mapping

from .specs import NOISE_MODELS, NoiseSpec


def noise_spec_from_dict(
    d: Mapping[str, Any], num_classes: int | None = None, num_clients: int | None = None
) -> NoiseSpec:
    """Build the spec for ``{"name": ..., **params}``.

    Unknown names and keys, missing required keys and bad values raise
    ConfigError naming them. With ``num_classes`` (and ``num_clients``) the
    dataset-dependent checks run too (map length, num_missing < C, ...).
    """
    spec = NOISE_MODELS.from_dict(d)
    if num_classes is not None:
        spec.check_dataset(num_classes, num_clients)
    return spec


def noise_models_markdown() -> str:
    """A markdown table of every registered noise model for docs/noise-models.md."""
    return NOISE_MODELS.markdown(("name", "parameters (defaults)", "paper", "code≠paper switches"))
