"""Dataset registry, prepared artifacts, digits, MNIST/Fashion-MNIST and CIFAR-10/100.

Downloads go to a local HTTP server serving tiny files written in the exact
upstream formats (tests/support/upstream_formats.py); the modules' REMOTES are
patched to point there with the tiny files' checksums.
"""

from __future__ import annotations

import gzip
import json
import pickle
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fnlcore.datasets as ds
from fnlcore.datasets import cifar, mnist
from fnlcore.datasets.base import DatasetInfo, label_columns, validate_options
from fnlcore.datasets.download import RemoteFile
from fnlcore.errors import ChecksumError, ConfigError, DataError
from tests.support.httpserver import file_server, serve_directory  # noqa: F401  (fixture)
from tests.support.upstream_formats import (
    MNIST_FILES,
    idx_bytes,
    py2_pickle_bytes,
    write_cifar_tarball,
    write_idx_gz,
    write_mnist_files,
    write_tar_gz,
)

CORE = {"digits", "mnist", "fmnist", "cifar10", "cifar100"}


# ---- registry and options -------------------------------------------------------------------


def test_registry_holds_the_core_datasets_with_consistent_infos():
    assert CORE <= set(ds.DATASETS)
    for name in CORE:
        info = ds.get_dataset(name)
        assert info.name == name and len(info.class_names) == info.num_classes
        assert info.in_memory and not info.multi_label and not info.manual
    assert ds.get_dataset("cifar100").num_classes == 100
    assert ds.get_dataset("cifar10").channels == 3 and ds.get_dataset("mnist").image_size == (28, 28)


def test_unknown_dataset_is_a_config_error_listing_names(tmp_path):
    with pytest.raises(ConfigError) as info:
        ds.get_dataset("cifar11")
    for name in CORE:
        assert name in str(info.value)
    with pytest.raises(ConfigError, match="cifar11"):
        ds.prepare_dataset("cifar11", tmp_path / "raw", tmp_path / "out")


@pytest.mark.parametrize("name", sorted(CORE))
def test_unknown_option_key_is_a_config_error_before_any_download(name, tmp_path, file_server):
    with pytest.raises(ConfigError, match="'colour'"):
        ds.prepare_dataset(name, tmp_path / "raw", tmp_path / "out", options={"colour": True},
                           mirrors=[file_server])
    assert file_server.requests == []
    assert not (tmp_path / "out" / "meta.json").exists()


def test_validate_options_merges_defaults_and_checks_types():
    defaults = {"test_size": 0.25, "split_seed": 0, "flag": False, "any": None}
    assert validate_options("x", {"test_size": 1}, defaults)["test_size"] == 1
    assert validate_options("x", None, defaults) == defaults
    assert validate_options("x", {"any": [1]}, defaults)["any"] == [1]
    with pytest.raises(ConfigError, match="split_seed"):
        validate_options("x", {"split_seed": "0"}, defaults)
    with pytest.raises(ConfigError, match="flag"):
        validate_options("x", {"flag": 1}, defaults)
    with pytest.raises(ConfigError, match="split_seed"):
        validate_options("x", {"split_seed": True}, defaults)
    with pytest.raises(ConfigError, match="takes no options"):
        validate_options("x", {"a": 1}, {})


def test_register_refuses_a_second_dataset_with_the_same_name():
    other = replace(ds.get_dataset("digits"), prepare=lambda ctx: None)
    with pytest.raises(ValueError, match="digits"):
        ds.DATASETS.register(other)
    assert ds.DATASETS["digits"].prepare.__module__ == "fnlcore.datasets.digits"


# ---- digits ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits_prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("digits") / "out"
    ds.prepare_dataset("digits", out.parent / "raw", out)
    return out


