"""Label and index files published in the official repositories, pinned and checked.

Two papers ship files that fix their experiments beyond what the raw data says:

* FedNoRo (GitHub ``wnn2000/FedNoRo``): ``data/train_ICH.csv`` and
  ``data/test_ICH.csv`` (the single-label ICH subset and its 7:3 split; row
  order drives the partition) and ``data/ICH_softlabel.csv`` (soft labels that
  drive the H-IDN noise generator; fednoro.md §1.1, §3).
* FedMLP (GitHub ``szbonaldo/FedMLP``): ``iid-dictusers/ICH_1037_55000.npy``
  and ``iid-dictusers/ChestXray14_1037_85000.npy`` (the client index lists, a
  pickled ``dict`` client -> ``set``/``list`` of train-CSV row positions;
  fedmlp.md §3).

Each is a :class:`OfficialFile`: a :class:`RemoteFile` at a pinned commit plus
how its content is checked. Where the publisher's bytes are known here they are
pinned by sha256 (``fetch`` checks them); where they are not (the soft labels,
the ``.npy`` files) the *content* is checked after loading: shape/ranges for
the soft labels, and for the index files the sha256 of a canonical CSV export
of the client lists (see :func:`client_index_export`).

The ``.npy`` index files are pickles. They are read with a restricted
unpickler that only builds numpy arrays/scalars and Python containers, so a
tampered file cannot run code even before its content check.

The last section holds the checks every on-disk dataset module shares for
upstream files in a raw folder: vectorised existence checks, the
MissingManualDataError message, once-only safe archive extraction, options.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import shutil
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..assignment import ClientAssignment
from ..errors import ChecksumError, ConfigError, DataError, MissingManualDataError
from ..io import atomic_path
from .base import validate_options
from .download import RemoteFile, fetch, file_digests

__all__ = [
    "FEDNORO_REPO",
    "FEDNORO_COMMIT",
    "FEDMLP_REPO",
    "FEDMLP_COMMIT",
    "ICH_CLASS_COLUMNS",
    "OfficialFile",
    "OFFICIAL_FILES",
    "official_file",
    "fetch_official",
    "read_fednoro_ich_csv",
    "read_fednoro_softlabels",
    "read_client_index_npy",
    "client_index_export",
    "client_index_sha256",
    "check_client_index_content",
    "load_fedmlp_clients",
    "fedmlp_assignment",
    "find_missing_files",
    "missing_manual_data",
    "describe_missing_images",
    "config_key_hint",
    "extract_archive",
    "extraction_marker",
    "read_extraction_marker",
    "parse_options",
    "sha256_label",
]

# Pinned commits (full hashes): commits at which these files exist in the
# repositories. The specs name later HEADs (FedNoRo 6719ad7, FedMLP 2ad28b8);
# the FedNoRo CSVs at the pin have the size and content of the spec fixtures
# taken at HEAD, and their sha256 pins the bytes whatever the commit. That
# ICH_softlabel.csv exists at the FedNoRo pin is inferred (the maintainer
# points to it since January 2024, FedNoRo issue #3), not verified here.
FEDNORO_REPO = "wnn2000/FedNoRo"
FEDNORO_COMMIT = "d658f4c3986198fa200933ef47d0290f00b6706e"
FEDMLP_REPO = "szbonaldo/FedMLP"
FEDMLP_COMMIT = "0b7fbe7698fcb053e243ada8f850776f6bab725a"

ICH_CLASS_COLUMNS = ("epidural", "intraparenchymal", "intraventricular", "subarachnoid", "subdural")
_FEDNORO_ICH_HEADER = ("id",) + ICH_CLASS_COLUMNS
_INDEX_EXPORT_HEADER = "client_id,position_in_client_list,train_csv_row_index"


def _raw_url(repo: str, commit: str, path: str) -> str:
    return f"https://raw.githubusercontent.com/{repo}/{commit}/{path}"


@dataclass(frozen=True)
class OfficialFile:
    """One published label/index file.

    ``remote`` carries the pinned URL and, where known, the sha256 of the
    published bytes (checked by :func:`~fnlcore.datasets.download.fetch`).
    ``content_sha256`` is the sha256 of the canonical export of the loaded
    content, for files whose byte checksum cannot be known here.
    ``rows`` is the expected number of data rows (CSV files).
    """

    key: str
    remote: RemoteFile
    repo: str
    commit: str
    path: str
    description: str
    rows: int | None = None
    content_sha256: str | None = None


def _fednoro(key: str, path: str, description: str, *, sha256: str | None, size: int | None, rows: int) -> OfficialFile:
    remote = RemoteFile(
        filename=path.rsplit("/", 1)[-1],
        urls=(_raw_url(FEDNORO_REPO, FEDNORO_COMMIT, path),),
        sha256=sha256,
        size=size,
    )
    return OfficialFile(key, remote, FEDNORO_REPO, FEDNORO_COMMIT, path, description, rows=rows)


def _fedmlp(key: str, path: str, description: str, *, content_sha256: str) -> OfficialFile:
    remote = RemoteFile(filename=path.rsplit("/", 1)[-1], urls=(_raw_url(FEDMLP_REPO, FEDMLP_COMMIT, path),))
    return OfficialFile(key, remote, FEDMLP_REPO, FEDMLP_COMMIT, path, description, content_sha256=content_sha256)


# The sha256 values of the FedNoRo CSVs were computed from byte-identical copies
# of the published files (the regression fixtures fednoro_{train,test}_ICH.csv).
# The content hashes of the FedMLP index files are sha256 of the canonical LF
# CSV export (client_index_export) of the published client lists, computed from
# the fixtures fedmlp_{ICH,ChestXray14}_client_indices.csv (the fixtures are
# stored with CRLF line ends, so their raw-byte hashes differ; the content is the same).
OFFICIAL_FILES: dict[str, OfficialFile] = {
    f.key: f
    for f in (
        _fednoro(
            "fednoro_ich_train",
            "data/train_ICH.csv",
            "FedNoRo single-label ICH training labels (47,578 rows, one-hot, row order = partition order)",
            sha256="a0d3c65c1fc15375ea85e8bec2ecc5bea0c7e7c8052d89aa71a2a2563d29d969",
            size=1_094_362,
            rows=47_578,
        ),
        _fednoro(
            "fednoro_ich_test",
            "data/test_ICH.csv",
            "FedNoRo single-label ICH test labels (20,391 rows, one-hot)",
            sha256="7460ffbb11bae3dc9bae9509bf325f5deb8dbf8963b2e1962b8dac5db5a2ec47",
            size=469_061,
            rows=20_391,
        ),
        _fednoro(
            "fednoro_ich_softlabel",
            "data/ICH_softlabel.csv",
            "FedNoRo ICH soft labels for H-IDN noise (rows aligned with train_ICH.csv, columns 1..5 = "
            "class probabilities); byte checksum unknown here, content is checked instead",
            sha256=None,
            size=None,
            rows=47_578,
        ),
        _fedmlp(
            "fedmlp_ich_clients",
            "iid-dictusers/ICH_1037_55000.npy",
            "FedMLP ICH client index lists (5 clients x 5,000 rows of train_dataset_ICH.csv)",
            content_sha256="a0295dc362fc7170f4e4781cd89563f081570a73a52f5fba8f90a8398a949a0d",
        ),
        _fedmlp(
            "fedmlp_chestxray14_clients",
            "iid-dictusers/ChestXray14_1037_85000.npy",
            "FedMLP ChestXray14 client index lists (8 clients x 5,889 rows of the train CSV)",
            content_sha256="308cf7e69620ac9dfa9ae9063717a03bb8c1d384aad17a6c3dee037935f695e3",
        ),
    )
}


def official_file(key: str) -> OfficialFile:
    """The table entry for ``key``; unknown keys raise ConfigError listing the valid ones."""
    try:
        return OFFICIAL_FILES[key]
    except KeyError:
        raise ConfigError(f"unknown official file {key!r}; valid keys: {', '.join(sorted(OFFICIAL_FILES))}") from None


def fetch_official(
    key: str,
    dest_dir: str | os.PathLike,
    mirrors: Sequence[str] = (),
    timeout: float = 60.0,
    entry: OfficialFile | None = None,
) -> Path:
    """Download (or reuse) an official file into ``dest_dir`` and check it; return its path.

    Files with a pinned sha256 are checked by ``fetch``. Files without one get
    their content checked here (soft labels: rows and probability columns;
    index files: content hash); a file that fails is moved aside to
    ``<name>.corrupt`` (so the next run downloads it again and nothing placed
    by hand is lost) and ChecksumError/DataError is raised.
    ``entry`` overrides the table entry (tests serve small stand-ins this way).
    """
    entry = entry or official_file(key)
    path = fetch(entry.remote, dest_dir, mirrors=mirrors, timeout=timeout)
    if entry.remote.sha256 or entry.remote.md5:
        return path
    check = _CONTENT_CHECKS.get(_kind(entry))
    if check is not None:
        try:
            check(path, entry)
        except DataError:
            bad = path.with_name(path.name + ".corrupt")
            os.replace(path, bad)
            raise
    return path


def _kind(entry: OfficialFile) -> str:
    return "npy" if entry.remote.filename.endswith(".npy") else "softlabel"


# -- FedNoRo CSVs ------------------------------------------------------------


def read_fednoro_ich_csv(path: str | os.PathLike, expected_rows: int | None = None) -> pd.DataFrame:
    """Read FedNoRo's ``train_ICH.csv``/``test_ICH.csv`` verbatim, in file order.

    Returns the columns ``id`` (str) and ``label`` (int64 class index = argmax of
    the five one-hot columns, FedNoRo §1.1). Raises DataError naming the file if
    the header differs, a row is not exactly one-hot, or the row count is wrong.
    """
    p = Path(path)
    try:
        df = pd.read_csv(p, dtype={"id": str})
    except (OSError, ValueError, pd.errors.ParserError) as exc:
        raise DataError(f"{p}: cannot be read as FedNoRo's ICH label CSV ({exc})") from None
    if tuple(df.columns) != _FEDNORO_ICH_HEADER:
        raise DataError(
            f"{p}: header is {','.join(map(str, df.columns))!r}, expected {','.join(_FEDNORO_ICH_HEADER)!r} "
            "(FedNoRo's data/train_ICH.csv / test_ICH.csv); delete the file and fetch it again"
        )
    onehot = df.loc[:, list(ICH_CLASS_COLUMNS)].to_numpy()
    if not np.isin(onehot, (0, 1)).all() or not (onehot.sum(axis=1) == 1).all():
        bad = int(np.flatnonzero(~(np.isin(onehot, (0, 1)).all(axis=1) & (onehot.sum(axis=1) == 1)))[0])
        raise DataError(f"{p}: data row {bad} is not one-hot over {ICH_CLASS_COLUMNS}; the file is not FedNoRo's")
    if expected_rows is not None and len(df) != expected_rows:
        raise DataError(f"{p}: {len(df)} data rows, expected {expected_rows}; the file is truncated or another version")
    return pd.DataFrame({"id": df["id"].to_numpy(dtype=object), "label": onehot.argmax(axis=1).astype(np.int64)})


def read_fednoro_softlabels(path: str | os.PathLike, expected_rows: int = 47_578, num_classes: int = 5) -> np.ndarray:
    """Soft labels of ``ICH_softlabel.csv``: float64 (rows, 5), row i = train_ICH.csv row i.

    FedNoRo reads ``df.iloc[:, 1:n_classes+1]`` (column 0 is an identifier), so
    that is what is returned. No checksum of this file is known here, so the
    content is validated instead: the row count, at least ``1 + num_classes``
    columns, finite values in [0, 1]. Raises DataError naming the file otherwise.
    """
    p = Path(path)
    try:
        df = pd.read_csv(p)
    except (OSError, ValueError, pd.errors.ParserError) as exc:
        raise DataError(f"{p}: cannot be read as FedNoRo's ICH_softlabel.csv ({exc})") from None
    if df.shape[1] < 1 + num_classes:
        raise DataError(f"{p}: {df.shape[1]} columns, expected an id column and {num_classes} probability columns")
    if len(df) != expected_rows:
        raise DataError(
            f"{p}: {len(df)} rows, expected {expected_rows} (one per row of train_ICH.csv); "
            "the file is truncated or another version; delete it and fetch it again"
        )
    probs = df.iloc[:, 1 : num_classes + 1]
    try:
        values = probs.to_numpy(dtype=np.float64)
    except (TypeError, ValueError):
        raise DataError(f"{p}: columns 1..{num_classes} must be numeric class probabilities") from None
    if not np.isfinite(values).all() or values.min() < 0 or values.max() > 1:
        raise DataError(f"{p}: columns 1..{num_classes} must be probabilities in [0, 1]")
    return values


def _check_softlabel(path: Path, entry: OfficialFile) -> None:
    read_fednoro_softlabels(path, expected_rows=entry.rows or 47_578)


# -- FedMLP client index files -------------------------------------------------


# The only globals a numpy pickle of a dict of sets/lists of ints needs. numpy 1.x
# wrote ``numpy.core.*``; numpy 2 names the same functions ``numpy._core.*``.
def _allowed_globals() -> dict[tuple[str, str], Any]:
    mu = np._core.multiarray
    table: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("builtins", "set"): set,
        ("builtins", "frozenset"): frozenset,
        ("builtins", "list"): list,
        ("builtins", "dict"): dict,
        ("builtins", "tuple"): tuple,
        ("builtins", "int"): int,
        ("__builtin__", "set"): set,
        ("__builtin__", "frozenset"): frozenset,
        ("__builtin__", "int"): int,
    }
    for mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
        table[(mod, "_reconstruct")] = mu._reconstruct
        table[(mod, "scalar")] = mu.scalar
    return table


class _IndexUnpickler(pickle.Unpickler):
    """Unpickler that refuses every global outside the allow-list (no code can run)."""

    _allowed = _allowed_globals()

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refusing to load global {module}.{name}") from None


def read_client_index_npy(path: str | os.PathLike) -> list[np.ndarray]:
    """Client index lists of a FedMLP/FedCorr-style ``dict_users`` ``.npy`` file.

    The file is ``np.save`` of a dict ``{client: set or list of row indices}``.
    Client ``k``'s array keeps the iteration order of its collection as the
    official code sees it after ``np.load(..., allow_pickle=True)`` (a set is
    rebuilt by unpickling exactly as ``np.load`` rebuilds it), because later
    random draws follow that order. Keys must be 0..K-1. Raises DataError naming
    the file on any other layout or on a pickle that needs anything but numpy
    arrays/scalars and Python containers.
    """
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            version = np.lib.format.read_magic(fh)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(fh)
            elif version == (2, 0):
                shape, _, dtype = np.lib.format.read_array_header_2_0(fh)
            else:
                raise ValueError(f"unsupported .npy format version {version}")
            if dtype != np.dtype(object) or shape != ():
                raise ValueError(
                    f"expected a pickled object (dtype object, shape ()), found dtype {dtype} shape {shape}"
                )
            obj = _IndexUnpickler(fh, encoding="latin1").load()
    except (OSError, ValueError, EOFError, pickle.UnpicklingError, AttributeError, TypeError, IndexError) as exc:
        raise DataError(f"{p}: not a client index file (a pickled dict of index sets): {exc}") from None
    if isinstance(obj, np.ndarray):
        obj = obj.item() if obj.shape == () else obj
    if not isinstance(obj, dict):
        raise DataError(f"{p}: expected a dict client -> indices, found {type(obj).__name__}")
    keys = sorted(int(k) for k in obj)
    if keys != list(range(len(obj))):
        raise DataError(f"{p}: client keys must be 0..{len(obj) - 1}, found {keys[:10]}")
    by_int = {int(k): v for k, v in obj.items()}
    clients = []
    for k in keys:
        coll = by_int[k]
        if not isinstance(coll, (set, frozenset, list, tuple, np.ndarray)):
            raise DataError(f"{p}: client {k} holds a {type(coll).__name__}, expected a set/list of indices")
        # Python-level iteration is the point here: the set's own order is the result.
        clients.append(np.fromiter((int(i) for i in coll), dtype=np.int64, count=len(coll)))
    return clients


def client_index_export(clients: Sequence[np.ndarray]) -> bytes:
    """Canonical CSV of client lists: ``client_id,position_in_client_list,train_csv_row_index``.

    One row per (client, position) in client then list order, ``\\n`` line ends,
    a final newline. This is the layout of the spec fixtures
    ``fedmlp_*_client_indices.csv``; its sha256 pins an index file's content.
    """
    sizes = np.array([len(c) for c in clients], dtype=np.int64)
    cid = np.repeat(np.arange(len(clients), dtype=np.int64), sizes)
    pos = np.concatenate([np.arange(s, dtype=np.int64) for s in sizes]) if len(sizes) else np.zeros(0, np.int64)
    idx = np.concatenate([np.asarray(c, dtype=np.int64) for c in clients]) if len(sizes) else np.zeros(0, np.int64)
    buf = io.StringIO()
    buf.write(_INDEX_EXPORT_HEADER + "\n")
    if len(idx):
        np.savetxt(buf, np.column_stack([cid, pos, idx]), fmt="%d", delimiter=",", newline="\n")
    return buf.getvalue().encode("ascii")


def client_index_sha256(clients: Sequence[np.ndarray]) -> str:
    """sha256 (hex) of :func:`client_index_export`."""
    return hashlib.sha256(client_index_export(clients)).hexdigest()


def check_client_index_content(clients: Sequence[np.ndarray], expected_sha256: str, source: str) -> None:
    """Raise ChecksumError unless the clients' canonical export hashes to ``expected_sha256``."""
    actual = client_index_sha256(clients)
    if actual != expected_sha256:
        sizes = [len(c) for c in clients]
        raise ChecksumError(
            f"{source}: content check failed: the client lists (sizes {sizes}) export to sha256 {actual}, "
            f"expected {expected_sha256}. The file is corrupted or not the published version; "
            "delete it and fetch it again (or point a mirror at a good copy)."
        )


