"""The on-disk datasets: ICH (FedNoRo and FedMLP forms), ISIC 2019, ChestX-ray14, Clothing1M.

Every input is a tiny file in the exact upstream format (Kaggle's
stage_2_train.csv layout, the ISIC ground truth with UNK, NIH's Data_Entry
header and images_XXX.tar.gz archives, the Clothing1M text files), except the
FedNoRo ICH label CSVs: those are the real published files (spec fixtures),
served by a local HTTP server so the pinned checksums are checked for real.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from sklearn.model_selection import train_test_split

import fnlcore.datasets as ds
from fnlcore.datasets import chestxray, clothing1m, ich, isic
from fnlcore.datasets.download import RemoteFile
from fnlcore.errors import ChecksumError, ConfigError, DataError, MissingManualDataError
from tests.support.httpserver import file_server  # noqa: F401  (fixture)

MEDICAL = {"ich_fednoro", "ich_fedmlp", "isic2019", "chestxray14", "clothing1m"}


def png_bytes(seed: int = 0) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((4, 4), seed % 256, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def jpeg_bytes(seed: int = 0) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((4, 4, 3), seed % 256, np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


def tar_gz(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def prepare(name, raw, out, options=None, mirrors=()):
    ds.prepare_dataset(name, raw, out, options=options, mirrors=mirrors)
    return ds.load_prepared(out)


def test_registry_describes_the_medical_datasets():
    infos = {n: ds.get_dataset(n) for n in MEDICAL}
    assert all(not i.in_memory for i in infos.values())
    assert {n for n, i in infos.items() if i.manual} == {"ich_fednoro", "ich_fedmlp", "clothing1m"}
    assert {n for n, i in infos.items() if i.multi_label} == {"ich_fedmlp", "chestxray14"}
    assert [infos[n].num_classes for n in ("ich_fednoro", "ich_fedmlp", "isic2019", "chestxray14", "clothing1m")] == [
        5, 5, 8, 8, 14,
    ]  # fmt: skip
    assert infos["isic2019"].class_names == ("MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC")
    assert infos["clothing1m"].class_names[0] == "T-Shirt" and infos["clothing1m"].class_names[-1] == "Underwear"


# ---- ICH, FedNoRo form --------------------------------------------------------------------


@pytest.fixture
def fednoro_server(file_server, spec_data_dir):
    for served, fixture in (("train_ICH.csv", "fednoro_train_ICH.csv"), ("test_ICH.csv", "fednoro_test_ICH.csv")):
        (file_server.root / served).write_bytes((spec_data_dir / fixture).read_bytes())
    return file_server


def test_ich_fednoro_without_images_fails_at_once_naming_everything(fednoro_server, tmp_path):
    raw, out = tmp_path / "raw", tmp_path / "out"
    with pytest.raises(MissingManualDataError) as info:
        ds.prepare_dataset("ich_fednoro", raw, out, mirrors=[fednoro_server.url])
    msg = str(info.value)
    for part in (
        str(raw / "stage_1_train_images"),
        "rsna-intracranial-hemorrhage-detection",
        "stage_1_train",
        "accept the competition rules",
        "prepare-dataset-resizing-and-saving-as-png",
        "data.datasets.ich_fednoro.raw_dir",
    ):
        assert part in msg
    assert fednoro_server.requests == []  # nothing downloaded before failing
    assert not (out / "meta.json").exists()


def test_ich_fednoro_with_some_images_lists_how_many_are_missing(fednoro_server, spec_data_dir, tmp_path):
    raw, out = tmp_path / "raw", tmp_path / "out"
    (raw / "stage_1_train_images").mkdir(parents=True)
    for i in ("ID_3a0809fec", "ID_78d909124"):  # the first two train ids
        (raw / "stage_1_train_images" / f"{i}.png").write_bytes(png_bytes())
    with pytest.raises(MissingManualDataError) as info:
        ds.prepare_dataset("ich_fednoro", raw, out, mirrors=[fednoro_server.url])
    msg = str(info.value)
    assert "67,967 of 67,969 expected images missing" in msg
    third = pd.read_csv(spec_data_dir / "fednoro_train_ICH.csv")["id"].iloc[2]
    assert f"{third}.png" in msg and "data.datasets.ich_fednoro.raw_dir" in msg
    # the label files were fetched and verified against the pinned sha256
    assert (raw / "train_ICH.csv").read_bytes() == (spec_data_dir / "fednoro_train_ICH.csv").read_bytes()
    assert not (out / "meta.json").exists()


def test_ich_fednoro_with_a_changed_label_file_is_a_checksum_error(fednoro_server, tmp_path):
    raw, out = tmp_path / "raw", tmp_path / "out"
    (raw / "stage_1_train_images").mkdir(parents=True)
    served = fednoro_server.root / "test_ICH.csv"
    served.write_bytes(served.read_bytes().replace(b"ID_440bb3b52,0,0,0,0,1", b"ID_440bb3b52,0,0,0,1,0"))
    with pytest.raises(ChecksumError, match="test_ICH.csv"):
        ds.prepare_dataset("ich_fednoro", raw, out, mirrors=[fednoro_server.url])
    assert not (raw / "test_ICH.csv").exists() and not (out / "meta.json").exists()


def test_ich_fednoro_prepares_with_all_images_and_soft_labels(fednoro_server, spec_data_dir, tmp_path, monkeypatch):
    raw, out = tmp_path / "raw", tmp_path / "out"
    train_ids = pd.read_csv(spec_data_dir / "fednoro_train_ICH.csv")["id"]
    test_ids = pd.read_csv(spec_data_dir / "fednoro_test_ICH.csv")["id"]
    folder = raw / "stage_1_train_images"
    folder.mkdir(parents=True)
    (folder / f"{train_ids.iloc[0]}.png").write_bytes(png_bytes())
    # Creating 67,969 files costs seconds of file-system time; the real existence check runs on
    # all of them in the test above. Here the check must see exactly the expected paths.
    expected = ("stage_1_train_images/" + pd.concat([train_ids, test_ids]) + ".png").tolist()
    real_check = ich.find_missing_files

    def all_present(root, relpaths):
        assert Path(root) == raw and list(relpaths) == expected
        assert not real_check(root, relpaths[:1]).any()
        return np.zeros(len(relpaths), dtype=bool)

    monkeypatch.setattr(ich, "find_missing_files", all_present)
    probs = np.random.default_rng(1).dirichlet(np.ones(5), size=len(train_ids))
    pd.DataFrame({"id": train_ids, **{str(j): probs[:, j] for j in range(5)}}).to_csv(
        fednoro_server.root / "ICH_softlabel.csv", index=False
    )
    # the stand-in is pinned by its own git blob id, as the official file is by the pinned tree's
    from dataclasses import replace

    from fnlcore.datasets import official_files

    key = "fednoro_ich_softlabel"
    stand_in = replace(official_files.OFFICIAL_FILES[key], git_blob=official_files.git_blob_sha1(fednoro_server.root / "ICH_softlabel.csv"))
    monkeypatch.setitem(official_files.OFFICIAL_FILES, key, stand_in)
    data = prepare("ich_fednoro", raw, out, {"soft_labels": True}, mirrors=[fednoro_server.url])
    assert (data.meta["n_train"], data.meta["n_test"]) == (47_578, 20_391)
    assert np.bincount(data.labels("train"), minlength=5).tolist() == [1046, 9776, 6198, 10275, 20283]
    assert np.bincount(data.labels("test"), minlength=5).tolist() == [451, 4156, 2716, 4442, 8626]
    paths = data.paths("train")
    assert paths[0] == str((folder / f"{train_ids.iloc[0]}.png").resolve())
    assert data.meta["files"]["train_ICH.csv"] == "sha256:" + ich.official_file("fednoro_ich_train").remote.sha256
    assert data.meta["files"]["ICH_softlabel.csv"].startswith("sha256:")
    train = data.split_frame("train")
    np.testing.assert_allclose(train[[f"soft_{j}" for j in range(5)]].to_numpy(), probs)
    assert data.split_frame("test")["soft_0"].isna().all()


# ---- ICH, FedMLP form ---------------------------------------------------------------------


def write_stage2(path: Path, images: list[tuple[str, list[int]]]) -> None:
    """Kaggle's stage_2_train.csv: 6 rows per image (5 subtypes then 'any')."""
    lines = ["ID,Label"]
    for img, labels in images:
        for sub, lab in zip(ich._STAGE2_SUBTYPES, [*labels, int(any(labels))]):
            lines.append(f"{img}_{sub},{lab}")
    path.write_text("\n".join(lines) + "\n")