def test_digits_prepared_and_loaded(digits_prepared):
    from sklearn.datasets import load_digits

    p = ds.load_prepared(digits_prepared)
    assert p.info is ds.get_dataset("digits")
    x_tr, x_te = p.images("train"), p.images("test")
    y_tr, y_te = p.labels("train"), p.labels("test")
    assert x_tr.shape == (1347, 8, 8, 1) and x_te.shape == (450, 8, 8, 1)
    assert x_tr.dtype == np.uint8 and y_tr.dtype == np.int64
    assert (p.num_samples("train"), p.num_samples("test")) == (1347, 450)

    bunch = load_digits()
    ids_tr = p.split_frame("train")["image_id"].to_numpy()
    ids_te = p.split_frame("test")["image_id"].to_numpy()
    assert np.all(np.diff(ids_tr) > 0) and np.all(np.diff(ids_te) > 0)  # original order kept
    assert sorted(np.concatenate([ids_tr, ids_te]).tolist()) == list(range(1797))
    np.testing.assert_array_equal(y_tr, bunch.target[ids_tr])
    np.testing.assert_array_equal(y_te, bunch.target[ids_te])
    # 0..16 -> rint(v*255/16): 0->0, 1->16, 8->128 (127.5 rounds to even), 16->255
    np.testing.assert_array_equal(x_te[..., 0], np.rint(bunch.images[ids_te] * 255 / 16).astype(np.uint8))
    lut = {0: 0, 1: 16, 8: 128, 15: 239, 16: 255}
    for v, want in lut.items():
        assert np.all(x_tr[..., 0][bunch.images[ids_tr] == v] == want)
    # stratified: each class's test share is ~25%
    share = np.bincount(y_te, minlength=10) / np.bincount(bunch.target, minlength=10)
    assert np.all(np.abs(share - 0.25) < 0.02)


def test_digits_artifact_files_and_meta(digits_prepared):
    meta = json.loads((digits_prepared / "meta.json").read_text())
    assert {k: meta[k] for k in ("name", "num_classes", "multi_label", "channels", "image_size", "in_memory")} == {
        "name": "digits", "num_classes": 10, "multi_label": False, "channels": 1, "image_size": [8, 8],
        "in_memory": True,
    }
    assert (meta["n_train"], meta["n_test"]) == (1347, 450)
    assert meta["class_names"] == [str(d) for d in range(10)] and "source" in meta and "files" in meta
    index = pd.read_parquet(digits_prepared / "index.parquet")
    assert list(index.columns[:3]) == ["sample_id", "split", "label"]
    assert index["sample_id"].dtype == np.int64 and index["label"].dtype == np.int64
    with np.load(digits_prepared / "arrays.npz") as npz:
        assert sorted(npz.files) == ["x_test", "x_train"]


def test_digits_is_deterministic_and_options_change_the_split(digits_prepared, tmp_path):
    ds.prepare_dataset("digits", tmp_path / "raw", tmp_path / "a")
    a = pd.read_parquet(tmp_path / "a" / "index.parquet")
    pd.testing.assert_frame_equal(a, pd.read_parquet(digits_prepared / "index.parquet"))
    ds.prepare_dataset("digits", tmp_path / "raw", tmp_path / "b", options={"test_size": 0.5, "split_seed": 3})
    b = ds.load_prepared(tmp_path / "b")
    assert (b.num_samples("train"), b.num_samples("test")) == (898, 899)
    with pytest.raises(ConfigError, match="test_size"):
        ds.prepare_dataset("digits", tmp_path / "raw", tmp_path / "c", options={"test_size": 1.5})


def test_prepared_dataset_rejects_wrong_access(digits_prepared):
    p = ds.load_prepared(digits_prepared)
    with pytest.raises(ConfigError, match="split"):
        p.labels("validation")
    with pytest.raises(DataError, match="images"):
        p.paths("train")


# ---- write_prepared / load_prepared ---------------------------------------------------------


def _toy_info(**kw) -> DatasetInfo:
    base = dict(
        name="toy_unregistered", num_classes=3, class_names=("a", "b", "c"), multi_label=False, channels=1,
        image_size=(2, 2), in_memory=True, source="test", papers=(), prepare=lambda ctx: None,
    )
    return DatasetInfo(**{**base, **kw})


def _toy_index(n_train=3, n_test=2, **cols) -> pd.DataFrame:
    frame = pd.DataFrame(
        {
            "sample_id": np.r_[np.arange(n_train), np.arange(n_test)].astype(np.int64),
            "split": ["train"] * n_train + ["test"] * n_test,
        }
    )
    for k, v in cols.items():
        frame[k] = v
    return frame


def _toy_arrays(n_train=3, n_test=2):
    return {"x_train": np.arange(n_train * 4, dtype=np.uint8).reshape(n_train, 2, 2, 1),
            "x_test": np.full((n_test, 2, 2, 1), 7, np.uint8)}


