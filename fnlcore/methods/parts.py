"""Building blocks several methods share (FedCorr, FedDiv and the baselines FedCorr adapted).

Not a method: no registration. Each block is the reference codes' behaviour, named
for what it computes, so a method file reads as its algorithm.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..fl.local import predict
from ..randaugment import mixup


def double_softmax_loss(probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-sample cross-entropy applied to softmax *probabilities* (FedCorr's and FedDiv's code).

    ``nn.CrossEntropyLoss(reduction='none')(softmax(z), y)`` = -P_y + log sum_c exp(P_c):
    the codes feed probabilities where logits belong; the loss scale (e.g. [1.461, 2.461]
    on 10 classes) is what their GMMs and rankings saw (fedcorr.md §4, A2).
    """
    return F.cross_entropy(probs.float(), labels, reduction="none")


def mixup_cross_entropy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, alpha: float,
                        gen: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """lambda CE(f(x~), y) + (1 - lambda) CE(f(x~), y[pi]) with one forward pass on x~ (FedCorr, FedDiv).

    Returns (loss, logits of the mixed batch) so a caller can add terms on the same output.
    """
    xm, ya, yb, lam = mixup(x, y, alpha, gen)
    out = model(xm)
    return lam * F.cross_entropy(out, ya) + (1.0 - lam) * F.cross_entropy(out, yb), out


def group_shape(num_clients: int, fraction: float | None) -> tuple[int, int]:
    """(clients per group, groups per pass) of FedCorr's stage-1 draw.

    ``fraction`` None = one client per group and K groups, exactly (computing 1/K in floats
    and applying the code's ``int()`` loses a client for some K, e.g. int(49 * (1/49)) = 0).
    An explicit fraction is used as the code does: ``int(K * f)`` and ``int(1 / f)``.
    """
    if fraction is None:
        return 1, num_clients
    per_group, groups = int(num_clients * fraction), int(1.0 / fraction)
    if per_group < 1:
        raise ValueError(f"fraction {fraction} gives 0 clients per group for K={num_clients}; use >= 1/K or leave it unset")
    return per_group, groups


def sequential_client_groups(rng: np.random.RandomState, num_clients: int, fraction: float | None) -> list[list[int]]:
    """FedCorr's stage-1 draw (also FedDiv's warm-up): one pass over the clients in groups.

    ``groups`` times (see :func:`group_shape`): draw ``per_group`` clients with
    ``rng.choice(K, n, p=prob)`` (with replacement, as the code: A7), zero their
    probability and renormalise. One client per group: every client once, in random order.
    """
    per_group, n_groups = group_shape(num_clients, fraction)
    prob = np.full(num_clients, 1.0 / num_clients)
    groups = []
    for _ in range(n_groups):
        if prob.sum() <= 0:
            break
        chosen = rng.choice(num_clients, per_group, p=prob)
        groups.append([int(k) for k in chosen])
        prob[chosen] = 0.0
        total = prob.sum()
        if total > 0:
            prob = prob / total
    return groups


@torch.no_grad()
def client_outputs(ctx, model: torch.nn.Module, idx: torch.Tensor, augment: bool = True,
                   batch_size: int = 100) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits, softmax probabilities, double-softmax losses on the current labels) for samples ``idx``.

    The codes run these passes in eval mode on the *training* dataset object, i.e. with
    training augmentation (``augment=True``), in batches of 100.
    """
    logits = predict(ctx, model, ctx.data.train, idx, augment=augment, batch_size=batch_size)
    probs = F.softmax(logits, dim=1)
    labels = ctx.data.given[idx.to(ctx.device)]
    return logits, probs, double_softmax_loss(probs, labels)