def fedmlp_raw(tmp_path: Path, n: int = 24, with_png=lambda i: i % 4 != 3) -> tuple[Path, list]:
    rng = np.random.default_rng(3)
    raw = tmp_path / "raw"
    (raw / "png185k_512").mkdir(parents=True)
    images = [(f"ID_{i:09x}", rng.integers(0, 2, 5).tolist()) for i in range(n)]
    images.append(images[5])  # Kaggle's file repeats a few images; FedMLP keeps both
    write_stage2(raw / "stage_2_train.csv", images)
    for i, (img, _) in enumerate(images[:n]):
        if with_png(i):
            (raw / "png185k_512" / f"{img}.png").write_bytes(png_bytes(i))
    return raw, images


def test_fedmlp_split_equals_train_test_split_after_global_seed():
    state = np.random.get_state()
    try:
        for n, seed in ((10, 2023), (97, 2023), (185, 7)):
            np.random.seed(seed)
            ref_train, ref_test = train_test_split(np.arange(n), test_size=0.3)  # FedMLP's call
            train, test = ich.fedmlp_split(n, seed, 0.3)
            np.testing.assert_array_equal(train, ref_train)
            np.testing.assert_array_equal(test, ref_test)
    finally:
        np.random.set_state(state)


def test_fedmlp_split_sizes_at_paper_scale():
    assert [len(x) for x in ich.fedmlp_split(185_051)] == [129_535, 55_516]
    assert [len(x) for x in ich.fedmlp_split(67_310)] == [47_117, 20_193]


