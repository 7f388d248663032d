"""ARFL (Fu et al. 2019, attack-resistant FL with residual-based reweighting; baselines.md §12, A11).

Clients train with plain CE (as FedAvg). The server aggregates by iteratively-reweighted least
squares around a repeated-median line, per coordinate of every tensor (fushuhao6/Attack-Resistant-
Federated-Learning, averaging mode "irls"): for the n client values y of one coordinate,

1. ranks r_i of y_i; the repeated-median line through (rank, sorted value):
   b = med_i med_{j≠i} (y_(i) − y_(j)) / (i − j), a = med(y) − b (n − 1)/2, ŷ_i = a + b r_i;
2. residuals e'_i = y_i − ŷ_i, scale s = 1.4826 (1 + 5/(n − 1)) med(|e'| without its smallest) + 1e-7;
3. leverage h_i of the design [1, r]; u_i = (e'_i / s) / sqrt(1 − h_i);
4. Huber weight ψ_i = clip(u_i, −κ, κ)/u_i, κ = Λ sqrt(2/n) (u = 0 -> 1);
5. confidence c_i = ψ_i · std(ψ) (sample std over clients); restricted value ỹ_i = y_i if ψ_i ≥ δ else ŷ_i.

Client weight g_i = Σ over all coordinates of c_i, g <- (g / max g)², normalised (data sizes
ignored); the global model is Σ_i g_i ỹ_i per coordinate. Medians of an even count average the two
middle values (this reproduces the spec's hand case: b = 0.075).

Decided where the spec is silent (no code≠paper switch: ARFL's paper and code agree here):
- 0-dim float tensors are not robust-fitted (the spec skips them) but averaged with the final
  client weights g; integer buffers (BN ``num_batches_tracked``) are copied from the first
  selected client (project convention, baselines.md §0.3);
- max g = 0 (identical clients, perfectly linear values: every std(ψ) = 0) -> uniform weights
  (the spec's guard against 0/0);
- fewer than 3 clients: a line through ≤ 2 points leaves no residual to judge (1 − h = 0), so the
  round is a plain uniform mean;
- tied client values get ranks in client order (stable sort), so exact permutation invariance
  holds for distinct values; coordinates are processed in chunks (the code's 2000-coordinate
  shards are only a memory device) in float64 on the CPU and float32 on a GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, NamedTuple, Sequence

import numpy as np
import torch

from .api import FLMethod, load, MethodParams, param, METHODS, State, weighted_average
from .api import numerics
from .parts import client_table, true_noise_rates

MAD_CONSTANT = 1.4826  # makes the median absolute deviation a consistent estimator of a normal's sigma
SCALE_EPS = 1e-7
CHUNK_ELEMENTS = 1 << 23  # bound on coordinates x n x (n - 1) per slope tensor (64 MB in float64; each has a few temporaries)


@dataclass(frozen=True)
class ARFLParams(MethodParams):
    name = "arfl"
    slug_fields = ()
    huber_lambda: float = param(2.0, gt=0, doc="Λ: Huber threshold kappa = Λ sqrt(2/n) on standardised residuals")
    delta: float = param(0.1, ge=0, le=1, doc="values whose Huber weight is below delta are replaced by the fitted line")


# -- pure parts ----------------------------------------------------------------------------


def median(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Median along ``dim``; an even count averages the two middle values."""
    s = x.sort(dim=dim).values
    n = s.shape[dim]
    return ((s.narrow(dim, (n - 1) // 2, 1) + s.narrow(dim, n // 2, 1)) / 2).squeeze(dim)


def ranks_of(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted y, ranks) per row; ties ranked in client order (a stable sort)."""
    sorted_y, order = y.sort(dim=1, stable=True)
    return sorted_y, order.argsort(dim=1)


def line_at(intercept: torch.Tensor, slope: torch.Tensor, ranks: torch.Tensor) -> torch.Tensor:
    """ŷ = a + b r per row: (m,), (m,), (m, n) -> (m, n)."""
    return intercept.unsqueeze(1) + slope.unsqueeze(1) * ranks.to(intercept.dtype)


def median_line(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The repeated-median line through (rank, sorted y) of each row: (intercept (m,), slope (m,), ranks (m, n))."""
    n = y.shape[1]
    sorted_y, ranks = ranks_of(y)
    i = torch.arange(n, device=y.device)
    others = torch.stack([torch.cat([i[:k], i[k + 1:]]) for k in range(n)])  # (n, n-1): j != i
    dx = (i.unsqueeze(1) - others).to(y.dtype)
    pair_slopes = (sorted_y.unsqueeze(2) - sorted_y[:, others]) / dx  # (m, n, n-1)
    slope = median(median(pair_slopes, dim=2), dim=1)
    return median(y, dim=1) - slope * (n - 1) / 2, slope, ranks


def rank_leverage(ranks: torch.Tensor, n: int) -> torch.Tensor:
    """diag of X (XᵀX)⁻¹ Xᵀ for X = [1, r] with r a permutation of 0..n-1: 1/n + (r − r̄)² / Σ(k − r̄)²."""
    centre = (n - 1) / 2
    spread = n * (n * n - 1) / 12  # Σ_k (k − r̄)²
    return 1.0 / n + (ranks.to(torch.float64) - centre).pow(2) / spread


class Fit(NamedTuple):
    """One IRLS pass on m coordinates: the line (intercept, slope), which values are kept (ψ ≥ δ,
    (m, n) bool; the others are replaced by the line) and the confidences c (m, n)."""

    intercept: torch.Tensor
    slope: torch.Tensor
    keep: torch.Tensor
    confidence: torch.Tensor

    def restricted(self, y: torch.Tensor) -> torch.Tensor:
        """ỹ: y where kept, the fitted line elsewhere (the ranks taken again from y)."""
        return torch.where(self.keep, y, line_at(self.intercept, self.slope, ranks_of(y)[1]))


def irls_fit(y: torch.Tensor, huber_lambda: float, delta: float) -> Fit:
    """One IRLS pass on (m coordinates, n clients)."""
    n = y.shape[1]
    intercept, slope, ranks = median_line(y)
    resid = y - line_at(intercept, slope, ranks)
    abs_sorted = resid.abs().sort(dim=1).values[:, 1:]  # the smallest residual removed
    scale = MAD_CONSTANT * (1 + 5 / (n - 1)) * median(abs_sorted, dim=1) + SCALE_EPS
    u = resid / scale.unsqueeze(1) / numerics.sqrt(1 - rank_leverage(ranks, n).to(y.dtype))
    kappa = huber_lambda * math.sqrt(2.0 / n)
    # clip(u, -κ, κ)/u: 1 inside the band (u = 0 included), κ/|u| outside
    psi = torch.where(u.abs() <= kappa, torch.ones_like(u), kappa / u.abs())
    return Fit(intercept, slope, psi >= delta, psi * psi.std(dim=1, keepdim=True))


def client_weights(confidence_sums: torch.Tensor) -> torch.Tensor:
    """g <- (g / max g)², normalised; uniform when max g is not positive (identical clients)."""
    g = confidence_sums.to(torch.float64)
    top = g.max()
    if not torch.isfinite(top) or top <= 0:
        return torch.full_like(g, 1.0 / g.numel())
    g = (g / top).pow(2)
    return g / g.sum()


def _robust_keys(state: Mapping[str, torch.Tensor]) -> list[str]:
    return [k for k, v in state.items() if v.is_floating_point() and v.dim() > 0]


def arfl_aggregate(states: Sequence[Mapping[str, torch.Tensor]], huber_lambda: float, delta: float,
                   chunk_elements: int = CHUNK_ELEMENTS) -> tuple[State, torch.Tensor]:
    """ARFL's server step on the client states: (global state, client weights g)."""
    n = len(states)
    if n < 3:
        w = torch.full((n,), 1.0 / n, dtype=torch.float64)
        return weighted_average(states, w.tolist()), w
    ref = states[0]
    device = next(iter(ref.values())).device
    work = torch.float64 if device.type == "cpu" else torch.float32
    per_chunk = max(chunk_elements // (n * (n - 1)), 1)

    def values(key: str) -> torch.Tensor:  # (numel, n): every client's value of each coordinate
        return torch.stack([s[key].reshape(-1) for s in states], dim=1).to(work)

    # Pass 1: the fits and the confidences that set the weights. A fit keeps its line and kept-mask,
    # not the restricted values: those are (numel, n) in float64 for every tensor at once, three times
    # FedAvg's peak memory on a ResNet-18 (rehearsal); pass 2 rebuilds them a tensor at a time.
    fits: dict[str, list[Fit]] = {}
    conf_sum = torch.zeros(n, dtype=torch.float64, device=device)
    for key in _robust_keys(ref):
        y = values(key)
        fits[key] = []
        for start in range(0, y.shape[0], per_chunk):
            fit = irls_fit(y[start:start + per_chunk], huber_lambda, delta)
            conf_sum += fit.confidence.sum(0).to(torch.float64)
            fits[key].append(fit._replace(confidence=None))
    w = client_weights(conf_sum.cpu())
    result: State = {}
    for key, key_fits in fits.items():
        y = values(key)
        out = torch.empty_like(y)
        for fit, start in zip(key_fits, range(0, y.shape[0], per_chunk)):
            out[start:start + per_chunk] = fit.restricted(y[start:start + per_chunk])
        result[key] = (out @ w.to(device=device, dtype=work)).reshape(ref[key].shape).to(ref[key].dtype)
    result.update(weighted_average([{k: s[k] for k in ref if k not in fits} for s in states], w.tolist()))
    return {k: result[k] for k in ref}, w


@METHODS.register
class ARFL(FLMethod):
    Params = ARFLParams
    label_kinds = ("single", "multi")  # multi-label: the engine's default loss (FedMLP's FedAvg)
    paper = "Fu et al. 2019; baseline (via FedCorr) in FedDiv"

    persistent = ("weight_sum", "times_selected")

    def __init__(self, params: ARFLParams, ctx):
        super().__init__(params, ctx)
        k = ctx.data.num_clients
        self.weight_sum = np.zeros(k)  # Σ over rounds of each client's ARFL weight (for client_results)
        self.times_selected = np.zeros(k, dtype=np.int64)

    def aggregate(self, r: int, updates) -> None:
        p = self.params
        ups = list(updates)  # the robust fit needs every client's value of each coordinate
        state, w = arfl_aggregate([u.state for u in ups], p.huber_lambda, p.delta)
        load(self.global_model, state)
        clients = np.array([u.client for u in ups])
        np.add.at(self.weight_sum, clients, w.numpy())
        np.add.at(self.times_selected, clients, 1)
        self.round_info.update(arfl_min_weight=float(w.min()), arfl_max_weight=float(w.max()))

    def client_results(self):
        data, nan = self.ctx.data, float("nan")
        rates = [nan] * data.num_clients if data.multi_label else true_noise_rates(data, empty=nan)
        sel = [int(s) for s in self.times_selected]
        return client_table(data, rates, times_selected=sel,
                            mean_arfl_weight=[float(w / s) if s else nan for w, s in zip(self.weight_sum, sel)])
