"""scikit-learn's bundled 8x8 handwritten digits: the offline demo dataset.

1,797 grey images of the digits 0-9 (UCI "Optical Recognition of Handwritten
Digits", test part), shipped inside scikit-learn, so the demo needs no
download. Pixel counts 0..16 become uint8 by ``rint(v * 255 / 16)`` (16 -> 255;
the only tie, 8 -> 127.5, rounds to 128).

Split: membership from ``train_test_split(arange(n), test_size=0.25,
stratify=y, random_state=0)`` (1,347 train / 450 test); each split keeps the
original order of ``load_digits`` (``image_id`` = position there), so
``sample_id`` order does not depend on the shuffle inside scikit-learn.
Options: ``test_size`` (float, 0.25) and ``split_seed`` (int, 0).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..errors import ConfigError
from .base import DATASETS, DataShape, DatasetInfo, PrepareContext, validate_options, write_prepared

NAME = "digits"
OPTIONS = {"test_size": 0.25, "split_seed": 0}


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """All 1,797 images as uint8 (n, 8, 8, 1) and their labels as int64, in scikit-learn's order."""
    from sklearn.datasets import load_digits  # lazy: scikit-learn takes ~1 s to import; only this step uses it

    bunch = load_digits()
    images = np.rint(bunch.images * (255.0 / 16.0)).astype(np.uint8)[..., None]
    return images, bunch.target.astype(np.int64)


def stratified_split(labels: np.ndarray, test_size: float = 0.25, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Sorted train and test positions of a stratified split (scikit-learn's ``train_test_split``)."""
    # lazy: scikit-learn takes ~1 s to import; only this step uses it
    from sklearn.model_selection import train_test_split

    if not 0.0 < test_size < 1.0:
        raise ConfigError(f"dataset 'digits': option test_size must lie in (0, 1), got {test_size}")
    train, test = train_test_split(
        np.arange(len(labels)), test_size=test_size, stratify=labels, random_state=seed
    )
    return np.sort(train), np.sort(test)


def _shape_for(options) -> DataShape:
    """Sizes under ``test_size`` (scikit-learn rounds the test part up) without loading the images."""
    opts = validate_options(NAME, options, OPTIONS)
    if not 0.0 < float(opts["test_size"]) < 1.0:  # as the split checks it, before any job
        raise ConfigError(f"dataset 'digits': option test_size must lie in (0, 1), got {opts['test_size']}")
    n_test = math.ceil(1797 * float(opts["test_size"]))
    return DataShape(1797 - n_test, n_test, 1, (8, 8), 10, False)


def prepare(ctx: PrepareContext) -> None:
    """Write the digits artifact (in memory, no download)."""
    opts = validate_options(NAME, ctx.options, OPTIONS)
    images, labels = digits_arrays()
    train, test = stratified_split(labels, float(opts["test_size"]), int(opts["split_seed"]))
    index = pd.DataFrame(
        {
            "sample_id": np.concatenate([np.arange(len(train)), np.arange(len(test))]).astype(np.int64),
            "split": ["train"] * len(train) + ["test"] * len(test),
            "label": np.concatenate([labels[train], labels[test]]),
            "image_id": np.concatenate([train, test]).astype(np.int64),
        }
    )
    import sklearn  # lazy: scikit-learn takes ~1 s to import; only this step uses it

    write_prepared(
        ctx.out_dir,
        INFO,
        index,
        {"x_train": images[train], "x_test": images[test]},
        extra_meta={"split_rule": "sklearn train_test_split stratified", "options": opts,
                    "sklearn_version": sklearn.__version__},
        raw_dir=ctx.raw_dir,
    )


INFO = DATASETS.register(
    DatasetInfo(
        name=NAME,
        num_classes=10,
        class_names=tuple(str(d) for d in range(10)),
        multi_label=False,
        channels=1,
        image_size=(8, 8),
        in_memory=True,
        source="scikit-learn load_digits (UCI Optical Recognition of Handwritten Digits, test set); "
        "https://archive.ics.uci.edu/dataset/80",
        papers=(),
        prepare=prepare,
        shape_for=_shape_for,
    )
)