def test_ich_fedmlp_keeps_images_with_a_png_and_splits_like_fedmlp(tmp_path):
    raw, images = fedmlp_raw(tmp_path)
    data = prepare("ich_fedmlp", raw, tmp_path / "out")
    kept = [(img, lab) for i, (img, lab) in enumerate(images) if i == len(images) - 1 or i % 4 != 3]
    assert data.meta["n_images_in_stage2_csv"] == 25 and data.meta["n_images_with_png"] == len(kept) == 19
    assert data.meta["n_repeated_image_ids"] == 1
    train_rows, test_rows = ich.fedmlp_split(len(kept))
    assert (data.meta["n_train"], data.meta["n_test"]) == (len(train_rows), len(test_rows)) == (13, 6)
    table = np.array([lab for _, lab in kept], np.uint8)
    np.testing.assert_array_equal(data.labels("train"), table[train_rows])
    np.testing.assert_array_equal(data.labels("test"), table[test_rows])
    assert data.labels("train").dtype == np.uint8 and data.labels("train").shape == (13, 5)
    assert data.split_frame("train")["image_id"].tolist() == [kept[r][0] for r in train_rows]
    assert data.paths("test")[0] == str((raw / "png185k_512" / f"{kept[test_rows[0]][0]}.png").resolve())
    assert data.meta["positives_per_class"] == table.sum(axis=0).tolist()


def test_ich_fedmlp_split_seed_option_changes_the_split(tmp_path):
    raw, _ = fedmlp_raw(tmp_path)
    a = prepare("ich_fedmlp", raw, tmp_path / "a")
    b = prepare("ich_fedmlp", raw, tmp_path / "b", {"split_seed": 1})
    assert a.split_frame("train")["table_row"].tolist() != b.split_frame("train")["table_row"].tolist()
    with pytest.raises(ConfigError, match="test_size"):
        ds.prepare_dataset("ich_fedmlp", raw, tmp_path / "c", {"test_size": 1.5})


def test_ich_fedmlp_missing_files_are_all_named(tmp_path):
    raw = tmp_path / "raw"
    with pytest.raises(MissingManualDataError) as info:
        ds.prepare_dataset("ich_fedmlp", raw, tmp_path / "out")
    msg = str(info.value)
    for part in (
        str(raw / "stage_2_train.csv"),
        str(raw / "png185k_512"),
        "stage_2",
        "data.datasets.ich_fedmlp.raw_dir",
    ):
        assert part in msg


def test_ich_fedmlp_with_no_png_at_all_is_missing_manual_data(tmp_path):
    raw, _ = fedmlp_raw(tmp_path, with_png=lambda i: False)
    with pytest.raises(
        MissingManualDataError, match="24 of 25 expected images missing|25 of 25 expected images missing"
    ):
        ds.prepare_dataset("ich_fedmlp", raw, tmp_path / "out")


