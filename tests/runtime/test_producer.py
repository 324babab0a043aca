"""The producer with a real LocalEngine and the calculator env: bounds, groups, drops, accounting."""

from __future__ import annotations

import asyncio

import pytest

from sao.engine import LocalEngine
from sao.envs import make_env
from sao.envs.calculator import make_tasks
from sao.rollout import AgentLoopConfig
from sao.runtime.clock import TrainingClock
from sao.runtime.producer import Producer
from sao.runtime.sampler import PromptSampler
from sao.runtime.staleness import StalenessManager

LOOP = AgentLoopConfig(max_turns=2, max_total_tokens=256, max_tokens_per_turn=12)


@pytest.fixture(scope="module")
def engine(tiny_moe_dir):
    return LocalEngine(tiny_moe_dir, device="cpu", dtype="float32", max_running=8)


def _producer(engine, tokenizer, *, batch=4, staleness=1, group=1, tau=None, version=0):
    mgr = StalenessManager(batch_size=batch, max_staleness=staleness, drop_older_than=tau)
    queue: asyncio.Queue = asyncio.Queue()
    sampler = PromptSampler(make_tasks(16, seed=1), group_size=group, seed=0)
    producer = Producer(
        engine, tokenizer, lambda: make_env("calculator"), sampler, mgr, queue, LOOP,
        max_in_flight=8, clock=TrainingClock(version=version), seed=0,
    )  # fmt: skip
    return producer, mgr, queue


def _dropped(producer) -> int:
    return sum(v for k, v in producer.counters.items() if k.startswith("dropped/"))


async def _run_until(producer, predicate, timeout=60.0):
    runner = asyncio.create_task(producer.run())
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "producer made no progress"
        await asyncio.sleep(0.05)
    producer.stop()
    await runner


def test_capacity_bounds_what_is_started_and_everything_is_accounted_for(engine, tiny_tokenizer):
    producer, mgr, queue = _producer(engine, tiny_tokenizer, batch=4, staleness=1)

    async def scenario():
        await _run_until(producer, lambda: queue.qsize() + _dropped(producer) >= 8)
        s = mgr.stats()
        assert s.started == 8  # (max_staleness + 1) * batch, nothing more without training
        items = [queue.get_nowait() for _ in range(queue.qsize())]
        assert all(len(item) == 1 for item in items)
        for [traj] in items:
            traj.validate()
            assert traj.metadata["env"] == "calculator"
        assert producer.counters["produced"] == len(items)
        assert (
            producer.counters["produced"] + _dropped(producer) == s.started
        )  # every episode finished and counted
        assert (s.trained, s.pending) == (0, s.started - s.dropped)

    asyncio.run(scenario())


def test_training_frees_capacity_for_new_episodes(engine, tiny_tokenizer):
    producer, mgr, queue = _producer(engine, tiny_tokenizer, batch=2, staleness=0)

    async def scenario():
        runner = asyncio.create_task(producer.run())
        while queue.qsize() < 2:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        assert mgr.stats().started == 2
        for _ in range(2):
            queue.get_nowait()
        mgr.on_trained(2)
        producer.notify_trained()
        while queue.qsize() < 2:
            await asyncio.sleep(0.05)
        producer.stop()
        await runner
        assert mgr.stats().started == 4

    asyncio.run(scenario())


def test_groups_arrive_whole_with_a_shared_group_id(engine, tiny_tokenizer):
    producer, _, queue = _producer(engine, tiny_tokenizer, batch=4, staleness=0, group=2)

    async def scenario():
        await _run_until(producer, lambda: queue.qsize() >= 2)
        for _ in range(2):
            group = queue.get_nowait()
            assert len(group) == 2
            assert group[0].group_id == group[1].group_id is not None
            assert group[0].prompt_id == group[1].prompt_id

    asyncio.run(scenario())


def test_too_stale_trajectories_are_dropped_and_counted(engine, tiny_tokenizer):
    producer, mgr, queue = _producer(engine, tiny_tokenizer, batch=2, staleness=1, tau=1, version=5)

    async def scenario():
        await _run_until(producer, lambda: producer.counters["dropped/too_stale"] >= 4)
        assert queue.qsize() == 0
        assert mgr.stats().drops_by_reason.get("too_stale", 0) >= 4

    asyncio.run(scenario())


