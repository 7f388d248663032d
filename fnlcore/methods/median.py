"""Coordinate-wise median (Yin et al., ICML 2018) as the server step; local training is FedAvg's.

Every floating coordinate of the global state (parameters and BatchNorm running statistics,
the state the server aggregates) becomes the median of the round's client values, unweighted
as in the paper. Computed a chunk of coordinates at a time (``CHUNK_VALUES`` client values):
the median of a coordinate does not depend on the others.

``even`` (an even number of clients; the paper's med{.} leaves it to the usual definition, and
there is no official code): 'mean' (default: the mean of the two middle values, the textbook
median and numpy.median's, computed in float64 and rounded once to the entry's dtype) |
'lower' (the lower middle value, what ``torch.median`` returns and what this project's
``trimmed_mean`` uses as Fed-NCL's code does). An odd count has one middle value either way.

Integer buffers (BatchNorm's ``num_batches_tracked``): copied from the round's first client, as
FedAvg does here (fnlcore.fl.state).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .api import FLMethod, load, MethodParams, param, METHODS, State
from .robust_aggregation import client_chunks

# Client values of an entry taken at a time: the stack and its sort hold a few copies of them.
CHUNK_VALUES = 2**22


@dataclass(frozen=True)
class MedianParams(MethodParams):
    name = "median"
    slug_fields = (("even", {"lower": "lower"}),)
    even: str = param("mean", choices=("mean", "lower"), doc="an even count of clients: mean of the two middle "
                                                             "values, or the lower one",
                      switch="'mean' (the median of Yin et al.'s text: mean of the two middle values for an even count)"
                             " | 'lower' (torch.median's lower middle value, as trimmed_mean / Fed-NCL's code)")


def median_of(stacked: torch.Tensor, even: str = "mean") -> torch.Tensor:
    """The median over dim 0 of (n, ...) values, in their dtype (see the module doc for ``even``)."""
    n = stacked.shape[0]
    s = stacked.sort(dim=0).values
    if n % 2 or even == "lower":
        return s[(n - 1) // 2]
    return ((s[n // 2 - 1].to(torch.float64) + s[n // 2].to(torch.float64)) / 2).to(stacked.dtype)


def coordinate_median(states: list[State], even: str = "mean") -> State:
    """Every floating entry: the coordinate-wise median of the states; integer entries from states[0]."""
    out: State = {}
    for k, ref in states[0].items():
        if not ref.is_floating_point():
            out[k] = ref.clone()
            continue
        med = torch.empty(ref.numel(), dtype=ref.dtype, device=ref.device)
        for at, x in client_chunks(states, k, CHUNK_VALUES):
            med[at] = median_of(x, even)
        out[k] = med.view(ref.shape)
    return out


@METHODS.register
class Median(FLMethod):
    Params = MedianParams
    label_kinds = ("single", "multi")  # multi-label: the engine's default loss (FedMLP's FedAvg)
    paper = "Yin et al., ICML 2018 (coordinate-wise median); no official code"

    def aggregate(self, r: int, updates) -> None:
        states = [u.state for u in updates]  # the median needs every client's value of each coordinate
        load(self.global_model, coordinate_median(states, self.params.even))
