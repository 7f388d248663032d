"""Writers of tiny files in the exact upstream formats, for downloader/parser tests.

- ``write_idx_gz``: MNIST/Fashion-MNIST idx files (``00 00 08 ndim``, big-endian
  uint32 dims, row-major bytes), gzipped.
- ``write_cifar_tarball``: the CIFAR "python version" archives: the real member
  names (``cifar-10-batches-py/data_batch_1`` ... / ``cifar-100-python/train``
  ...) and the real pickle contents, pickled the way the originals were, by
  Python 2 (protocol 2, every ``str`` a Python 2 byte string, numpy arrays
  referenced as ``numpy.core.multiarray._reconstruct``), so that
  ``pickle.load(f, encoding="bytes")`` yields bytes keys as with the real files.

All outputs are deterministic (gzip/tar mtimes fixed) so their md5 is stable.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import pickle
import struct
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}

CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
CIFAR100_COARSE_NAMES = (
    "aquatic_mammals fish flowers food_containers fruit_and_vegetables household_electrical_devices "
    "household_furniture insects large_carnivores large_man-made_outdoor_things large_natural_outdoor_scenes "
    "large_omnivores_and_herbivores medium_mammals non-insect_invertebrates people reptiles small_mammals "
    "trees vehicles_1 vehicles_2"
).split()


def md5_of(path: Path) -> str:
    """md5 hex digest of a file (what tests inject as the 'published' checksum)."""
    return hashlib.md5(Path(path).read_bytes()).hexdigest()


def sha256_of(path: Path) -> str:
    """sha256 hex digest of a file."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _gzip_bytes(raw: bytes) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
        gz.write(raw)
    return buf.getvalue()


def idx_bytes(array: np.ndarray) -> bytes:
    """Uncompressed idx encoding of a uint8 array."""
    a = np.ascontiguousarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, a.ndim]) + struct.pack(f">{a.ndim}I", *a.shape)
    return header + a.tobytes()


def write_idx_gz(path: Path, array: np.ndarray) -> Path:
    """Write ``array`` (uint8) as a gzipped idx file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(_gzip_bytes(idx_bytes(array)))
    return path


@dataclass(frozen=True)
class TinyMnist:
    """Arrays written by :func:`write_mnist_files` and the md5 of each file (by role)."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    md5: dict[str, str]


def write_mnist_files(folder: Path, n_train: int = 12, n_test: int = 5, seed: int = 0, size: int = 28) -> TinyMnist:
    """The four MNIST idx.gz files with random images/labels; returns what was written."""
    rng = np.random.default_rng(seed)
    x_train = rng.integers(0, 256, (n_train, size, size), dtype=np.uint8)
    x_test = rng.integers(0, 256, (n_test, size, size), dtype=np.uint8)
    y_train = (np.arange(n_train) % 10).astype(np.uint8)
    y_test = ((np.arange(n_test) * 3) % 10).astype(np.uint8)
    arrays = {"train_images": x_train, "train_labels": y_train, "test_images": x_test, "test_labels": y_test}
    md5 = {}
    for role, name in MNIST_FILES.items():
        md5[role] = md5_of(write_idx_gz(Path(folder) / name, arrays[role]))
    return TinyMnist(x_train, y_train.astype(np.int64), x_test, y_test.astype(np.int64), md5)


class _Py2Pickler(pickle._Pickler):  # the pure-Python pickler lets us emit Python 2 opcodes
    """Pickle as Python 2's cPickle (protocol 2) did for the CIFAR batches."""

    dispatch = dict(pickle._Pickler.dispatch)
    _MODULE_NAMES = {"numpy._core.multiarray": "numpy.core.multiarray"}

    def save_py2_str(self, obj: str | bytes) -> None:
        raw = obj.encode("latin1") if isinstance(obj, str) else obj
        if len(raw) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(raw)]) + raw)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(raw)) + raw)
        self.memoize(obj)

    dispatch[str] = save_py2_str
    dispatch[bytes] = save_py2_str

    def save_global(self, obj: Any, name: str | None = None) -> None:
        name = name or getattr(obj, "__qualname__", None) or obj.__name__
        module = pickle.whichmodule(obj, name)
        module = self._MODULE_NAMES.get(module, module)
        self.write(pickle.GLOBAL + f"{module}\n{name}\n".encode("ascii"))
        self.memoize(obj)

    dispatch[type] = save_global


def py2_pickle_bytes(obj: Any) -> bytes:
    """``obj`` pickled as Python 2 did (protocol 2, ``str`` as byte strings, numpy 1.x global names)."""
    buf = io.BytesIO()
    _Py2Pickler(buf, protocol=2).dump(obj)
    return buf.getvalue()


