"""CPU threads of the local runtime: how many intra-op torch threads the engine and the trainer each get.

In the local runtime the engine (a loop thread of this process, or a child process with
``engine.backend=process``) and the trainer (one dedicated thread of this process, `trainer_executor`) run
at the same time in async mode. Torch's default gives each of them every core, so on a small CPU they
oversubscribe it, and tiny models lose more to parallel overhead than they gain (docs/performance.md,
"Threads"). The default plan gives each side half of the cores the process may run on (at least one):

- ``engine.threads`` / ``trainer.threads`` null: ``max(1, cores // 2)`` each, where ``cores`` is the CPU
  affinity of this process (``os.sched_getaffinity``, which containers and ``taskset`` restrict);
- unless ``OMP_NUM_THREADS`` is set: then torch's own setting (that value) is kept for the side left null,
  as before this plan existed;
- a number: that side's thread count, whatever the cores;
- ``engine.backend=vllm/sglang``: the engine is a server with its own threads; the trainer still gets half.

One process, one BLAS pool: torch sets OpenMP's count per thread, but MKL's matrix products use the count
set last in the process. The plan's defaults are equal, so this does not matter; unequal explicit counts
with the in-process engine give the matrix products the count of whichever side started last (use
``engine.backend=process`` for truly separate counts). The counts each side really runs with are logged as
``trainer/threads`` and ``runtime/engine_threads`` (read inside the trainer's and the engine's threads).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

__all__ = ["ThreadPlan", "available_cores", "plan_threads", "trainer_executor"]


def available_cores() -> int:
    """CPUs this process may run on (its affinity mask; ``os.cpu_count()`` where there is none)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class ThreadPlan:
    """Intra-op torch threads of each side; None keeps torch's setting (``OMP_NUM_THREADS``, else all
    cores). ``engine`` is None too when the engine is a vLLM/SGLang server (it has its own)."""

    engine: int | None
    trainer: int | None
    cores: int

    def describe(self) -> str:
        """One line for the run's start-up log."""

        def side(n: int | None) -> str:
            return "torch default" if n is None else str(n)

        return f"torch threads: engine {side(self.engine)}, trainer {side(self.trainer)} ({self.cores} cores)"


def plan_threads(
    backend: str,
    engine_threads: int | None,
    trainer_threads: int | None,
    *,
    cores: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> ThreadPlan:
    """The plan for engine ``backend`` with the configured counts (None: the default, module docstring)."""
    cores = available_cores() if cores is None else cores
    env = os.environ if environ is None else environ
    default = None if env.get("OMP_NUM_THREADS") else max(1, cores // 2)
    engine = engine_threads if engine_threads is not None else default
    if backend not in ("local", "process"):
        engine = None
    trainer = trainer_threads if trainer_threads is not None else default
    return ThreadPlan(engine, trainer, cores)


def trainer_executor(threads: int | None) -> ThreadPoolExecutor:
    """One worker thread for the trainer's compute (steps, value pretraining, scoring probes), its intra-op
    torch threads set to ``threads`` when it starts (None: as the process has them)."""

    def init() -> None:
        if threads is not None:
            import torch

            torch.set_num_threads(threads)

    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="sao-trainer", initializer=init)