def _check_npy(path: Path, entry: OfficialFile) -> None:
    if entry.content_sha256:
        check_client_index_content(read_client_index_npy(path), entry.content_sha256, str(path))


_CONTENT_CHECKS: Mapping[str, Callable[[Path, OfficialFile], None]] = {"softlabel": _check_softlabel, "npy": _check_npy}


def load_fedmlp_clients(key: str, path: str | os.PathLike, expected_sha256: str | None = None) -> list[np.ndarray]:
    """Load a FedMLP index file and check its content; return per-client row indices.

    ``key`` is ``"fedmlp_ich_clients"`` or ``"fedmlp_chestxray14_clients"``;
    ``expected_sha256`` overrides the pinned content hash (tests). The indices
    are positions in FedMLP's train CSV (fedmlp.md §3, §5), each client's array
    in its official iteration order (a ClientAssignment's client order).
    """
    entry = official_file(key)
    clients = read_client_index_npy(path)
    check_client_index_content(clients, expected_sha256 or entry.content_sha256 or "", str(path))
    return clients


def fedmlp_assignment(clients: Sequence[np.ndarray], num_samples: int) -> ClientAssignment:
    """Wrap loaded client lists as a ClientAssignment over ``num_samples`` training rows.

    FedMLP trains on the indexed rows only; rows in no list belong to no client.
    ``num_samples`` is the train CSV length (ICH 129,535; ChestXray14 47,116 or
    47,117, fedmlp.md §3/§5); an index out of range raises DataError.
    """
    return ClientAssignment(num_samples=int(num_samples), clients=tuple(np.asarray(c, np.int64) for c in clients))