def test_write_prepared_canonicalises_order_and_round_trips(tmp_path):
    info = _toy_info()
    index = _toy_index(label=[0, 1, 2, 2, 0], extra=list("vwxyz")).iloc[[4, 0, 2, 3, 1]]
    ds.write_prepared(tmp_path, info, index, _toy_arrays(), extra_meta={"note": "hi"})
    p = ds.load_prepared(tmp_path)
    assert p.index["split"].tolist() == ["train"] * 3 + ["test"] * 2
    assert p.index["sample_id"].tolist() == [0, 1, 2, 0, 1]
    assert list(p.index.columns) == ["sample_id", "split", "label", "extra"]
    np.testing.assert_array_equal(p.labels("train"), [0, 1, 2])
    np.testing.assert_array_equal(p.labels("test"), [2, 0])
    assert p.index["extra"].tolist() == list("vwxyz")
    np.testing.assert_array_equal(p.images("test"), _toy_arrays()["x_test"])
    assert p.meta["note"] == "hi" and p.info.name == "toy_unregistered"  # info rebuilt from meta
    with pytest.raises(ConfigError, match="not registered"):
        p.info.prepare(None)


@pytest.mark.parametrize(
    "index_kw, arrays, match",
    [
        ({"label": [0, 1, 3, 0, 0]}, _toy_arrays(), r"\[0, 3\)"),
        ({"label": [0.0, 1, 2, 0, 0]}, _toy_arrays(), "integers"),
        ({}, _toy_arrays(), "lacks column"),
        ({"label": [0, 1, 2, 0, 0], "split": ["train"] * 3 + ["valid"] * 2}, _toy_arrays(), "split values"),
        ({"label": [0, 1, 2, 0, 0], "sample_id": [0, 1, 3, 0, 1]}, _toy_arrays(), "sample_id"),
        ({"label": [0, 1, 2, 0, 0], "sample_id": [0, 1, 1, 0, 1]}, _toy_arrays(), "sample_id"),
        ({"label": [0, 1, 2, 0, 0]}, {"x_train": _toy_arrays()["x_train"]}, "x_test"),
        ({"label": [0, 1, 2, 0, 0]}, {**_toy_arrays(), "x_test": np.zeros((2, 2, 2, 1), np.int16)}, "uint8"),
        ({"label": [0, 1, 2, 0, 0]}, {**_toy_arrays(), "x_test": np.zeros((2, 2, 3, 1), np.uint8)}, "uint8"),
        ({"label": [0, 1, 2, 0, 0]}, {**_toy_arrays(), "y": np.zeros(2)}, "unexpected"),
    ],
)
def test_write_prepared_rejects_bad_input_and_writes_nothing(tmp_path, index_kw, arrays, match):
    index = _toy_index(**index_kw)
    with pytest.raises(DataError, match=match):
        ds.write_prepared(tmp_path, _toy_info(), index, arrays)
    assert not (tmp_path / "meta.json").exists() and not (tmp_path / "index.parquet").exists()


def test_multi_label_on_disk_artifact_gives_matrix_labels_and_absolute_paths(tmp_path):
    info = _toy_info(name="toy_ml", multi_label=True, in_memory=False, channels=3, image_size=(224, 224))
    lab = np.array([[1, 0, 1], [0, 0, 0], [1, 1, 1], [0, 1, 0]])
    index = _toy_index(2, 2, **{f"label_{j}": lab[:, j] for j in range(3)},
                       path=["a/1.png", "a/2.png", "b/3.png", "/elsewhere/4.png"])
    ds.write_prepared(tmp_path / "out", info, index, None, extra_meta={"raw_dir": tmp_path / "raw"})
    p = ds.load_prepared(tmp_path / "out")
    assert label_columns(p.meta) == ["label_0", "label_1", "label_2"]
    y = p.labels("train")
    assert y.dtype == np.uint8 and y.shape == (2, 3)
    np.testing.assert_array_equal(p.labels("test"), lab[2:])
    raw = str((tmp_path / "raw").resolve())
    assert list(p.paths("train")) == [f"{raw}/a/1.png", f"{raw}/a/2.png"]
    assert list(p.paths("test")) == [f"{raw}/b/3.png", "/elsewhere/4.png"]
    assert not (tmp_path / "out" / "arrays.npz").exists()
    with pytest.raises(DataError, match="paths"):
        p.images("train")
    bad = index.copy()
    bad["label_1"] = [0, 2, 0, 0]
    with pytest.raises(DataError, match="0/1"):
        ds.write_prepared(tmp_path / "bad", info, bad, None, raw_dir=tmp_path)
    with pytest.raises(DataError, match="raw_dir"):
        ds.write_prepared(tmp_path / "bad", info, index, None)


