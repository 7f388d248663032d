"""NIH ChestX-ray14 as FedMLP uses it (fedmlp.md §5): PA views, top-8 findings, 7:3 split.

Source: NIH Clinical Center, https://nihcc.app.box.com/v/ChestXray-NIHCC:
``Data_Entry_2017_v2020.csv`` and the 12 archives ``images_001.tar.gz`` ..
``images_012.tar.gz`` (PNGs under ``images/``). The archives are fetched from
the NIH Box links of NIH's ``batch_download_zips.py`` and checked against the
MD5s in NIH's FAQ. The CSV has no direct link (it sits behind the Box web page)
and no published checksum: place it by hand or serve it from a mirror; its
sha256 is recorded in meta.json. Archives are extracted into ``images/`` once
each (a marker per archive); archives already extracted are not downloaded again.

Labels (FedMLP ``preprocess/label_rectify.py``): rows with View Position ==
'PA' (67,310), one-hot over the 14 findings in alphabetical order ('No Finding'
-> all zeros, kept). FedMLP keeps the 8 classes with the most positive images
(the selection script is not published): by default the top 8 by PA positives,
in the original alphabetical order (spec recommendation); the list is recorded
in meta.json (``class_names``). Split: ``train_test_split(test_size=0.3)``
after ``np.random.seed(2023)`` -> 47,117 train / 20,193 test. The published
client index file is reproduced by ``iid_sampling(n=47,116, ...)``, one row
fewer than this recipe gives (fedmlp.md §3): option ``n_train_for_index``
records which n the partition step should use.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import ConfigError, DataError
from .base import DATASETS, DatasetInfo, PrepareContext, write_prepared
from .download import RemoteFile
from .ich import fedmlp_split
from .rawfiles import (
    extract_archive,
    find_missing_files,
    missing_manual_data,
    parse_options,
    read_extraction_marker,
    sha256_label,
)

__all__ = [
    "FINDINGS",
    "DATA_ENTRY",
    "IMAGE_ARCHIVES",
    "ChestXrayOptions",
    "read_data_entry",
    "select_top_classes",
    "prepare_chestxray14",
]

FINDINGS = (
    "Atelectasis", "Cardiomegaly", "Consolidation", "Edema", "Effusion", "Emphysema", "Fibrosis",
    "Hernia", "Infiltration", "Mass", "Nodule", "Pleural_Thickening", "Pneumonia", "Pneumothorax",
)  # fmt: skip
NO_FINDING = "No Finding"
# Top 8 over all views (fedmlp.md §9.4), alphabetical. The registry lists these;
# the prepared meta.json holds the list actually selected from the PA rows.
EXPECTED_TOP8 = (
    "Atelectasis", "Consolidation", "Effusion", "Infiltration", "Mass", "Nodule", "Pleural_Thickening", "Pneumothorax",
)  # fmt: skip
IMAGE_DIR = "images"
NIH_PAGE = "https://nihcc.app.box.com/v/ChestXray-NIHCC"

DATA_ENTRY = RemoteFile(filename="Data_Entry_2017_v2020.csv", urls=())  # no direct link, no published checksum

# NIH Box links (NIH's batch_download_zips.py) and MD5s (NIH FAQ, "Q07").
_BOX = "https://nihcc.box.com/shared/static/"
_ARCHIVES = (
    ("vfk49d74nhbxq3nqjg0900w5nvkorp5c", "fe8ed0a6961412fddcbb3603c11b3698"),
    ("i28rlmbvmfjbl8p2n3ril0pptcmcu9d1", "ab07a2d7cbe6f65ddd97b4ed7bde10bf"),
    ("f1t00wrtdk94satdfb9olcolqx20z2jp", "2301d03bde4c246388bad3876965d574"),
    ("0aowwzs5lhjrceb3qp67ahp0rd1l1etg", "9f1b7f5aae01b13f4bc8e2c44a4b8ef6"),
    ("v5e3goj22zr6h8tzualxfsqlqaygfbsn", "1861f3cd0ef7734df8104f2b0309023b"),
    ("asi7ikud9jwnkrnkj99jnpfkjdes7l6l", "456b53a8b351afd92a35bc41444c58c8"),
    ("jn1b4mw4n6lnh74ovmcjb8y48h8xj07n", "1075121ea20a137b87f290d6a4a5965e"),
    ("tvpxmn7qyrgl0w8wfh9kqfjskv6nmm1j", "b61f34cec3aa69f295fbb593cbd9d443"),
    ("upyy3ml7qdumlgk2rfcvlb9k6gvqq2pj", "442a3caa61ae9b64e61c561294d1e183"),
    ("l6nilvfa9cg3s28tqv1qc1olm3gnz54p", "09ec81c4c31e32858ad8cf965c494b74"),
    ("hhq8fkdgvcari67vfhs7ppg2w6ni4jze", "499aefc67207a5a97692424cf5dbeed5"),
    ("ioqwiy20ihqwyr8pf4c24eazhh281pbu", "dc9fda1757c2de0032b63347a7d2895c"),
)
IMAGE_ARCHIVES: tuple[RemoteFile, ...] = tuple(
    RemoteFile(filename=f"images_{i:03d}.tar.gz", urls=(f"{_BOX}{box}.gz",), md5=md5)
    for i, (box, md5) in enumerate(_ARCHIVES, start=1)
)


@dataclass(frozen=True)
class ChestXrayOptions:
    """Options of ``chestxray14``.

    ``classes``: None (default) selects the 8 findings with the most PA
    positives; or a list of 8 finding names to fix the selection.
    ``split_seed`` (2023) / ``test_size`` (0.3): FedMLP's split recipe.
    ``n_train_for_index``: the n FedMLP's IID sampler was given (47,116
    reproduces the published index file; 47,117 is what the split recipe
    yields); recorded in meta.json for the partition step, the split itself
    is not truncated. ``keep_archives``: keep the .tar.gz files after
    extraction (False deletes each once extracted; the marker keeps its MD5).
    ``decoded_cache`` (true): training reads the images from a decoded cache built once at the
    size it reads them (fnlcore.datasets.decoded_cache, rules/cache.smk); false decodes every epoch.
    """

    classes: list | None = None
    split_seed: int = 2023
    test_size: float = 0.3
    n_train_for_index: int = 47_116
    keep_archives: bool = True
    decoded_cache: bool = True

    def __post_init__(self) -> None:
        if self.classes is not None:
            bad = [c for c in self.classes if c not in FINDINGS]
            if len(self.classes) != 8 or bad or len(set(self.classes)) != 8:
                raise ConfigError(
                    f"option classes must list 8 distinct findings out of {list(FINDINGS)}, got {self.classes!r}"
                )
        if not 0.0 < self.test_size < 1.0:
            raise ConfigError(f"option test_size must lie in (0, 1), got {self.test_size}")
        if self.n_train_for_index <= 0:
            raise ConfigError(f"option n_train_for_index must be positive, got {self.n_train_for_index}")


def read_data_entry(path: str | os.PathLike, view_position: str = "PA") -> pd.DataFrame:
    """Rows of ``Data_Entry_2017_v2020.csv`` with the given view, one-hot over the 14 findings.

    Returns ``image_id`` (the ``Image Index``) and one uint8 column per finding
    (``FINDINGS`` order), in file order. Columns are located by position as in
    FedMLP (0: Image Index, 1: Finding Labels, 6: View Position) after checking
    their names. An unknown finding is a DataError naming it.
    """
    p = Path(path)
    try:
        df = pd.read_csv(p, usecols=[0, 1, 6], dtype=str)
    except (OSError, ValueError, pd.errors.ParserError) as exc:
        raise DataError(f"{p}: cannot be read as NIH's Data_Entry_2017_v2020.csv ({exc})") from None
    if list(df.columns) != ["Image Index", "Finding Labels", "View Position"]:
        raise DataError(
            f"{p}: columns 0, 1, 6 are {list(df.columns)}, expected ['Image Index', 'Finding Labels', "
            "'View Position'] (NIH's Data_Entry_2017_v2020.csv)"
        )
    df = df[df["View Position"] == view_position].reset_index(drop=True)
    dummies = df["Finding Labels"].str.get_dummies(sep="|")
    unknown = sorted(set(dummies.columns) - set(FINDINGS) - {NO_FINDING})
    if unknown:
        raise DataError(f"{p}: unknown finding label(s) {unknown}; expected {list(FINDINGS)} or {NO_FINDING!r}")
    out = pd.DataFrame({"image_id": df["Image Index"].to_numpy(dtype=object)})
    for name in FINDINGS:
        out[name] = dummies[name].to_numpy(np.uint8) if name in dummies else np.zeros(len(df), np.uint8)
    return out


def select_top_classes(onehot: pd.DataFrame, k: int = 8) -> tuple[str, ...]:
    """The ``k`` findings with the most positives, returned in ``FINDINGS`` (alphabetical) order.

    Ties are broken toward the earlier finding in ``FINDINGS``.
    """
    counts = onehot.loc[:, list(FINDINGS)].to_numpy().sum(axis=0, dtype=np.int64)
    ranked = np.lexsort((np.arange(len(FINDINGS)), -counts))[:k]
    return tuple(FINDINGS[i] for i in sorted(ranked))


def prepare_chestxray14(ctx: PrepareContext) -> None:
    """Prepare ChestX-ray14 for FedMLP (see the module docstring)."""
    opts: ChestXrayOptions = parse_options("chestxray14", ChestXrayOptions, ctx.options)
    raw = ctx.raw_dir
    entry_path = raw / DATA_ENTRY.filename
    if not entry_path.is_file():
        if not ctx.mirrors:
            raise missing_manual_data(
                "chestxray14",
                raw,
                [f"{entry_path} (file)"],
                source=f"NIH Clinical Center ChestX-ray14, {NIH_PAGE} (file Data_Entry_2017_v2020.csv)",
                access="public; download it from the Box page in a browser (it has no direct link), or configure "
                "a mirror that serves it (config key data.datasets.chestxray14.mirrors)",
                layout=[
                    DATA_ENTRY.filename,
                    f"{IMAGE_DIR}/<Image Index>.png   (downloaded and extracted automatically from "
                    "images_001.tar.gz .. images_012.tar.gz)",
                ],
            )
        entry_path = ctx.fetch(DATA_ENTRY)
    table = read_data_entry(entry_path)
    rel = (IMAGE_DIR + "/" + table["image_id"]).to_numpy(dtype=object)
    files = {DATA_ENTRY.filename: sha256_label(entry_path)}

    missing = find_missing_files(raw, rel)
    for remote in IMAGE_ARCHIVES:
        marker = read_extraction_marker(raw, remote.filename)
        if marker is None and missing.any():
            path = ctx.fetch(remote, progress=True)
            marker = extract_archive(path, raw, IMAGE_DIR, record={"checksum": remote.checksum_label()})
            if not opts.keep_archives:
                path.unlink()
        files[remote.filename] = marker["checksum"] if marker else "not needed (images already in place)"
    missing = find_missing_files(raw, rel)
    if missing.any():
        first = ", ".join(p.rsplit("/", 1)[-1] for p in rel[missing][:5])
        raise DataError(
            f"{raw / IMAGE_DIR}: {int(missing.sum()):,} of {len(rel):,} PA images listed in "
            f"{DATA_ENTRY.filename} are missing after extracting every archive (first: {first}). Fix: delete "
            f"{raw / '.extracted'} and the archives, then run again."
        )

    classes = tuple(opts.classes) if opts.classes is not None else select_top_classes(table)
    labels = table.loc[:, list(classes)].to_numpy(np.uint8)
    train_rows, test_rows = fedmlp_split(len(table), opts.split_seed, opts.test_size)
    parts = []
    for split, rows in (("train", train_rows), ("test", test_rows)):
        part = pd.DataFrame({"sample_id": np.arange(len(rows), dtype=np.int64), "split": split})
        for j in range(len(classes)):
            part[f"label_{j}"] = labels[rows, j]
        part["path"] = rel[rows]
        part["image_id"] = table["image_id"].to_numpy(dtype=object)[rows]
        part["table_row"] = rows  # row among the PA rows of Data_Entry (FedMLP's onehot-label-PA.csv)
        parts.append(part)
    index = pd.concat(parts, ignore_index=True)

    positives = table.loc[:, list(FINDINGS)].to_numpy().sum(axis=0)
    extra = {
        "view_position": "PA",
        "n_pa_images": int(len(table)),
        "pa_positives_per_finding": {f: int(c) for f, c in zip(FINDINGS, positives)},
        "class_selection": "given in options" if opts.classes is not None else "top 8 by PA positives",
        "split_seed": opts.split_seed,
        "test_size": opts.test_size,
        "n_train_for_index": opts.n_train_for_index,
        "client_index_file": "fedmlp_chestxray14_clients",
        "expected_by_fedmlp": {"n_pa_images": 67_310, "n_train": 47_117, "n_test": 20_193},
    }
    info = replace(CHESTXRAY14, class_names=classes)
    write_prepared(ctx.out_dir, info, index, None, extra, raw_dir=raw, files=files)


CHESTXRAY14 = DATASETS.register(
    DatasetInfo(
        name="chestxray14",
        num_classes=8,
        class_names=EXPECTED_TOP8,
        multi_label=True,
        channels=3,  # FedMLP converts the grey PNGs to RGB
        image_size=(224, 224),
        in_memory=False,
        source=f"NIH ChestX-ray14, {NIH_PAGE}",
        papers=("fedmlp",),
        prepare=prepare_chestxray14,
        split_sizes=(47_117, 20_193),  # fedmlp.md §3: the train_test_split recipe on the 67,310 PA images
        manual=False,
    )
)