# -- Checks of upstream files placed by hand or extracted into a raw folder ----
# Shared by the on-disk dataset modules (ich, isic, chestxray, clothing1m).


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


def extract_archive(
    archive: str | os.PathLike,
    raw_dir: str | os.PathLike,
    prefix: str,
    record: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Extract the members of a .zip/.tar(.gz) under ``prefix`` into ``raw_dir``, once.

    Members keep their paths (``prefix/...``); members outside ``prefix`` are
    skipped; links, devices and paths escaping ``raw_dir`` are refused. Files are
    extracted to a temporary folder and moved into place, then a marker
    (:func:`extraction_marker`) is written atomically: an archive counts as
    extracted only when its marker exists, so an interrupted run re-extracts it.
    A corrupt archive raises DataError, is moved aside to ``<name>.corrupt`` (so
    the next run downloads it again) and leaves no marker. ``record`` is stored
    in the marker (e.g. the archive's checksum). Returns the marker's record.
    """
    archive, raw = Path(archive), Path(raw_dir)
    done = read_extraction_marker(raw, archive.name)
    if done is not None:
        return done
    tmp = Path(tempfile.mkdtemp(prefix=f".{archive.name}.", suffix=".extracting", dir=raw))
    want = prefix.strip("/") + "/"
    count = 0
    try:
        try:
            if zipfile.is_zipfile(archive):
                with zipfile.ZipFile(archive) as zf:
                    for info in zf.infolist():
                        rel = _safe_member(info.filename)
                        if rel is None:
                            raise DataError(f"{archive}: member {info.filename!r} points outside the folder; refused")
                        if info.is_dir() or not rel.startswith(want):
                            continue
                        if (info.external_attr >> 16) & 0o170000 == 0o120000:
                            raise DataError(f"{archive}: member {info.filename!r} is a symbolic link; refused")
                        dest = tmp / rel
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        with zf.open(info) as src, open(dest, "wb") as out:
                            shutil.copyfileobj(src, out, 1 << 20)
                        count += 1
            else:
                with tarfile.open(archive, "r:*") as tf:
                    for member in tf:
                        rel = _safe_member(member.name)
                        if rel is None:
                            raise DataError(f"{archive}: member {member.name!r} points outside the folder; refused")
                        if member.isdir() or not rel.startswith(want):
                            continue
                        if not member.isfile():
                            raise DataError(f"{archive}: member {member.name!r} is not a regular file; refused")
                        dest = tmp / rel
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        src = tf.extractfile(member)
                        assert src is not None
                        with src, open(dest, "wb") as out:
                            shutil.copyfileobj(src, out, 1 << 20)
                        count += 1
        except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error, OSError) as exc:
            bad = archive.with_name(archive.name + ".corrupt")
            if archive.exists():
                os.replace(archive, bad)
            raise DataError(
                f"{archive}: the archive is corrupt or truncated ({type(exc).__name__}: {exc}); "
                f"it was moved aside to {bad}. Fix: run again to download it afresh "
                "(or place a good copy there by hand)."
            ) from None
        if count == 0:
            raise DataError(f"{archive}: no files under {want!r} in the archive; is this the right file?")
        _move_tree(tmp / want.rstrip("/"), raw / want.rstrip("/"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rec = {"archive": archive.name, "prefix": want.rstrip("/"), "members": count, **dict(record or {})}
    marker = extraction_marker(raw, archive.name)
    with atomic_path(marker) as t:
        t.write_text(json.dumps(rec, indent=2, sort_keys=True) + "\n")
    return rec


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