def test_stage2_csv_out_of_layout_is_a_data_error(tmp_path):
    p = tmp_path / "stage_2_train.csv"
    write_stage2(p, [("ID_a", [0, 1, 0, 0, 0]), ("ID_b", [1, 0, 0, 0, 0])])
    lines = p.read_text().splitlines()
    lines[2], lines[3] = lines[3], lines[2]  # swap two subtype rows of ID_a
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match="groups of 6"):
        ich.parse_stage2_labels(p)
    p.write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(DataError, match="multiple of 6"):
        ich.parse_stage2_labels(p)


def test_stage2_parse_matches_a_row_by_row_reading(tmp_path):
    rng = np.random.default_rng(5)
    images = [(f"ID_{i:09x}", rng.integers(0, 2, 5).tolist()) for i in range(30)]
    p = tmp_path / "stage_2_train.csv"
    write_stage2(p, images)
    table = ich.parse_stage2_labels(p)
    assert table["image_id"].tolist() == [img for img, _ in images]
    np.testing.assert_array_equal(table[list(ich.ICH_CLASSES)].to_numpy(), np.array([lab for _, lab in images]))


# ---- ISIC 2019 ----------------------------------------------------------------------------


def isic_served(root: Path, n: int = 30, unk_row: int | None = None) -> pd.DataFrame:
    rng = np.random.default_rng(7)
    classes = rng.integers(0, 8, n)
    gt = pd.DataFrame({"image": [f"ISIC_{i:07d}" for i in range(n)]})
    for j, c in enumerate(isic.ISIC_CLASSES):
        gt[c] = (classes == j).astype(float)
    gt["UNK"] = 0.0
    if unk_row is not None:
        gt.loc[unk_row, list(isic.ISIC_CLASSES)] = 0.0
        gt.loc[unk_row, "UNK"] = 1.0
    gt.to_csv(root / "ISIC_2019_Training_GroundTruth.csv", index=False)
    with zipfile.ZipFile(root / "ISIC_2019_Training_Input.zip", "w") as zf:
        zf.writestr("ISIC_2019_Training_Input/ATTRIBUTION.txt", "attribution")
        zf.writestr("ISIC_2019_Training_Input/LICENSE.txt", "CC-BY-NC")
        for i, img in enumerate(gt["image"]):
            zf.writestr(f"ISIC_2019_Training_Input/{img}.jpg", jpeg_bytes(i))
    return gt


@given(st.integers(2, 5000), st.integers(0, 2**31 - 1))
@settings(max_examples=40, deadline=None)
def test_isic_split_takes_floor_of_seventy_percent(n, seed):
    train, test = isic.isic_split(n, seed)
    assert len(train) == (7 * n) // 10 and len(train) + len(test) == n
    assert sorted(np.concatenate([train, test]).tolist()) == list(range(n))
    np.testing.assert_array_equal(np.concatenate([train, test]), np.random.RandomState(seed).permutation(n))


def test_isic_split_at_paper_scale():
    train, test = isic.isic_split(25_331)
    assert (len(train), len(test)) == (17_731, 7_600)
    assert len(isic.isic_split(70)[0]) == 49  # exact floor, not float 0.7 * 70 = 48.99...


def test_isic_downloads_extracts_and_persists_fednoro_split_files(file_server, tmp_path):
    gt = isic_served(file_server.root)
    raw, out = tmp_path / "raw", tmp_path / "out"
    data = prepare("isic2019", raw, out, mirrors=[file_server.url])
    assert (data.meta["n_train"], data.meta["n_test"]) == (21, 9)
    train_rows, test_rows = isic.isic_split(30)
    labels = gt[list(isic.ISIC_CLASSES)].to_numpy().argmax(axis=1)
    np.testing.assert_array_equal(data.labels("train"), labels[train_rows])
    np.testing.assert_array_equal(data.labels("test"), labels[test_rows])
    assert (raw / "ISIC_2019_Training_Input" / "ISIC_0000000.jpg").read_bytes() == jpeg_bytes(0)
    assert data.paths("train")[0] == str(
        (raw / "ISIC_2019_Training_Input" / f"{gt['image'][train_rows[0]]}.jpg").resolve()
    )
    for split, rows in (("train", train_rows), ("test", test_rows)):
        written = pd.read_csv(out / f"{split}.csv")
        assert list(written.columns) == ["image", *isic.ISIC_CLASSES]  # FedNoRo asserts 8 classes
        assert written["image"].tolist() == gt["image"][rows].tolist()
        np.testing.assert_array_equal(written.iloc[:, 1:].to_numpy().argmax(axis=1), labels[rows])
    assert data.meta["files"]["ISIC_2019_Training_Input.zip"].startswith("sha256:")
    assert data.meta["class_counts"] == np.bincount(labels, minlength=8).tolist()
    # extracted once: a rerun needs neither the zip nor the network
    (raw / "ISIC_2019_Training_Input.zip").unlink()
    n = len(file_server.requests)
    again = prepare("isic2019", raw, tmp_path / "out2", mirrors=[file_server.url])
    assert len(file_server.requests) == n
    assert again.split_frame("train")["image_id"].tolist() == data.split_frame("train")["image_id"].tolist()


