"""FedMLP's partial-label losses that its FedNoRo port (fednoro_ml) reuses: the logit-adjusted
loss over each client's annotated classes (WPC) and the distillation on its missing classes
(fedmlp.md §2.2, §2.3). Not a method: no registration.

K clients at once: (K, B, C) entries, (K, C) class masks, (K, B) real rows (None: all) -> (K,).
"""

from __future__ import annotations

import torch

from .logit_adjust import la_bce


def real_row_sums(entries: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Per-client sums of (K, B, C) entries over the real rows."""
    if mask is not None:
        entries = torch.where(mask[:, :, None], entries, torch.zeros_like(entries))
    return entries.sum((1, 2))


def wpc_loss(logits, y, shift, active, batch_size: int | torch.Tensor, mask) -> torch.Tensor:
    """L_WPC = sum_i sum_{c in A_k} l_LA / (B |A_k|) (fedmlp.md §2.2); ``shift`` and ``active`` (K, C),
    ``active`` 0/1; ``batch_size`` B, or (K,) one per client."""
    per = la_bce(logits, y, shift[:, None, :]) * active[:, None, :]
    return real_row_sums(per, mask) / (batch_size * active.sum(1).clamp_min(1))


def missing_distillation(p, p_global, missing, batch_size: int | torch.Tensor, mask) -> torch.Tensor:
    """D = sum_i sum_{c in M_k} (p - p^G)^2 / (B |M_k|) (fedmlp.md §2.3); ``missing`` (K, C); 0 for a
    client that misses nothing (no 0 / 0)."""
    m = missing.sum(1)
    total = real_row_sums(((p - p_global) ** 2) * missing[:, None, :], mask)
    return torch.where(m > 0, total / (batch_size * m).clamp_min(1), torch.zeros_like(total))
