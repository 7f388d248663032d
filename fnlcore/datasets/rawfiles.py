"""Checks of upstream files placed by hand or extracted into a raw folder.

Shared by the on-disk dataset modules (ich, isic, chestxray, clothing1m): which
expected files are missing, the error that names them with the source and the
licence step, safe archive extraction with a completion marker, option parsing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import ConfigError, DataError, MissingManualDataError, StorageError
from ..io import atomic_path, free_bytes
from .base import validate_options
from .download import file_digests, format_bytes, is_disk_full

#: Extraction bound: the files of an archive may add up to at most EXTRACT_MAX_RATIO times the
#: archive's own size, and never less than EXTRACT_MIN_LIMIT (tiny archives of tiny files expand
#: more through tar's 512-byte padding). The archives extracted here (NIH's images_*.tar.gz, ISIC's
#: zip) hold PNG/JPEG images, which do not compress further, so they expand by about 1x: 10x is
#: ample, while a decompression bomb expands by ~1000x. A caller that knows better passes max_bytes.
EXTRACT_MAX_RATIO = 10
EXTRACT_MIN_LIMIT = 16 << 20
_CHUNK = 1 << 20
# What reading a broken archive raises (gzip's BadGzipFile is an OSError).
_READ_ERRORS = (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error, OSError)



def find_missing_files(root: str | os.PathLike, relpaths: Sequence[str] | np.ndarray) -> np.ndarray:
    """Boolean mask: which of ``relpaths`` (relative to ``root``, ``/``-separated) do not exist.

    One ``os.listdir`` per distinct parent folder and a vectorised membership
    test per folder, instead of one ``stat`` per file: a million paths in a
    thousand folders cost a thousand directory reads.
    """
    root = Path(root)
    rel = pd.Series(np.asarray(relpaths, dtype=object), dtype=object)
    missing = np.ones(len(rel), dtype=bool)
    if not len(rel):
        return missing
    parts = rel.str.rpartition("/")
    names = parts[2]
    for parent, idx in parts[0].groupby(parts[0], sort=False).indices.items():
        try:
            present = os.listdir(root / parent if parent else root)
        except (FileNotFoundError, NotADirectoryError):
            continue
        missing[idx] = ~names.iloc[idx].isin(present).to_numpy()
    return missing


def config_key_hint(dataset: str) -> str:
    """How a user points the workflow at a dataset's raw folder (config keys)."""
    return (
        f"set the config key data.datasets.{dataset}.raw_dir to the folder that holds them "
        f"(default: <data.raw_dir>/{dataset})"
    )


def missing_manual_data(
    dataset: str,
    raw_dir: str | os.PathLike,
    missing: Sequence[str],
    *,
    source: str,
    access: str,
    layout: Sequence[str],
) -> MissingManualDataError:
    """A MissingManualDataError that names every missing item, the source, the access step and the fix.

    ``missing``: one line per missing file/folder (already described);
    ``layout``: the expected layout under ``raw_dir``, one line per entry.
    """
    raw = Path(raw_dir)
    lines = [f"dataset {dataset!r} needs files placed by hand in {raw}; missing:"]
    lines += [f"  - {m}" for m in missing]
    lines.append(f"Source: {source}")
    lines.append(f"Access: {access}")
    lines.append("Expected layout:")
    lines += [f"  {raw}/{entry}" for entry in layout]
    lines.append(f"Fix: place the files as above, or {config_key_hint(dataset)}.")
    return MissingManualDataError("\n".join(lines))


def describe_missing_images(
    folder: str, relpaths: np.ndarray, missing: np.ndarray, raw_dir: Path, show: int = 5
) -> str:
    """One line: how many of the expected images in ``folder`` are missing, with the first few names."""
    n_missing, n = int(missing.sum()), len(missing)
    first = ", ".join(str(p).rsplit("/", 1)[-1] for p in np.asarray(relpaths, dtype=object)[missing][:show])
    where = raw_dir / folder
    state = "folder does not exist" if not where.is_dir() else f"{n_missing:,} of {n:,} expected images missing"
    return f"{where}/ ({state}; first missing: {first}{', ...' if n_missing > show else ''})"


