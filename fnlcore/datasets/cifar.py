"""CIFAR-10 and CIFAR-100 from the official python tarballs (FedGR 003, FedDiv 004, Fed-NCL 001).

The archive URL and md5 are those torchvision publishes
(``torchvision/datasets/cifar.py``). The pickled batches are read straight
from the tarball (no extraction to disk) with ``pickle.load(encoding="bytes")``
through an unpickler that only admits the numpy names the batches use.
Sample order is torchvision's: CIFAR-10 train = ``data_batch_1..5`` in order,
test = ``test_batch``; CIFAR-100 ``train``/``test`` with the fine labels
(the coarse label is kept as the index column ``coarse_label``). Rows of
3,072 bytes (R, G, B planes of 32x32) become (N, 32, 32, 3) uint8.

Tests can replace the archive through ``REMOTES`` (read at prepare time) or
call :func:`prepare_cifar` with their own :class:`RemoteFile`.
"""

from __future__ import annotations

import io
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import DataError
from ..safe_pickle import UNPICKLE_ERRORS, NumpyUnpickler
from .base import DATASETS, DatasetInfo, PrepareContext, validate_options, write_prepared
from .download import RemoteFile

BASE_URL = "https://www.cs.toronto.edu/~kriz/"


@dataclass(frozen=True)
class CifarLayout:
    """Member names and pickle keys of one CIFAR archive."""

    folder: str
    train_members: tuple[str, ...]
    test_members: tuple[str, ...]
    meta_member: str
    label_key: str
    names_key: str
    coarse_key: str | None = None
    coarse_names_key: str | None = None


LAYOUTS = {
    "cifar10": CifarLayout(
        folder="cifar-10-batches-py",
        train_members=tuple(f"data_batch_{i}" for i in range(1, 6)),
        test_members=("test_batch",),
        meta_member="batches.meta",
        label_key="labels",
        names_key="label_names",
    ),
    "cifar100": CifarLayout(
        folder="cifar-100-python",
        train_members=("train",),
        test_members=("test",),
        meta_member="meta",
        label_key="fine_labels",
        names_key="fine_label_names",
        coarse_key="coarse_labels",
        coarse_names_key="coarse_label_names",
    ),
}

#: dataset name -> RemoteFile of its archive (read at prepare time, so tests may patch it).
REMOTES: dict[str, RemoteFile] = {
    "cifar10": RemoteFile(
        "cifar-10-python.tar.gz", (BASE_URL + "cifar-10-python.tar.gz",), md5="c58f30108f718f92721af3b95e74349a"
    ),
    "cifar100": RemoteFile(
        "cifar-100-python.tar.gz", (BASE_URL + "cifar-100-python.tar.gz",), md5="eb9058c3a382ffc7106e4002c42a8d85"
    ),
}
OPTIONS: dict[str, object] = {}

CIFAR10_CLASSES = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
)
CIFAR100_CLASSES = tuple(
    """apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus butterfly camel
    can castle caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile cup dinosaur
    dolphin elephant flatfish forest fox girl hamster house kangaroo keyboard lamp lawn_mower leopard lion
    lizard lobster man maple_tree motorcycle mountain mouse mushroom oak_tree orange orchid otter palm_tree
    pear pickup_truck pine_tree plain plate poppy porcupine possum rabbit raccoon ray road rocket rose sea
    seal shark shrew skunk skyscraper snail snake spider squirrel streetcar sunflower sweet_pepper table
    tank telephone television tiger tractor train trout tulip turtle wardrobe whale willow_tree wolf woman
    worm""".split()
)


class _BatchUnpickler(NumpyUnpickler):
    """Unpickler for the CIFAR batches: dicts, lists, bytes and numpy arrays only."""

    allowed = NumpyUnpickler.numpy_globals()  # the batches were pickled by numpy 1.x (numpy.core)
    refusal = "unexpected global in a CIFAR batch:"


def _str_keys(d: Any, where: str) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise DataError(f"{where}: expected a pickled dict, got {type(d).__name__}")
    return {(k.decode("latin1") if isinstance(k, bytes) else str(k)): v for k, v in d.items()}


def _load_member(tar: tarfile.TarFile, member: str, archive: Path) -> dict[str, Any]:
    where = f"{archive}:{member}"
    try:
        fh = tar.extractfile(member)
    except KeyError:
        raise DataError(f"{archive}: member {member!r} is missing; wrong or corrupted archive") from None
    if fh is None:
        raise DataError(f"{where} is not a regular file; wrong or corrupted archive")
    try:
        with fh:
            return _str_keys(_BatchUnpickler(io.BytesIO(fh.read()), encoding="bytes").load(), where)
    except UNPICKLE_ERRORS + (OSError, zlib.error) as exc:
        raise DataError(f"{where}: cannot unpickle ({exc}); wrong or corrupted archive") from None