@dataclass(frozen=True)
class TinyCifar:
    """Images (N, 32, 32, 3) and labels (torchvision order) written by :func:`write_cifar_tarball`."""

    path: Path
    md5: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    coarse_train: np.ndarray | None
    coarse_test: np.ndarray | None


def _rows(x: np.ndarray) -> np.ndarray:
    """(N, 32, 32, 3) -> the upstream (N, 3072) rows: R plane, G plane, B plane."""
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2).reshape(len(x), -1))


def write_cifar_tarball(
    folder: Path,
    variant: str = "cifar10",
    per_batch: int = 3,
    n_test: int = 4,
    seed: int = 0,
    label_names: list[str] | None = None,
) -> TinyCifar:
    """A tiny ``cifar-10-python.tar.gz`` (5 train batches of ``per_batch``) or ``cifar-100-python.tar.gz``."""
    rng = np.random.default_rng(seed)
    members: list[tuple[str, bytes]] = []
    if variant == "cifar10":
        top, fname, n_batches = "cifar-10-batches-py", "cifar-10-python.tar.gz", 5
        names = label_names or CIFAR10_NAMES
        num = len(names)
        meta = {"num_cases_per_batch": per_batch, "label_names": names, "num_vis": 3072}
        members.append(("batches.meta", py2_pickle_bytes(meta)))
    elif variant == "cifar100":
        from fnlcore.datasets.cifar import CIFAR100_CLASSES  # the names are data; the writer reuses them

        top, fname, n_batches = "cifar-100-python", "cifar-100-python.tar.gz", 1
        names = label_names or list(CIFAR100_CLASSES)
        num = len(names)
        meta = {"fine_label_names": names, "coarse_label_names": CIFAR100_COARSE_NAMES}
        members.append(("meta", py2_pickle_bytes(meta)))
    else:
        raise ValueError(variant)

    xs, ys, cs = [], [], []
    test_x = rng.integers(0, 256, (n_test, 32, 32, 3), dtype=np.uint8)
    test_y = rng.integers(0, num, n_test)
    test_c = rng.integers(0, 20, n_test)
    for b in range(n_batches):
        n = per_batch * (5 if variant == "cifar100" else 1)
        x = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
        y = rng.integers(0, num, n)
        c = rng.integers(0, 20, n)
        xs.append(x)
        ys.append(y)
        cs.append(c)
        if variant == "cifar10":
            batch = {
                "batch_label": f"training batch {b + 1} of 5",
                "labels": [int(v) for v in y],
                "data": _rows(x),
                "filenames": [f"img_{b}_{i}.png" for i in range(n)],
            }
            members.append((f"data_batch_{b + 1}", py2_pickle_bytes(batch)))
        else:
            batch = {
                "filenames": [f"img_{i}.png" for i in range(n)],
                "batch_label": "training batch 1 of 1",
                "fine_labels": [int(v) for v in y],
                "coarse_labels": [int(v) for v in c],
                "data": _rows(x),
            }
            members.append(("train", py2_pickle_bytes(batch)))
    if variant == "cifar10":
        test = {
            "batch_label": "testing batch 1 of 1",
            "labels": [int(v) for v in test_y],
            "data": _rows(test_x),
            "filenames": [f"test_{i}.png" for i in range(n_test)],
        }
        members.append(("test_batch", py2_pickle_bytes(test)))
        members.append(("readme.html", b"<html>tiny test archive</html>\n"))
    else:
        test = {
            "filenames": [f"test_{i}.png" for i in range(n_test)],
            "batch_label": "testing batch 1 of 1",
            "fine_labels": [int(v) for v in test_y],
            "coarse_labels": [int(v) for v in test_c],
            "data": _rows(test_x),
        }
        members.append(("test", py2_pickle_bytes(test)))

    path = Path(folder) / fname
    path.parent.mkdir(parents=True, exist_ok=True)
    write_tar_gz(path, top, members)
    is100 = variant == "cifar100"
    return TinyCifar(
        path=path,
        md5=md5_of(path),
        x_train=np.concatenate(xs),
        y_train=np.concatenate(ys).astype(np.int64),
        x_test=test_x,
        y_test=test_y.astype(np.int64),
        coarse_train=np.concatenate(cs).astype(np.int64) if is100 else None,
        coarse_test=test_c.astype(np.int64) if is100 else None,
    )


def write_tar_gz(path: Path, top: str, members: list[tuple[str, bytes]]) -> Path:
    """A deterministic .tar.gz with a top folder ``top`` holding ``members`` (name, content)."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar:
            d = tarfile.TarInfo(top)
            d.type, d.mode, d.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(d)
            for name, data in members:
                info = tarfile.TarInfo(f"{top}/{name}")
                info.size, info.mode, info.mtime = len(data), 0o644, 0
                tar.addfile(info, io.BytesIO(data))
    Path(path).write_bytes(buf.getvalue())
    return Path(path)
