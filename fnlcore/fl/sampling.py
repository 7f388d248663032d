"""Which clients take part in a round.

- all clients every round (FedNoRo, Fed-NCL, FedMLP);
- a fraction per round: m = max(int(frac*K), 1) distinct clients drawn uniformly
  (``RandomState.choice(K, m, replace=False)``, FedAvg-style);
- cycles without replacement (FedGR's warm-up): shuffle the K clients, take the
  next m each round, reshuffle when the list is exhausted. When K is not a multiple
  of m, a round that empties the list takes the rest of its m from the new
  permutation, skipping the clients it already holds (they stay in the new cycle,
  later): no client twice in a round, every client exactly once per permutation.
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
        """The round's m distinct clients: the next ones of the current permutation; when it runs
        out, one fresh ``rng.permutation(K)`` whose first entries not already taken this round
        fill the rest (the skipped ones keep their places in the new cycle)."""
        out = self.queue[: self.m]
        self.queue = self.queue[self.m:]
        if len(out) < self.m:
            taken = set(out)
            fresh = [int(k) for k in rng.permutation(self.num_clients)]
            for k in fresh:
                if len(out) == self.m:
                    break
                if k not in taken:
                    out.append(k)
            picked = set(out)
            self.queue = [k for k in fresh if k not in picked or k in taken]
        return out

    def state_dict(self) -> dict:
        return {"queue": list(self.queue)}

    def load_state_dict(self, d: dict) -> None:
        self.queue = list(d["queue"])
