"""Geometric median by smoothed Weiszfeld: RFA (Pillutla, Kakade, Harchaoui, IEEE TSP 2022) as the
server step; local training is FedAvg's.

The aggregate z minimises sum_i alpha_i ||z - theta_i|| over the round's client states, alpha_i
the aggregation weights (``training.weighting``: the clients' data sizes by default, RFA's
weights), normalised to sum 1. As RFA's code (``geometric_median_update``, GitHub
krishnap25/RFA) computes it:

1. z = sum_i alpha_i theta_i (the weighted mean: one call of the averaging oracle);
2. up to ``max_iter`` times: beta_i = alpha_i / max(nu, ||z - theta_i||), normalised;
   z = sum_i beta_i theta_i; stop when the objective sum_i alpha_i ||z - theta_i|| changed by
   less than ``ftol`` times its new value.

Defaults: ``max_iter`` = 2, what RFA's experiment scripts pass (``--weiszfeld-maxiter 2``, i.e.
three averaging calls; the argparse default there is 4), ``nu`` = 1e-5 (the code's ``eps``),
``ftol`` = 1e-6 (the code's).

As for FedAvg here, a state is the whole state dict: every floating entry (parameters and
BatchNorm running statistics) is one block of one vector, so the median is taken jointly over
them (RFA works on the update theta_i - theta_global; the geometric median moves with a common
shift, so the two agree). Sums and distances are in float64, entry by entry and a chunk of
coordinates at a time (``CHUNK_VALUES``); z is rounded to each entry's dtype once, at the end.
Integer buffers (BatchNorm's ``num_batches_tracked``): the round's first client's, as FedAvg's.
Not ported: RFA's server also drops updates whose norm is NaN/inf and refuses an aggregate
update of norm >= 1000 (its ``MAX_UPDATE_NORM``, applied to plain averaging too); FedAvg here
does neither, so neither does this.

Diagnostic columns: ``weiszfeld_iterations`` (iterations run) and, on single-label data,
``gm_noisy_weight`` (the final weights beta of the clients holding any wrong label, summed).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .api import FLMethod, load, MethodParams, param, METHODS, State
from .api import numerics
from .robust_aggregation import client_chunks, float_keys, noisy_client_flags, weighted_sum

# Client values taken at a time in the distance pass (a float64 chunk of every client's values).
CHUNK_VALUES = 2**22


@dataclass(frozen=True)
class GeometricMedianParams(MethodParams):
    name = "geometric_median"
    slug_fields = (("max_iter", "it"),)
    max_iter: int = param(2, ge=0, doc="Weiszfeld iterations after the weighted-mean start (RFA's experiments: 2)")
    nu: float = param(1e-5, gt=0, doc="smoothing: a distance below nu counts as nu (RFA's code: 1e-5)")
    ftol: float = param(1e-6, ge=0, doc="stop once the objective changes by less than ftol times its value")


def _distances(z: State, states: list[State], keys: list[str]) -> torch.Tensor:
    """(n,) float64 Euclidean distances ||z - states_i|| over ``keys``."""
    sq = torch.zeros(len(states), dtype=torch.float64, device=z[keys[0]].device if keys else "cpu")
    for k in keys:
        zk = z[k].reshape(-1)
        for at, x in client_chunks(states, k, CHUNK_VALUES, torch.float64):
            sq += (x - zk[at]).square_().sum(dim=1)
    return numerics.sqrt(sq)


def weiszfeld(states: list[State], weights, max_iter: int = 2, nu: float = 1e-5,
              ftol: float = 1e-6) -> tuple[State, torch.Tensor, int]:
    """RFA's smoothed Weiszfeld over every floating entry of the states: (z as float64 entries, the last
    weights used (alpha after 0 iterations), iterations run)."""
    keys = float_keys(states[0])
    alpha = torch.as_tensor([float(w) for w in weights], dtype=torch.float64)
    if len(alpha) != len(states) or (alpha < 0).any() or alpha.sum() <= 0:
        raise ValueError(f"weights must be {len(states)} non-negative numbers with a positive sum, got {alpha.tolist()}")
    alpha = alpha / alpha.sum()
    beta, obj = alpha, None
    for done in range(max_iter + 1):  # done: the Weiszfeld iterations that gave beta
        z = weighted_sum(states, keys, beta.tolist())
        dist = _distances(z, states, keys).cpu()
        prev, obj = obj, float((alpha * dist).sum())
        if done == max_iter or (prev is not None and abs(prev - obj) < ftol * obj):
            return z, beta, done
        beta = alpha / dist.clamp(min=nu)
        beta = beta / beta.sum()


def geometric_median(states: list[State], weights, max_iter: int = 2, nu: float = 1e-5,
                     ftol: float = 1e-6) -> tuple[State, torch.Tensor, int]:
    """The aggregate state (floating entries: :func:`weiszfeld`, cast to their dtype; integer entries
    from states[0]), the final weights and the iterations run."""
    z, beta, done = weiszfeld(states, weights, max_iter, nu, ftol)
    return {k: (z[k].to(v.dtype) if k in z else v.clone()) for k, v in states[0].items()}, beta, done


@METHODS.register
class GeometricMedian(FLMethod):
    Params = GeometricMedianParams
    label_kinds = ("single", "multi")  # multi-label: the engine's default loss (FedMLP's FedAvg)
    paper = "RFA: Pillutla et al., IEEE TSP 2022 (smoothed Weiszfeld as krishnap25/RFA's code)"

    def aggregate(self, r: int, updates) -> None:
        ups = list(updates)  # every Weiszfeld iteration reads every client's state
        p = self.params
        out, beta, done = geometric_median([u.state for u in ups], [self.aggregation_weight(u) for u in ups],
                                           p.max_iter, p.nu, p.ftol)
        load(self.global_model, out)
        self.round_info["weiszfeld_iterations"] = float(done)
        flags = noisy_client_flags(self.ctx, [u.client for u in ups])
        if flags is not None:
            self.round_info["gm_noisy_weight"] = float(sum(float(b) for b, f in zip(beta, flags) if f))
