"""FedLSR's local self-regularisation pieces that its single-label form (fedlsr) and FedMLP's
multi-label port (fedlsr_ml) share: the two weak views and lam draw a client prepares, and the
element-wise JS divergence between the two views' tempered predictions. Not a method: no
registration."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .api import LocalJob, Phase
from .api import numerics
from .parts import beta_draw


def js_elementwise(q1: torch.Tensor, q2: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """1/2 [KL(q1 || m) + KL(q2 || m)], m = (q1 + q2) / 2, each KL summed and divided by a client's
    B * C elements (the code's deprecated 'mean', spelled out): q (..., B, C) -> (...), a client's
    real rows only (mask (K, B)). ``F.kl_div`` per entry, as the code: a hand-written KL rounds
    its gradient differently."""
    log_m = numerics.log((q1 + q2) / 2)
    kl1, kl2 = F.kl_div(log_m, q1, reduction="none"), F.kl_div(log_m, q2, reduction="none")
    c = q1.shape[-1]
    if mask is None:
        n = q1.shape[-2] * c
    else:
        zero = torch.zeros((), dtype=kl1.dtype, device=kl1.device)
        kl1, kl2 = torch.where(mask[..., None], kl1, zero), torch.where(mask[..., None], kl2, zero)
        n = mask.sum(-1).clamp_min(1).to(kl1.dtype) * c  # a client riding along without a batch: 0, not 0/0
    return 0.5 * (kl1.sum((-2, -1)) + kl2.sum((-2, -1))) / n


def lam_beta11(n: int, gen: torch.Generator | None, device) -> tuple[torch.Tensor]:
    """FedLSR's ``Phase.draws`` (single- and multi-label): lam ~ Beta(1, 1), once per batch (a 0-dim
    draw), drawn after the batch's two weak views, as the official code."""
    return (torch.tensor(beta_draw(1.0, gen, device)),)


def two_weak_views(method, r, k, nets) -> LocalJob:
    """FedLSR's stage ``prepare``: raw images, two weak views, then lam, declared so the batched engine
    draws them ahead."""
    return LocalJob(phases=[Phase(augment="raw", views=("weak:1", "weak:2"), draws=lam_beta11)])
