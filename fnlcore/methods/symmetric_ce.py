"""The symmetric cross-entropy (Wang et al., ICCV 2019) per sample, shared by the SCE baseline (sce)
and RHFL's local loss (rhfl). Not a method: no registration.

SCE = alpha CE + beta RCE, the reverse CE RCE = -sum_c p_c log q_c of the prediction p against the
one-hot label q, whose log 0 is a constant A: RCE = -A (1 - p_y) (p clamped to [1e-7, 1]).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# A, the log 0 of the one-hot label: 'code' clamps the label to [1e-4, 1] as the official code
# (and RHFL's port) does; 'paper' is the text's A = -4.
LOG_ZERO = {"code": math.log(1e-4), "paper": -4.0}


def sce_per_sample(logits: torch.Tensor, y: torch.Tensor, alpha: float, beta: float, log_zero: float) -> torch.Tensor:
    """alpha CE + beta (-A) (1 - p_y) of each row: (N, C) logits, y (N,); 1 - p_y summed over c != y."""
    ce = F.cross_entropy(logits, y, reduction="none")
    p = F.softmax(logits, dim=1).clamp(1e-7, 1.0)
    others = p.sum(1) - p.gather(1, y[:, None]).squeeze(1)
    return alpha * ce + beta * (-log_zero) * others
