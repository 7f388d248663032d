"""Canonical, filesystem-safe pieces of slugs: float formatting and short hashes."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np


def fmt_float(x: float) -> str:
    """Shortest round-trip positional form: 0.4 -> '0.4', 1 -> '1.0', 3e-4 -> '0.0003'.

    A minus sign becomes 'm' so that '-' stays the slug separator.
    """
    s = np.format_float_positional(float(x), trim="0")
    return s.replace("-", "m")


def short_hash(obj: Any) -> str:
    """'h' + 6 hex digits of the SHA-256 of the canonical JSON of ``obj``."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return "h" + hashlib.sha256(text.encode()).hexdigest()[:6]
