"""GCE and SCE: hand cases from their papers' definitions (the engine-wide contracts cover the rest)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from fnlcore.methods.gce import gce_per_sample
from fnlcore.methods.symmetric_ce import LOG_ZERO, sce_per_sample


def test_gce_hand_case_and_its_two_limits():
    z, y = torch.zeros(1, 2), torch.tensor([0])  # p_y = 1/2
    assert gce_per_sample(z, y, 0.5).item() == pytest.approx((1 - math.sqrt(0.5)) / 0.5)
    logits, labels = torch.randn(64, 10, generator=torch.Generator().manual_seed(0)), torch.arange(64) % 10
    p_y = F.softmax(logits, 1).gather(1, labels[:, None]).squeeze(1)
    assert torch.allclose(gce_per_sample(logits, labels, 1.0), 1 - p_y)  # q = 1: mean absolute error (/2)
    ce = F.cross_entropy(logits, labels, reduction="none")
    assert torch.allclose(gce_per_sample(logits, labels, 1e-4), ce, atol=2e-3)  # q -> 0: CE


@pytest.mark.parametrize("log_zero, a", [("code", math.log(1e-4)), ("paper", -4.0)])
def test_sce_hand_case(log_zero, a):
    z, y = torch.zeros(1, 4), torch.tensor([2])  # p = 1/4 everywhere: CE = log 4, 1 - p_y = 3/4
    got = sce_per_sample(z, y, 0.1, 1.0, LOG_ZERO[log_zero]).item()
    assert got == pytest.approx(0.1 * math.log(4) + (-a) * 0.75, rel=1e-6)


def test_sce_without_its_reverse_term_is_scaled_ce_and_rce_is_bounded():
    logits, labels = torch.randn(32, 5, generator=torch.Generator().manual_seed(1)), torch.arange(32) % 5
    ce = F.cross_entropy(logits, labels, reduction="none")
    assert torch.allclose(sce_per_sample(logits, labels, 2.0, 0.0, LOG_ZERO["code"]), 2.0 * ce)
    rce = sce_per_sample(logits, labels, 0.0, 1.0, LOG_ZERO["paper"])
    assert bool((rce >= 0).all()) and bool((rce <= 4.0).all())  # -A (1 - p_y) in [0, -A]