def test_training_progress_reaches_each_fresh_env_and_a_failing_hook_costs_only_its_episode(
    engine, tiny_tokenizer
):
    from sao.envs.base import TrainingProgress

    seen: list[TrainingProgress] = []

    def make():
        env = make_env("calculator")
        if len(seen) % 2:  # every other env's hook raises

            def broken(progress):
                seen.append(progress)
                raise RuntimeError("hook bug")

            env.set_training_progress = broken
        else:
            env.set_training_progress = seen.append
        return env

    producer, mgr, queue = _producer(engine, tiny_tokenizer, batch=4, staleness=1)
    producer.make_env = make
    producer.progress = lambda: TrainingProgress(step=3, trained_trajectories=12)

    async def scenario():
        await _run_until(producer, lambda: queue.qsize() >= 2 and producer.counters["dropped/env_error"] >= 2)

    asyncio.run(scenario())
    assert seen and all(p == TrainingProgress(3, 12) for p in seen)
    s = mgr.stats()
    assert s.started == s.trained + s.dropped + s.pending  # the failed episodes are counted, not lost


class _Faulty:
    """The calculator env, broken in one way chosen per episode (by a shared counter): it raises in reset or
    step, hangs in step, or answers a malformed result; every fifth episode is left intact."""

    kinds = ("reset", "step", "hang", "nan", None)

    def __init__(self, counter: list[int]) -> None:
        self.env = make_env("calculator")
        self.kind = self.kinds[counter[0] % len(self.kinds)]
        counter[0] += 1
        self.max_turns, self.closed = self.env.max_turns, False

    async def reset(self, task):
        if self.kind == "reset":
            raise OSError("task store unreachable")
        return await self.env.reset(task)

    async def step(self, text):
        if self.kind == "step":
            raise ZeroDivisionError("grader bug")
        if self.kind == "hang":
            await asyncio.sleep(3600)
        result = await self.env.step(text)
        if self.kind == "nan":
            result.reward = float("nan")
        return result

    async def close(self):
        self.closed = True
        await self.env.close()


def test_env_faults_drop_their_episodes_by_reason_log_once_per_kind_and_the_producer_goes_on(
    engine, tiny_tokenizer, caplog
):
    import dataclasses

    counter, envs = [0], []

    def make():
        envs.append(_Faulty(counter))
        return envs[-1]

    producer, mgr, queue = _producer(engine, tiny_tokenizer, batch=8, staleness=1)
    producer.make_env = make
    producer.loop_cfg = dataclasses.replace(LOOP, env_timeout_s=0.5)

    async def scenario():
        c = producer.counters
        await _run_until(producer, lambda: queue.qsize() >= 3 and c["dropped/env_timeout"] >= 2)

    with caplog.at_level("WARNING", logger="sao.runtime.producer"):
        asyncio.run(scenario())
    c = producer.counters
    assert c["dropped/env_error"] >= 6 and c["dropped/env_timeout"] >= 2, c  # reset + step + nan; hang
    s = mgr.stats()
    assert s.started == s.trained + s.dropped + s.pending and c["produced"] == queue.qsize() >= 3
    finished = [e for e in envs if e.kind != "hang" or e.closed]
    assert all(e.closed for e in finished) and sum(e.closed for e in envs) >= 8  # each env was closed
    logged = [r.getMessage() for r in caplog.records if "episode dropped" in r.getMessage()]
    assert sorted(m.split(")")[0] for m in logged) == [
        "episode dropped (env_error",
        "episode dropped (env_timeout",
    ]
    assert any("grader bug" in m or "task store unreachable" in m or "reward nan" in m for m in logged)


def test_an_error_that_is_not_an_episode_failure_stops_the_producer_and_is_reported(engine, tiny_tokenizer):
    """A tokenizer without the end-of-turn token the loop needs is a configuration error, not an episode's
    fault: the first episode that meets it stops the producer, and the run is told (``on_fatal``)."""
    import copy

    no_eot = copy.deepcopy(tiny_tokenizer)
    no_eot.convert_tokens_to_ids = lambda text: None  # neither <|im_end|> nor an eos token resolves
    producer, mgr, _ = _producer(engine, no_eot, batch=4)
    fatal: list[BaseException] = []
    producer.on_fatal = fatal.append
    asyncio.run(asyncio.wait_for(producer.run(), 60))  # it ends by itself
    assert fatal and isinstance(fatal[0], ValueError) and "no end-of-turn token" in str(fatal[0])
    s = mgr.stats()
    assert producer.counters["dropped/fatal"] >= 1 and s.started == s.trained + s.dropped + s.pending
