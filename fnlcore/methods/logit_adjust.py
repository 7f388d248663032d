"""Logit adjustment, single- and multi-label (Menon et al. 2021; FedLA, FedNoRo, FedCorr; FedMLP's
LA-BCE, fedmlp.md §2.1). Not a method."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .api import masked_mean
from .api import numerics


def log_priors(counts: torch.Tensor) -> torch.Tensor:
    """(K, C) counts -> log class frequencies per client (-inf where a class is absent)."""
    return numerics.log(counts / counts.sum(1, keepdim=True).clamp_min(1)).float()


class LogitAdjusted:
    """Mixin: client log-priors from the current given labels, recomputed at each round start."""

    def refresh_priors(self) -> None:
        self.log_prior = log_priors(self.ctx.data.class_counts())

    def la_loss(self, sb) -> torch.Tensor:
        """A step's logit-adjusted CE (``params.tau``) on the given labels: FedLA, FedNoRo's stage 1."""
        return la_cross_entropy(sb.logits, self.labels(sb.idx.reshape(-1)), self.log_prior[sb.clients],
                                self.params.tau, sb.mask)


def la_shift(prior: torch.Tensor, tau: float) -> torch.Tensor:
    """tau log(pi / (1 - pi)) per class (fedmlp.md §2.1): -inf at pi = 0, +inf at pi = 1, 0 when tau = 0."""
    if tau == 0:
        return torch.zeros_like(prior)
    return tau * (numerics.log(prior) - torch.log1p(-prior))


def la_bce(logits: torch.Tensor, y: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Per-entry l_LA = BCE(sigma(z + shift), y), log clamped at -100 (``F.binary_cross_entropy``)."""
    return F.binary_cross_entropy(torch.sigmoid(logits.float() + shift), y, reduction="none")


def la_cross_entropy(logits: torch.Tensor, y: torch.Tensor, log_prior: torch.Tensor, tau: float,
                     mask: torch.Tensor | None) -> torch.Tensor:
    """Logit-adjusted CE of K clients, CE(z + tau log(pi_k), y): (K, B, C) logits, (K * B,) or (K, B) labels,
    (K, C) log-priors, (K, B) real rows (None: all) -> (K,) means over each client's real rows."""
    k, b, c = logits.shape
    per = F.cross_entropy((logits + tau * log_prior[:, None, :]).reshape(k * b, c), y.reshape(-1), reduction="none")
    return masked_mean(per.view(k, b), mask)
