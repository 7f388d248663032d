"""Partition artifacts: deterministic parquet, class counts CSV, figure, reading back, bad files."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fnlcore.assignment import ClientAssignment
from fnlcore.errors import DataError
from fnlcore.io import write_parquet
from fnlcore.partition import (
    bernoulli_dirichlet,
    class_count_frame,
    iid_fedcorr,
    partition_figure,
    read_partition,
    write_partition_artifacts,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def paths(tmp_path, tag):
    return tmp_path / f"{tag}.parquet", tmp_path / f"{tag}_counts.csv", tmp_path / f"{tag}.png"


def test_artifacts_round_trip_and_same_seed_same_bytes(tmp_path):
    y = np.random.RandomState(0).randint(0, 3, 500)
    runs = [bernoulli_dirichlet(y, 7, 0.8, 1.0, seed=4) for _ in range(2)]
    for tag, a in zip(("a", "b"), runs):
        write_partition_artifacts(a, y, 3, *paths(tmp_path, tag), class_names=["x", "y", "z"], title="t")
    pa, ca, fa = paths(tmp_path, "a")
    pb, _, _ = paths(tmp_path, "b")
    assert pa.read_bytes() == pb.read_bytes()
    back = read_partition(pa, num_samples=500)
    assert back.equals(runs[0])
    frame = pd.read_parquet(pa)
    assert list(frame.columns) == ["sample_id", "client", "position"]
    assert all(dtype == np.int64 for dtype in frame.dtypes)
    counts = pd.read_csv(ca)
    assert list(counts.columns) == ["client", "n", "x", "y", "z"]
    assert counts["n"].tolist() == runs[0].sizes().tolist()
    assert counts[["x", "y", "z"]].to_numpy().tolist() == runs[0].class_counts(y, 3).tolist()
    assert fa.read_bytes()[:8] == PNG_MAGIC
    other = bernoulli_dirichlet(y, 7, 0.8, 1.0, seed=5)
    write_partition_artifacts(other, y, 3, *paths(tmp_path, "c"))
    assert paths(tmp_path, "c")[0].read_bytes() != pa.read_bytes()


def test_counts_by_hand_and_multilabel():
    a = ClientAssignment.from_lists(5, [[4, 0], [2], []])
    y = np.array([1, 0, 1, 2, 2])
    frame = class_count_frame(a, y, 3)
    assert frame.to_dict("list") == {"client": [0, 1, 2], "n": [2, 1, 0], "0": [0, 0, 0], "1": [1, 1, 0], "2": [1, 0, 0]}
    multi = np.array([[1, 1], [0, 1], [1, 0], [0, 0], [1, 1]])
    frame = class_count_frame(a, multi, 2, class_names=["a", "b"])
    assert frame[["a", "b"]].to_numpy().tolist() == [[2, 2], [1, 0], [0, 0]]


def test_trailing_empty_clients_survive_with_num_clients(tmp_path):
    a = ClientAssignment.from_lists(4, [[3, 1], [0], []])
    p, c, f = paths(tmp_path, "e")
    write_partition_artifacts(a, np.array([0, 1, 0, 1]), 2, p, c, f)
    assert read_partition(p, 4, num_clients=3).equals(a)
    assert read_partition(p, 4).num_clients == 2


def test_large_figure_renders(tmp_path):
    counts = np.random.RandomState(0).poisson(3.0, size=(500, 100))
    counts[counts < 3] = 0
    fig = partition_figure(counts)
    from fnlcore.io import save_figure

    save_figure(fig, tmp_path / "big.png", dpi=60)
    assert (tmp_path / "big.png").read_bytes()[:8] == PNG_MAGIC


def test_bad_inputs_write_nothing(tmp_path):
    a = iid_fedcorr(20, 2, 0)
    p, c, f = paths(tmp_path, "bad")
    with pytest.raises(DataError, match="class_names has 2 entries but num_classes=3"):
        write_partition_artifacts(a, np.zeros(20, dtype=int), 3, p, c, f, class_names=["a", "b"])
    with pytest.raises(DataError, match="labels have 19 rows"):
        write_partition_artifacts(a, np.zeros(19, dtype=int), 1, p, c, f)
    assert list(tmp_path.iterdir()) == []


def test_read_partition_reports_bad_files(tmp_path):
    missing = tmp_path / "none.parquet"
    with pytest.raises(DataError, match="does not exist"):
        read_partition(missing, 10)
    no_position = tmp_path / "cols.parquet"
    write_parquet(pd.DataFrame({"sample_id": [0, 1], "client": [0, 0]}), no_position)
    with pytest.raises(DataError, match=r"lacks column\(s\) \['position'\]"):
        read_partition(no_position, 10)
    gap = tmp_path / "gap.parquet"
    write_parquet(pd.DataFrame({"sample_id": [0, 1], "client": [0, 0], "position": [0, 2]}), gap)
    with pytest.raises(DataError, match="corrupted"):
        read_partition(gap, 10)
    out_of_range = tmp_path / "range.parquet"
    write_parquet(pd.DataFrame({"sample_id": [0, 12], "client": [0, 0], "position": [0, 1]}), out_of_range)
    with pytest.raises(DataError, match="range.parquet.*out of range"):
        read_partition(out_of_range, 10)
    with pytest.raises(DataError, match="num_clients=1"):
        write_parquet(pd.DataFrame({"sample_id": [0, 1], "client": [0, 1], "position": [0, 0]}), gap)
        read_partition(gap, 10, num_clients=1)


def test_figure_pools_clients_beyond_max_columns():
    from fnlcore.partition.artifacts import _pool

    # rows {0,1,2},{3} x columns {0,1},{2}: 0+1+3+4+6+7, 2+5+8, 9+10, 11
    assert _pool(np.arange(12.0).reshape(4, 3), 3, 2).tolist() == [[21.0, 15.0], [19.0, 11.0]]
    fig = partition_figure(np.ones((500, 3)))
    ax = fig.axes[0]
    assert "pool 5 consecutive clients" in ax.get_xlabel()
    assert ax.get_ylabel() == "class"
    assert len(ax.collections[0].get_offsets()) == 100 * 3  # one dot per group of 5 clients and class
    small = partition_figure(np.array([[1, 0], [0, 4]]), class_names=["cat", "dog"]).axes[0]
    assert [t.get_text() for t in small.get_yticklabels()] == ["cat", "dog"]
    assert small.collections[0].get_sizes()[1] == pytest.approx(4 * small.collections[0].get_sizes()[0])
