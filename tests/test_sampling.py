"""Client sampling (fnlcore/fl/sampling.py): the cyclic warm-up sampler's invariants."""

from __future__ import annotations

import numpy as np
import pytest

from fnlcore.fl import sampling


def _rounds(cyc: sampling.CyclicSampler, rng: np.random.RandomState, n: int) -> list[list[int]]:
    return [cyc.next(rng) for _ in range(n)]


@pytest.mark.parametrize("num_clients", [1, 2, 3, 4, 5, 7, 10, 12, 17, 25])
def test_cyclic_sampler_no_client_twice_in_a_round_and_once_per_cycle(num_clients):
    for m in range(1, num_clients + 1):
        for seed in range(3):
            cyc = sampling.CyclicSampler(num_clients, 1.0)
            cyc.m = m
            rng = np.random.RandomState(seed)
            counts = np.zeros(num_clients, dtype=int)
            for picks in _rounds(cyc, rng, 3 * num_clients):
                assert len(picks) == m and len(set(picks)) == m, (num_clients, m, picks)
                assert all(0 <= k < num_clients for k in picks)
                counts[picks] += 1
                # every permutation visits each client once: counts never drift apart by more than one
                assert counts.max() - counts.min() <= 1, (num_clients, m, counts)
            # the queue is what is left of the current permutation: distinct, and exactly the less-seen clients
            assert len(set(cyc.queue)) == len(cyc.queue)
            assert sorted(cyc.queue) == sorted(np.flatnonzero(counts < counts.max()).tolist()) or not cyc.queue


def test_cyclic_sampler_unchanged_when_m_divides_k():
    cyc, rng, ref = sampling.CyclicSampler(10, 0.2), np.random.RandomState(5), np.random.RandomState(5)
    got = _rounds(cyc, rng, 15)
    perms = [[int(k) for k in ref.permutation(10)] for _ in range(3)]
    assert got == [p[i:i + 2] for p in perms for i in range(0, 10, 2)]


def test_cyclic_sampler_fills_a_round_from_the_next_permutation_by_hand():
    ref = np.random.RandomState(0)
    p1, p2, p3 = ([int(k) for k in ref.permutation(4)] for _ in range(3))
    cyc, rng = sampling.CyclicSampler(4, 0.75), np.random.RandomState(0)
    assert cyc.m == 3
    r1, r2, r3, r4 = _rounds(cyc, rng, 4)
    assert r1 == p1[:3]
    # the last client of p1, then the first two of p2 that are not it; it keeps its place in p2's cycle
    tail = p1[3]
    rest2 = [k for k in p2 if k != tail]
    assert r2 == [tail] + rest2[:2]
    left = [k for k in p2 if k not in r2[1:]]  # p2 without the two taken: 2 clients, `tail` among them
    assert r3 == left + [k for k in p3 if k not in left][:1]
    assert len(set(r4)) == 3


def test_cyclic_sampler_state_round_trip():
    a, rng_a = sampling.CyclicSampler(7, 0.43), np.random.RandomState(2)
    _rounds(a, rng_a, 3)
    b = sampling.CyclicSampler(7, 0.43)
    b.load_state_dict(a.state_dict())
    rng_b = np.random.RandomState()
    rng_b.set_state(rng_a.get_state())
    assert _rounds(a, rng_a, 10) == _rounds(b, rng_b, 10)
