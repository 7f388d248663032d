"""A method's rounds as stretches: which stretch runs when, on how many clients (read by `fnl plan`).

Algorithm knowledge only: what a stretch costs is the cost model's (fnlcore.app.method_costs, from
benchmarks/method_costs.json). Here and not in app/ because methods declare their schedule
(``FLMethod.schedule``) and a method must not import the application layer. Not a method."""

from __future__ import annotations

from dataclasses import dataclass

from ..fl import sampling


@dataclass(frozen=True)
class Stretch:
    """A stretch of a run's rounds: ``name`` (the key of its cost in benchmarks/method_costs.json),
    ``rounds``, ``clients`` trained a round, ``evaluated``: whether these rounds score the test set."""

    name: str
    rounds: int
    clients: int
    evaluated: bool = True


def warm_up_then(warmup_rounds: int, settings, num_clients: int, name: str) -> list[Stretch]:
    """The schedule of a method whose first ``warmup_rounds`` rounds are a warm-up stretch and the rest
    stretch ``name`` (FedNoRo, DivideMix)."""
    m = sampling.clients_per_round(num_clients, settings.client_fraction)
    warm = min(warmup_rounds, settings.rounds)
    return [Stretch("warmup", warm, m), Stretch(name, settings.rounds - warm, m)]
