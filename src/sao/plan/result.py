"""What a simulation reports (`PlanResult`), and the weighted-histogram statistics it is built from.

Staleness is reported three ways, because they differ:

* ``admission`` — at the start of an episode, ``⌊n / batch_size⌋ − version``: how many versions ahead of
  the trainer the producer started it (``n`` is its start index; it would be trained in batch ``⌊n/B⌋``
  if trajectories were trained in start order). The capacity rule bounds it by ``max_staleness``.
* ``age`` — per trajectory, trainer version at its training minus the version when it started;
* ``lag`` — per generated token, trainer version at training minus the engine version that generated it
  (the runtime's ``policy/lag``). A long episode keeps generating while later-started short ones are
  trained, so age and lag are *not* bounded by ``max_staleness``.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["DistStats", "PlanResult", "dist_stats"]


@dataclass(frozen=True)
class DistStats:
    mean: float
    p50: float
    p99: float
    max: float
    count: float  # total weight (tokens or trajectories)


def dist_stats(hist: Counter[int] | dict[int, float]) -> DistStats:
    """Mean, p50, p99 and max of a weighted integer histogram ``{value: weight}`` (zeros when empty)."""
    total = float(sum(hist.values()))
    if total <= 0:
        return DistStats(0.0, 0.0, 0.0, 0.0, 0.0)
    items = sorted(hist.items())
    mean = sum(v * w for v, w in items) / total

    def quantile(q: float) -> float:
        acc = 0.0
        for value, weight in items:
            acc += weight
            if acc >= q * total - 1e-9:
                return float(value)
        return float(items[-1][0])

    return DistStats(mean, quantile(0.5), quantile(0.99), float(items[-1][0]), total)


@dataclass
class PlanResult:
    """One simulated configuration, measured after ``warmup_steps`` trainer steps.

    Rates are per wall-clock second of the measured window; utilisations are fractions of it
    (engine: mean over replicas of the time it steps — decode or prefill; trainer: time training).
    ``engine_occupancy``: mean active sequences per replica; ``in_flight``: started, unfinished
    episodes (the producer's count: a group counts until all its members finished), time-weighted mean,
    and ``in_flight_series`` as ``(t_s, episodes)`` points. ``engine_counters``: the replicas' cumulative
    timeline counters over the whole run; ``timeline``: the runtime-format samples when asked for.
    """

    mode: str
    engine_replicas: int
    trainer_workers: int
    gpus: float
    colocated: bool
    batch_size: int
    steps: int
    warmup_steps: int
    window_s: float
    trajectories_per_s: float
    tokens_per_s: float
    step_s_mean: float
    train_s_mean: float
    push_s: float
    engine_utilisation: float
    trainer_utilisation: float
    engine_occupancy: float
    in_flight_mean: float
    lag: DistStats
    age: DistStats
    admission: DistStats
    in_flight_series: list[tuple[float, int]] = field(default_factory=list)
    engine_counters: dict[str, float] = field(default_factory=dict)
    timeline: list[dict[str, Any]] = field(default_factory=list)  # runtime-format samples, when asked

    @property
    def trajectories_per_hour(self) -> float:
        return self.trajectories_per_s * 3600.0

    def to_dict(self, series: bool = True) -> dict[str, Any]:
        out = asdict(self)
        out["trajectories_per_hour"] = self.trajectories_per_hour
        out.pop("timeline")
        if not series:
            out.pop("in_flight_series")
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}
