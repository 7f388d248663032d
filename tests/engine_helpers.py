"""A tiny federated run on scikit-learn's digits, built without the workflow (for engine tests)."""

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


def make_ctx(settings: TrainSettings | None = None, seed: int = 0, **data_kw):
    xtr, ytr, given, xte, yte, a = digits_data(**data_kw)
    dev = torch.device("cpu")
    data = FederatedData(
        ImageSource(dev, images=xtr), ImageSource(dev, images=xte), torch.as_tensor(ytr), torch.as_tensor(given),
        torch.as_tensor(yte), [torch.as_tensor(c) for c in a.clients], 10,
    )
    s = settings or TrainSettings(rounds=4, local_epochs=1, batch_size=16, optimizer="adam", lr=3e-3)
    return build_context(data, "digits", (8, 8), 1, s, seed, dev, log=lambda m: None)