def _safe_member(name: str) -> str | None:
    """The normalised relative path of an archive member, or None if it would escape the target."""
    norm = os.path.normpath(name.replace("\\", "/")).replace("\\", "/")
    if norm.startswith("/") or norm == ".." or norm.startswith("../") or ":" in norm.split("/", 1)[0]:
        return None
    return "" if norm == "." else norm


def extraction_marker(raw_dir: str | os.PathLike, archive_name: str) -> Path:
    """Where the 'archive fully extracted' marker of ``archive_name`` lives."""
    return Path(raw_dir) / ".extracted" / f"{archive_name}.json"


def read_extraction_marker(raw_dir: str | os.PathLike, archive_name: str) -> dict[str, Any] | None:
    """The marker's record (archive name, prefix, member count, checksum) or None if not extracted."""
    path = extraction_marker(raw_dir, archive_name)
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def extraction_limit(archive_size: int) -> int:
    """The most bytes an archive of ``archive_size`` bytes may extract to (see EXTRACT_MAX_RATIO)."""
    return max(EXTRACT_MAX_RATIO * archive_size, EXTRACT_MIN_LIMIT)


def extract_archive(
    archive: str | os.PathLike,
    raw_dir: str | os.PathLike,
    prefix: str,
    record: Mapping[str, Any] | None = None,
    *,
    max_bytes: int | None = None,
) -> dict[str, Any]:
    """Extract the members of a .zip/.tar(.gz) under ``prefix`` into ``raw_dir``, once.

    Members keep their paths (``prefix/...``); members outside ``prefix`` are
    skipped; links, devices and paths escaping ``raw_dir`` are refused. Files are
    extracted to a temporary folder and moved into place, then a marker
    (:func:`extraction_marker`) is written atomically: an archive counts as
    extracted only when its marker exists, so an interrupted run re-extracts it.
    ``record`` is stored in the marker (e.g. the archive's checksum). Returns the
    marker's record.

    Bounds: the archive's members must add up to at most ``max_bytes`` (default
    :func:`extraction_limit` of its size), checked on the sizes the archive
    declares before anything is written and again on the bytes actually written
    (a member yielding more than it declares is refused). Before writing, the
    sizes of the members to extract are compared with the free space of
    ``raw_dir``. Failures: a corrupt archive raises DataError and is moved aside
    to ``<name>.corrupt`` (so the next run downloads it again); an archive over
    the bound raises DataError and stays in place; a full disk (ENOSPC/EDQUOT, or
    too little free space up front) raises StorageError naming the folder, the
    bytes needed and free, and keeps the archive. No failure leaves a marker or
    a half-extracted file.
    """
    archive, raw = Path(archive), Path(raw_dir)
    done = read_extraction_marker(raw, archive.name)
    if done is not None:
        return done
    want = prefix.strip("/") + "/"
    members: list[tuple[str, int, Any]] = []
    needed = 0
    tmp: Path | None = None
    try:
        try:
            limit = max_bytes if max_bytes is not None else extraction_limit(archive.stat().st_size)
            with contextlib.ExitStack() as stack:
                members = _list_members(archive, want, limit, stack)
                if not members:
                    raise DataError(f"{archive}: no files under {want!r} in the archive; is this the right file?")
                needed = sum(size for _, size, _ in members)
                _check_room(archive, raw, needed)
                try:
                    tmp = Path(tempfile.mkdtemp(prefix=f".{archive.name}.", suffix=".extracting", dir=raw))
                except OSError as exc:
                    raise _OutputError(exc) from exc
                written = 0
                for rel, size, open_member in members:
                    with open_member() as src:
                        written = _write_member(src, tmp / rel, size, written, archive, rel, limit)
        except _OutputError as exc:
            if tmp is not None:  # first, so the free space reported counts it back
                shutil.rmtree(tmp, ignore_errors=True)
                tmp = None
            raise _write_failure(archive, raw, needed, exc.error) from None
        except _READ_ERRORS as exc:
            bad = archive.with_name(archive.name + ".corrupt")
            if archive.exists():
                os.replace(archive, bad)
            raise DataError(
                f"{archive}: the archive is corrupt or truncated ({type(exc).__name__}: {exc}); "
                f"it was moved aside to {bad}. Fix: run again to download it afresh "
                "(or place a good copy there by hand)."
            ) from None
        _move_tree(tmp / want.rstrip("/"), raw / want.rstrip("/"))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    rec = {"archive": archive.name, "prefix": want.rstrip("/"), "members": len(members), **dict(record or {})}
    marker = extraction_marker(raw, archive.name)
    with atomic_path(marker) as t:
        t.write_text(json.dumps(rec, indent=2, sort_keys=True) + "\n")
    return rec