def test_load_prepared_needs_meta_json(tmp_path):
    with pytest.raises(DataError, match="meta.json"):
        ds.load_prepared(tmp_path)


@settings(max_examples=25, deadline=None)
@given(labels=st.lists(st.integers(0, 4), min_size=0, max_size=40), n_test=st.integers(0, 10), seed=st.integers(0, 9))
def test_round_trip_keeps_labels_in_sample_id_order(tmp_path_factory, labels, n_test, seed):
    labels = np.array(labels + [0] * n_test, dtype=np.int64)
    n_train = len(labels) - n_test
    info = _toy_info(num_classes=5, class_names=tuple("abcde"), in_memory=False)
    index = _toy_index(n_train, n_test, label=labels, path=[f"{i}.png" for i in range(len(labels))])
    shuffled = index.sample(frac=1.0, random_state=seed)
    out = tmp_path_factory.mktemp("rt")
    ds.write_prepared(out, info, shuffled, raw_dir=out)
    p = ds.load_prepared(out)
    np.testing.assert_array_equal(p.labels("train"), labels[:n_train])
    np.testing.assert_array_equal(p.labels("test"), labels[n_train:])
    assert [Path(s).name for s in p.paths("test")] == [f"{i}.png" for i in range(n_train, len(labels))]


# ---- idx parsing (MNIST format) --------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(shape=st.tuples(st.integers(0, 5), st.integers(1, 6), st.integers(1, 6)), seed=st.integers(0, 100))
def test_idx_round_trip(tmp_path_factory, shape, seed):
    a = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
    p = write_idx_gz(tmp_path_factory.mktemp("idx") / "x.gz", a)
    np.testing.assert_array_equal(mnist.read_idx(p, 3), a)


def test_idx_header_hand_checked():
    assert idx_bytes(np.array([3, 1], np.uint8)) == b"\x00\x00\x08\x01\x00\x00\x00\x02\x03\x01"


@pytest.mark.parametrize(
    "raw, match",
    [
        (b"\x00\x00\x08\x03\x00\x00\x00\x02\x00\x00\x00\x02\x00\x00\x00\x02" + bytes(7), "truncated"),
        (b"\x00\x00\x08\x03\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00\x01" + bytes(2), "truncated"),
        (b"\x00\x00\x08\x01\x00\x00\x00\x02\x00\x00", "magic"),  # a label file where images are expected
        (b"\x00\x00\x0d\x03" + bytes(12), "magic"),  # float data type
        (b"\x00\x00", "too short"),
        (b"\x00\x00\x08\x03\x00\x00", "header truncated"),
    ],
)
def test_read_idx_rejects_corrupt_files_naming_them(tmp_path, raw, match):
    p = tmp_path / "bad-idx3-ubyte.gz"
    p.write_bytes(gzip.compress(raw))
    with pytest.raises(DataError, match=match) as info:
        mnist.read_idx(p, 3)
    assert str(p) in str(info.value)


def test_read_idx_rejects_a_file_that_is_not_gzip(tmp_path):
    p = tmp_path / "plain.gz"
    p.write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x01\x05")
    with pytest.raises(DataError, match="gzip") as info:
        mnist.read_idx(p, 1)
    assert str(p) in str(info.value)
    truncated = tmp_path / "cut.gz"
    truncated.write_bytes(gzip.compress(idx_bytes(np.zeros((4, 28, 28), np.uint8)))[:40])
    with pytest.raises(DataError, match=str(truncated)):
        mnist.read_idx(truncated, 3)


def test_read_split_checks_counts_and_label_range(tmp_path):
    x = write_idx_gz(tmp_path / "x.gz", np.zeros((3, 28, 28), np.uint8))
    y2 = write_idx_gz(tmp_path / "y2.gz", np.zeros(2, np.uint8))
    y_bad = write_idx_gz(tmp_path / "yb.gz", np.array([0, 1, 10], np.uint8))
    with pytest.raises(DataError, match="3 images but"):
        mnist.read_split(x, y2)
    with pytest.raises(DataError, match="label 10"):
        mnist.read_split(x, y_bad)


# ---- MNIST / Fashion-MNIST end to end against the local server ------------------------------


