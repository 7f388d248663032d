"""MNIST and Fashion-MNIST from their four gzipped idx files (Fed-NCL, 001).

Files and md5 checksums are those torchvision publishes
(``torchvision/datasets/mnist.py``); the URLs are https copies of the same
bytes (the md5 checks that): torchvision's own MNIST mirror and the CVDF
mirror TensorFlow used, and for Fashion-MNIST the publisher's S3 bucket through
its https REST endpoint (the ``s3-website`` address torchvision lists is http
only) and the files committed to zalandoresearch/fashion-mnist. No http URL is
left: a plain-http transfer can be swapped on the way (Fashion-MNIST issue
#107: a cache on the path served MNIST's file; only the md5 caught it), and
http://yann.lecun.com has been reported answering 403 to downloads since 2024.
The idx format: a big-endian header
``00 00 08 ndim`` (0x08 = unsigned byte; magic 0x00000803 for images,
0x00000801 for labels), ``ndim`` big-endian uint32 dimensions, then the bytes
row-major. Sample order is the file order (as in torchvision).

Tests (or a user with a private copy) can replace the downloaded files through
``REMOTES`` (a module-level dict, read at prepare time) or call
:func:`prepare_idx_dataset` with their own :class:`RemoteFile` objects.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd

from ..errors import DataError
from .base import DATASETS, DatasetInfo, PrepareContext, validate_options, write_prepared
from .download import RemoteFile

MNIST_URLS = ("https://ossci-datasets.s3.amazonaws.com/mnist/", "https://storage.googleapis.com/cvdf-datasets/mnist/")
FMNIST_URLS = (
    "https://fashion-mnist.s3.eu-central-1.amazonaws.com/",
    "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
)

#: role -> file name, identical for both datasets.
FILES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}
_MD5 = {
    "mnist": {
        "train_images": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train_labels": "d53e105ee54ea40749a09fcbcd1e9432",
        "test_images": "9fb629c4189551a2d022fa330f9573f3",
        "test_labels": "ec29112dd5afa0611ce80d1b7f02629c",
    },
    "fmnist": {
        "train_images": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train_labels": "25c81989df183df01b3e8a0aad5dffbe",
        "test_images": "bef4ecab320f06d8554ea6380940ec79",
        "test_labels": "bb300cfdad3c16e7a12a480ee83cd310",
    },
}


def _remotes(md5: Mapping[str, str], bases: tuple[str, ...]) -> dict[str, RemoteFile]:
    return {role: RemoteFile(fn, tuple(b + fn for b in bases), md5=md5[role]) for role, fn in FILES.items()}


#: dataset name -> role -> RemoteFile (read at prepare time, so tests may patch it).
REMOTES: dict[str, dict[str, RemoteFile]] = {
    "mnist": _remotes(_MD5["mnist"], MNIST_URLS),
    "fmnist": _remotes(_MD5["fmnist"], FMNIST_URLS),
}
OPTIONS: dict[str, object] = {}

IDX_UBYTE = 0x08


def read_idx(path: str | Path, ndim: int) -> np.ndarray:
    """Read a gzipped idx file of unsigned bytes with ``ndim`` dimensions (3: images, 1: labels).

    The header, the dimensions and the byte count are checked; a corrupt or
    truncated file is a DataError naming it.
    """
    path = Path(path)
    try:
        with gzip.open(path, "rb") as fh:
            raw = fh.read()
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{path}: not a readable gzip file ({exc}); delete it and download it again") from None
    if len(raw) < 4:
        raise DataError(f"{path}: only {len(raw)} bytes, too short for an idx header; delete it and download it again")
    magic = raw[:4]
    if magic[0] != 0 or magic[1] != 0 or magic[2] != IDX_UBYTE or magic[3] != ndim:
        expected = 0x0800 | ndim
        raise DataError(
            f"{path}: idx magic is 0x{int.from_bytes(magic, 'big'):08x}, expected 0x{expected:08x} "
            f"(unsigned bytes, {ndim} dimension(s)); wrong or corrupted file"
        )
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: idx header truncated ({len(raw)} bytes); delete it and download it again")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    count = int(np.prod(dims, dtype=np.int64))
    if len(raw) - header != count:
        raise DataError(
            f"{path}: header announces dims {dims} = {count} bytes but the file holds {len(raw) - header}; "
            "the file is truncated or corrupted. Delete it and download it again"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def read_split(images_path: Path, labels_path: Path, num_classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Images (n, H, W, 1) uint8 and labels (n,) int64 of one split, checked against each other."""
    images = read_idx(images_path, 3)
    labels = read_idx(labels_path, 1).astype(np.int64)
    if len(images) != len(labels):
        raise DataError(f"{images_path} has {len(images)} images but {labels_path} has {len(labels)} labels")
    if len(labels) and labels.max() >= num_classes:
        raise DataError(f"{labels_path}: label {labels.max()} is outside 0..{num_classes - 1}")
    return images[..., None], labels


