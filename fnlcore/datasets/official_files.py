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
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..assignment import ClientAssignment
from ..errors import ChecksumError, ConfigError, DataError
from ..safe_pickle import UNPICKLE_ERRORS, NumpyUnpickler
from .download import RemoteFile, fetch

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
    "git_blob_sha1",
    "check_git_blob",
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
# taken at HEAD, and their sha256 pins the bytes whatever the commit. The pin's
# tree lists data/ICH_softlabel.csv with git blob id FEDNORO_SOFTLABEL_GIT_BLOB
# (read from the repository's tree; the file itself is too large to mirror
# here), so that id pins its bytes.
FEDNORO_REPO = "wnn2000/FedNoRo"
FEDNORO_COMMIT = "d658f4c3986198fa200933ef47d0290f00b6706e"
FEDNORO_SOFTLABEL_GIT_BLOB = "6b79847e85f414b2e223e816b3f321feae060f1e"
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
    ``git_blob`` is the git blob id (sha1 of ``blob <size>\\0<bytes>``) the
    pinned commit's tree gives, for files known by that id only.
    """

    key: str
    remote: RemoteFile
    repo: str
    commit: str
    path: str
    description: str
    rows: int | None = None
    content_sha256: str | None = None
    git_blob: str | None = None


def _fednoro(
    key: str, path: str, description: str, *, sha256: str | None, size: int | None, rows: int, git_blob: str | None = None
) -> OfficialFile:
    remote = RemoteFile(
        filename=path.rsplit("/", 1)[-1],
        urls=(_raw_url(FEDNORO_REPO, FEDNORO_COMMIT, path),),
        sha256=sha256,
        size=size,
    )
    return OfficialFile(key, remote, FEDNORO_REPO, FEDNORO_COMMIT, path, description, rows=rows, git_blob=git_blob)


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
            "class probabilities); pinned by the commit's git blob id, content checked too",
            sha256=None,
            size=None,
            rows=47_578,
            git_blob=FEDNORO_SOFTLABEL_GIT_BLOB,
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
    their git blob id (where pinned) and content checked here (soft labels:
    rows and probability columns; index files: content hash); a file that fails is moved aside to
    ``<name>.corrupt`` (so the next run downloads it again and nothing placed
    by hand is lost) and ChecksumError/DataError is raised.
    ``entry`` overrides the table entry (tests serve small stand-ins this way).
    """
    entry = entry or official_file(key)
    path = fetch(entry.remote, dest_dir, mirrors=mirrors, timeout=timeout)
    if entry.remote.sha256 or entry.remote.md5:
        return path
    check = _CONTENT_CHECKS.get(_kind(entry))
    try:
        if entry.git_blob:
            check_git_blob(path, entry.git_blob, f"{entry.repo}@{entry.commit[:7]}:{entry.path}")
        if check is not None:
            check(path, entry)
    except DataError:
        bad = path.with_name(path.name + ".corrupt")
        os.replace(path, bad)
        raise
    return path


def git_blob_sha1(path: str | os.PathLike) -> str:
    """The git blob id of a file: sha1 of ``b"blob <size>\\0"`` followed by its bytes."""
    p = Path(path)
    h = hashlib.sha1(b"blob %d\0" % p.stat().st_size)
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_git_blob(path: str | os.PathLike, expected: str, source: str) -> None:
    """Raise ChecksumError unless ``path`` has the git blob id ``expected`` (that of ``source``)."""
    actual = git_blob_sha1(path)
    if actual != expected:
        raise ChecksumError(
            f"{path}: git blob id {actual}, expected {expected} ({source}). The file is corrupted or "
            "not the published version; delete it and fetch it again (or point a mirror at a good copy)."
        )


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
    that is what is returned. Its bytes are pinned by a git blob id, checked by
    :func:`fetch_official`; this checks the content: the row count, at least
    ``1 + num_classes`` columns, finite values in [0, 1]. Raises DataError naming the file otherwise.
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


# The only globals a numpy pickle of a dict of sets/lists of ints needs, numpy's built the safe way.
def _allowed_globals() -> dict[tuple[str, str], Any]:
    table: dict[tuple[str, str], Any] = NumpyUnpickler.numpy_globals(scalars=True)
    for mod in ("builtins", "__builtin__"):  # Python 3's and Python 2's names
        table.update({(mod, "set"): set, (mod, "frozenset"): frozenset, (mod, "int"): int})
    table.update({("builtins", "list"): list, ("builtins", "dict"): dict, ("builtins", "tuple"): tuple})
    return table


class _IndexUnpickler(NumpyUnpickler):
    """Unpickler that refuses every global outside the allow-list (no code can run)."""

    allowed = _allowed_globals()


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
    except UNPICKLE_ERRORS + (OSError,) as exc:
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


# Raw-folder helpers moved to rawfiles.py; kept importable from here.
from .rawfiles import (  # noqa: E402,F401
    config_key_hint,
    describe_missing_images,
    extract_archive,
    extraction_marker,
    find_missing_files,
    missing_manual_data,
    parse_options,
    read_extraction_marker,
    sha256_label,
)