def _names(meta: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    if key not in meta:
        raise DataError(f"{where}: key {key!r} missing")
    return tuple(n.decode("utf-8") if isinstance(n, bytes) else str(n) for n in meta[key])


def _batches(tar: tarfile.TarFile, members: tuple[str, ...], layout: CifarLayout, archive: Path):
    """Images (N, 32, 32, 3), fine labels, coarse labels (or None) of the given members, in order."""
    xs, ys, cs = [], [], []
    for m in members:
        where = f"{archive}:{layout.folder}/{m}"
        batch = _load_member(tar, f"{layout.folder}/{m}", archive)
        for key in ("data", layout.label_key) + ((layout.coarse_key,) if layout.coarse_key else ()):
            if key not in batch:
                raise DataError(f"{where}: key {key!r} missing; wrong or corrupted archive")
        data = np.asarray(batch["data"])
        labels = np.asarray(batch[layout.label_key], dtype=np.int64)
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(data) != len(labels):
            raise DataError(
                f"{where}: data must be uint8 (N, 3072) with N labels, got {data.dtype} {data.shape} "
                f"and {len(labels)} labels"
            )
        xs.append(data)
        ys.append(labels)
        if layout.coarse_key:
            cs.append(np.asarray(batch[layout.coarse_key], dtype=np.int64))
    x = np.concatenate(xs).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(x), np.concatenate(ys), (np.concatenate(cs) if cs else None)


def read_cifar_archive(archive: str | Path, layout: CifarLayout) -> dict[str, Any]:
    """Parse a CIFAR python tarball in memory: x_/y_/coarse_ per split, class and coarse names."""
    archive = Path(archive)
    try:
        tar = tarfile.open(archive, "r:gz")
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{archive}: not a readable .tar.gz ({exc}); delete it and download it again") from None
    try:
        with tar:
            meta_where = f"{archive}:{layout.folder}/{layout.meta_member}"
            meta = _load_member(tar, f"{layout.folder}/{layout.meta_member}", archive)
            out: dict[str, Any] = {"class_names": _names(meta, layout.names_key, meta_where)}
            if layout.coarse_names_key:
                out["coarse_names"] = _names(meta, layout.coarse_names_key, meta_where)
            for split, members in (("train", layout.train_members), ("test", layout.test_members)):
                out[f"x_{split}"], out[f"y_{split}"], out[f"coarse_{split}"] = _batches(tar, members, layout, archive)
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise DataError(f"{archive}: corrupted archive ({exc}); delete it and download it again") from None
    return out


def prepare_cifar(ctx: PrepareContext, info: DatasetInfo, remote: RemoteFile) -> None:
    """Fetch the archive ``remote``, parse it and write the in-memory artifact."""
    validate_options(info.name, ctx.options, OPTIONS)
    archive = ctx.fetch(remote)
    parsed = read_cifar_archive(archive, LAYOUTS[info.name])
    if parsed["class_names"] != info.class_names:
        raise DataError(
            f"{archive}: class names {parsed['class_names']} differ from the published {info.class_names}; "
            "wrong archive"
        )
    y_train, y_test = parsed["y_train"], parsed["y_test"]
    index = pd.DataFrame(
        {
            "sample_id": np.concatenate([np.arange(len(y_train)), np.arange(len(y_test))]).astype(np.int64),
            "split": np.repeat(np.array(["train", "test"], dtype=object), [len(y_train), len(y_test)]),
            "label": np.concatenate([y_train, y_test]),
        }
    )
    extra: dict[str, Any] = {}
    if parsed["coarse_train"] is not None:
        index["coarse_label"] = np.concatenate([parsed["coarse_train"], parsed["coarse_test"]])
        extra["coarse_class_names"] = list(parsed["coarse_names"])
    write_prepared(
        ctx.out_dir,
        info,
        index,
        {"x_train": parsed["x_train"], "x_test": parsed["x_test"]},
        extra_meta=extra,
        raw_dir=ctx.raw_dir,
        files={remote.filename: remote.checksum_label()},
    )


def _prepare(name: str):
    def prepare(ctx: PrepareContext) -> None:
        prepare_cifar(ctx, INFOS[name], REMOTES[name])

    prepare.__qualname__ = f"prepare_{name}"
    return prepare


INFOS: dict[str, DatasetInfo] = {
    "cifar10": DATASETS.register(
        DatasetInfo(
            name="cifar10",
            num_classes=10,
            class_names=CIFAR10_CLASSES,
            multi_label=False,
            channels=3,
            image_size=(32, 32),
            in_memory=True,
            source="CIFAR-10 (Krizhevsky 2009), 50,000 train / 10,000 test; https://www.cs.toronto.edu/~kriz/cifar.html",
            papers=("fedncl", "fedgr", "feddiv"),
            prepare=_prepare("cifar10"),
            split_sizes=(50_000, 10_000),
            augmentation="crop_flip",  # RandomCrop(32, padding 4) + flip (fedcorr.md §1)
        )
    ),
    "cifar100": DATASETS.register(
        DatasetInfo(
            name="cifar100",
            num_classes=100,
            class_names=CIFAR100_CLASSES,
            multi_label=False,
            channels=3,
            image_size=(32, 32),
            in_memory=True,
            source="CIFAR-100 (Krizhevsky 2009), 50,000 train / 10,000 test, fine labels; "
            "https://www.cs.toronto.edu/~kriz/cifar.html",
            papers=("fedgr", "feddiv"),
            prepare=_prepare("cifar100"),
            split_sizes=(50_000, 10_000),
            augmentation="crop_flip",
        )
    ),
}
