"""`EnginePool`: N engine replicas behind one `InferenceEngine`.

Routing. Every request of one episode goes to the same replica (its KV and prefix stay warm there): the
pool remembers the replica in a context variable of the calling asyncio task, so an episode (one task of
the producer or the evaluator, all its turns awaited in it) keeps its replica without any episode id in
the engine protocol. A task's first request goes to the least-loaded live replica: fewest requests in
flight, then fewest episodes routed to it so far.

Faults. Each replica is a `SupervisedEngine`: a replica that dies fails its in-flight requests with
`EngineCrashedError` (those episodes are dropped as ``engine_crash``), is restarted with the latest weights,
and is given up after ``engine.max_restarts`` restarts with no trained step in between (the run then stops
with a checkpoint). An episode whose replica was restarted continues on the fresh one only if it asks
again; the agent loop drops it first.

Versions. Each replica reports the version of every token it generates; the pool's ``version`` is the
oldest version any live replica decodes with. ``update_weights`` updates every replica concurrently, and
`start_replicas` starts them concurrently.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from sao.engine.types import Generation, SamplingParams, WeightsLike

from .engine_guard import SupervisedEngine
from .engines import EngineStartError

__all__ = ["EnginePool", "start_replicas"]

T = TypeVar("T")

_pool_ids = itertools.count()


class EnginePool:
    """The `InferenceEngine` over ``replicas`` (module docstring)."""

    def __init__(self, replicas: Sequence[SupervisedEngine]) -> None:
        if not replicas:
            raise ValueError("an EnginePool needs at least one replica")
        self.replicas = list(replicas)
        self._route: contextvars.ContextVar[int] = contextvars.ContextVar(f"sao_replica_{next(_pool_ids)}")
        self.in_flight = [0] * len(self.replicas)
        self.episodes = [0] * len(self.replicas)

    @property
    def version(self) -> int:
        live = [r.version for r in self.replicas if r.alive]
        return min(live) if live else min(r.version for r in self.replicas)

    @property
    def context_limit(self) -> int | None:
        limits = [r.context_limit for r in self.replicas if r.context_limit is not None]
        return min(limits) if limits else None

    def replica_for_task(self) -> int:
        """The replica of the calling task: its own one, else the least-loaded live one (remembered)."""
        index = self._route.get(None)
        if index is not None:
            return index
        live = [i for i, r in enumerate(self.replicas) if r.alive] or list(range(len(self.replicas)))
        index = min(live, key=lambda i: (self.in_flight[i], self.episodes[i], i))
        self._route.set(index)
        self.episodes[index] += 1
        return index

    async def generate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> Generation:
        index = self.replica_for_task()
        self.in_flight[index] += 1
        try:
            gen = await self.replicas[index].generate(prompt_token_ids, params)
        finally:
            self.in_flight[index] -= 1
        gen.metadata.setdefault("replica", index)
        return gen

    async def update_weights(self, weights: WeightsLike, version: int) -> None:
        """Every replica loads ``weights`` (a state dict, an object reference, or a directory)."""
        await asyncio.gather(*(r.update_weights(weights, version) for r in self.replicas))

    def note_progress(self) -> None:
        for replica in self.replicas:
            replica.note_progress()

    @property
    def restarts(self) -> int:
        return sum(r.restarts for r in self.replicas)

    def stats(self) -> dict[str, float]:
        """Sums of the replicas' counters; ``idle_fraction`` their mean; per replica ``replica{i}/…``
        for requests in flight and restarts."""
        per = [r.stats() for r in self.replicas]
        out: dict[str, float] = {}
        for s in per:
            for name, value in s.items():
                if isinstance(value, (int, float)):
                    out[name] = out.get(name, 0.0) + float(value)
        idle = [s["idle_fraction"] for s in per if "idle_fraction" in s]
        if idle:
            out["idle_fraction"] = sum(idle) / len(idle)
        out["version"] = float(self.version)
        out["replicas"] = float(len(self.replicas))
        out["replicas_alive"] = float(sum(r.alive for r in self.replicas))
        for i, replica in enumerate(self.replicas):
            out[f"replica{i}/in_flight"] = float(self.in_flight[i])
            out[f"replica{i}/restarts"] = float(replica.restarts)
        return out

    async def close(self) -> None:
        await asyncio.gather(*(r.close() for r in self.replicas), return_exceptions=True)


async def start_replicas(starts: Sequence[Callable[[], Awaitable[T]]]) -> list[T]:
    """Run every replica's start function at once; their engines, in order. When any fails, the ones that
    started are closed and `EngineStartError` names every replica that failed with its error (a
    cancellation or interrupt is re-raised as it is)."""
    results = await asyncio.gather(*(start() for start in starts), return_exceptions=True)
    failed = [(i, r) for i, r in enumerate(results) if isinstance(r, BaseException)]
    if not failed:
        return list(results)  # type: ignore[arg-type]
    started = [r for r in results if not isinstance(r, BaseException)]
    await asyncio.gather(*(e.close() for e in started), return_exceptions=True)  # type: ignore[attr-defined]
    for _, err in failed:
        if not isinstance(err, Exception):
            raise err
    detail = "; ".join(f"replica {i}: {type(err).__name__}: {err}" for i, err in failed)
    raise EngineStartError(
        f"{len(failed)} of {len(starts)} engine replicas did not start: {detail}"
    ) from failed[0][1]
