"""The user's path with their own data: a local copy of ich_fednoro, a subset of its IDs, the image size.

The label CSVs are FedNoRo's real published files (spec fixtures) placed by hand in the
raw folder, as a researcher with their own copy would have them: they verify against the
pinned checksums without any network. The PNGs are tiny files made here; only the images
of the subset exist.
"""

from __future__ import annotations

import hashlib
import io
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

import fnlcore.datasets as ds
from fnlcore.datasets import ich
from fnlcore.errors import ConfigError, DataError, MissingManualDataError
from fnlcore.imagefiles import ImageFiles

H, W = 6, 5  # the files' own size in these tests (not square, not 512)


def png(h: int = H, w: int = W, value: int = 7) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((h, w), value, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def own_copy(tmp_path, spec_data_dir):
    """A raw folder with the official CSVs placed by hand and the PNGs of 4 train + 2 test ids."""
    raw = tmp_path / "my_ich"
    (raw / "stage_1_train_images").mkdir(parents=True)
    for name in ("train_ICH.csv", "test_ICH.csv"):
        shutil.copy(spec_data_dir / f"fednoro_{name}", raw / name)
    train = pd.read_csv(raw / "train_ICH.csv")
    test = pd.read_csv(raw / "test_ICH.csv")
    rows = {"train": [40, 3, 17, 3, 1000], "test": [5, 2]}  # out of order, one repeated
    ids = list(train["id"].iloc[rows["train"]]) + list(test["id"].iloc[rows["test"]])
    for i in ids:
        (raw / "stage_1_train_images" / f"{i}.png").write_bytes(png())
    subset = tmp_path / "ids.csv"
    pd.DataFrame({"ID": ids, "note": "x"}).to_csv(subset, index=False)
    return raw, subset, train, test, rows


def test_subset_of_own_copy_keeps_fednoro_order_and_records_provenance(own_copy, tmp_path):
    raw, subset, train, test, rows = own_copy
    out = tmp_path / "out"
    ds.prepare_dataset("ich_fednoro", raw, out, {"subset": str(subset)})  # no mirror: nothing is downloaded
    data = ds.load_prepared(out)
    kept_train = sorted(set(rows["train"]))
    assert (data.meta["n_train"], data.meta["n_test"]) == (4, 2)
    assert list(data.split_frame("train")["image_id"]) == list(train["id"].iloc[kept_train])
    assert list(data.split_frame("train")["full_sample_id"]) == kept_train
    labels = train.iloc[kept_train, 1:].to_numpy().argmax(axis=1)
    assert data.labels("train").tolist() == labels.tolist()
    assert list(data.split_frame("test")["image_id"]) == list(test["id"].iloc[sorted(rows["test"])])
    meta = data.meta
    assert meta["subset"] == {
        "file": str(subset.resolve()),
        "sha256": hashlib.sha256(subset.read_bytes()).hexdigest(),
        "n_ids": 6,
        "kept": {"n_train": 4, "n_test": 2},
    }
    assert meta["provenance"]["source_dir"] == str(raw.resolve())
    assert meta["provenance"]["label_files_verified"] == ["test_ICH.csv", "train_ICH.csv"]
    assert meta["provenance"]["n_samples"] == 6
    assert meta["files"]["train_ICH.csv"] == "sha256:" + ich.official_file("fednoro_ich_train").remote.sha256
    assert data.paths("test")[0].startswith(str(raw.resolve()))


def test_image_size_is_the_files_own_unless_set(own_copy, tmp_path):
    raw, subset, *_ = own_copy
    data = ds.load_prepared(_prepare(raw, tmp_path / "own", {"subset": str(subset)}))
    assert data.info.image_size == (H, W) and data.meta["image_size"] == [H, W]
    assert data.meta["image_size_from"].startswith("file stage_1_train_images/")
    x, _ = ImageFiles(data.paths("train"), data.info.image_size, data.info.channels)[0]
    assert tuple(x.shape) == (3, H, W)  # no resize: the file's own pixels

    data = ds.load_prepared(_prepare(raw, tmp_path / "r512", {"subset": str(subset), "image_size": 512}))
    assert data.info.image_size == (512, 512) and data.meta["image_size_from"] == "option image_size"
    x, _ = ImageFiles(data.paths("train"), data.info.image_size, data.info.channels)[0]
    assert tuple(x.shape) == (3, 512, 512)
    data = ds.load_prepared(_prepare(raw, tmp_path / "hw", {"subset": str(subset), "image_size": [8, 4]}))
    assert data.meta["image_size"] == [8, 4]


@pytest.mark.parametrize("bad", [0, "512", [512], True, [4, -1]])
def test_bad_image_size_is_one_config_error(own_copy, tmp_path, bad):
    raw, subset, *_ = own_copy
    with pytest.raises(ConfigError, match="image_size"):
        ds.prepare_dataset("ich_fednoro", raw, tmp_path / "out", {"subset": str(subset), "image_size": bad})


def test_subset_needs_only_its_own_images(own_copy, tmp_path):
    raw, subset, train, *_ = own_copy
    (raw / "stage_1_train_images" / f"{train['id'].iloc[17]}.png").unlink()
    with pytest.raises(MissingManualDataError, match=r"1 of 6 expected images missing"):
        ds.prepare_dataset("ich_fednoro", raw, tmp_path / "out", {"subset": str(subset)})
    assert not (tmp_path / "out" / "meta.json").exists()


def test_subset_with_an_unknown_id_or_no_test_id_is_an_error(own_copy, tmp_path):
    raw, subset, train, *_ = own_copy
    typo = tmp_path / "typo.csv"
    typo.write_text("id\nID_3a0809fec\nID_nothere\n")
    with pytest.raises(DataError, match="1 of 2 IDs are not in the dataset's label files.*ID_nothere"):
        ds.prepare_dataset("ich_fednoro", raw, tmp_path / "out", {"subset": str(typo)})
    only_train = tmp_path / "train_only.csv"
    only_train.write_text("id\n" + train["id"].iloc[3] + "\n")
    with pytest.raises(DataError, match="keeps no test sample"):
        ds.prepare_dataset("ich_fednoro", raw, tmp_path / "out", {"subset": str(only_train)})
    no_column = tmp_path / "no_column.csv"
    no_column.write_text("name\nID_3a0809fec\n")
    with pytest.raises(DataError, match="no ID column"):
        ds.prepare_dataset("ich_fednoro", raw, tmp_path / "out", {"subset": str(no_column)})
    with pytest.raises(ConfigError, match="subset"):
        ds.prepare_dataset("ich_fednoro", raw, tmp_path / "out", {"subset": str(tmp_path / "absent.csv")})


def test_own_copy_with_a_changed_label_file_is_not_used(own_copy, tmp_path):
    """A label CSV that does not verify is never read as is (here: no network to replace it)."""
    raw, subset, *_ = own_copy
    text = (raw / "test_ICH.csv").read_bytes()
    (raw / "test_ICH.csv").write_bytes(text.replace(b"ID_440bb3b52,0,0,0,0,1", b"ID_440bb3b52,0,0,0,1,0"))
    with pytest.raises(DataError, match="test_ICH.csv"):
        ds.prepare_dataset("ich_fednoro", raw, tmp_path / "out", {"subset": str(subset)},
                           mirrors=["http://127.0.0.1:9/"])
    assert not (tmp_path / "out" / "meta.json").exists()


def _prepare(raw: Path, out: Path, options: dict) -> Path:
    ds.prepare_dataset("ich_fednoro", raw, out, options)
    return out
