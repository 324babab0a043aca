"""`EnginePool` routing and faults on in-process engines (Ray replicas: tests/distributed)."""

from __future__ import annotations

import asyncio

import pytest

from sao.engine.types import EngineCrashedError, Generation, SamplingParams
from sao.runtime.engine_guard import SupervisedEngine
from sao.runtime.engine_pool import EnginePool


class Echo:
    """An engine that answers after ``delay`` seconds and records which prompts it served."""

    def __init__(self, name: str, delay: float = 0.01) -> None:
        self.name, self.delay = name, delay
        self.served: list[tuple[int, ...]] = []
        self.alive = True
        self.version = 0
        self.weights: list[tuple[object, int]] = []

    async def generate(self, prompt, params):
        if not self.alive:
            raise RuntimeError("dead")
        await asyncio.sleep(self.delay)
        if not self.alive:
            raise RuntimeError("died mid-request")
        self.served.append(tuple(prompt))
        return Generation(token_ids=[1], logprobs=[0.0], versions=[self.version], finish_reason="stop")

    async def update_weights(self, weights, version):
        self.weights.append((weights, version))
        self.version = version

    def stats(self):
        return {"tokens_generated": float(len(self.served)), "idle_fraction": 0.5}

    async def close(self):
        self.alive = False


def _pool(engines: list[Echo], restarts: list[Echo] | None = None, max_restarts: int = 2) -> EnginePool:
    def supervised(engine: Echo) -> SupervisedEngine:
        async def start():
            fresh = Echo(engine.name + "'")
            if restarts is not None:
                restarts.append(fresh)
            return fresh

        async def weights():
            return {"w": 1}, 5

        return SupervisedEngine(engine, start, weights, max_restarts=max_restarts)

    return EnginePool([supervised(e) for e in engines])


def test_every_turn_of_an_episode_goes_to_one_replica_and_new_episodes_spread():
    engines = [Echo("a"), Echo("b")]
    pool = _pool(engines)
    params = SamplingParams(max_new_tokens=1)

    async def episode(i: int) -> set[int]:
        seen = set()
        for turn in range(3):
            gen = await pool.generate([i, turn], params)
            seen.add(gen.metadata["replica"])
        return seen

    async def main():
        return await asyncio.gather(*(episode(i) for i in range(6)))

    routes = asyncio.run(main())
    assert all(len(r) == 1 for r in routes)  # affinity: one replica per episode
    for engine in engines:  # each replica served whole episodes, and the load was split
        episodes = {p[0] for p in engine.served}
        assert len(episodes) == 3
        assert sorted(p[1] for p in engine.served) == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_a_new_episode_goes_to_the_least_loaded_replica():
    engines = [Echo("a", delay=0.3), Echo("b", delay=0.3)]
    pool = _pool(engines)
    params = SamplingParams(max_new_tokens=1)

    async def main():
        first = asyncio.create_task(pool.generate([0], params))  # a: 1 in flight
        await asyncio.sleep(0.05)
        second = asyncio.create_task(pool.generate([1], params))  # b: least loaded
        await asyncio.sleep(0.05)
        await first  # a drains
        third = await pool.generate([2], params)  # a has none in flight, b one: a
        routes = (await first, await second, third)
        return tuple(g.metadata["replica"] for g in routes)

    assert asyncio.run(main()) == (0, 1, 0)


def test_a_dead_replica_fails_its_requests_is_restarted_and_the_others_keep_serving():
    engines = [Echo("a", delay=0.2), Echo("b", delay=0.05)]
    restarts: list[Echo] = []
    pool = _pool(engines, restarts)
    params = SamplingParams(max_new_tokens=1)

    async def main():
        on_a = asyncio.create_task(pool.generate([0], params))
        await asyncio.sleep(0.02)
        on_b = asyncio.create_task(pool.generate([1], params))
        await asyncio.sleep(0.02)
        engines[0].alive = False  # replica 0 dies with a request in flight
        with pytest.raises(EngineCrashedError):
            await on_a
        assert (await on_b).metadata["replica"] == 1
        await asyncio.sleep(0.05)  # the restart runs
        fresh = await pool.generate([2], params)
        return fresh

    fresh = asyncio.run(main())
    assert len(restarts) == 1 and restarts[0].weights == [({"w": 1}, 5)]  # restarted with the latest weights
    assert pool.restarts == 1 and pool.stats()["replica0/restarts"] == 1.0
    assert fresh.metadata["replica"] == 0 and fresh.versions == [5]  # the fresh replica, on the new weights


def test_weights_reach_every_replica_and_the_version_is_the_oldest_live_one():
    engines = [Echo("a"), Echo("b")]
    pool = _pool(engines)

    async def main():
        await pool.update_weights({"w": 2}, 3)

    asyncio.run(main())
    assert [e.weights for e in engines] == [[({"w": 2}, 3)]] * 2
    assert pool.version == 3
    engines[1].version = 2
    assert pool.version == 2
    stats = pool.stats()
    assert stats["replicas"] == 2.0 and stats["idle_fraction"] == 0.5 and stats["tokens_generated"] == 0.0
