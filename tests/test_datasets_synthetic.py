"""Synthetic stand-in datasets (smoke scale) and the ``tiny`` model."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fnlcore.datasets as ds
import fnlcore.models
from fnlcore.datasets import synthetic as syn
from fnlcore.errors import ConfigError
from fnlcore.models import MODELS, build_model

BASES = ("mnist", "fmnist", "cifar10", "cifar100", "isic2019", "ich_fednoro", "ich_fedmlp", "chestxray14", "clothing1m")
MULTI = ("ich_fedmlp", "chestxray14")
# Hand-checkable style: no noise, no per-sample variation, no texture.
PLAIN = syn.SyntheticStyle(texture_contrast=0.0, noise_std=0.0, amplitude=(1.0, 1.0), brightness_std=0.0)


def _small_options(base: str, **extra) -> dict:
    k = ds.get_dataset(base).num_classes
    n = max(2 * k, 24)
    return {"n_train": n, "n_test": n, "image_size": [8, 8], **extra}


def _prepare(tmp_path, base: str, options: dict, tag: str = "a") -> ds.PreparedDataset:
    out = tmp_path / f"{base}_{tag}"
    ds.prepare_dataset(syn.synthetic_name(base), tmp_path / "raw", out, options)
    return ds.load_prepared(out)


# ---- registry -------------------------------------------------------------------------------


def test_every_real_dataset_has_a_registered_stand_in_of_its_shape():
    assert set(syn.SYNTHETIC_BASES) == set(BASES)
    for base in BASES:
        real, fake = ds.get_dataset(base), ds.get_dataset(f"synthetic_{base}")
        assert fake is syn.SYNTHETIC[f"synthetic_{base}"]
        assert (fake.num_classes, fake.class_names, fake.multi_label, fake.channels, fake.image_size) == (
            real.num_classes, real.class_names, real.multi_label, real.channels, real.image_size
        )
        assert fake.in_memory and not fake.manual
        assert fake.papers == real.papers
        assert fake.source == f"synthetic stand-in for {base} (smoke scale)"
    assert ds.get_dataset("synthetic_ich_fednoro").image_size == (512, 512)
    assert ds.get_dataset("synthetic_chestxray14").multi_label


def test_reloading_the_module_registers_again_without_clashes():
    importlib.reload(syn)
    assert ds.get_dataset("synthetic_cifar10") is syn.SYNTHETIC["synthetic_cifar10"]


# ---- prepare / load round trip ----------------------------------------------------------------


@pytest.mark.parametrize("base", BASES)
def test_prepare_and_load_round_trip(tmp_path, base):
    opts = _small_options(base, seed=3)
    loaded = _prepare(tmp_path, base, opts)
    info = ds.get_dataset(base)
    n, k, c = opts["n_train"], info.num_classes, info.channels
    meta = loaded.meta
    assert meta["name"] == f"synthetic_{base}" and meta["stand_in_for"] == base
    assert meta["image_size"] == [8, 8] and meta["in_memory"] and meta["channels"] == c
    assert meta["options"] == {"n_train": n, "n_test": n, "seed": 3, "image_size": [8, 8]}
    for split in ("train", "test"):
        x, y = loaded.images(split), loaded.labels(split)
        assert x.dtype == np.uint8 and x.shape == (n, 8, 8, c)
        if info.multi_label:
            assert y.dtype == np.uint8 and y.shape == (n, k)
        else:
            assert y.dtype == np.int64 and y.shape == (n,)
            assert np.bincount(y, minlength=k).min() >= 2
    assert list(loaded.split_frame("train")["sample_id"]) == list(range(n))
    if info.multi_label:
        assert len(meta["prevalence"]) == k
    # the artifact's arrays are exactly what generate() returns for the same spec
    data = syn.generate(syn.spec_from_options(syn.SYNTHETIC[f"synthetic_{base}"], opts))
    assert np.array_equal(loaded.images("train"), data.x_train)
    assert np.array_equal(loaded.labels("test"), data.y_test)


def test_default_sizes_are_the_real_datasets(tmp_path):
    loaded = _prepare(tmp_path, "mnist", {})
    assert loaded.images("train").shape == (400, 28, 28, 1)
    assert loaded.images("test").shape == (200, 28, 28, 1)
    assert loaded.meta["options"] == {"n_train": 400, "n_test": 200, "seed": 0, "image_size": [28, 28]}


def test_non_square_image_size_option():
    opts = {"image_size": [12, 20], "n_train": 16, "n_test": 16}
    spec = syn.spec_from_options(syn.SYNTHETIC["synthetic_isic2019"], opts)
    data = syn.generate(spec)
    assert data.x_train.shape == (16, 12, 20, 3)


# ---- determinism --------------------------------------------------------------------------------


def test_same_seed_gives_byte_identical_arrays_and_another_seed_differs(tmp_path):
    opts = _small_options("ich_fedmlp", seed=7)
    a, b = _prepare(tmp_path, "ich_fedmlp", opts, "a"), _prepare(tmp_path, "ich_fedmlp", opts, "b")
    for split in ("train", "test"):
        assert a.images(split).tobytes() == b.images(split).tobytes()
        assert a.labels(split).tobytes() == b.labels(split).tobytes()
    c = _prepare(tmp_path, "ich_fedmlp", {**opts, "seed": 8}, "c")
    assert a.images("train").tobytes() != c.images("train").tobytes()


def test_chunk_size_does_not_change_the_images():
    spec = syn.SyntheticSpec(num_classes=5, channels=3, image_size=(8, 8), multi_label=False, n_train=50, n_test=10)
    rng = lambda: np.random.default_rng([0, 1])  # noqa: E731
    protos = syn.class_prototypes(5, 3, (8, 8), np.random.default_rng(0))
    y = syn.single_labels(spec.n_train, 5, np.random.default_rng(1))
    whole = syn.render_images(protos, y, False, rng())
    for chunk in (1, 192, 192 * 7 + 5):
        assert np.array_equal(syn.render_images(protos, y, False, rng(), chunk_values=chunk), whole)


def test_test_split_does_not_depend_on_n_train():
    info = syn.SYNTHETIC["synthetic_cifar10"]
    a = syn.generate(syn.spec_from_options(info, {"n_train": 20, "n_test": 30, "image_size": [8, 8]}))
    b = syn.generate(syn.spec_from_options(info, {"n_train": 60, "n_test": 30, "image_size": [8, 8]}))
    assert np.array_equal(a.x_test, b.x_test) and np.array_equal(a.y_test, b.y_test)


# ---- labels -------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(k=st.integers(1, 120), extra=st.integers(0, 300), seed=st.integers(0, 2**32 - 1))
def test_single_labels_hold_every_class_at_least_twice(k, extra, seed):
    n = 2 * k + extra
    y = syn.single_labels(n, k, np.random.default_rng(seed))
    assert y.dtype == np.int64 and y.shape == (n,)
    assert np.bincount(y, minlength=k).min() >= 2 and y.min() >= 0 and y.max() < k


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 60),
    prevalence=st.lists(st.sampled_from([0.0, 0.05, 0.3, 0.9, 1.0]), min_size=1, max_size=10),
    seed=st.integers(0, 2**32 - 1),
)
def test_multi_labels_have_a_positive_and_a_negative_per_class(n, prevalence, seed):
    y = syn.multi_labels(n, np.array(prevalence), np.random.default_rng(seed))
    assert y.dtype == np.uint8 and y.shape == (n, len(prevalence))
    assert (y.max(0) == 1).all() and (y.min(0) == 0).all()


def test_multi_label_prevalence_lies_in_bounds():
    for base in MULTI:
        info = syn.SYNTHETIC[f"synthetic_{base}"]
        data = syn.generate(syn.spec_from_options(info, {"n_train": 4000, "n_test": 30, "image_size": [4, 4]}))
        p = data.prevalence
        assert p.shape == (info.num_classes,) and (p >= 0.1).all() and (p <= 0.4).all()
        observed = data.y_train.mean(0)
        assert np.abs(observed - p).max() < 0.04  # binomial sd <= 0.008 at n=4000
        for y in (data.y_train, data.y_test):
            assert (y.max(0) == 1).all() and (y.min(0) == 0).all()


def test_class_balance_is_roughly_uniform():
    data = syn.generate(syn.SyntheticSpec(10, 1, (4, 4), False, n_train=5000, n_test=20))
    counts = np.bincount(data.y_train, minlength=10)
    assert counts.min() > 400 and counts.max() < 600


# ---- images (hand-checkable) ------------------------------------------------------------------


def test_interpolation_matrix_rows_are_convex_weights():
    m = syn._interpolation_matrix(8, 4)
    assert m.shape == (8, 4) and np.allclose(m.sum(1), 1.0) and (m >= 0).all()
    assert np.allclose(syn._interpolation_matrix(5, 5), np.eye(5))
    # pixel centre 2.5 of 8 maps to grid coordinate 2.5 * 4 / 8 - 0.5 = 0.75: 1/4 of cell 0, 3/4 of cell 1
    assert np.allclose(m[2], [0.25, 0.75, 0.0, 0.0])
    assert np.allclose(syn._interpolation_matrix(3, 1), 1.0)


def test_single_label_image_is_the_rounded_clipped_prototype_without_noise():
    rng = np.random.default_rng(0)
    protos = syn.class_prototypes(3, 1, (4, 6), rng, PLAIN)
    assert protos.static.shape == (3, 4, 6, 1) and protos.static.dtype == np.float32
    y = np.array([2, 0, 1, 2])
    x = syn.render_images(protos, y, False, np.random.default_rng(1), PLAIN)
    want = np.clip(np.rint(128.0 + protos.static[y]), 0, 255).astype(np.uint8)
    assert np.array_equal(x, want)


def test_multi_label_image_is_the_mean_of_positive_prototypes_or_the_background():
    protos = syn.class_prototypes(3 + 1, 3, (5, 5), np.random.default_rng(0), PLAIN)
    y = np.array([[1, 0, 1], [0, 0, 0], [0, 1, 0]], dtype=np.uint8)
    x = syn.render_images(protos, y, True, np.random.default_rng(1), PLAIN)
    s = protos.static
    want = np.stack([(s[0] + s[2]) / 2, s[3], s[1]])
    assert np.abs(x.astype(float) - np.clip(np.rint(128.0 + want), 0, 255)).max() <= 1  # float32 rounding


def test_texture_is_a_grating_with_a_per_sample_phase():
    style = syn.SyntheticStyle(layout_contrast=0.0, color_contrast=0.0, noise_std=0.0, amplitude=(1.0, 1.0),
                               brightness_std=0.0, texture_contrast=30.0)
    protos = syn.class_prototypes(1, 1, (16, 16), np.random.default_rng(0), style)
    assert np.abs(protos.static).max() == 0
    amplitude = np.hypot(protos.texture_cos, protos.texture_sin)
    assert np.allclose(amplitude, 30.0 * np.sqrt(2.0), rtol=1e-5)  # std 30 for a grating
    x = syn.render_images(protos, np.zeros(2, dtype=np.int64), False, np.random.default_rng(5), style)
    assert not np.array_equal(x[0], x[1])  # same class, different phase


# ---- bad options ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, key",
    [
        ({"n_samples": 10}, "n_samples"),
        ({"n_train": "400"}, "n_train"),
        ({"n_test": 2.5}, "n_test"),
        ({"seed": -1}, "seed"),
        ({"image_size": [0, 8]}, "image_size"),
        ({"image_size": [8]}, "image_size"),
        ({"image_size": "32x32"}, "image_size"),
        ({"image_size": [8.0, 8.0]}, "image_size"),
        ({"n_train": 19, "image_size": [8, 8]}, "n_train"),
        ({"n_test": 0, "image_size": [8, 8]}, "n_test"),
    ],
)
def test_bad_options_are_config_errors_naming_the_key(tmp_path, options, key):
    with pytest.raises(ConfigError, match=key) as err:
        ds.prepare_dataset("synthetic_cifar10", tmp_path / "raw", tmp_path / "out", options)
    assert "synthetic_cifar10" in str(err.value)
    assert not (tmp_path / "out" / "meta.json").exists()


def test_too_few_samples_for_the_classes_names_n_train_and_num_classes():
    with pytest.raises(ConfigError, match=r"n_train=150.*num_classes=100.*n_train >= 200"):
        syn.spec_from_options(syn.SYNTHETIC["synthetic_cifar100"], {"n_train": 150})
    with pytest.raises(ConfigError, match="n_test"):
        syn.spec_from_options(syn.SYNTHETIC["synthetic_chestxray14"], {"n_test": 1})


# ---- learnability and the tiny model ------------------------------------------------------------


def _cifar10_16px():
    info = syn.SYNTHETIC["synthetic_cifar10"]
    return syn.generate(syn.spec_from_options(info, {"image_size": [16, 16]}))


def test_nearest_class_mean_beats_chance_by_a_wide_margin():
    data = _cifar10_16px()
    xtr = data.x_train.reshape(len(data.x_train), -1).astype(np.float64)
    xte = data.x_test.reshape(len(data.x_test), -1).astype(np.float64)
    means = np.stack([xtr[data.y_train == k].mean(0) for k in range(10)])
    pred = ((xte[:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    assert (pred == data.y_test).mean() > 0.8  # chance is 0.1


@pytest.mark.slow  # ~6 s on 2 CPU cores, most of it torch's first-call warm-up
def test_tiny_cnn_learns_synthetic_cifar10_in_a_few_epochs():
    data = _cifar10_16px()
    torch.manual_seed(0)
    model = build_model("tiny", 10, 3, (16, 16))
    to_x = lambda a: (torch.from_numpy(a).permute(0, 3, 1, 2).float() - 128.0) / 64.0  # noqa: E731
    x, y = to_x(data.x_train), torch.from_numpy(data.y_train)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(0)
    for _ in range(8):
        for batch in torch.randperm(len(x), generator=gen).split(32):
            loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        accuracy = (model(to_x(data.x_test)).argmax(1) == torch.from_numpy(data.y_test)).float().mean().item()
    assert accuracy > 0.8  # chance is 0.1


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("size", [(8, 8), (32, 32), (224, 224), (20, 36)])
def test_tiny_model_gives_logits_at_any_image_size(channels, size):
    torch.manual_seed(0)
    model = build_model("tiny", 7, channels, size)
    x = torch.randn(2, channels, *size)
    assert model(x).shape == (2, 7)
    assert model.features(x).shape == (2, 32) and model.feature_dim == 32
    assert sum(p.numel() for p in model.parameters()) == (
        channels * 16 * 9 + 16 + 16 * 32 * 9 + 32 + 32 * 7 + 7
    )


def test_tiny_is_registered_and_documented():
    assert "tiny" in MODELS
    assert "| tiny " in fnlcore.models.__doc__
    with pytest.raises(ConfigError, match="tiny"):
        build_model("tiny", 10, 3, (32, 32), pretrained=True)
