"""FedMLP partial labels: the eight active-class fixtures of fedmlp.md §3 and the zeroing of missing classes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fnlcore.assignment import ClientAssignment
from fnlcore.errors import ConfigError, DataError
from fnlcore.noise import FedMLPPartial, apply_partial_labels, fedmlp_active_classes, fedmlp_partial_noise

FIXTURES = {
    ("ICH", 1): [[0, 1, 2, 3], [0, 1, 3, 4], [0, 1, 2, 4], [0, 2, 3, 4], [0, 2, 3, 4]],
    ("ICH", 2): [[0, 2, 3], [0, 3, 4], [0, 2, 3], [1, 2, 4], [0, 1, 2]],
    ("ICH", 3): [[0, 3], [0, 3], [0, 4], [2, 4], [1, 4]],
    ("ICH", 4): [[0], [1], [2], [3], [4]],
    ("CXR", 1): [
        [0, 1, 2, 3, 4, 5, 6],
        [0, 1, 2, 4, 5, 6, 7],
        [0, 1, 2, 3, 4, 6, 7],
        [0, 1, 2, 3, 4, 5, 7],
        [1, 2, 3, 4, 5, 6, 7],
        [1, 2, 3, 4, 5, 6, 7],
        [0, 2, 3, 4, 5, 6, 7],
        [1, 2, 3, 4, 5, 6, 7],
    ],
    ("CXR", 3): [
        [0, 1, 3, 5, 6],
        [0, 1, 2, 5, 7],
        [0, 1, 2, 4, 6],
        [0, 2, 4, 6, 7],
        [0, 2, 4, 5, 6],
        [0, 1, 3, 5, 6],
        [1, 2, 3, 6, 7],
        [1, 3, 4, 5, 6],
    ],
    ("CXR", 5): [[1, 3, 5], [0, 5, 7], [0, 2, 7], [1, 4, 7], [0, 2, 4], [2, 5, 7], [0, 4, 7], [3, 5, 7]],
    ("CXR", 7): [[0], [1], [2], [3], [4], [5], [6], [7]],
}


@pytest.mark.parametrize("dataset,missing", sorted(FIXTURES))
def test_active_classes_match_spec_fixtures(dataset, missing):
    c = 5 if dataset == "ICH" else 8
    assert fedmlp_active_classes(c, c, missing) == FIXTURES[(dataset, missing)]
    assert fedmlp_active_classes(c, c, missing, seed=1037) == FIXTURES[(dataset, missing)]


def test_active_classes_errors():
    with pytest.raises(ConfigError, match="num_missing"):
        fedmlp_active_classes(5, 5, 5)
    with pytest.raises(ConfigError, match="num_missing"):
        fedmlp_active_classes(5, 5, 0)
    with pytest.raises(ConfigError, match="as many clients as classes"):
        fedmlp_active_classes(6, 5, 4)
    # a > 1 works with any number of clients
    assert len(fedmlp_active_classes(20, 5, 2)) == 20


def test_apply_partial_labels_hand_case():
    y = np.array([[1, 1, 0], [0, 1, 1], [1, 0, 1], [1, 1, 1]], dtype=np.uint8)
    a = ClientAssignment.from_lists(4, [[1, 0], [2]])  # sample 3 belongs to nobody
    mask = np.array([[True, False, True], [False, True, False]])
    res = apply_partial_labels(y, a, mask, 3)
    np.testing.assert_array_equal(res.given, [[1, 0, 0], [0, 0, 1], [0, 0, 0], [1, 1, 1]])
    np.testing.assert_array_equal(res.sample_active, [[1, 0, 1], [1, 0, 1], [0, 1, 0], [1, 1, 1]])
    np.testing.assert_array_equal(res.is_noisy, [True, True, True, False])
    assert res.given.dtype == np.uint8
    np.testing.assert_allclose(res.client_level, [1 / 3, 2 / 3])
    assert res.client_type == ("partial", "partial")


def test_partial_on_chestxray14_fixture_partition(spec_data_dir):
    df = pd.read_csv(spec_data_dir / "fedmlp_ChestXray14_client_indices.csv")
    df = df.sort_values(["client_id", "position_in_client_list"])
    clients = [g["train_csv_row_index"].to_numpy() for _, g in df.groupby("client_id")]
    n = 47116
    a = ClientAssignment.from_lists(n, clients)
    y = (np.random.RandomState(0).rand(n, 8) < 0.2).astype(np.uint8)
    res = fedmlp_partial_noise(y, a, num_classes=8, num_missing=5)
    active = FIXTURES[("CXR", 5)]
    for k, idx in enumerate(a.clients):
        missing = [c for c in range(8) if c not in active[k]]
        assert (res.given[np.ix_(idx, missing)] == 0).all()
        np.testing.assert_array_equal(res.given[np.ix_(idx, active[k])], y[np.ix_(idx, active[k])])
    assert not res.active_mask[:, 6].any()  # class 6 is labelled by nobody (fedmlp.md A7)
    assigned = a.client_of() >= 0
    assert (res.given[assigned, 6] == 0).all()
    np.testing.assert_array_equal(res.given[~assigned], y[~assigned])  # the 4 unused rows keep their labels


def test_partial_spec_seed_and_errors():
    y = np.ones((10, 5), dtype=np.uint8)
    a = ClientAssignment.from_lists(10, [range(i * 2, i * 2 + 2) for i in range(5)])
    assert FedMLPPartial(3).active_classes(5, 5, seed=0) == FIXTURES[("ICH", 3)]  # class_seed 1037 ignores the noise seed
    assert FedMLPPartial(3, class_seed=None).active_classes(5, 5, seed=1037) == FIXTURES[("ICH", 3)]
    with pytest.raises(DataError, match="multi-label|0/1 matrix"):
        FedMLPPartial(1).run(np.zeros(10, np.int64), a, 5, 0)
    with pytest.raises(ConfigError, match="missing=5 must be < num_classes=5"):
        FedMLPPartial(5).run(y, a, 5, 0)
