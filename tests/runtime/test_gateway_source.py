"""`GatewaySource`: admission under the staleness capacity (wait / reject / timeout, first come first served),
groups, losses and the books, without HTTP or a model."""

from __future__ import annotations

import asyncio

import pytest

from sao.runtime.clock import TrainingClock
from sao.runtime.gateway_source import GatewaySource
from sao.runtime.staleness import StalenessManager
from sao.serve.limits import LimitExceededError
from sao.types import Trajectory


def _traj(sid: str, version: int = 0, group: str | None = None, **meta) -> Trajectory:
    return Trajectory(
        prompt_id=sid, token_ids=[1, 2, 3], action_mask=[0, 1, 1], rollout_logprobs=[0.0, -0.5, -0.5],
        versions=[-1, version, version], turn_ids=[-1, 0, 0], rewards=[1.0],
        metadata={"session_id": sid, **meta}, group_id=group,
    )  # fmt: skip


def _source(batch=2, staleness=0, drop=None, **kw):
    books = StalenessManager(batch, staleness, drop)
    queue: asyncio.Queue = asyncio.Queue(maxsize=books.capacity)
    clock = TrainingClock()
    return GatewaySource(books, queue, clock, **kw), books, queue, clock


def _balanced(books: StalenessManager) -> None:
    s = books.stats()
    assert s.started == s.trained + s.dropped + s.pending


def test_over_capacity_a_new_session_waits_until_a_trained_batch_frees_room():
    async def main():
        src, books, queue, _ = _source(batch=2, staleness=0)  # capacity 2
        await src.admit("a", None)
        await src.admit("b", None)
        third = asyncio.create_task(src.admit("c", None))
        await asyncio.sleep(0.05)
        assert not third.done() and src.metrics()["gateway/waiting"] == 1.0
        await src.closed("a", None, [_traj("a")])
        await src.closed("b", None, [_traj("b")])
        assert queue.qsize() == 2
        await asyncio.sleep(0.05)
        assert not third.done()  # closing frees nothing: the trajectories are pending until trained
        books.on_trained(2)
        src.notify_trained()
        await asyncio.wait_for(third, 1)
        assert src.session_books() == {"admitted": 3, "rewarded": 2, "truncated": 0, "abandoned": 0,
                                       "discarded": 0, "lost_on_resume": 0, "open": 1}  # fmt: skip
        _balanced(books)

    asyncio.run(main())


def test_waiting_sessions_are_admitted_first_come_first_served():
    async def main():
        src, books, queue, _ = _source(batch=1, staleness=0)
        await src.admit("first", None)
        order = []

        async def admit(sid):
            await src.admit(sid, None)
            order.append(sid)

        tasks = [asyncio.create_task(admit(f"w{i}")) for i in range(3)]
        await asyncio.sleep(0.02)
        for _ in range(3):
            await src.closed(order[-1] if order else "first", None, [_traj("x")])
            queue.get_nowait()
            books.on_trained(1)
            src.notify_trained()
            await asyncio.sleep(0.02)
        await asyncio.gather(*tasks)
        assert order == ["w0", "w1", "w2"]

    asyncio.run(main())


def test_admission_timeout_and_reject_mode_answer_429_with_retry_after():
    async def main():
        src, books, _, _ = _source(batch=1, staleness=0, admission_timeout_s=0.05, retry_after_s=3)
        await src.admit("a", None)
        with pytest.raises(LimitExceededError) as err:
            await src.admit("b", None)
        assert err.value.status == 429 and err.value.headers == {"Retry-After": "3"}
        assert "after waiting 0.05 s" in err.value.reason and "capacity" in err.value.reason
        rej, books2, _, _ = _source(batch=1, staleness=0, admission="reject")
        await rej.admit("a", None)
        with pytest.raises(LimitExceededError) as err:
            await rej.admit("b", None)
        assert err.value.status == 429 and rej.counters["sessions/rejected"] == 1
        assert books.stats().started == books2.stats().started == 1  # a refusal reserves nothing

    asyncio.run(main())


def test_a_cancelled_wait_and_a_discarded_session_give_their_start_back():
    async def main():
        src, books, _, _ = _source(batch=1, staleness=0)
        await src.admit("a", None)
        waiting = asyncio.create_task(src.admit("b", None))
        await asyncio.sleep(0.02)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        src.discarded("a", None)  # its first request failed: nothing recorded
        assert books.stats().started == 0 and src.session_books()["discarded"] == 1
        await asyncio.wait_for(src.admit("c", None), 1)  # the room is there again
        _balanced(books)

    asyncio.run(main())


