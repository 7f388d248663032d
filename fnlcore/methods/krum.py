"""Krum and Multi-Krum (Blanchard et al., NeurIPS 2017) as the server step; local training is FedAvg's.

With n updates of which f may be Byzantine, the score of update i is the sum of its squared
distances to its n - f - 2 nearest other updates; Krum keeps the update with the lowest score,
Multi-Krum (``multi`` = m > 1, the paper's Section 5) the m lowest and outputs their plain
mean. The paper's guarantee needs n > 2f + 2; a setting that breaks it is refused.

Here an update is a client's whole state dict, as the server aggregates it (fnlcore.fl.state):
every floating entry, parameters and BatchNorm running statistics alike, flattened into one
vector. Distances between states equal distances between the updates theta_i - theta_global
(every client starts from one global model). Squared distances are summed in float64, entry by
entry and a chunk of coordinates at a time (memory: ``CHUNK_VALUES`` values per chunk). Ties in
the score go to the client that comes first in the round's order.

Decisions where the paper is silent (there is no official code):

* ``f`` None (default): the largest f the round allows, floor((n - 3) / 2) for its n clients
  (n = 3 or 4: f = 0; 10: f = 3; 20: f = 8);
* integer buffers (BatchNorm's ``num_batches_tracked``): the best-scored client's, as its float
  entries are (Multi-Krum: they cannot be averaged; the best-scored chosen client's);
* Multi-Krum's mean is unweighted, as in the paper (``training.weighting`` is not used).

Diagnostic column ``krum_noisy_share`` (single-label data): the share of the chosen updates that
come from clients holding any wrong label (the run's true labels; nothing reads it back).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .api import ConfigError, FLMethod, load, MethodParams, param, METHODS, sampling, State
from .robust_aggregation import client_chunks, float_keys, noisy_client_flags, weighted_sum

# Coordinates taken at a time: the stacked chunk (clients x chunk, float64) and one row's
# differences; 2^22 values keep that under ~70 MB however large an entry is.
CHUNK_VALUES = 2**22


@dataclass(frozen=True)
class KrumParams(MethodParams):
    name = "krum"
    slug_fields = ("f", ("multi", "m"))
    f: int | None = param(None, ge=0, doc="clients assumed Byzantine; null: the most the round allows, "
                                           "floor((n - 3) / 2) for n clients a round")
    multi: int = param(1, ge=1, doc="m: Multi-Krum averages the m best-scored updates (1: Krum)")


def pairwise_sq_distances(states: list[State]) -> torch.Tensor:
    """(n, n) float64 squared Euclidean distances between the states over their floating entries."""
    n = len(states)
    keys = float_keys(states[0])
    dev = states[0][keys[0]].device if keys else torch.device("cpu")
    d = torch.zeros((n, n), dtype=torch.float64, device=dev)
    for k in keys:
        for _, x in client_chunks(states, k, CHUNK_VALUES, torch.float64):
            for i in range(n):
                d[i] += (x - x[i]).square_().sum(dim=1)
    return d


def krum_scores(d: torch.Tensor, f: int) -> torch.Tensor:
    """Score of each point: the sum of its n - f - 2 smallest squared distances to the others."""
    n = d.shape[0]
    nearest = n - f - 2
    if nearest < 1:
        raise ConfigError(f"Krum with f={f} needs more than f + 2 = {f + 2} updates, got {n}")
    return d.clone().fill_diagonal_(float("inf")).sort(dim=1).values[:, :nearest].sum(dim=1)


def max_byzantine(n: int) -> int:
    """The largest f with n > 2f + 2 (Blanchard et al.'s condition)."""
    return (n - 3) // 2


def check_krum(n: int, f: int | None, multi: int) -> int:
    """The f to use with n updates; ConfigError (naming the fix) where Krum's condition fails."""
    if n < 3:
        raise ConfigError(f"method 'krum' needs at least 3 clients a round (n > 2f + 2 with f >= 0), got {n}; "
                          "raise training.client_fraction or the number of clients")
    f_used = max_byzantine(n) if f is None else f
    if n <= 2 * f_used + 2:
        raise ConfigError(f"method 'krum': f={f_used} needs n > 2f + 2 = {2 * f_used + 2} clients a round, got n={n}; "
                          f"lower f (at most {max_byzantine(n)} here, or leave it null) or use more clients a round")
    if multi > n - f_used:
        raise ConfigError(f"method 'krum': multi={multi} must be at most n - f = {n - f_used} (n={n} clients a round, "
                          f"f={f_used}); lower multi")
    return f_used


def krum_select(states: list[State], f: int | None = None, multi: int = 1) -> list[int]:
    """Positions in ``states`` of the ``multi`` lowest Krum scores, best first (ties: earlier position)."""
    f_used = check_krum(len(states), f, multi)
    scores = krum_scores(pairwise_sq_distances(states), f_used)
    return [int(i) for i in torch.argsort(scores.cpu(), stable=True)[:multi]]


def krum(states: list[State], f: int | None = None, multi: int = 1) -> tuple[State, list[int]]:
    """The aggregate and the chosen positions: Krum's pick, or the mean of Multi-Krum's picks
    (float entries in float64, cast back; integer entries from the best-scored pick)."""
    chosen = krum_select(states, f, multi)
    best = states[chosen[0]]
    if len(chosen) == 1:
        return dict(best), chosen
    acc = weighted_sum([states[i] for i in chosen], float_keys(best), [1.0] * len(chosen))
    return {k: acc[k].div_(len(chosen)).to(v.dtype) if k in acc else v.clone() for k, v in best.items()}, chosen


@METHODS.register
class Krum(FLMethod):
    Params = KrumParams
    label_kinds = ("single", "multi")  # multi-label: the engine's default loss (FedMLP's FedAvg)
    paper = "Blanchard et al., NeurIPS 2017 (Krum, Multi-Krum); no official code"

    def __init__(self, params: KrumParams, ctx):
        super().__init__(params, ctx)
        check_krum(sampling.clients_per_round(ctx.data.num_clients, ctx.settings.client_fraction), params.f,
                   params.multi)

    def aggregate(self, r: int, updates) -> None:
        ups = list(updates)  # the scores need every client's state
        out, chosen = krum([u.state for u in ups], self.params.f, self.params.multi)
        load(self.global_model, out)
        flags = noisy_client_flags(self.ctx, [ups[i].client for i in chosen])
        if flags is not None:
            self.round_info["krum_noisy_share"] = sum(flags) / len(flags)
