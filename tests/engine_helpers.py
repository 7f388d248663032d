"""A tiny federated run on scikit-learn's digits, built without the workflow (for engine tests).

``make_ctx(multi_label=True)`` gives a multi-label version: four binary labels derived from
the digit (MULTI_LABEL_CLASSES) with FedMLP-style partial annotation (client k annotates
classes k, k+1, ... mod C; the others are set to 0 and masked out in ``active``).
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import load_digits

from fnlcore.assignment import ClientAssignment
from fnlcore.fl.data import FederatedData, ImageSource
from fnlcore.app.train import build_context
from fnlcore.fl.settings import TrainSettings


def digits_data(num_clients: int = 4, n_train: int = 400, noisy_clients=(0,), rate: float = 0.6, seed: int = 0):
    d = load_digits()
    x = np.rint(d.images * 255 / 16).astype(np.uint8)[..., None]
    y = d.target.astype(np.int64)
    rs = np.random.RandomState(seed)
    perm = rs.permutation(len(y))
    tr, te = perm[:n_train], perm[n_train : n_train + 300]
    ytr = y[tr]
    clients = tuple(np.array_split(np.arange(n_train), num_clients))
    given = ytr.copy()
    for k in noisy_clients:
        idx = clients[k]
        flip = idx[rs.rand(len(idx)) < rate]
        given[flip] = (given[flip] + 1 + rs.randint(0, 9, len(flip))) % 10
    return x[tr], ytr, given, x[te], y[te], ClientAssignment(n_train, clients)


# name -> digits that are positive for it
MULTI_LABEL_CLASSES = {"even": (0, 2, 4, 6, 8), "big": (5, 6, 7, 8, 9), "loop": (0, 6, 8, 9), "prime": (2, 3, 5, 7)}


def multi_label_of(digits: np.ndarray) -> np.ndarray:
    """(N, 4) float32 0/1 labels of MULTI_LABEL_CLASSES for digit labels."""
    return np.stack([np.isin(digits, pos) for pos in MULTI_LABEL_CLASSES.values()], axis=1).astype(np.float32)


def active_classes(num_clients: int, num_classes: int, missing: int) -> list[list[int]]:
    """Client k annotates classes k, k+1, ..., k + C - missing - 1 (mod C)."""
    return [sorted((k + j) % num_classes for j in range(num_classes - missing)) for k in range(num_clients)]


def digits_multi_label_data(num_clients: int = 4, n_train: int = 400, missing: int = 2, seed: int = 0):
    """(x_train, y_true (N, C), given (N, C), active (N, C), x_test, y_test (M, C), assignment)."""
    xtr, dtr, _, xte, dte, a = digits_data(num_clients, n_train, noisy_clients=(), seed=seed)
    ytr, yte = multi_label_of(dtr), multi_label_of(dte)
    active = np.zeros_like(ytr)
    for k, cls in enumerate(active_classes(num_clients, ytr.shape[1], missing)):
        active[np.ix_(a.clients[k], cls)] = 1.0
    return xtr, ytr, ytr * active, active, xte, yte, a


def make_ctx(settings: TrainSettings | None = None, seed: int = 0, multi_label: bool = False, **data_kw):
    dev = torch.device("cpu")
    if multi_label:
        xtr, ytr, given, active, xte, yte, a = digits_multi_label_data(**data_kw)
        data = FederatedData(
            ImageSource(dev, images=xtr), ImageSource(dev, images=xte), torch.as_tensor(ytr), torch.as_tensor(given),
            torch.as_tensor(yte), [torch.as_tensor(c) for c in a.clients], ytr.shape[1], multi_label=True,
            active=torch.as_tensor(active), class_names=tuple(MULTI_LABEL_CLASSES),
        )
    else:
        xtr, ytr, given, xte, yte, a = digits_data(**data_kw)
        data = FederatedData(
            ImageSource(dev, images=xtr), ImageSource(dev, images=xte), torch.as_tensor(ytr), torch.as_tensor(given),
            torch.as_tensor(yte), [torch.as_tensor(c) for c in a.clients], 10,
        )
    s = settings or TrainSettings(rounds=4, local_epochs=1, batch_size=16, optimizer="adam", lr=3e-3)
    return build_context(data, "digits", (8, 8), 1, s, seed, dev, log=lambda m: None)
