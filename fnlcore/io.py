"""Atomic writes: an output either appears complete or not at all.

Every artifact is written to a temporary name in the destination directory
and renamed into place (rename is atomic on POSIX within one filesystem), so
a killed job never leaves a half-written file that looks finished.

Files get the permissions a plain ``open()`` would give them (``0666`` less the umask;
folders ``0777`` less the umask), not the private ``0600`` of a temporary file, so
colleagues sharing a results folder can read what a run wrote. A write that fills the
disk, and a parquet file that cannot be read, raise errors naming the file and the fix.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator
import zipfile
import zlib

import numpy as np
import pandas as pd

from .errors import DataError, StorageError


def current_umask() -> int:
    """The process's umask, read without changing it where the system allows
    (``os.umask`` sets a new mask to read the old one: a window other threads would see)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode ``open(path, "w")`` gives a new file: 0666 less the umask."""
    return 0o666 & ~current_umask()


def free_bytes(folder: str | os.PathLike) -> int:
    """Free bytes (for an unprivileged user) on the filesystem holding ``folder`` (or its nearest existing parent)."""
    p = Path(folder).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def ensure_free_space(folder: str | os.PathLike, needed: int, what: str) -> None:
    """Raise :class:`StorageError` naming ``folder``, the needed and the free bytes when ``needed`` does not fit."""
    free = free_bytes(folder)
    if free < needed:
        raise StorageError(
            f"not enough free space in {folder} to write {what}: it needs about {_size(needed)}, "
            f"{_size(free)} are free; free some space there (or move results_dir to a larger disk) and rerun"
        )


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} bytes" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` on success.

    On any exception the temporary file is removed and ``path`` is untouched.
    ``suffix`` keeps writers that infer the format from the extension happy. The file
    ends with the umask's mode (see the module doc); a full disk raises :class:`StorageError`.
    """
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    sfx = suffix if suffix is not None else "".join(dest.suffixes) or ".tmp"
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part" + sfx, dir=dest.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, file_mode())  # after writing: some writers replace the file they were given
        os.replace(tmp_path, dest)
    except BaseException as err:
        # torch's writer reports a full disk as "file write failed" / "unexpected pos": a write
        # error while (before the partial file goes) the disk is all but full counts as one
        full = _disk_full(err) or (isinstance(err, (OSError, RuntimeError)) and _nearly_full(dest.parent))
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        if full:
            raise StorageError(
                f"the disk holding {dest.parent} filled up while writing {dest.name} ({_size(free_bytes(dest.parent))} "
                "free now); free some space there (or move results_dir to a larger disk) and rerun"
            ) from err
        raise


def _nearly_full(folder: Path) -> bool:
    try:
        return free_bytes(folder) < (1 << 20)
    except OSError:
        return False


def _disk_full(err: BaseException) -> bool:
    """ENOSPC/EDQUOT, raised directly or wrapped by a writer (torch reports it as a RuntimeError)."""
    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if isinstance(e, (OSError, RuntimeError)) and ("No space left on device" in str(e) or "Disk quota exceeded" in str(e)):
            return True
        e = e.__cause__ or e.__context__
    return False


def write_parquet(df: pd.DataFrame, path: str | os.PathLike, metadata: dict[bytes, bytes] | None = None) -> None:
    """Write a DataFrame atomically and deterministically (same data -> same bytes); ``metadata``
    joins the schema's key-value metadata (a run's code version, fnlcore.app.train.write_metrics)."""
    with atomic_path(path) as tmp:
        if not metadata:
            df.to_parquet(tmp, index=False, engine="pyarrow", compression="zstd")
            return
        import pyarrow as pa  # lazy: pyarrow only where parquet is read or written
        import pyarrow.parquet as pq  # lazy: pyarrow only where parquet is read or written

        table = pa.Table.from_pandas(df, preserve_index=False)  # what to_parquet(index=False) writes
        pq.write_table(table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata}), tmp,
                       compression="zstd")


def read_parquet(path: str | os.PathLike) -> pd.DataFrame:
    """Read a parquet artifact; a truncated or corrupt file raises :class:`DataError` naming it and the fix."""
    import pyarrow as pa  # lazy: pyarrow only where parquet is read or written

    try:
        return pd.read_parquet(path, engine="pyarrow")
    except (pa.ArrowException, OSError) as err:
        if isinstance(err, FileNotFoundError):
            raise
        raise DataError(
            f"{path}: not a readable parquet file ({err}); it is truncated or corrupt: {rebuild_advice(path)}"
        ) from None


def read_npz(path: str | os.PathLike, keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The arrays ``keys`` of an ``.npz`` artifact (no pickles: object arrays are refused); an empty,
    truncated or corrupt file, or one lacking a key, raises :class:`DataError` naming it and the fix."""

    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in keys if k not in z.files]
            if missing:
                raise ValueError(f"it lacks {', '.join(missing)} (holds {', '.join(z.files) or 'nothing'})")
            return {k: z[k] for k in keys}
    except FileNotFoundError:
        raise
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as err:
        raise DataError(f"{path}: not a readable .npz file ({type(err).__name__}: {err or 'empty'}); it is "
                        f"truncated or corrupt: {rebuild_advice(path)}") from None


def rebuild_advice(path: str | os.PathLike) -> str:
    """The fix for a broken workflow artifact. A plain rerun rebuilds a deleted file only where a
    job that needs it must run anyway: a partition whose noisy labels are present is not rebuilt
    ("Nothing to be done"). ``--forcerun`` names the file: its job runs, then what was made from it."""
    return (f"delete it and rerun with `--forcerun {os.fspath(path)}` added to the snakemake command, "
            "so the workflow builds it again (and what was made from it)")


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
    import matplotlib.pyplot as plt  # lazy: matplotlib only where a figure is drawn

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