def prepare_idx_dataset(ctx: PrepareContext, info: DatasetInfo, remotes: Mapping[str, RemoteFile]) -> None:
    """Fetch the four idx files of ``remotes`` (roles as in ``FILES``), parse and write the artifact."""
    validate_options(info.name, ctx.options, OPTIONS)
    paths = {role: ctx.fetch(remotes[role]) for role in FILES}
    x_train, y_train = read_split(paths["train_images"], paths["train_labels"], info.num_classes)
    x_test, y_test = read_split(paths["test_images"], paths["test_labels"], info.num_classes)
    h, w = info.image_size
    for name, x in (("train", x_train), ("test", x_test)):
        if x.shape[1:3] != (h, w):
            raise DataError(f"dataset {info.name!r}: {name} images are {x.shape[1:3]}, expected {(h, w)}")
    index = pd.DataFrame(
        {
            "sample_id": np.concatenate([np.arange(len(y_train)), np.arange(len(y_test))]).astype(np.int64),
            "split": np.repeat(np.array(["train", "test"], dtype=object), [len(y_train), len(y_test)]),
            "label": np.concatenate([y_train, y_test]),
        }
    )
    files = {r.filename: r.checksum_label() for r in remotes.values()}
    write_prepared(ctx.out_dir, info, index, {"x_train": x_train, "x_test": x_test}, raw_dir=ctx.raw_dir, files=files)


def _prepare(name: str):
    def prepare(ctx: PrepareContext) -> None:
        prepare_idx_dataset(ctx, INFOS[name], REMOTES[name])

    prepare.__qualname__ = f"prepare_{name}"
    return prepare


MNIST_CLASSES = tuple(
    f"{d} - {w}" for d, w in enumerate("zero one two three four five six seven eight nine".split())
)
FMNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)

INFOS: dict[str, DatasetInfo] = {
    "mnist": DATASETS.register(
        DatasetInfo(
            name="mnist",
            num_classes=10,
            class_names=MNIST_CLASSES,
            multi_label=False,
            channels=1,
            image_size=(28, 28),
            in_memory=True,
            source="MNIST (LeCun et al.), 60,000 train / 10,000 test; http://yann.lecun.com/exdb/mnist/ "
            "(mirror https://ossci-datasets.s3.amazonaws.com/mnist/)",
            papers=("fedncl",),
            prepare=_prepare("mnist"),
            split_sizes=(60_000, 10_000),
        )
    ),
    "fmnist": DATASETS.register(
        DatasetInfo(
            name="fmnist",
            num_classes=10,
            class_names=FMNIST_CLASSES,
            multi_label=False,
            channels=1,
            image_size=(28, 28),
            in_memory=True,
            source="Fashion-MNIST (Xiao et al. 2017), 60,000 train / 10,000 test; "
            "https://github.com/zalandoresearch/fashion-mnist",
            papers=("fedncl",),
            prepare=_prepare("fmnist"),
            split_sizes=(60_000, 10_000),
        )
    ),
}