class _OutputError(Exception):
    """Writing the extracted files failed (as opposed to reading the archive): never 'corrupt archive'."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


def _list_members(archive: Path, want: str, limit: int, stack: contextlib.ExitStack) -> list[tuple[str, int, Any]]:
    """(relative path, declared size, opener) of each file to extract, after the safety and size checks.

    The declared sizes of all file members (inside ``prefix`` or not) count toward ``limit``; a tar is
    checked member by member as its headers are read, so a bomb stops before its data is decompressed.
    Listing a .tar.gz costs one decompression pass more than extracting it: the price of knowing the
    total before writing anything.
    """
    members: list[tuple[str, int, Any]] = []
    total = 0
    if zipfile.is_zipfile(archive):
        zf = stack.enter_context(zipfile.ZipFile(archive))
        for info in zf.infolist():
            rel = _safe_member(info.filename)
            if rel is None:
                raise DataError(f"{archive}: member {info.filename!r} points outside the folder; refused")
            if info.is_dir():
                continue
            total = _count_toward_limit(archive, total, info.file_size, limit)
            if not rel.startswith(want):
                continue
            if (info.external_attr >> 16) & 0o170000 == 0o120000:
                raise DataError(f"{archive}: member {info.filename!r} is a symbolic link; refused")
            members.append((rel, info.file_size, lambda info=info: zf.open(info)))
        return members
    tf = stack.enter_context(tarfile.open(archive, "r:*"))
    for member in tf:
        rel = _safe_member(member.name)
        if rel is None:
            raise DataError(f"{archive}: member {member.name!r} points outside the folder; refused")
        if member.isdir():
            continue
        if member.isfile():
            total = _count_toward_limit(archive, total, member.size, limit)
        if not rel.startswith(want):
            continue
        if not member.isfile():
            raise DataError(f"{archive}: member {member.name!r} is not a regular file; refused")
        members.append((rel, member.size, lambda member=member: tf.extractfile(member)))
    return members


def _count_toward_limit(archive: Path, total: int, size: int, limit: int) -> int:
    total += size
    if total > limit:
        raise DataError(
            f"{archive}: refused to extract: its files add up to more than its limit of {format_bytes(limit)} "
            f"(the archive has {format_bytes(archive.stat().st_size)}; the default limit is {EXTRACT_MAX_RATIO}x "
            f"that, at least {format_bytes(EXTRACT_MIN_LIMIT)}). Image archives do not expand like that: this is "
            "a decompression bomb or the wrong file. Nothing was extracted and the archive is left in place. "
            f"Fix: delete {archive} and download it again from a trusted source (a mirror: "
            "data.datasets.<dataset>.mirrors), or, if you trust it, extract it yourself into "
            f"{archive.parent} (files already in place are used as they are)."
        )
    return total


def _write_member(src: Any, dest: Path, size: int, written: int, archive: Path, rel: str, limit: int) -> int:
    """Copy one member to ``dest``, enforcing its declared size and the archive's limit; the new total.

    Errors of the output side (mkdir, open, write, close) become _OutputError; errors reading
    ``src`` propagate as they are (a corrupt archive).
    """
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        out = open(dest, "wb")
    except OSError as exc:
        raise _OutputError(exc) from exc
    try:
        copied = 0
        while chunk := src.read(_CHUNK):
            copied += len(chunk)
            written += len(chunk)
            # Guards against an archive whose data does not match its headers (the listing trusted them).
            if copied > size or written > limit:
                raise DataError(
                    f"{archive}: member {rel!r} yields more than the {format_bytes(size)} it declares"
                    + (f" and the archive more than its limit of {format_bytes(limit)}" if written > limit else "")
                    + "; refused (a malformed archive or a decompression bomb). The partial output was removed "
                    f"and the archive is left in place. Fix: delete {archive} and download it again from a "
                    "trusted source."
                )
            try:
                out.write(chunk)
            except OSError as exc:
                raise _OutputError(exc) from exc
    finally:
        try:
            out.close()  # a buffered or NFS write may only fail here
        except OSError as exc:
            raise _OutputError(exc) from exc
    return written


def _free(folder: Path) -> int | None:
    try:
        return free_bytes(folder)
    except OSError:
        return None


def _check_room(archive: Path, raw: Path, needed: int) -> None:
    """StorageError before writing anything when the files to extract cannot fit in ``raw``."""
    free = _free(raw)
    if free is not None and needed > free:
        raise StorageError(
            f"{raw}: not enough free space to extract {archive.name}: its files need {format_bytes(needed)}, "
            f"{format_bytes(free)} are free. Nothing was extracted and the archive {archive} is kept. "
            f"{_ROOM_FIX}"
        )


_ROOM_FIX = (
    "Fix: free space on that disk (or move the raw folder to a larger disk and point data.raw_dir, or "
    "data.datasets.<dataset>.raw_dir, at it) and run again; the archive is not downloaded again."
)


def _write_failure(archive: Path, raw: Path, needed: int, error: OSError) -> Exception:
    """The error for a failed write while extracting: a full disk is a StorageError, anything else a DataError."""
    if is_disk_full(error):
        free = _free(raw)
        return StorageError(
            f"{raw}: the disk filled up (or the quota ran out) while extracting {archive.name} ({error.strerror}): "
            f"its files need {format_bytes(needed)}, "
            + (f"{format_bytes(free)} are free now" if free is not None else "the free space is unknown")
            + f". The partial output was removed; the archive {archive} is kept (it is not corrupt). {_ROOM_FIX}"
        )
    return DataError(
        f"{raw}: cannot write the files of {archive.name} ({type(error).__name__}: {error}); the partial output "
        f"was removed and the archive {archive} is kept. Fix: make {raw} writable (or point data.raw_dir at a "
        "writable folder) and run again."
    )


def _move_tree(src: Path, dest: Path) -> None:
    """Move the files of ``src`` into ``dest`` (one rename when ``dest`` is new)."""
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dest)
        return
    for dirpath, _, files in os.walk(src):
        target = dest / os.path.relpath(dirpath, src)
        target.mkdir(parents=True, exist_ok=True)
        for f in files:
            os.replace(os.path.join(dirpath, f), target / f)


def parse_options(dataset: str, options_cls: type, options: Mapping[str, Any] | None) -> Any:
    """Build a dataset's frozen options dataclass from config options (unknown keys -> ConfigError)."""
    merged = validate_options(dataset, options, asdict(options_cls()))
    try:
        return options_cls(**merged)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"dataset {dataset!r}: {exc}") from None


