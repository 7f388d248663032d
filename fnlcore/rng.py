"""Random-number conventions.

The project's rule (DESIGN.md "Fidelity"): a generator function called with
seed ``s`` returns what the official code returns when it runs right after
``np.random.seed(s)`` (and ``random.seed(s)`` where it uses Python's
``random``). ``np.random.RandomState(s)`` is bit-identical to the legacy global
state after ``np.random.seed(s)``, so every generator here takes a private
RandomState and never touches global state.

Partition, noise and training seeds are always separate arguments.
"""

from __future__ import annotations

import random

import numpy as np


def legacy_rng(seed: int) -> np.random.RandomState:
    """The state ``np.random.seed(seed)`` would leave, as a private object."""
    return np.random.RandomState(int(seed))


def python_rng(seed: int) -> random.Random:
    """The state ``random.seed(seed)`` would leave, as a private object."""
    return random.Random(int(seed))
