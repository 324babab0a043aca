"""The best split of a GPU pool between engine replicas and trainer workers.

For a pool of ``gpus`` GPUs, every split with ``n`` replicas of ``gpus_per_engine`` and the rest as trainer
workers of ``gpus_per_trainer`` (at least one of each) is simulated in async mode; the split with the most
trained trajectories per hour wins. Sync mode colocated on the whole pool (engines and trainer
time-sharing all GPUs) is simulated beside it for comparison. ``stride`` thins the sweep for big pools
(every ``stride``-th replica count, plus both ends).
"""

from __future__ import annotations

from dataclasses import dataclass

from .costs import StageCosts
from .layout import Layout, Policy
from .result import PlanResult
from .sim import simulate
from .workload import Workload

__all__ = ["SplitReport", "best_split", "split_candidates"]


@dataclass
class SplitReport:
    gpus: int
    candidates: list[PlanResult]  # async, one per split, in replica order
    best: PlanResult
    colocated_sync: PlanResult

    @property
    def speedup(self) -> float:
        """Best async split over colocated sync, in trained trajectories per hour."""
        return self.best.trajectories_per_s / self.colocated_sync.trajectories_per_s


def split_candidates(
    gpus: int, gpus_per_engine: float, gpus_per_trainer: float, stride: int = 1
) -> list[Layout]:
    """Disjoint layouts using at most ``gpus``: n replicas and as many trainer workers as the rest holds."""
    most = int((gpus - gpus_per_trainer) // gpus_per_engine)
    if most < 1:
        raise ValueError(
            f"{gpus} GPUs cannot hold one engine ({gpus_per_engine}) and one trainer ({gpus_per_trainer})"
        )
    counts = sorted({*range(1, most + 1, max(1, stride)), most})
    return [
        Layout(n, int((gpus - n * gpus_per_engine) // gpus_per_trainer), gpus_per_engine, gpus_per_trainer)
        for n in counts
    ]


def best_split(
    workload: Workload,
    costs: StageCosts,
    policy: Policy,
    gpus: int,
    *,
    gpus_per_engine: float = 1.0,
    gpus_per_trainer: float = 1.0,
    stride: int = 1,
    steps: int = 12,
    warmup_steps: int = 2,
    seed: int = 0,
) -> SplitReport:
    """Sweep the splits of ``gpus`` (module docstring)."""
    run = {"steps": steps, "warmup_steps": warmup_steps, "seed": seed}
    asynchronous = policy.with_mode("async")
    results = [
        simulate(workload, costs, layout, asynchronous, **run)
        for layout in split_candidates(gpus, gpus_per_engine, gpus_per_trainer, stride)
    ]
    pool = Layout.colocated_pool(gpus, gpus_per_engine, gpus_per_trainer)
    colocated = simulate(workload, costs, pool, policy.with_mode("sync"), **run)
    best = max(results, key=lambda r: r.trajectories_per_s)
    return SplitReport(gpus, results, best, colocated)
