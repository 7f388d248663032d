"""Datasets: a registry of named datasets, checksummed downloads and prepared artifacts.

Every module of this package is imported the first time ``DATASETS`` is read
(a new dataset is one file calling ``DATASETS.register(DatasetInfo(...))``). Typical use::

    from fnlcore.datasets import prepare_dataset, load_prepared
    prepare_dataset("cifar10", raw_dir="data/raw/cifar10", out_dir="results/data/cifar10")
    ds = load_prepared("results/data/cifar10")
    x, y = ds.images("train"), ds.labels("train")
"""

from .base import (
    DATASETS,
    SPLITS,
    DataShape,
    DatasetInfo,
    PreparedDataset,
    PrepareContext,
    get_dataset,
    label_columns,
    load_prepared,
    prepare_dataset,
    validate_options,
    expected_shape,
    write_prepared,
)
from .download import RemoteFile, fetch, verify_file


__all__ = [
    "DATASETS",
    "SPLITS",
    "DataShape",
    "DatasetInfo",
    "PreparedDataset",
    "PrepareContext",
    "RemoteFile",
    "expected_shape",
    "fetch",
    "get_dataset",
    "label_columns",
    "load_prepared",
    "prepare_dataset",
    "validate_options",
    "verify_file",
    "write_prepared",
]
