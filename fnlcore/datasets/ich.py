"""RSNA intracranial haemorrhage (ICH, Kaggle) in the two forms the papers use.

``ich_fednoro`` (FedNoRo, fednoro.md §1.1): single-label, 5 classes. The
labels and the 7:3 split are FedNoRo's published ``data/train_ICH.csv`` /
``data/test_ICH.csv`` (47,578 / 20,391 rows), used verbatim and in file order
(the partitioner walks the train rows class by class in row order). Class =
argmax of the one-hot columns. Images: ``stage_1_train_images/<ID>.png`` made
by the Kaggle notebook "prepare-dataset-resizing-and-saving-as-png".

``ich_fedmlp`` (FedMLP, fedmlp.md §5): multi-label, 5 subtype labels per image,
from Kaggle's ``stage_2_train.csv`` restricted to the images whose PNG exists
in ``png185k_512/`` (FedMLP's table has 185,051 of them), split 7:3 with
sklearn's ``train_test_split(test_size=0.3)`` drawing from the RNG state
``np.random.seed(2023)`` leaves. FedMLP trains on the 25,000 rows listed in its
published index file (``official_files``: ``fedmlp_ich_clients``).

Both need the Kaggle images, which only an account that accepted the
competition rules can download: they are placed by hand and checked (existence
only, no decoding) before anything is written.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import ConfigError, DataError, MissingManualDataError
from ..rng import legacy_rng
from .base import DATASETS, DatasetInfo, PrepareContext, write_prepared
from .official_files import ICH_CLASS_COLUMNS, fetch_official, official_file, read_fednoro_ich_csv, read_fednoro_softlabels
from .rawfiles import (
    describe_missing_images,
    file_image_size,
    find_missing_files,
    image_size_setting,
    keep_subset,
    missing_manual_data,
    parse_options,
    read_id_subset,
    sha256_label,
)

__all__ = [
    "ICH_CLASSES",
    "IchFedNoRoOptions",
    "IchFedMLPOptions",
    "parse_stage2_labels",
    "fedmlp_split",
    "prepare_ich_fednoro",
    "prepare_ich_fedmlp",
]

ICH_CLASSES = ICH_CLASS_COLUMNS
KAGGLE_SOURCE = (
    "Kaggle competition 'rsna-intracranial-hemorrhage-detection' "
    "(https://www.kaggle.com/c/rsna-intracranial-hemorrhage-detection/data)"
)
KAGGLE_ACCESS = (
    "sign in to Kaggle and accept the competition rules on the competition's 'Rules' page, then download "
    "(e.g. `kaggle competitions download -c rsna-intracranial-hemorrhage-detection`)"
)
PNG_NOTEBOOK = (
    "convert the DICOMs to PNG with the Kaggle notebook 'prepare-dataset-resizing-and-saving-as-png' "
    "(guiferviz; per-image DICOM window, min-max to 8 bit, native resolution; fednoro.md §1.1)"
)

FEDNORO_IMAGE_DIR = "stage_1_train_images"
FEDMLP_IMAGE_DIR = "png185k_512"
STAGE2_CSV = "stage_2_train.csv"
# stage_2_train.csv lists 6 rows per image in this order; FedMLP reads them by position.
_STAGE2_SUBTYPES = ICH_CLASS_COLUMNS + ("any",)


# -- ich_fednoro ----------------------------------------------------------------


@dataclass(frozen=True)
class IchFedNoRoOptions:
    """Options of ``ich_fednoro``.

    ``soft_labels``: also fetch FedNoRo's ``ICH_softlabel.csv`` (needed by the
    H-IDN noise model, fednoro.md §3) and store its 5 probabilities as index
    columns ``soft_0..soft_4`` of the train rows (NaN for test rows).
    ``subset``: path of a CSV with a column ``id`` listing the images to use
    (train and test ids of FedNoRo's CSVs); only their PNGs must exist. The
    rows keep FedNoRo's order; the file's path, sha256 and the counts kept go
    to meta.json.
    ``image_size``: None (default) keeps the files' own size, as FedNoRo's code
    does (no Resize for ICH): the size of the first image, to which any image
    of another size is resized when loaded; N or [H, W] resizes every image
    (512 was this project's earlier fixed setting).
    ``decoded_cache`` (true): training reads the images from a decoded cache built once at the
    size it reads them (fnlcore.datasets.decoded_cache, rules/cache.smk); false decodes every epoch.
    """

    soft_labels: bool = False
    subset: str | None = None
    image_size: Any = None
    decoded_cache: bool = True

    def __post_init__(self) -> None:
        if self.subset is not None and not (isinstance(self.subset, str) and self.subset.strip()):
            raise ConfigError(f"option subset must be the path of a CSV of IDs, got {self.subset!r}")
        image_size_setting(self.image_size)


def prepare_ich_fednoro(ctx: PrepareContext) -> None:
    """Prepare FedNoRo's single-label ICH (see the module docstring)."""
    opts: IchFedNoRoOptions = parse_options("ich_fednoro", IchFedNoRoOptions, ctx.options)
    raw = ctx.raw_dir
    if not (raw / FEDNORO_IMAGE_DIR).is_dir():  # fail before any download
        raise _fednoro_missing(raw, [f"{raw / FEDNORO_IMAGE_DIR}/ (folder does not exist)"])

    files: dict[str, str] = {}
    frames = []
    for split, key in (("train", "fednoro_ich_train"), ("test", "fednoro_ich_test")):
        entry = official_file(key)
        path = fetch_official(key, raw, ctx.mirrors)
        files[path.name] = entry.remote.checksum_label()
        df = read_fednoro_ich_csv(path, expected_rows=entry.rows)
        frames.append(
            pd.DataFrame(
                {
                    "sample_id": np.arange(len(df), dtype=np.int64),
                    "split": split,
                    "label": df["label"].to_numpy(np.int64),
                    "path": (FEDNORO_IMAGE_DIR + "/" + df["id"] + ".png").to_numpy(dtype=object),
                    "image_id": df["id"].to_numpy(dtype=object),
                }
            )
        )
    index = pd.concat(frames, ignore_index=True)
    if index["image_id"].duplicated().any():
        raise DataError(
            "FedNoRo's train_ICH.csv/test_ICH.csv share or repeat an image id; the files are not the published ones"
        )

    extra: dict[str, object] = {"label_source": f"{official_file('fednoro_ich_train').remote.urls[0]} (+ test_ICH.csv)"}
    if opts.soft_labels:  # before the subset: row i of ICH_softlabel.csv is row i of the full train_ICH.csv
        entry = official_file("fednoro_ich_softlabel")
        path = fetch_official("fednoro_ich_softlabel", raw, ctx.mirrors)
        soft = read_fednoro_softlabels(path, expected_rows=int((index["split"] == "train").sum()))
        is_train = (index["split"] == "train").to_numpy()
        for j in range(soft.shape[1]):
            col = np.full(len(index), np.nan)
            col[is_train] = soft[:, j]
            index[f"soft_{j}"] = col
        files[path.name] = sha256_label(path)
        extra["soft_label_source"] = entry.remote.urls[0]
    if opts.subset is not None:
        index, extra["subset"] = keep_subset(index, *read_id_subset(opts.subset))

    missing = find_missing_files(raw, index["path"].to_numpy())
    if missing.any():
        raise _fednoro_missing(
            raw, [describe_missing_images(FEDNORO_IMAGE_DIR, index["path"].to_numpy(), missing, raw)]
        )
    extra["provenance"] = _provenance(raw, files, index)
    info, extra["image_size_from"] = _image_size(raw, index, opts.image_size)
    write_prepared(ctx.out_dir, info, index, None, extra, raw_dir=raw, files=files)


def _provenance(raw: Path, files: dict[str, str], index: pd.DataFrame) -> dict[str, object]:
    """Where the data came from and what was checked (meta.json's ``provenance``)."""
    return {
        "source_dir": str(raw.resolve()),
        "label_files_verified": sorted(files),  # each checked against its pinned checksum or git blob id
        "images": "existence checked (no published checksums for the PNGs)",
        "n_samples": int(len(index)),
    }


def _image_size(raw: Path, index: pd.DataFrame, option: Any) -> tuple[DatasetInfo, str]:
    """The dataset info with the size the network sees: the option's, or the first image file's."""
    size = image_size_setting(option)
    if size is not None:
        return dataclasses.replace(ICH_FEDNORO, image_size=size), "option image_size"
    first = str(index["path"].iloc[0])
    return dataclasses.replace(ICH_FEDNORO, image_size=file_image_size(raw / first)), f"file {first}"


def _fednoro_missing(raw: Path, missing: list[str]) -> MissingManualDataError:
    return missing_manual_data(
        "ich_fednoro",
        raw,
        missing,
        source=f"{KAGGLE_SOURCE}, stage_1_train images (FedNoRo draws train and test from stage-1 train)",
        access=f"{KAGGLE_ACCESS}; then {PNG_NOTEBOOK}",
        layout=[
            f"{FEDNORO_IMAGE_DIR}/<ID>.png   (one PNG per id of FedNoRo's train_ICH.csv and test_ICH.csv, "
            "e.g. ID_3a0809fec.png; 67,969 in all)",
            "train_ICH.csv, test_ICH.csv   (downloaded automatically from FedNoRo's repository)",
        ],
    )


# -- ich_fedmlp -----------------------------------------------------------------


@dataclass(frozen=True)
class IchFedMLPOptions:
    """Options of ``ich_fedmlp``.

    ``split_seed``: the seed of ``np.random.seed`` before FedMLP's
    ``train_test_split`` (2023, ``preprocess/split_train_test.py``);
    ``test_size``: its ``test_size`` (0.3).
    ``decoded_cache`` (true): training reads the images from a decoded cache built once at the
    size it reads them (fnlcore.datasets.decoded_cache, rules/cache.smk); false decodes every epoch.
    """

    split_seed: int = 2023
    test_size: float = 0.3
    decoded_cache: bool = True

    def __post_init__(self) -> None:
        if not 0.0 < self.test_size < 1.0:
            raise ConfigError(f"option test_size must lie in (0, 1), got {self.test_size}")


def parse_stage2_labels(path: str | os.PathLike) -> pd.DataFrame:
    """Per-image subtype labels of Kaggle's ``stage_2_train.csv``, in file order.

    The file has 6 rows per image (``ID_<img>_<subtype>,Label`` for epidural,
    intraparenchymal, intraventricular, subarachnoid, subdural, any). FedMLP's
    ``preprocess/ICH_process.py`` reads them by position in groups of 6 and keeps
    the first 5 labels; this does the same, vectorised, after checking that every
    group really has that layout (DataError otherwise). A repeated image (the
    Kaggle file repeats a few) is kept as often as it appears, as in FedMLP.
    Returns ``image_id`` (``ID_<img>``) and the five uint8 label columns.
    """
    p = Path(path)
    try:
        df = pd.read_csv(p, dtype={"ID": str, "Label": "Int64"})
    except (OSError, ValueError, pd.errors.ParserError) as exc:
        raise DataError(f"{p}: cannot be read as Kaggle's stage_2_train.csv ({exc})") from None
    if list(df.columns) != ["ID", "Label"]:
        raise DataError(f"{p}: header is {list(df.columns)}, expected ['ID', 'Label'] (Kaggle's stage_2_train.csv)")
    if len(df) % 6:
        raise DataError(f"{p}: {len(df)} rows is not a multiple of 6 (6 rows per image); the file is truncated")
    ids = df["ID"].to_numpy(dtype=object).reshape(-1, 6)
    labels = df["Label"].to_numpy(dtype=np.int64, na_value=-1).reshape(-1, 6)
    base = pd.Series(ids[:, 0], dtype=object).str.rsplit("_", n=1).str[0]
    for j, sub in enumerate(_STAGE2_SUBTYPES):
        ok = (pd.Series(ids[:, j], dtype=object) == base + "_" + sub).to_numpy()
        if not ok.all():
            row = 6 * int(np.flatnonzero(~ok)[0]) + j
            raise DataError(
                f"{p}: data row {row} is {ids.flat[row]!r}, expected '<image id>_{sub}'. FedMLP reads this file "
                "in groups of 6 rows (epidural, intraparenchymal, intraventricular, subarachnoid, subdural, any) "
                "per image; use Kaggle's unmodified stage_2_train.csv"
            )
    if not np.isin(labels, (0, 1)).all():
        raise DataError(f"{p}: Label values must be 0 or 1")
    out = pd.DataFrame({"image_id": base.to_numpy(dtype=object)})
    for j, name in enumerate(ICH_CLASS_COLUMNS):
        out[name] = labels[:, j].astype(np.uint8)
    return out


def fedmlp_split(n: int, seed: int = 2023, test_size: float = 0.3) -> tuple[np.ndarray, np.ndarray]:
    """FedMLP's 7:3 split of ``n`` rows: (train rows, test rows), each in the order the split returns them.

    ``sklearn.model_selection.train_test_split(data, test_size=0.3)`` after
    ``np.random.seed(seed)`` (random_state None uses the global legacy RNG);
    a private ``RandomState(seed)`` gives the same draws. Row i of FedMLP's
    train CSV is data row ``train[i]``.
    """
    # lazy: scikit-learn takes ~1 s to import; only this step uses it
    from sklearn.model_selection import train_test_split

    train, test = train_test_split(np.arange(n, dtype=np.int64), test_size=test_size, random_state=legacy_rng(seed))
    return np.asarray(train, np.int64), np.asarray(test, np.int64)


def prepare_ich_fedmlp(ctx: PrepareContext) -> None:
    """Prepare FedMLP's multi-label ICH (see the module docstring)."""
    opts: IchFedMLPOptions = parse_options("ich_fedmlp", IchFedMLPOptions, ctx.options)
    raw = ctx.raw_dir
    missing = []
    if not (raw / STAGE2_CSV).is_file():
        missing.append(f"{raw / STAGE2_CSV} (file)")
    if not (raw / FEDMLP_IMAGE_DIR).is_dir():
        missing.append(f"{raw / FEDMLP_IMAGE_DIR}/ (folder does not exist)")
    if missing:
        raise _fedmlp_missing(raw, missing)

    table = parse_stage2_labels(raw / STAGE2_CSV)
    n_csv = len(table)
    rel = (FEDMLP_IMAGE_DIR + "/" + table["image_id"] + ".png").to_numpy(dtype=object)
    have = ~find_missing_files(raw, rel)
    if not have.any():
        raise _fedmlp_missing(raw, [describe_missing_images(FEDMLP_IMAGE_DIR, rel, ~have, raw)])
    # FedMLP's data_png185k_512.csv: the stage-2 images whose PNG exists, in stage-2 order.
    table = table.loc[have].reset_index(drop=True)
    rel = rel[have]

    train_rows, test_rows = fedmlp_split(len(table), opts.split_seed, opts.test_size)
    parts = []
    for split, rows in (("train", train_rows), ("test", test_rows)):
        part = pd.DataFrame({"sample_id": np.arange(len(rows), dtype=np.int64), "split": split})
        for j, name in enumerate(ICH_CLASS_COLUMNS):
            part[f"label_{j}"] = table[name].to_numpy()[rows]
        part["path"] = rel[rows]
        part["image_id"] = table["image_id"].to_numpy(dtype=object)[rows]
        part["table_row"] = rows  # row of FedMLP's data_png185k_512.csv
        parts.append(part)
    index = pd.concat(parts, ignore_index=True)

    labels = table.loc[:, list(ICH_CLASS_COLUMNS)].to_numpy()
    cardinality = np.bincount(labels.sum(axis=1), minlength=6)
    extra = {
        "split_seed": opts.split_seed,
        "test_size": opts.test_size,
        "n_images_in_stage2_csv": n_csv,
        "n_images_with_png": int(len(table)),
        "n_repeated_image_ids": int(table["image_id"].duplicated().sum()),
        "positives_per_class": labels.sum(axis=0).tolist(),
        "label_cardinality_counts": {str(k): int(v) for k, v in enumerate(cardinality)},
        "expected_by_fedmlp": {
            "n_images": 185_051,
            "positives_per_class": [2761, 32564, 23766, 32122, 42496],
            "n_train": 129_535,
            "n_test": 55_516,
        },
        "client_index_file": "fedmlp_ich_clients",
    }
    files = {STAGE2_CSV: sha256_label(raw / STAGE2_CSV)}
    write_prepared(ctx.out_dir, ICH_FEDMLP, index, None, extra, raw_dir=raw, files=files)


def _fedmlp_missing(raw: Path, missing: list[str]) -> MissingManualDataError:
    return missing_manual_data(
        "ich_fedmlp",
        raw,
        missing,
        source=f"{KAGGLE_SOURCE}: stage_2_train.csv and the stage_2_train DICOMs",
        access=f"{KAGGLE_ACCESS}; then {PNG_NOTEBOOK}, at 512x512, into {FEDMLP_IMAGE_DIR}/",
        layout=[
            f"{STAGE2_CSV}   (Kaggle's label file, 6 rows per image)",
            f"{FEDMLP_IMAGE_DIR}/<ID>.png   (e.g. ID_12cadc6af.png; FedMLP used 185,051 images)",
        ],
    )


# -- registry ---------------------------------------------------------------------

ICH_FEDNORO = DATASETS.register(
    DatasetInfo(
        name="ich_fednoro",
        num_classes=5,
        class_names=ICH_CLASSES,
        multi_label=False,
        channels=3,  # FedNoRo converts the grey PNGs to RGB
        image_size=(512, 512),  # the Kaggle PNGs' native size; prepare records the files' own (option image_size)
        in_memory=False,
        source=f"{KAGGLE_SOURCE}; labels and split: FedNoRo's data/train_ICH.csv, data/test_ICH.csv",
        papers=("fednoro",),
        prepare=prepare_ich_fednoro,
        split_sizes=(47_578, 20_391),  # FedNoRo's train_ICH.csv / test_ICH.csv (fednoro.md §1.1)
        manual=True,
    )
)

ICH_FEDMLP = DATASETS.register(
    DatasetInfo(
        name="ich_fedmlp",
        num_classes=5,
        class_names=ICH_CLASSES,
        multi_label=True,
        channels=3,
        image_size=(224, 224),  # FedMLP resizes to 224x224 (fedmlp.md §4)
        in_memory=False,
        source=f"{KAGGLE_SOURCE}; multi-label table and split as FedMLP's preprocess/ICH_process.py and "
        "split_train_test.py",
        papers=("fedmlp",),
        prepare=prepare_ich_fedmlp,
        split_sizes=(129_535, 55_516),  # fedmlp.md §3 (the partition keeps 5 x 5,000 of the train rows)
        manual=True,
    )
)


def official_soft_labels(ds) -> "np.ndarray":
    """FedNoRo's published soft labels (n_train, 5) from a prepared ``ich_fednoro`` (float64, code order).

    They are in the artifact only when the dataset was prepared with the option
    ``soft_labels: true``; otherwise this says how to get them.
    """
    cols = [f"soft_{j}" for j in range(len(ICH_CLASSES))]
    frame = ds.split_frame("train")
    if ds.info.name != "ich_fednoro" or not all(c in frame.columns for c in cols):
        raise ConfigError(
            f"noise 'fednoro_hidn' with soft_labels='official_csv' needs FedNoRo's ICH_softlabel.csv, which only "
            f"exists for ich_fednoro; set data.datasets.ich_fednoro.options.soft_labels: true and prepare it again "
            f"(dataset here: {ds.info.name!r})"
        )
    return frame[cols].to_numpy(dtype=np.float64)
