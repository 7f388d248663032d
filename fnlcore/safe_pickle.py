"""Unpickling with an allow-list: the published files some papers ship as pickles (index sets, label
arrays) are read without letting a file name any other global, so no code in them can run."""

from __future__ import annotations

import pickle
from typing import Any


class AllowListUnpickler(pickle.Unpickler):
    """Builds only the globals of ``allowed`` ((module, name) -> the object); refuses every other."""

    allowed: dict[tuple[str, str], Any] = {}

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self.allowed[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refusing to load global {module}.{name}") from None
