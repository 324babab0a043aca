"""The staleness manager: capacity rule, drop rule, accounting, thread safety, resume."""

from __future__ import annotations

import threading

import pytest

from sao.runtime.staleness import StalenessManager


def test_capacity_is_max_staleness_plus_one_batches():
    mgr = StalenessManager(batch_size=4, max_staleness=1)
    assert sum(mgr.try_start() for _ in range(20)) == 8
    mgr.on_trained(4)
    assert sum(mgr.try_start() for _ in range(20)) == 4


def test_zero_staleness_allows_exactly_one_batch_ahead():
    mgr = StalenessManager(batch_size=3, max_staleness=0)
    assert [mgr.try_start() for _ in range(4)] == [True, True, True, False]


def test_groups_start_together_or_not_at_all():
    mgr = StalenessManager(batch_size=8, max_staleness=0)
    assert mgr.try_start(8)
    assert not mgr.try_start(8)
    assert not mgr.try_start(1)


def test_drop_rule_is_strictly_more_than_tau_versions():
    mgr = StalenessManager(batch_size=2, max_staleness=3, drop_older_than=2)
    assert not mgr.should_drop(oldest_version=3, current_version=5)
    assert mgr.should_drop(oldest_version=2, current_version=5)
    assert not StalenessManager(2, 3).should_drop(0, 100)


def test_every_started_trajectory_is_trained_dropped_or_pending():
    mgr = StalenessManager(batch_size=2, max_staleness=2)
    for _ in range(6):
        assert mgr.try_start()
    mgr.on_trained(2)
    mgr.on_dropped("too_stale")
    mgr.on_dropped("env_error", 2)
    s = mgr.stats()
    assert (s.started, s.trained, s.dropped, s.pending) == (6, 2, 3, 1)
    assert s.drops_by_reason == {"too_stale": 1, "env_error": 2}
    assert mgr.try_start(5) and not mgr.try_start()


def test_concurrent_admission_never_exceeds_capacity():
    mgr = StalenessManager(batch_size=16, max_staleness=1)
    admitted = []

    def worker():
        admitted.append(sum(mgr.try_start() for _ in range(100)))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(admitted) == mgr.capacity == 32


def test_resume_counts_lost_in_flight_episodes_as_dropped():
    mgr = StalenessManager(batch_size=2, max_staleness=1)
    for _ in range(4):
        mgr.try_start()
    mgr.on_trained(2)
    resumed = StalenessManager(batch_size=2, max_staleness=1)
    resumed.load_state_dict(mgr.state_dict())
    s = resumed.stats()
    assert (s.started, s.trained, s.pending) == (4, 2, 0)
    assert s.drops_by_reason == {"lost_on_resume": 2}


@pytest.mark.parametrize(("batch", "staleness", "tau"), [(0, 0, None), (1, -1, None), (1, 0, -1)])
def test_invalid_settings_raise(batch, staleness, tau):
    with pytest.raises(ValueError):
        StalenessManager(batch, staleness, tau)
