"""A stream of fresh tasks (``data.stream``): task ``i`` of a run is generated for it, never revisited.

The env's own generator (``make_tasks(n, seed, ...)``) is asked for chunks of ``chunk`` tasks; chunk ``c``
gets a seed derived from the run's seed and ``c`` by a hash, so chunks do not share the generator's seed
windows and the stream does not meet held-out tasks generated with small seeds. The position is only the
index ``i`` (the sampler's draw count), so a resumed run goes on with task ``i + 1`` exactly.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable

from sao.envs.base import Task

__all__ = ["TaskStream", "chunk_seed"]


def chunk_seed(seed: int, chunk: int, namespace: str = "stream") -> int:
    """A 31-bit generator seed for chunk ``chunk`` of the stream of run seed ``seed``."""
    digest = hashlib.sha256(f"{seed}/{namespace}/{chunk}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


class TaskStream:
    """``task(i)``: the ``i``-th fresh task, from ``generate(n, seed) -> list[Task]``.

    Ids are made unique along the stream: ``"<i>:<the generator's id>"``. Only the current chunk is kept.
    """

    def __init__(self, generate: Callable[[int, int], list[Task]], seed: int, chunk: int = 256) -> None:
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        self.generate, self.seed, self.chunk = generate, seed, chunk
        self._chunk_index: int | None = None
        self._tasks: list[Task] = []

    def task(self, index: int) -> Task:
        if index < 0:
            raise ValueError(f"stream index must be >= 0, got {index}")
        c, offset = divmod(index, self.chunk)
        if c != self._chunk_index:
            tasks = self.generate(self.chunk, chunk_seed(self.seed, c))
            if len(tasks) != self.chunk:
                raise ValueError(f"the env's task generator made {len(tasks)} tasks, {self.chunk} asked")
            self._tasks, self._chunk_index = tasks, c
        task = self._tasks[offset]
        return dataclasses.replace(task, id=f"{index}:{task.id}")
