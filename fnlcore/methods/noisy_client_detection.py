"""How FedNoRo tells noisy clients from clean ones, shared by FedNoRo (its stage-1 detection) and the
Table 3 study of its indicators (fednoro_detection): one indicator per client from the global
model, and the clients a 2-component GMM puts in the noisy component (fednoro.md §6, §8, A6).
Not a method: no registration."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .api import predict
from .parts import class_loss_matrix, fit_two_gaussians, lid_scores


def gmm_noisy(features: np.ndarray, random_state: int, noisy_high: bool = True) -> np.ndarray:
    """(K,) bool: the clients one 2-component GMM fit (sklearn defaults) puts in the noisy component, the
    one whose means sum larger (``noisy_high``) or smaller."""
    gmm = fit_two_gaussians(features, random_state)
    sums = gmm.means_.sum(axis=1)
    return gmm.predict(features) == int(np.argmax(sums) if noisy_high else np.argmin(sums))


def client_indicators(ctx, model, indicator="loss", per_class=False, augment=True, lid_k=20) -> np.ndarray:
    """K x 1 (or K x C for per-class losses) indicator matrix from the global model (FedNoRoDetectionParams)."""
    data = ctx.data
    assigned = torch.cat(data.clients)
    logits = predict(ctx, model, data.train, assigned, augment=augment)
    given = data.given[assigned.to(ctx.device)]
    if indicator == "lid":
        probs = F.softmax(logits, dim=1)
        return np.array([[float(np.mean(np.asarray(lid_scores(part, lid_k))))]
                         for part in probs.split([len(idx) for idx in data.clients])])
    if indicator == "conf":
        per_sample = F.softmax(logits, dim=1).gather(1, given[:, None]).squeeze(1)
    else:
        per_sample = F.cross_entropy(logits, given, reduction="none")
    values = np.zeros(len(data.train))
    values[assigned.numpy()] = per_sample.double().cpu().numpy()
    if per_class:
        return class_loss_matrix(values, data.given.cpu().numpy(), [c.numpy() for c in data.clients], data.num_classes)
    return np.array([[values[c.numpy()].mean() if len(c) else 0.0] for c in data.clients])
