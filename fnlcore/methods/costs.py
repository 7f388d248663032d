"""How a method's rounds look to `fnl plan`'s cost model (fnlcore/app/cost.py reads them).

Here and not in app/cost.py because methods declare their stages (``FLMethod.cost_stages``)
and a method must not import the application layer. Not a method."""

from __future__ import annotations

from dataclasses import dataclass

from ..fl import sampling


@dataclass(frozen=True)
class CostStage:
    """A stretch of rounds as `fnl plan`'s cost model sees it (fnlcore/app/cost.py).

    ``clients``: clients trained a round; ``factor``: a round's cost over a FedAvg round on
    the same clients; ``evaluated``: whether these rounds score the test set.
    """

    name: str
    rounds: int
    clients: int
    factor: float
    evaluated: bool = True


def warm_up_then(cls, warmup_rounds: int, settings, num_clients: int, name: str) -> list[CostStage]:
    """Cost stages of a method whose first ``warmup_rounds`` rounds cost a FedAvg round and the
    rest ``cls.round_cost`` (FedNoRo, DivideMix)."""
    m = sampling.clients_per_round(num_clients, settings.client_fraction)
    warm = min(warmup_rounds, settings.rounds)
    return [CostStage("warmup", warm, m, 1.0), CostStage(name, settings.rounds - warm, m, cls.round_cost or 1.0)]
