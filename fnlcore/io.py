"""Atomic writes: an output either appears complete or not at all.

Every artifact is written to a temporary name in the destination directory
and renamed into place (rename is atomic on POSIX within one filesystem), so
a killed job never leaves a half-written file that looks finished.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pandas as pd


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` on success.

    On any exception the temporary file is removed and ``path`` is untouched.
    ``suffix`` keeps writers that infer the format from the extension happy.
    """
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    sfx = suffix if suffix is not None else "".join(dest.suffixes) or ".tmp"
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part" + sfx, dir=dest.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


def write_parquet(df: pd.DataFrame, path: str | os.PathLike) -> None:
    """Write a DataFrame atomically and deterministically (same data -> same bytes)."""
    with atomic_path(path) as tmp:
        df.to_parquet(tmp, index=False, engine="pyarrow", compression="zstd")


def read_parquet(path: str | os.PathLike) -> pd.DataFrame:
    return pd.read_parquet(path, engine="pyarrow")


def write_csv(df: pd.DataFrame, path: str | os.PathLike, **kwargs: Any) -> None:
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=False, **kwargs)


def write_json(obj: Any, path: str | os.PathLike) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def write_npz(path: str | os.PathLike, **arrays: np.ndarray) -> None:
    """Uncompressed npz (fast to memory-map-load); atomic."""
    with atomic_path(path, suffix=".npz") as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)


def save_figure(fig: Any, path: str | os.PathLike, **kwargs: Any) -> None:
    """Save a matplotlib figure atomically and close it."""
    import matplotlib.pyplot as plt

    dest = Path(path)
    with atomic_path(dest, suffix=dest.suffix) as tmp:
        fig.savefig(tmp, format=dest.suffix.lstrip(".") or "png", **kwargs)
    plt.close(fig)


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
