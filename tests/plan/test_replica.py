"""One engine replica: processor sharing in virtual time, exact step sums, FIFO admission, versions."""

from __future__ import annotations

import pytest

from sao.plan import EngineCosts
from sao.plan.replica import Replica, Sequence


def run_to_end(replica: Replica) -> list[tuple[float, Sequence]]:
    """Pop finish events until the replica is idle: ``(time, sequence)`` in finish order."""
    out = []
    while (t := replica.next_event()) is not None:
        out.extend((t, s) for s in replica.pop_finished(t))
    return out


def test_one_sequence_takes_the_sum_of_its_steps_plus_its_prefill() -> None:
    costs = EngineCosts(t0_s=0.01, t1_s=0.002, c_s=0.0, p_s=1e-4)
    replica = Replica(costs, max_running=4)
    replica.submit(Sequence(prefill=50, context=50, gen=100), 0.0)
    [(t, _)] = run_to_end(replica)
    assert t == pytest.approx(50 * 1e-4 + 100 * (0.01 + 0.002), rel=1e-12)
    assert replica.busy_s == pytest.approx(t)
    assert replica.decode_steps == pytest.approx(100) and replica.tokens_generated == pytest.approx(100)


def test_context_cost_integrates_the_growing_context() -> None:
    # Continuum of steps: ∫_0^G c·(P + v) dv = c·(P·G + G²/2); the discrete sum is c·(P·G + G(G−1)/2).
    costs = EngineCosts(t0_s=0.0, t1_s=0.0, c_s=1e-5)
    replica = Replica(costs, max_running=1)
    replica.submit(Sequence(prefill=0, context=1000, gen=200), 0.0)
    [(t, _)] = run_to_end(replica)
    assert t == pytest.approx(1e-5 * (1000 * 200 + 200**2 / 2), rel=1e-12)
    assert replica.context_tokens == pytest.approx(1000 * 200 + 200**2 / 2, rel=1e-9)


def test_two_equal_sequences_share_every_step() -> None:
    costs = EngineCosts(t0_s=0.01, t1_s=0.004)
    replica = Replica(costs, max_running=2)
    for _ in range(2):
        replica.submit(Sequence(0, 0, 100), 0.0)
    finished = run_to_end(replica)
    assert [t for t, _ in finished] == pytest.approx([100 * (0.01 + 2 * 0.004)] * 2)
    assert replica.tokens_generated == pytest.approx(200) and replica.decode_steps == pytest.approx(100)


def test_a_shorter_sequence_leaves_and_the_longer_speeds_up() -> None:
    replica = Replica(EngineCosts(t0_s=0.01, t1_s=0.01), max_running=2)
    replica.submit(Sequence(0, 0, 50), 0.0)
    replica.submit(Sequence(0, 0, 100), 0.0)
    times = [t for t, _ in run_to_end(replica)]
    assert times == pytest.approx([50 * 0.03, 50 * 0.03 + 50 * 0.02])


def test_requests_beyond_max_running_wait_in_order() -> None:
    replica = Replica(EngineCosts(t0_s=0.01), max_running=1)
    first, second = Sequence(0, 0, 10, owner="a"), Sequence(0, 0, 10, owner="b")
    replica.submit(first, 0.0)
    replica.submit(second, 0.0)
    assert replica.queued == 2 and len(replica.waiting) == 1
    finished = run_to_end(replica)
    assert [(round(t, 9), s.owner) for t, s in finished] == [(0.1, "a"), (0.2, "b")]


def test_a_push_freezes_decoding_and_splits_the_tokens_by_version() -> None:
    replica = Replica(EngineCosts(t0_s=0.01), max_running=1)
    seq = Sequence(0, 0, 100)
    replica.submit(seq, 0.0)
    replica.freeze(0.4)  # 40 tokens done with version 0
    replica.unfreeze(1.4, version=1)  # one second of push
    [(t, done)] = run_to_end(replica)
    assert t == pytest.approx(2.0)
    split = replica.tokens_by_version(done)
    assert [v for v, _ in split] == [0, 1]
    assert [n for _, n in split] == pytest.approx([40.0, 60.0])
    assert replica.busy_s == pytest.approx(1.0)  # the push is not engine work


def test_a_prefill_stalls_the_sequences_already_running() -> None:
    replica = Replica(EngineCosts(t0_s=0.01, p_s=0.001), max_running=2)
    a = Sequence(0, 0, 100, owner="a")
    replica.submit(a, 0.0)
    replica.advance(0.5)  # 50 tokens of a
    replica.submit(Sequence(200, 200, 10, owner="b"), 0.5)  # 0.2 s of prefill: a waits
    finished = run_to_end(replica)
    # b: 0.5 + 0.2 + 10 steps; a: 40 more after b (each step 0.01 s whether 1 or 2 run: t1 = 0).
    assert [(s.owner, round(t, 9)) for t, s in finished] == [("b", 0.8), ("a", 1.2)]