def _patch_mnist(monkeypatch, name, server, tiny, md5_override=None, official=None):
    """Point REMOTES[name] at the local server (as official URL, or a dead one if mirrors are used)."""
    base = official if official is not None else server.url + "/"
    remotes = {
        role: RemoteFile(fn, (base + fn,), md5=(md5_override or {}).get(role, tiny.md5[role]))
        for role, fn in MNIST_FILES.items()
    }
    monkeypatch.setitem(mnist.REMOTES, name, remotes)
    return remotes


@pytest.mark.parametrize("name", ["mnist", "fmnist"])
def test_mnist_like_download_and_parse(monkeypatch, file_server, tmp_path, name):
    tiny = write_mnist_files(file_server.root, n_train=12, n_test=5, seed=1)
    _patch_mnist(monkeypatch, name, file_server, tiny)
    ds.prepare_dataset(name, tmp_path / "raw", tmp_path / "out")
    p = ds.load_prepared(tmp_path / "out")
    np.testing.assert_array_equal(p.images("train")[..., 0], tiny.x_train)
    np.testing.assert_array_equal(p.images("test")[..., 0], tiny.x_test)
    assert p.images("train").shape == (12, 28, 28, 1)
    np.testing.assert_array_equal(p.labels("train"), np.arange(12) % 10)
    np.testing.assert_array_equal(p.labels("test"), (np.arange(5) * 3) % 10)
    assert p.meta["files"] == {fn: "md5:" + tiny.md5[role] for role, fn in MNIST_FILES.items()}
    assert sorted(f.name for f in (tmp_path / "raw").iterdir()) == sorted(MNIST_FILES.values())
    assert len(file_server.requests) == 4

    # Preparing again reuses the verified raw files: no new request.
    ds.prepare_dataset(name, tmp_path / "raw", tmp_path / "out2")
    assert len(file_server.requests) == 4


def test_mnist_through_a_mirror_when_the_official_host_is_down(monkeypatch, file_server, tmp_path):
    tiny = write_mnist_files(file_server.root / "mnist")
    _patch_mnist(monkeypatch, "mnist", file_server, tiny, official="http://127.0.0.1:9/")
    ds.prepare_dataset("mnist", tmp_path / "raw", tmp_path / "out", mirrors=[file_server.url_for("mnist")])
    assert ds.load_prepared(tmp_path / "out").num_samples("train") == 12
    assert {r.path for r in file_server.requests} == {f"/mnist/{fn}" for fn in MNIST_FILES.values()}


def test_mnist_corrupted_download_leaves_no_artifact(monkeypatch, file_server, tmp_path):
    tiny = write_mnist_files(file_server.root)
    _patch_mnist(monkeypatch, "mnist", file_server, tiny, md5_override={"test_images": "1" * 32})
    ds.prepare_dataset("digits", tmp_path / "raw_digits", tmp_path / "out")  # a stale complete artifact
    with pytest.raises(ChecksumError, match="t10k-images-idx3-ubyte.gz"):
        ds.prepare_dataset("mnist", tmp_path / "raw", tmp_path / "out")
    assert not (tmp_path / "out" / "meta.json").exists()
    with pytest.raises(DataError):
        ds.load_prepared(tmp_path / "out")
    assert not (tmp_path / "raw" / "t10k-images-idx3-ubyte.gz").exists()
    assert not (tmp_path / "raw" / "t10k-images-idx3-ubyte.gz.part").exists()


def test_mnist_corrupt_content_with_matching_checksum_is_a_data_error(monkeypatch, file_server, tmp_path):
    tiny = write_mnist_files(file_server.root)
    bad = file_server.root / MNIST_FILES["train_labels"]
    bad.write_bytes(gzip.compress(idx_bytes(np.zeros(11, np.uint8))))  # 11 labels for 12 images
    from tests.support.upstream_formats import md5_of

    _patch_mnist(monkeypatch, "mnist", file_server, tiny, md5_override={"train_labels": md5_of(bad)})
    with pytest.raises(DataError, match="12 images but"):
        ds.prepare_dataset("mnist", tmp_path / "raw", tmp_path / "out")
    assert not (tmp_path / "out" / "index.parquet").exists() and not (tmp_path / "out" / "meta.json").exists()