def sha256_label(path: str | os.PathLike) -> str:
    """``"sha256:<hex>"`` of a file (recorded in meta where no published checksum exists)."""
    return "sha256:" + file_digests(path, ("sha256",))["sha256"]


# -- the researcher's own subset and image size -----------------------------------------------

SUBSET_ID_COLUMNS = ("id", "image_id", "image")


def read_id_subset(path: str | os.PathLike) -> tuple[np.ndarray, dict[str, Any]]:
    """The IDs a subset file lists, and its provenance (absolute path, sha256, number of IDs).

    The file is a CSV with a header and a column ``id`` (or ``image_id`` /
    ``image``, any case), e.g. a trimmed copy of FedNoRo's ``train_ICH.csv``;
    other columns are ignored. A repeated ID counts once.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"option subset: {p} is not a file; give the path of a CSV with a column 'id'")
    try:
        frame = pd.read_csv(p, dtype=str)
    except (OSError, ValueError, pd.errors.ParserError) as exc:
        raise DataError(f"{p}: cannot be read as a CSV of IDs ({exc})") from None
    by_lower = {str(c).strip().lower(): c for c in frame.columns}
    column = next((by_lower[c] for c in SUBSET_ID_COLUMNS if c in by_lower), None)
    if column is None:
        raise DataError(
            f"{p}: no ID column; expected a header with one of {list(SUBSET_ID_COLUMNS)}, found {list(frame.columns)}"
        )
    ids = frame[column].dropna().str.strip()
    ids = ids[ids != ""].drop_duplicates().to_numpy(dtype=object)
    if not len(ids):
        raise DataError(f"{p}: column {column!r} lists no IDs")
    provenance = {"file": str(p.resolve()), "sha256": sha256_label(p).split(":", 1)[1], "n_ids": int(len(ids))}
    return ids, provenance


def keep_subset(index: pd.DataFrame, ids: np.ndarray, provenance: dict[str, Any], id_column: str = "image_id") -> tuple[pd.DataFrame, dict[str, Any]]:
    """The rows of ``index`` whose ``id_column`` is in ``ids``, in their order, renumbered per split.

    Every listed ID must be a row of the index (a typo would otherwise shrink
    the data silently) and each split must keep a row. The kept rows carry
    ``full_sample_id`` (their sample_id in the full set). Returns the new index
    and the provenance extended with the number of rows kept per split.
    """
    known = index[id_column].isin(pd.Index(ids))
    unknown = pd.Index(ids).difference(pd.Index(index[id_column]))
    if len(unknown):
        first = ", ".join(map(str, unknown[:5]))
        raise DataError(
            f"{provenance['file']}: {len(unknown):,} of {len(ids):,} IDs are not in the dataset's label files "
            f"(first: {first}); fix the subset file"
        )
    kept = index.loc[known].copy()
    counts = {}
    for split in ("train", "test"):
        rows = (kept["split"] == split).to_numpy()
        counts[f"n_{split}"] = int(rows.sum())
        if not rows.any():
            raise DataError(f"{provenance['file']}: the subset keeps no {split} sample; list IDs of both splits")
    kept["full_sample_id"] = kept["sample_id"].to_numpy(np.int64)
    kept["sample_id"] = kept.groupby("split", sort=False).cumcount().to_numpy(np.int64)
    return kept.reset_index(drop=True), {**provenance, "kept": counts}


def image_size_setting(value: Any) -> tuple[int, int] | None:
    """The option ``image_size``: None (the files' own size), N (N×N) or [H, W]; anything else is a ConfigError."""
    if value is None:
        return None
    if isinstance(value, bool):
        pass
    elif isinstance(value, int) and value > 0:
        return (value, value)
    elif isinstance(value, (list, tuple)) and len(value) == 2 and all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value
    ):
        return (int(value[0]), int(value[1]))
    raise ConfigError(f"option image_size must be omitted (the files' own size), N or [H, W] (positive integers), got {value!r}")


def file_image_size(path: str | os.PathLike) -> tuple[int, int]:
    """(H, W) of an image file, from its header (no decoding)."""
    from PIL import Image  # lazy: PIL only where image files are decoded

    try:
        with Image.open(path) as im:
            w, h = im.size
    except OSError as exc:
        raise DataError(f"cannot read image {path}: {exc}; re-place it") from None
    return (int(h), int(w))
