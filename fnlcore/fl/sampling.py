"""Which clients take part in a round.

- all clients every round (FedNoRo, Fed-NCL, FedMLP);
- a fraction per round: m = max(int(frac*K), 1) distinct clients drawn uniformly
  (``RandomState.choice(K, m, replace=False)``, FedAvg-style);
- cycles without replacement (FedGR's warm-up): shuffle the K clients, take the
  next m each round, reshuffle when the list is exhausted.
"""

from __future__ import annotations

import numpy as np


def clients_per_round(num_clients: int, fraction: float) -> int:
    return max(int(fraction * num_clients), 1)


def all_clients(num_clients: int) -> list[int]:
    return list(range(num_clients))


def uniform_fraction(rng: np.random.RandomState, num_clients: int, fraction: float) -> list[int]:
    if fraction >= 1.0:
        return all_clients(num_clients)
    m = clients_per_round(num_clients, fraction)
    return [int(k) for k in rng.choice(num_clients, m, replace=False)]


class CyclicSampler:
    """Sampling without replacement across rounds; its state is part of the checkpoint."""

    def __init__(self, num_clients: int, fraction: float):
        self.num_clients = num_clients
        self.m = clients_per_round(num_clients, fraction)
        self.queue: list[int] = []

    def next(self, rng: np.random.RandomState) -> list[int]:
        out: list[int] = []
        while len(out) < self.m:
            if not self.queue:
                self.queue = [int(k) for k in rng.permutation(self.num_clients)]
            out.append(self.queue.pop(0))
        return out

    def state_dict(self) -> dict:
        return {"queue": list(self.queue)}

    def load_state_dict(self, d: dict) -> None:
        self.queue = list(d["queue"])