def test_mnist_truncated_download_resumes_on_the_next_prepare(monkeypatch, file_server, tmp_path):
    tiny = write_mnist_files(file_server.root)
    _patch_mnist(monkeypatch, "mnist", file_server, tiny)
    name = MNIST_FILES["train_images"]
    file_server.truncate[name] = 500
    with pytest.raises(DataError, match="truncated"):
        ds.prepare_dataset("mnist", tmp_path / "raw", tmp_path / "out")
    assert (tmp_path / "raw" / (name + ".part")).stat().st_size == 500
    file_server.truncate.clear()
    ds.prepare_dataset("mnist", tmp_path / "raw", tmp_path / "out")
    assert file_server.requests_for(name)[-1].range == "bytes=500-"
    np.testing.assert_array_equal(ds.load_prepared(tmp_path / "out").images("train")[..., 0], tiny.x_train)


def test_published_mnist_checksums_are_torchvisions():
    assert mnist.REMOTES["mnist"]["train_images"].md5 == "f68b3c2dcbeaaa9fbdd348bbdeb94873"
    assert mnist.REMOTES["mnist"]["test_labels"].urls == (
        "https://ossci-datasets.s3.amazonaws.com/mnist/t10k-labels-idx1-ubyte.gz",
        "https://storage.googleapis.com/cvdf-datasets/mnist/t10k-labels-idx1-ubyte.gz",
    )
    assert mnist.REMOTES["fmnist"]["test_images"].md5 == "bef4ecab320f06d8554ea6380940ec79"
    assert cifar.REMOTES["cifar10"].md5 == "c58f30108f718f92721af3b95e74349a"
    assert cifar.REMOTES["cifar100"].urls == ("https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",)


# ---- CIFAR-10 / CIFAR-100 -------------------------------------------------------------------


def _patch_cifar(monkeypatch, name, server, tiny, md5=None):
    remote = RemoteFile(tiny.path.name, (server.url_for(tiny.path.name),), md5=md5 or tiny.md5)
    monkeypatch.setitem(cifar.REMOTES, name, remote)


def test_cifar10_download_and_parse_in_torchvision_order(monkeypatch, file_server, tmp_path):
    tiny = write_cifar_tarball(file_server.root, "cifar10", per_batch=3, n_test=4, seed=2)
    _patch_cifar(monkeypatch, "cifar10", file_server, tiny)
    ds.prepare_dataset("cifar10", tmp_path / "raw", tmp_path / "out")
    p = ds.load_prepared(tmp_path / "out")
    assert p.images("train").shape == (15, 32, 32, 3) and p.images("test").shape == (4, 32, 32, 3)
    np.testing.assert_array_equal(p.images("train"), tiny.x_train)  # batches 1..5 in order
    np.testing.assert_array_equal(p.images("test"), tiny.x_test)
    np.testing.assert_array_equal(p.labels("train"), tiny.y_train)
    np.testing.assert_array_equal(p.labels("test"), tiny.y_test)
    assert p.meta["class_names"][9] == "truck" and p.meta["files"] == {tiny.path.name: "md5:" + tiny.md5}
    assert not any(f.is_dir() for f in (tmp_path / "raw").iterdir())  # nothing extracted


def test_cifar_pixel_layout_hand_checked(tmp_path):
    # one image whose R plane is 1, G plane 2, B plane 3, except pixel (0, 1) of G = 9
    row = np.r_[np.full(1024, 1), np.full(1024, 2), np.full(1024, 3)].astype(np.uint8)
    row[1024 + 1] = 9
    batch = {"batch_label": "b", "labels": [4], "data": row[None, :], "filenames": ["f.png"]}
    meta = {"label_names": list(cifar.CIFAR10_CLASSES), "num_cases_per_batch": 1, "num_vis": 3072}
    members = [("batches.meta", py2_pickle_bytes(meta)), ("test_batch", py2_pickle_bytes(batch))]
    members += [(f"data_batch_{i}", py2_pickle_bytes(batch)) for i in range(1, 6)]
    path = write_tar_gz(tmp_path / "c.tar.gz", "cifar-10-batches-py", members)
    parsed = cifar.read_cifar_archive(path, cifar.LAYOUTS["cifar10"])
    x = parsed["x_test"][0]
    assert x.shape == (32, 32, 3)
    assert tuple(x[0, 0]) == (1, 2, 3) and tuple(x[0, 1]) == (1, 9, 3) and tuple(x[31, 31]) == (1, 2, 3)
    assert parsed["y_train"].tolist() == [4] * 5


