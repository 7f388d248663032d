"""Noise artifacts: parquet layout, byte-identical output, read-back, summary CSV, figures."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fnlcore.assignment import ClientAssignment
from fnlcore.errors import DataError
from fnlcore.noise import (
    FedCorrNoise,
    FedMLPPartial,
    SymmetricNoise,
    noise_frame,
    read_noise,
    transition_counts,
    write_noise_artifacts,
)


def _setup(n=600, k=6, c=10, seed=0):
    rs = np.random.RandomState(seed)
    y = rs.randint(0, c, n).astype(np.int64)
    perm = rs.permutation(n)
    a = ClientAssignment.from_lists(n, [perm[i * 90 : (i + 1) * 90] for i in range(k)])  # 60 unassigned
    return y, a


def _write(tmp_path, tag, result, y, a, c):
    paths = {
        "parquet_path": tmp_path / tag / "seed0.parquet",
        "summary_path": tmp_path / tag / "seed0.summary.csv",
        "rates_figure_path": tmp_path / tag / "seed0.rates.png",
        "matrix_figure_path": tmp_path / tag / "seed0.matrix.png",
    }
    summary = write_noise_artifacts(result, y, a, c, **paths)
    return paths, summary


def test_single_label_artifacts(tmp_path):
    y, a = _setup()
    res = FedCorrNoise(rho=1.0, tau=0.5).run(y, a, 10, seed=3)
    paths, summary = _write(tmp_path, "a", res, y, a, 10)
    for p in paths.values():
        assert p.exists() and p.stat().st_size > 0
    assert not list(tmp_path.rglob("*.part*"))  # no temporary leftovers
    df = pd.read_parquet(paths["parquet_path"])
    assert list(df.columns) == ["sample_id", "client", "position", "label_true", "label_given", "is_noisy"]
    assert len(df) == 540
    np.testing.assert_array_equal(df["sample_id"], np.concatenate(a.clients))
    np.testing.assert_array_equal(df["position"], np.tile(np.arange(90), 6))
    np.testing.assert_array_equal(df["label_given"], res.given[df["sample_id"]])
    np.testing.assert_array_equal(df["is_noisy"], df["label_true"] != df["label_given"])

    csv = pd.read_csv(paths["summary_path"])
    assert list(csv.columns) == ["client", "n", "noisy", "noise_type", "nominal_level", "realized_rate"]
    for k in range(6):
        idx = a.clients[k]
        assert csv.loc[k, "realized_rate"] == pytest.approx(res.is_noisy[idx].mean())
        assert csv.loc[k, "nominal_level"] == pytest.approx(res.client_level[k])
    assert csv["noise_type"].iloc[0] == "sym_incl"

    table = read_noise(paths["parquet_path"])
    assert not table.multi_label and table.active is None
    np.testing.assert_array_equal(table.given, res.given[table.sample_id])
    assert table.assignment(600, 6).equals(a)
    by_sample = table.given_by_sample(600)
    assigned = a.client_of() >= 0
    np.testing.assert_array_equal(by_sample[assigned], res.given[assigned])
    assert (by_sample[~assigned] == -1).all()


def test_same_seed_gives_byte_identical_parquet(tmp_path):
    y, a = _setup()
    spec = SymmetricNoise(rate=0.3)
    p1, _ = _write(tmp_path, "one", spec.run(y, a, 10, seed=7), y, a, 10)
    p2, _ = _write(tmp_path, "two", spec.run(y, a, 10, seed=7), y, a, 10)
    p3, _ = _write(tmp_path, "three", spec.run(y, a, 10, seed=8), y, a, 10)
    b1 = p1["parquet_path"].read_bytes()
    assert b1 == p2["parquet_path"].read_bytes()
    assert b1 != p3["parquet_path"].read_bytes()
    assert p1["summary_path"].read_bytes() == p2["summary_path"].read_bytes()


def test_multi_label_artifacts(tmp_path):
    n, c = 100, 5
    rs = np.random.RandomState(1)
    y = (rs.rand(n, c) < 0.4).astype(np.uint8)
    a = ClientAssignment.from_lists(n, [range(i * 20, (i + 1) * 20) for i in range(5)])
    res = FedMLPPartial(missing=2).run(y, a, c, seed=0)
    paths, summary = _write(tmp_path, "ml", res, y, a, c)
    df = pd.read_parquet(paths["parquet_path"])
    expected = ["sample_id", "client", "position"] + [f"{p}_{j}" for p in ("true", "given", "active") for j in range(c)]
    assert list(df.columns) == expected + ["is_noisy"]
    assert all(df[f"active_{j}"].dtype == np.uint8 for j in range(c))
    assert list(summary.columns)[-2:] == ["active_classes", "positives_removed"]
    assert summary.loc[0, "active_classes"] == "0 2 3"  # ICH missing-2 fixture, client 0
    removed = ((y == 1) & (res.given == 0)).sum()
    assert summary["positives_removed"].sum() == removed
    table = read_noise(paths["parquet_path"])
    assert table.multi_label
    np.testing.assert_array_equal(table.given, res.given[table.sample_id])
    np.testing.assert_array_equal(table.active, res.sample_active[table.sample_id])


def test_transition_counts_hand_case():
    y = np.array([0, 0, 1, 1, 2], dtype=np.int64)
    a = ClientAssignment.from_lists(5, [[0, 1, 2, 3]])
    res = SymmetricNoise(rate=0.0).run(y, a, 3, 0)
    object.__setattr__(res, "given", np.array([0, 1, 1, 1, 0]))
    np.testing.assert_array_equal(transition_counts(res, y, a, 3), [[1, 1, 0], [0, 2, 0], [0, 0, 0]])


def test_mismatched_inputs_raise(tmp_path):
    y, a = _setup()
    res = SymmetricNoise(rate=0.3).run(y, a, 10, 0)
    with pytest.raises(DataError, match="shape"):
        noise_frame(res, y[:-1], a)
    other = ClientAssignment.from_lists(600, [range(10)])
    with pytest.raises(DataError, match="partition"):
        noise_frame(res, y, other)
    with pytest.raises(DataError, match="class_names"):
        write_noise_artifacts(
            res, y, a, 10, tmp_path / "p.parquet", tmp_path / "s.csv", tmp_path / "r.png", tmp_path / "m.png",
            class_names=["a", "b"],
        )
    assert not (tmp_path / "p.parquet").exists()
    bad = tmp_path / "bad.parquet"
    pd.DataFrame({"x": [1]}).to_parquet(bad)
    with pytest.raises(DataError, match="not a noise parquet"):
        read_noise(bad)


def test_noise_figures_carry_a_title(tmp_path, monkeypatch):
    from fnlcore.noise import artifacts

    titles = []
    monkeypatch.setattr(artifacts, "save_figure", lambda fig, path, dpi: titles.append(fig._suptitle.get_text()))
    y, a = _setup()
    res = FedCorrNoise(rho=1.0, tau=0.5).run(y, a, 10, seed=3)
    write_noise_artifacts(res, y, a, 10, tmp_path / "p.parquet", tmp_path / "s.csv", tmp_path / "r.png",
                          tmp_path / "m.png", title="cifar10 · iid · fedcorr")
    write_noise_artifacts(res, y, a, 10, tmp_path / "p.parquet", tmp_path / "s.csv", tmp_path / "r.png",
                          tmp_path / "m.png")
    assert titles == ["cifar10 · iid · fedcorr"] * 2 + ["noise model fedcorr"] * 2