def test_abandoned_sessions_are_dropped_never_queued_and_too_stale_ones_are_dropped():
    async def main():
        src, books, queue, clock = _source(batch=4, staleness=0, drop=1)
        for sid in "abc":
            await src.admit(sid, None)
        src.abandoned("a", None)
        clock.version = 5
        await src.closed("b", None, [_traj("b", version=1)])  # 4 versions old > drop_older_than=1
        await src.closed("c", None, [_traj("c", version=5)])
        assert queue.qsize() == 1 and queue.get_nowait()[0].prompt_id == "c"
        assert books.stats().drops_by_reason == {"abandoned": 1, "too_stale": 1}
        _balanced(books)

    asyncio.run(main())


def test_branches_of_one_session_are_one_queue_item_and_counted_as_started():
    async def main():
        src, books, queue, _ = _source(batch=2, staleness=0)
        await src.admit("a", None)
        await src.closed("a", None, [_traj("a"), _traj("a", prefix_mismatch=True)])
        assert len(queue.get_nowait()) == 2
        assert books.stats().started == 2 and src.counters["branches"] == 1
        books.on_trained(2)
        _balanced(books)

    asyncio.run(main())


def test_groups_reserve_their_room_queue_whole_and_are_dropped_whole():
    async def main():
        src, books, queue, _ = _source(batch=4, staleness=0, group_size=2)  # capacity 4 = two groups
        with pytest.raises(LimitExceededError, match="group_id") as err:
            await src.admit("x", None)
        assert err.value.status == 400
        await src.admit("g1-a", "g1")
        assert books.stats().started == 2  # the whole group is reserved by its first member
        await src.admit("g1-b", "g1")
        with pytest.raises(LimitExceededError, match="already has 2 sessions"):
            await src.admit("g1-c", "g1")
        await src.closed("g1-a", "g1", [_traj("g1-a", group="g1")])
        assert queue.qsize() == 0  # a group is queued only when complete
        await src.closed("g1-b", "g1", [_traj("g1-b", group="g1")])
        assert [t.prompt_id for t in queue.get_nowait()] == ["g1-a", "g1-b"]
        await src.admit("g2-a", "g2")
        await src.admit("g2-b", "g2")
        src.abandoned("g2-a", "g2")
        await src.closed("g2-b", "g2", [_traj("g2-b", group="g2")])
        assert queue.qsize() == 0
        assert books.stats().drops_by_reason == {"abandoned": 1, "incomplete_group": 1}
        _balanced(books)

    asyncio.run(main())


def test_a_group_that_never_fills_is_dropped_after_the_idle_timeout():
    async def main():
        src, books, queue, _ = _source(batch=4, staleness=0, group_size=4, idle_timeout_s=0.05)
        running = asyncio.create_task(src.run())
        await src.admit("a", "g")
        await src.closed("a", "g", [_traj("a", group="g")])
        await asyncio.sleep(0.3)
        src.stop()
        await running
        assert books.stats().drops_by_reason == {"group_never_filled": 3, "incomplete_group": 1}
        assert queue.qsize() == 0
        _balanced(books)

    asyncio.run(main())


def test_value_pretraining_takes_the_first_sessions_then_admission_moves_to_the_books():
    async def main():
        src, books, queue, _ = _source(batch=2, staleness=0, pretrain_sessions=2)
        await src.admit("p1", None)
        await src.admit("p2", None)
        late = asyncio.create_task(src.admit("t1", None))
        await asyncio.sleep(0.02)
        assert not late.done()  # the corpus has its two sessions in flight
        src.abandoned("p1", None)  # a lost pretraining session makes room for another
        await asyncio.wait_for(late, 1)
        await src.closed("p2", None, [_traj("p2")])
        await src.closed("t1", None, [_traj("t1")])
        corpus = await asyncio.wait_for(src.pretrain_corpus(), 1)
        assert [t.prompt_id for t in corpus] == ["p2", "t1"] and books.stats().started == 0
        await src.admit("t2", None)  # now the books admit
        assert books.stats().started == 1 and queue.qsize() == 0

    asyncio.run(main())


def test_stop_answers_waiting_and_new_sessions_with_503():
    async def main():
        src, _, _, _ = _source(batch=1, staleness=0)
        await src.admit("a", None)
        waiting = asyncio.create_task(src.admit("b", None))
        await asyncio.sleep(0.02)
        src.stop()
        for pending in (waiting, src.admit("c", None)):
            with pytest.raises(LimitExceededError) as err:
                await pending
            assert err.value.status == 503

    asyncio.run(main())


def test_resumed_books_count_sessions_open_at_the_checkpoint_as_lost():
    src, _, _, _ = _source()
    src.load_state_dict({"sessions/admitted": 10, "sessions/rewarded": 6, "sessions/abandoned": 1})
    books = src.session_books()
    assert books["lost_on_resume"] == 3 and books["open"] == 0
    assert books["admitted"] == sum(v for k, v in books.items() if k != "admitted")