def test_cifar100_fine_and_coarse_labels(monkeypatch, file_server, tmp_path):
    tiny = write_cifar_tarball(file_server.root, "cifar100", per_batch=2, n_test=3, seed=5)
    _patch_cifar(monkeypatch, "cifar100", file_server, tiny)
    ds.prepare_dataset("cifar100", tmp_path / "raw", tmp_path / "out")
    p = ds.load_prepared(tmp_path / "out")
    np.testing.assert_array_equal(p.images("train"), tiny.x_train)
    np.testing.assert_array_equal(p.labels("train"), tiny.y_train)
    np.testing.assert_array_equal(p.labels("test"), tiny.y_test)
    np.testing.assert_array_equal(p.split_frame("test")["coarse_label"].to_numpy(), tiny.coarse_test)
    assert len(p.meta["class_names"]) == 100 and p.meta["class_names"][0] == "apple"
    assert len(p.meta["coarse_class_names"]) == 20 and p.meta["coarse_class_names"][-1] == "vehicles_2"


def test_cifar_corrupted_download_leaves_no_artifact(monkeypatch, file_server, tmp_path):
    tiny = write_cifar_tarball(file_server.root, "cifar10")
    _patch_cifar(monkeypatch, "cifar10", file_server, tiny, md5="2" * 32)
    with pytest.raises(ChecksumError, match="cifar-10-python.tar.gz"):
        ds.prepare_dataset("cifar10", tmp_path / "raw", tmp_path / "out")
    assert not (tmp_path / "out" / "meta.json").exists() and not (tmp_path / "out" / "index.parquet").exists()
    assert list((tmp_path / "raw").iterdir()) == []


def test_cifar_wrong_class_names_is_a_data_error(monkeypatch, file_server, tmp_path):
    names = list(cifar.CIFAR10_CLASSES)
    names[0] = "aeroplane"
    tiny = write_cifar_tarball(file_server.root, "cifar10", label_names=names)
    _patch_cifar(monkeypatch, "cifar10", file_server, tiny)
    with pytest.raises(DataError, match="class names"):
        ds.prepare_dataset("cifar10", tmp_path / "raw", tmp_path / "out")


def test_cifar_archive_missing_member_or_bad_content(tmp_path):
    layout = cifar.LAYOUTS["cifar10"]
    meta = py2_pickle_bytes({"label_names": list(cifar.CIFAR10_CLASSES)})
    path = write_tar_gz(tmp_path / "a.tar.gz", layout.folder, [("batches.meta", meta)])
    with pytest.raises(DataError, match="data_batch_1") as info:
        cifar.read_cifar_archive(path, layout)
    assert str(path) in str(info.value)

    short = {"labels": [1, 2], "data": np.zeros((1, 3072), np.uint8)}
    members = [("batches.meta", meta)] + [(f"data_batch_{i}", py2_pickle_bytes(short)) for i in range(1, 6)]
    path = write_tar_gz(tmp_path / "b.tar.gz", layout.folder, members + [("test_batch", py2_pickle_bytes(short))])
    with pytest.raises(DataError, match="2 labels"):
        cifar.read_cifar_archive(path, layout)

    (tmp_path / "c.tar.gz").write_bytes(b"not a tarball")
    with pytest.raises(DataError, match="c.tar.gz"):
        cifar.read_cifar_archive(tmp_path / "c.tar.gz", layout)


def test_cifar_unpickler_refuses_unexpected_globals(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    layout = cifar.LAYOUTS["cifar10"]
    path = write_tar_gz(tmp_path / "e.tar.gz", layout.folder, [("batches.meta", pickle.dumps(Evil(), protocol=2))])
    with pytest.raises(DataError, match="unexpected global"):
        cifar.read_cifar_archive(path, layout)


def test_prepared_cifar_served_from_two_tarballs_uses_separate_raw_dirs(monkeypatch, tmp_path):
    root = tmp_path / "srv"
    t10 = write_cifar_tarball(root, "cifar10", per_batch=1, n_test=1)
    t100 = write_cifar_tarball(root, "cifar100", per_batch=1, n_test=1)
    with serve_directory(root) as server:
        _patch_cifar(monkeypatch, "cifar10", server, t10)
        _patch_cifar(monkeypatch, "cifar100", server, t100)
        for name in ("cifar10", "cifar100"):
            ds.prepare_dataset(name, tmp_path / "raw" / name, tmp_path / "out" / name)
    assert ds.load_prepared(tmp_path / "out" / "cifar10").num_samples("train") == 5
    assert ds.load_prepared(tmp_path / "out" / "cifar100").num_samples("train") == 5
