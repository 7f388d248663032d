"""Trimmed mean ("Trimm", Yin et al. 2018) as Fed-NCL's code computes it (baselines.md §4, fedncl.md §6).

Local training is FedAvg's (plain CE). The server, for every state-dict entry:
stacks the client tensors (float32, as the code), takes the coordinate-wise
median across clients (``torch.median``: the *lower* middle value for an even
count), the deviations delta_c = theta_c - med, keeps per coordinate the ``keep``
clients with the smallest |delta_c| and outputs med + (mean of every kept
deviation of that entry: ONE scalar per entry, over all coordinates and kept
clients). keep = int(K * clean_fraction * client_fraction) - 1 (code:
``int(num_users * bernoulli_p * frac) - 1`` for Bernoulli noise, clean_fraction
0.5 for the Gaussian noise); the table sets ``clean_fraction`` per column.

[CODE≠PAPER] ``rule``: 'code_scalar' (default, the code above) |
'per_coordinate' (med + per-coordinate mean of the kept deviations, i.e. the
mean of the ``keep`` values closest to the median, without the scalar quirk).
The paper's "drop the largest and smallest K%" is not what produced its numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .api import ConfigError, FLMethod, load, MethodParams, param, METHODS, State
from .robust_aggregation import client_chunks


@dataclass(frozen=True)
class TrimmedMeanParams(MethodParams):
    name = "trimmed_mean"
    slug_fields = ("clean_fraction",)
    clean_fraction: float = param(0.5, gt=0, le=1, doc="p of the Bernoulli noise (0.5 for Gaussian): keep = int(K p frac) - 1")
    keep: int | None = param(None, ge=1, doc="clients kept per coordinate; default from clean_fraction")
    rule: str = param("code_scalar", choices=("code_scalar", "per_coordinate"),
                      switch="'code_scalar' (code: median + one mean deviation scalar per entry) | 'per_coordinate' "
                             "(mean of the keep values closest to the coordinate median)")


def keep_count(num_clients: int, clean_fraction: float, client_fraction: float) -> int:
    """int(K * p * frac) - 1, the code's ``number_to_consider``."""
    return int(num_clients * clean_fraction * client_fraction) - 1


# Coordinates of an entry taken at a time: the median, the sort and the gather hold several
# (clients x chunk) copies; over a whole VGG-16 classifier entry (16.8 M coordinates x 20 clients)
# they peaked at 11.6 GB (benchmarks/README.md, the rehearsal), in chunks of 2^22 / clients at ~5 GB.
CHUNK_VALUES = 2**22


def trimmed_mean(states: list[State], keep: int, rule: str = "code_scalar") -> State:
    """Every entry of the state dict: lower median + mean kept deviation (one scalar per entry, or per
    coordinate); integer buffers computed in float32 and truncated back, as the code.

    Coordinate-wise, a chunk of coordinates at a time (:data:`CHUNK_VALUES` client values): the
    median, the order and the kept deviations of a coordinate do not depend on the others, and the
    code rule's one scalar is the mean of the whole entry's kept deviations, assembled in place
    first, so the result equals the whole entry's in one chunk bit for bit."""
    out: State = {}
    for k, ref in states[0].items():
        med = torch.empty(ref.numel(), dtype=torch.float32)
        kept = torch.empty((keep, ref.numel()), dtype=torch.float32)
        for at, chunk in client_chunks(states, k, CHUNK_VALUES, torch.float32):
            med[at] = m = chunk.median(dim=0).values
            dev = chunk - m
            kept[:, at] = torch.take_along_dim(dev, torch.argsort(dev.abs(), dim=0, stable=True)[:keep], dim=0)
        shift = kept.view(keep, *ref.shape).mean() if rule == "code_scalar" else kept.mean(dim=0)
        out[k] = (med + shift).view(ref.shape).to(ref.dtype)
    return out


@METHODS.register
class TrimmedMean(FLMethod):
    Params = TrimmedMeanParams
    label_kinds = ("single", "multi")  # multi-label: the engine's default loss (FedMLP's FedAvg)
    paper = "Yin et al. 2018, as in Fed-NCL's code; baseline of Fed-NCL Tables I-III"

    def __init__(self, params: TrimmedMeanParams, ctx):
        super().__init__(params, ctx)
        s = ctx.settings
        self.keep = params.keep or keep_count(ctx.data.num_clients, params.clean_fraction, s.client_fraction)
        if self.keep < 1:
            raise ConfigError(f"method 'trimmed_mean': keep = int({ctx.data.num_clients} clients * clean_fraction "
                              f"{params.clean_fraction} * client_fraction {s.client_fraction}) - 1 = {self.keep} < 1; "
                              "set keep")

    def aggregate(self, r: int, updates) -> None:
        states = [u.state for u in updates]  # the median needs every client's value of each entry
        load(self.global_model, trimmed_mean(states, min(self.keep, len(states)), self.params.rule))