def test_isic_row_order_option_sorts_each_split(file_server, tmp_path):
    isic_served(file_server.root)
    data = prepare("isic2019", tmp_path / "raw", tmp_path / "out", {"row_order": "file"}, mirrors=[file_server.url])
    ids = data.split_frame("train")["image_id"].tolist()
    assert ids == sorted(ids) and len(ids) == 21


def test_isic_positive_unk_is_a_data_error_without_artifact(file_server, tmp_path):
    isic_served(file_server.root, unk_row=4)
    with pytest.raises(DataError, match="UNK is 1 for 1 images"):
        ds.prepare_dataset("isic2019", tmp_path / "raw", tmp_path / "out", mirrors=[file_server.url])
    assert not (tmp_path / "out" / "meta.json").exists()


def test_isic_truncated_zip_is_a_data_error_without_artifact(file_server, tmp_path):
    isic_served(file_server.root)
    z = file_server.root / "ISIC_2019_Training_Input.zip"
    z.write_bytes(z.read_bytes()[: z.stat().st_size // 2])
    raw, out = tmp_path / "raw", tmp_path / "out"
    with pytest.raises(DataError, match="corrupt or truncated"):
        ds.prepare_dataset("isic2019", raw, out, mirrors=[file_server.url])
    assert not (out / "meta.json").exists() and not (out / "train.csv").exists()
    assert (raw / "ISIC_2019_Training_Input.zip.corrupt").exists() and not (raw / ".extracted").exists()


# ---- ChestX-ray14 -------------------------------------------------------------------------

NIH_HEADER = (
    "Image Index,Finding Labels,Follow-up #,Patient ID,Patient Age,Patient Gender,View Position,"
    "OriginalImage[Width,Height],OriginalImagePixelSpacing[x,y]"
)
# PA positives per finding (hand-made): the top 8 are Hernia 7, Cardiomegaly 6, Atelectasis 5,
# Effusion 5, Edema 4, Mass 4, then three findings tie at 3 (Emphysema, Infiltration,
# Pneumothorax) and the earlier two win. AP rows (excluded) are full of Pneumothorax and Nodule.
PA_DESIGN = {
    "Atelectasis": 5, "Cardiomegaly": 6, "Consolidation": 1, "Edema": 4, "Effusion": 5, "Emphysema": 3,
    "Fibrosis": 2, "Hernia": 7, "Infiltration": 3, "Mass": 4, "Nodule": 2, "Pleural_Thickening": 1,
    "Pneumonia": 0, "Pneumothorax": 3,
}  # fmt: skip
PA_TOP8 = ("Atelectasis", "Cardiomegaly", "Edema", "Effusion", "Emphysema", "Hernia", "Infiltration", "Mass")


def nih_table(n_pa: int = 24, n_ap: int = 10) -> tuple[list[str], list[list[str]], list[str]]:
    """Rows (image, findings, view) interleaving PA and AP; returns names, findings, views."""
    findings: list[list[str]] = [[] for _ in range(n_pa)]
    offset = 0
    for f, count in PA_DESIGN.items():
        for i in range(count):
            findings[(offset + i) % n_pa].append(f)
        offset += count
    rows, labels, views = [], [], []
    pa = iter(range(n_pa))
    for r in range(n_pa + n_ap):
        view = "AP" if r % 3 == 2 and r // 3 < n_ap else "PA"
        if view == "PA":
            labels.append(sorted(findings[next(pa)]))
        else:
            labels.append(["Nodule", "Pneumothorax"])
        rows.append(f"{r // 2 + 1:08d}_{r % 2:03d}.png")
        views.append(view)
    assert views.count("PA") == n_pa
    return rows, labels, views


def write_nih_csv(path: Path, names, labels, views) -> None:
    lines = [NIH_HEADER]
    for i, (name, lab, view) in enumerate(zip(names, labels, views)):
        text = "|".join(lab) if lab else "No Finding"
        lines.append(f"{name},{text},{i % 2},{i // 2 + 1},{40 + i},M,{view},2500,2048,0.143,0.143")
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture
def nih_served(file_server, monkeypatch):
    names, labels, views = nih_table()
    write_nih_csv(file_server.root / "Data_Entry_2017_v2020.csv", names, labels, views)
    halves = (names[: len(names) // 2], names[len(names) // 2 :])
    remotes = []
    for k, part in enumerate(halves, start=1):
        arc = tar_gz(
            file_server.root / f"images_{k:03d}.tar.gz", {f"images/{n}": png_bytes(i) for i, n in enumerate(part)}
        )
        remotes.append(RemoteFile(filename=arc.name, urls=(), md5=md5(arc)))
    monkeypatch.setattr(chestxray, "IMAGE_ARCHIVES", tuple(remotes))
    file_server.nih = (names, labels, views)
    return file_server


def test_nih_fixture_positives_follow_the_design():
    names, labels, views = nih_table()
    counts = {f: sum(f in lab for lab, v in zip(labels, views) if v == "PA") for f in chestxray.FINDINGS}
    assert counts == PA_DESIGN


def test_chestxray_pa_filter_top8_and_split(nih_served, tmp_path):
    names, labels, views = nih_served.nih
    raw, out = tmp_path / "raw", tmp_path / "out"
    data = prepare("chestxray14", raw, out, mirrors=[nih_served.url])
    assert tuple(data.meta["class_names"]) == PA_TOP8
    assert data.meta["pa_positives_per_finding"] == PA_DESIGN
    assert data.meta["n_pa_images"] == 24 and data.meta["n_train_for_index"] == 47_116
    pa = [i for i, v in enumerate(views) if v == "PA"]
    train_rows, test_rows = ich.fedmlp_split(len(pa))
    assert (data.meta["n_train"], data.meta["n_test"]) == (len(train_rows), len(test_rows)) == (16, 8)
    onehot = np.array([[int(c in labels[i]) for c in PA_TOP8] for i in pa], np.uint8)
    np.testing.assert_array_equal(data.labels("train"), onehot[train_rows])
    np.testing.assert_array_equal(data.labels("test"), onehot[test_rows])
    kept = set(data.index["image_id"])
    assert kept == {names[i] for i in pa} and not kept & {n for n, v in zip(names, views) if v == "AP"}
    assert ((data.labels("train").sum(axis=1) == 0).sum() + (data.labels("test").sum(axis=1) == 0).sum()) == (
        onehot.sum(axis=1) == 0
    ).sum()  # rows that become all-zero are kept
    assert Path(data.paths("test")[0]).read_bytes()[:4] == b"\x89PNG"
    for k in (1, 2):
        name = f"images_{k:03d}.tar.gz"
        assert data.meta["files"][name] == f"md5:{md5(nih_served.root / name)}"
    assert data.meta["files"]["Data_Entry_2017_v2020.csv"].startswith("sha256:")


def test_chestxray_reruns_without_downloading_extracted_archives(nih_served, tmp_path):
    raw = tmp_path / "raw"
    prepare("chestxray14", raw, tmp_path / "out", {"keep_archives": False}, mirrors=[nih_served.url])
    assert not list(raw.glob("images_*.tar.gz")) and len(list((raw / "images").iterdir())) == 34
    n = len(nih_served.requests)
    data = prepare("chestxray14", raw, tmp_path / "out", mirrors=[nih_served.url])
    assert len(nih_served.requests) == n and data.meta["n_pa_images"] == 24


def test_chestxray_class_option_and_bad_options(nih_served, tmp_path):
    chosen = ["Atelectasis", "Cardiomegaly", "Consolidation", "Edema", "Effusion", "Emphysema", "Fibrosis", "Hernia"]
    data = prepare("chestxray14", tmp_path / "raw", tmp_path / "out", {"classes": chosen}, mirrors=[nih_served.url])
    assert data.meta["class_names"] == chosen and data.meta["class_selection"] == "given in options"
    for bad in (
        {"classes": chosen[:7]},
        {"classes": chosen[:7] + ["Cancer"]},
        {"view": "AP"},
        {"n_train_for_index": 0},
    ):
        with pytest.raises(ConfigError):
            ds.prepare_dataset("chestxray14", tmp_path / "raw", tmp_path / "out2", bad, mirrors=[nih_served.url])


def test_chestxray_archive_with_wrong_md5_leaves_no_artifact(nih_served, tmp_path):
    out = tmp_path / "out"
    prepare("chestxray14", tmp_path / "raw1", out, mirrors=[nih_served.url])
    assert (out / "meta.json").exists()
    tar_gz(nih_served.root / "images_002.tar.gz", {"images/x.png": b"other bytes"})
    raw = tmp_path / "raw2"
    with pytest.raises(ChecksumError, match="images_002.tar.gz"):
        ds.prepare_dataset("chestxray14", raw, out, mirrors=[nih_served.url])
    assert not (out / "meta.json").exists()  # the earlier artifact no longer looks complete
    assert (
        not (raw / "images_002.tar.gz").exists() and chestxray.read_extraction_marker(raw, "images_002.tar.gz") is None
    )


def test_chestxray_truncated_archive_is_a_data_error(nih_served, monkeypatch, tmp_path):
    arc = nih_served.root / "images_001.tar.gz"
    arc.write_bytes(arc.read_bytes()[:200])
    remotes = list(chestxray.IMAGE_ARCHIVES)
    remotes[0] = RemoteFile(filename=arc.name, urls=(), md5=md5(arc))  # a published checksum of a bad file
    monkeypatch.setattr(chestxray, "IMAGE_ARCHIVES", tuple(remotes))
    raw, out = tmp_path / "raw", tmp_path / "out"
    with pytest.raises(DataError, match="corrupt or truncated"):
        ds.prepare_dataset("chestxray14", raw, out, mirrors=[nih_served.url])
    assert not (out / "meta.json").exists() and not (raw / "images").exists()


def test_chestxray_data_entry_missing_without_mirror_is_manual(tmp_path):
    raw = tmp_path / "raw"
    with pytest.raises(MissingManualDataError) as info:
        ds.prepare_dataset("chestxray14", raw, tmp_path / "out")
    msg = str(info.value)
    assert str(raw / "Data_Entry_2017_v2020.csv") in msg and "nihcc.app.box.com" in msg and "mirrors" in msg


def test_chestxray_archive_table_matches_nih():
    assert [r.filename for r in chestxray.IMAGE_ARCHIVES] == [f"images_{i:03d}.tar.gz" for i in range(1, 13)]
    assert all(
        r.md5 and len(r.urls) == 1 and r.urls[0].startswith("https://nihcc.box.com/") for r in chestxray.IMAGE_ARCHIVES
    )
    assert chestxray.IMAGE_ARCHIVES[0].md5 == "fe8ed0a6961412fddcbb3603c11b3698"


def test_data_entry_reader_rejects_unknown_findings(tmp_path):
    p = tmp_path / "Data_Entry_2017_v2020.csv"
    write_nih_csv(p, ["a.png", "b.png"], [["Mass"], ["Cancer"]], ["PA", "PA"])
    with pytest.raises(DataError, match="Cancer"):
        chestxray.read_data_entry(p)
    p.write_text(
        "Image Index,Labels,Follow-up #,Patient ID,Patient Age,Patient Gender,View Position\na.png,Mass,0,1,2,M,PA\n"
    )
    with pytest.raises(DataError, match="Finding Labels"):
        chestxray.read_data_entry(p)


# ---- Clothing1M ---------------------------------------------------------------------------


def clothing_raw(tmp_path: Path, n_train: int = 20, n_test: int = 6) -> tuple[Path, dict]:
    raw = tmp_path / "raw"
    rng = np.random.default_rng(11)
    # real keys look like images/7/83/1578283757,3498424237.jpg (commas in names)
    keys = [f"images/{i % 3}/{i % 7:02d}/{1000 + i},{5000 + 3 * i}.jpg" for i in range(n_train + n_test + 4)]
    noisy = {k: int(rng.integers(0, 14)) for k in keys}
    clean = {k: int(rng.integers(0, 14)) for k in keys[n_train:]}
    train_keys, test_keys = keys[:n_train][::-1], keys[n_train : n_train + n_test]
    (raw).mkdir()
    kv_lines = [f"{k} {v}" for k, v in noisy.items()]
    kv_lines.insert(0, f"{train_keys[0]} 13")  # a repeated key: the last label wins
    (raw / "noisy_label_kv.txt").write_text("\n".join(kv_lines) + "\n")
    (raw / "clean_label_kv.txt").write_text("\n".join(f"{k} {v}" for k, v in clean.items()) + "\n")
    (raw / "noisy_train_key_list.txt").write_text("\n".join(train_keys) + "\n")
    (raw / "clean_test_key_list.txt").write_text("\n".join(test_keys) + "\n")
    for k in keys:
        (raw / k).parent.mkdir(parents=True, exist_ok=True)
        (raw / k).write_bytes(jpeg_bytes())
    return raw, {"noisy": noisy, "clean": clean, "train": train_keys, "test": test_keys}


def test_clothing1m_train_noisy_test_clean_in_key_list_order(tmp_path):
    raw, truth = clothing_raw(tmp_path)
    data = prepare("clothing1m", raw, tmp_path / "out")
    assert (data.meta["n_train"], data.meta["n_test"]) == (20, 6)
    assert data.split_frame("train")["path"].tolist() == truth["train"]
    assert data.labels("train").tolist() == [truth["noisy"][k] for k in truth["train"]]
    assert data.labels("test").tolist() == [truth["clean"][k] for k in truth["test"]]
    assert data.paths("test")[0] == str((raw / truth["test"][0]).resolve())
    assert set(data.meta["files"]) == set(clothing1m.CLOTHING1M_FILES)


def test_clothing1m_missing_files_are_all_named(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "clean_label_kv.txt").write_text("")
    with pytest.raises(MissingManualDataError) as info:
        ds.prepare_dataset("clothing1m", raw, tmp_path / "out")
    msg = str(info.value)
    for name in ("noisy_label_kv.txt", "noisy_train_key_list.txt", "clean_test_key_list.txt", "images/"):
        assert f"{raw / name}" in msg
    assert f"{raw / 'clean_label_kv.txt'} (file)" not in msg
    assert "by request" in msg and "data.datasets.clothing1m.raw_dir" in msg


def test_clothing1m_missing_images_and_labels(tmp_path):
    raw, truth = clothing_raw(tmp_path)
    (raw / truth["train"][3]).unlink()
    with pytest.raises(MissingManualDataError, match="1 of 26 expected images missing") as info:
        ds.prepare_dataset("clothing1m", raw, tmp_path / "out")
    assert truth["train"][3].rsplit("/", 1)[-1] in str(info.value)
    (raw / truth["train"][3]).write_bytes(jpeg_bytes())
    with open(raw / "clean_test_key_list.txt", "a") as fh:
        fh.write("images/9/99/unlabelled.jpg\n")
    with pytest.raises(DataError, match="1 keys have no label in clean_label_kv.txt"):
        ds.prepare_dataset("clothing1m", raw, tmp_path / "out")
    assert not (tmp_path / "out" / "meta.json").exists()


def test_clothing1m_labels_out_of_range_and_options(tmp_path):
    raw, _ = clothing_raw(tmp_path)
    with pytest.raises(ConfigError, match="unknown option"):
        ds.prepare_dataset("clothing1m", raw, tmp_path / "out", {"subset": 1000})
    with open(raw / "noisy_label_kv.txt", "a") as fh:
        fh.write("images/0/00/x.jpg 14\n")
    with pytest.raises(DataError, match=r"0\.\.13"):
        ds.prepare_dataset("clothing1m", raw, tmp_path / "out")


@given(st.lists(st.integers(0, 6), min_size=14, max_size=14))
@settings(max_examples=60, deadline=None)
def test_top_class_selection_ranks_by_count_then_alphabet(counts):
    frame = pd.DataFrame(
        {f: np.r_[np.ones(c, np.uint8), np.zeros(6 - c, np.uint8)] for f, c in zip(chestxray.FINDINGS, counts)}
    )
    chosen = chestxray.select_top_classes(frame)
    ranked = sorted(range(14), key=lambda i: (-counts[i], i))[:8]
    assert chosen == tuple(chestxray.FINDINGS[i] for i in sorted(ranked))


def test_clothing1m_keys_escaping_the_folder_are_refused(tmp_path):
    raw, _ = clothing_raw(tmp_path)
    with open(raw / "noisy_label_kv.txt", "a") as fh:
        fh.write("images/../../outside.jpg 3\n")
    with open(raw / "noisy_train_key_list.txt", "a") as fh:
        fh.write("images/../../outside.jpg\n")
    with pytest.raises(DataError, match="outside.jpg"):
        ds.prepare_dataset("clothing1m", raw, tmp_path / "out")
