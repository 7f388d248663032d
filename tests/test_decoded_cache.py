"""The decoded image cache: the training data path reads the same pixels from it as from the files."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from fnlcore.app.train import load_federated_data
from fnlcore.assignment import ClientAssignment
from fnlcore.datasets.base import DatasetInfo, write_prepared
from fnlcore.datasets.clothing1m import Clothing1MOptions
from fnlcore.datasets.decoded_cache import (
    CacheGeometry,
    build_decoded_cache,
    cache_files,
    cache_geometries,
    find_decoded_cache,
    planned_cache_files,
)
from fnlcore.datasets.rawfiles import parse_options
from fnlcore.errors import ConfigError, DataError
from fnlcore.fl.data import ImageSource
from fnlcore.io import write_json, write_parquet

N_TRAIN, N_TEST = 11, 5


def _write_images(raw, n: int, prefix: str, seed: int) -> list[str]:
    """Grey PNGs and RGB JPEGs of assorted sizes (the formats of the on-disk sets)."""
    rng = np.random.default_rng(seed)
    names = []
    for i in range(n):
        w, h = int(rng.integers(20, 60)), int(rng.integers(20, 60))
        if i % 2:
            name = f"{prefix}{i}.png"
            Image.fromarray(rng.integers(0, 256, (h, w), dtype=np.uint8), "L").save(raw / name)
        else:
            name = f"{prefix}{i}.jpg"
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB").save(raw / name, quality=85)
        names.append(name)
    return names


def _prepare(tmp_path, channels: int = 3, reverse: bool = False):
    raw = tmp_path / "raw"
    raw.mkdir(exist_ok=True)
    train, test = _write_images(raw, N_TRAIN, "tr", 0), _write_images(raw, N_TEST, "te", 1)
    if reverse:
        train = train[::-1]
    info = DatasetInfo(
        name="files_stand_in", num_classes=3, class_names=("a", "b", "c"), multi_label=False, channels=channels,
        image_size=(24, 24), in_memory=False, source="test", papers=(), prepare=lambda ctx: None,
    )
    index = pd.DataFrame({
        "sample_id": np.r_[np.arange(N_TRAIN), np.arange(N_TEST)],
        "split": ["train"] * N_TRAIN + ["test"] * N_TEST,
        "label": np.arange(N_TRAIN + N_TEST) % 3,
        "path": train + test,
    })
    data_dir = tmp_path / "prepared"
    write_prepared(data_dir, info, index, raw_dir=raw)
    return data_dir


def _noise(tmp_path) -> str:
    assignment = ClientAssignment.from_lists(N_TRAIN, [np.arange(0, 6), np.arange(6, N_TRAIN)])
    frame = assignment.to_frame()
    frame["label_true"] = frame["sample_id"] % 3
    frame["label_given"] = frame["label_true"]
    frame["is_noisy"] = False
    path = tmp_path / "noise.parquet"
    write_parquet(frame, path)
    return str(path)


def _batches(source: ImageSource, order: list[int]) -> list[torch.Tensor]:
    return [x for x, _ in source.batches(torch.tensor(order), batch_size=4)]


@pytest.mark.parametrize("transform", ["resize", "resize_crop_center"])
def test_training_reads_the_same_pixels_from_the_cache(tmp_path, transform):
    data_dir = _prepare(tmp_path)
    noise = _noise(tmp_path)
    cpu = torch.device("cpu")
    decoded = load_federated_data(str(data_dir), noise, 2, cpu, workers=0, image_transform=transform)
    assert decoded.train.cache is None and decoded.test.cache is None  # nothing built yet: decode

    for split, geometry in cache_geometries(3, (24, 24), transform).items():
        build_decoded_cache(data_dir, split, geometry)
    cached = load_federated_data(str(data_dir), noise, 2, cpu, workers=0, image_transform=transform)
    assert cached.train.cache is not None and cached.test.cache is not None

    order = np.random.default_rng(3).permutation(N_TRAIN).tolist()
    for a, b in zip(_batches(decoded.train, order), _batches(cached.train, order), strict=True):
        assert a.dtype == torch.uint8 and torch.equal(a, b)
    test_order = list(range(N_TEST))
    for a, b in zip(_batches(decoded.test, test_order), _batches(cached.test, test_order), strict=True):
        assert torch.equal(a, b)
    if transform == "resize_crop_center":  # train read larger (the device crops), test cut after a short-side resize
        assert cached.train.batches(torch.tensor([0]), 1).__next__()[0].shape[-2:] == (27, 27)
        assert np.load(cache_files(data_dir, "test", cache_geometries(3, (24, 24), transform)["test"])[0]).shape == (
            N_TEST, 3, 24, 24)


def test_grey_cache_and_parallel_workers_match_the_files(tmp_path):
    data_dir = _prepare(tmp_path, channels=1)
    geometry = CacheGeometry(1, (16, 20))
    npy = build_decoded_cache(data_dir, "train", geometry, workers=2, batch_size=3)
    pixels = np.load(npy, mmap_mode="r")
    assert pixels.shape == (N_TRAIN, 1, 16, 20) and pixels.dtype == np.uint8
    from fnlcore.datasets import load_prepared
    from fnlcore.imagefiles import ImageFiles

    files = ImageFiles(list(load_prepared(data_dir).paths("train")), (16, 20), channels=1)
    for i in (0, 1, N_TRAIN - 1):
        assert np.array_equal(files[i][0].numpy(), pixels[i])


def test_a_cache_of_another_preparation_is_an_error_and_an_incomplete_one_is_ignored(tmp_path):
    data_dir = _prepare(tmp_path)
    geometry = CacheGeometry(3, (24, 24))
    build_decoded_cache(data_dir, "train", geometry)
    from fnlcore.datasets import load_prepared

    paths = list(load_prepared(data_dir).paths("train"))
    assert find_decoded_cache(data_dir, "train", paths, geometry) is not None
    with pytest.raises(DataError, match="another preparation"):  # same count, other order
        find_decoded_cache(data_dir, "train", paths[::-1], geometry)
    _npy, done = cache_files(data_dir, "train", geometry)
    done.unlink()  # the completion record is written last: without it the pixels may be partial
    assert find_decoded_cache(data_dir, "train", paths, geometry) is None


def test_the_workflow_asks_for_the_caches_of_each_split_at_the_size_training_reads(tmp_path):
    files = planned_cache_files(tmp_path, "clothing1m", {}, "resize_crop_center")
    names = sorted(p.rsplit("/", 1)[1] for p in files)
    assert names == ["test-c3-224x224-short256.json", "test-c3-224x224-short256.npy",
                     "train-c3-256x256.json", "train-c3-256x256.npy"]
    assert planned_cache_files(tmp_path, "clothing1m", {"decoded_cache": False}, "resize") == []
    assert planned_cache_files(tmp_path, "cifar10", {}, "resize") == []  # in memory already
    with pytest.raises(ConfigError, match="decoded_cache"):
        planned_cache_files(tmp_path, "isic2019", {"decoded_cache": "yes"}, "resize")
    # ICH keeps its files' own size: the prepared artifact's, once it exists
    write_json({"image_size": [256, 256]}, tmp_path / "meta.json")
    names = sorted(p.rsplit("/", 1)[1] for p in planned_cache_files(tmp_path, "ich_fednoro", {}, "resize"))
    assert names[-1] == "train-c3-256x256.npy"


def test_decoded_cache_is_a_dataset_option_of_the_on_disk_sets():
    assert parse_options("clothing1m", Clothing1MOptions, {"decoded_cache": False}).decoded_cache is False
    with pytest.raises(ConfigError, match="decoded_cache"):
        parse_options("clothing1m", Clothing1MOptions, {"decoded_cache": "no"})
    assert CacheGeometry.parse("c3-224x224-short256") == CacheGeometry(3, (224, 224), 256)
    with pytest.raises(ConfigError, match="geometry"):
        CacheGeometry.parse("224x224")


@pytest.mark.parametrize("content", [b"", b"\x93NUMPY cut short"])
def test_a_broken_cache_file_names_itself_and_the_fix(tmp_path, content):
    """Issue 46 ("every load error names its file"): numpy's bare error named no file."""
    from fnlcore.imagefiles import ImageFiles

    cache = tmp_path / "decoded-train.npy"
    cache.write_bytes(content)
    files = ImageFiles(["a.png"], (8, 8), cache=cache)
    with pytest.raises(DataError, match=re.escape(str(cache)) + ".*--forcerun"):
        files[0]


def test_a_truncated_prepared_meta_file_names_itself(tmp_path):
    """Issue 46 ("every load error names its file"): the planned caches read meta.json's image size."""
    (tmp_path / "meta.json").write_text('{"image_size": [256,')
    with pytest.raises(DataError, match=re.escape(str(tmp_path / "meta.json")) + ".*prepare the dataset again"):
        planned_cache_files(tmp_path, "ich_fednoro", {}, "resize")
