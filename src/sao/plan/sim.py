"""The discrete-event simulation of a run: producer, engine replicas, trainer and weight pushes.

It replays sao's runtime rules, not a simplification of them:

* **producer** (`sao.runtime.producer`): starts whole groups of ``group_size`` episodes (one sampled prompt,
  ``group_size`` independent samples of the rest) while ``in_flight + group_size <= max_in_flight`` and the
  staleness capacity allows (`sao.runtime.staleness`: ``started − trained + group_size <= (max_staleness +
  1)·batch_size``); a group leaves ``in_flight`` and is queued only when all its members finished;
* **routing** (`sao.runtime.engine_pool`): an episode's first request goes to the replica with the fewest
  requests in flight, then the fewest episodes routed so far, then the lowest index; all its turns stay there;
* **trainer** (`sao.runtime.runner`): takes whole groups from the queue until it holds ``batch_size``
  trajectories, trains (the version advances at the end of the step), pushes the weights (every
  ``push_every`` steps; no engine steps during the push), then frees the capacity (`Books`) and takes the
  next batch;
* **sync mode**: the same with capacity and in-flight bound of one batch (`sao.plan.layout.Policy`).

Engine replicas are `sao.plan.replica.Replica` (processor sharing in virtual time), so the event count grows
with turns and episodes, not tokens. The producer's 50 ms polling and all host overheads are ignored.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from typing import Any

from .costs import StageCosts
from .layout import Layout, Policy
from .replica import Replica, Sequence
from .result import PlanResult, dist_stats
from .workload import Episode, Workload

__all__ = ["simulate"]

_REPLICA, _ENV, _TRAINED, _PUSHED, _SAMPLE = range(5)


@dataclass(eq=False)
class _Group:
    size: int
    runs: list[_Run] = field(default_factory=list)
    remaining: int = 0


@dataclass(eq=False)
class _Run:
    index: int  # start order (the runtime's episode index)
    group: _Group
    episode: Episode
    replica: int
    version_at_start: int
    turn: int = 0
    context: int = 0
    tokens: Counter[int] = field(default_factory=Counter)  # engine version -> generated tokens


class _Simulation:
    def __init__(
        self,
        workload: Workload,
        costs: StageCosts,
        layout: Layout,
        policy: Policy,
        *,
        steps: int,
        warmup_steps: int,
        seed: int,
        timeline_every_s: float | None,
    ) -> None:
        if layout.colocated and policy.mode != "sync":
            raise ValueError("a colocated layout time-shares its GPUs: it runs in sync mode only")
        if not 0 <= warmup_steps < steps:
            raise ValueError(f"need 0 <= warmup_steps < steps, got {warmup_steps} and {steps}")
        self.workload, self.costs, self.layout = workload, costs, layout
        self.policy, self.bounds = policy, policy.effective
        self.steps, self.warmup = steps, warmup_steps
        self.rng = random.Random(seed)
        self.replicas = [Replica(costs.engine, policy.max_running) for _ in range(layout.engine_replicas)]
        self.routed = [0] * layout.engine_replicas
        self.events: list[tuple[float, int, int, Any]] = []
        self.order = itertools.count()
        self.t = 0.0
        self.started = self.trained = self.unfreed = self.in_flight = self.queued = 0
        self.version = self.steps_done = 0
        self.queue: deque[_Group] = deque()
        self.trainer_busy = False
        self.done = False
        self.lag: Counter[int] = Counter()
        self.age: Counter[int] = Counter()
        self.admission: Counter[int] = Counter()
        self.train_s_window = 0.0
        self.tokens_window = 0
        self.flight_area, self.flight_t = 0.0, 0.0
        self.series: list[tuple[float, int]] = [(0.0, 0)]
        self.window: dict[str, float] = {}
        self.timeline: list[dict[str, Any]] = []
        self.timeline_every_s = timeline_every_s

    # ---- event plumbing -----------------------------------------------------------------------------

    def _at(self, t: float, kind: int, payload: Any = None) -> None:
        heapq.heappush(self.events, (t, next(self.order), kind, payload))

    def _schedule(self, r: int) -> None:
        replica = self.replicas[r]
        replica.epoch += 1
        when = replica.next_event()
        if when is not None:
            self._at(when, _REPLICA, (r, replica.epoch))

    def run(self) -> PlanResult:
        if self.warmup == 0:
            self._snapshot()
        if self.timeline_every_s:
            self._at(0.0, _SAMPLE)
        self._produce()
        handlers = {
            _REPLICA: self._on_replica,
            _ENV: self._after_env,
            _TRAINED: self._on_trained,
            _PUSHED: self._on_pushed,
            _SAMPLE: self._on_sample,
        }
        while self.events and not self.done:
            self.t, _, kind, payload = heapq.heappop(self.events)
            handlers[kind](payload)
        if not self.done:
            raise RuntimeError(f"simulation stalled at t={self.t:.3f}s after {self.steps_done} steps")
        return self._result()

    # ---- producer and episodes ----------------------------------------------------------------------

    def _set_in_flight(self, value: int) -> None:
        self.flight_area += self.in_flight * (self.t - self.flight_t)
        self.flight_t, self.in_flight = self.t, value
        self.series.append((self.t, value))

    def _produce(self) -> None:
        size, b = self.policy.group_size, self.bounds
        capacity = self.policy.capacity
        while self.in_flight + size <= b.max_in_flight and self.started - self.trained + size <= capacity:
            first = self.workload.sample(self.rng)
            episodes = [first] + [
                replace(self.workload.sample(self.rng), prompt_tokens=first.prompt_tokens)
                for _ in range(size - 1)
            ]
            group = _Group(size, remaining=size)
            for episode in episodes:
                self.admission[self.started // b.batch_size - self.version] += 1
                run = _Run(self.started, group, episode, self._route(), self.version)
                self.started += 1
                group.runs.append(run)
                self._submit_turn(run)
            self._set_in_flight(self.in_flight + size)

    def _route(self) -> int:
        r = min(range(len(self.replicas)), key=lambda i: (self.replicas[i].queued, self.routed[i], i))
        self.routed[r] += 1
        return r

    def _submit_turn(self, run: _Run) -> None:
        turns = run.episode.turns
        new = run.episode.prompt_tokens if run.turn == 0 else turns[run.turn - 1].obs_tokens
        run.context += new
        prefill = new if self.policy.prefix_cache else run.context  # without a prefix cache: all of it
        request = Sequence(prefill, run.context, turns[run.turn].gen_tokens, run)
        self.replicas[run.replica].submit(request, self.t)
        self._schedule(run.replica)

    def _on_replica(self, payload: tuple[int, int]) -> None:
        r, epoch = payload
        replica = self.replicas[r]
        if epoch != replica.epoch:
            return
        for seq in replica.pop_finished(self.t):
            run: _Run = seq.owner
            run.context += seq.gen
            for version, tokens in replica.tokens_by_version(seq):
                run.tokens[version] += tokens
            env_s = run.episode.turns[run.turn].env_s
            run.turn += 1
            if env_s > 0:
                self._at(self.t + env_s, _ENV, run)
            else:
                self._after_env(run)
        self._schedule(r)

    def _after_env(self, run: _Run) -> None:
        if run.turn < len(run.episode.turns):
            self._submit_turn(run)
            return
        group = run.group
        group.remaining -= 1
        if group.remaining == 0:
            self._set_in_flight(self.in_flight - group.size)
            self.queue.append(group)
            self.queued += group.size
            self._produce()
            self._try_train()

    # ---- trainer and weight pushes ------------------------------------------------------------------

    def _try_train(self) -> None:
        if self.trainer_busy or self.queued < self.policy.batch_size:
            return
        runs: list[_Run] = []
        while len(runs) < self.policy.batch_size:
            group = self.queue.popleft()
            self.queued -= group.size
            runs.extend(group.runs)
        measured = self.steps_done >= self.warmup
        tokens = 0
        for run in runs:
            tokens += run.episode.total_tokens
            if measured:
                for version, count in run.tokens.items():
                    self.lag[self.version - version] += count
                self.age[self.version - run.version_at_start] += 1
        train_s = self.costs.trainer.step_s(tokens, self.layout.trainer_workers)
        if measured:
            self.train_s_window += train_s
            self.tokens_window += tokens
        self.trainer_busy = True
        self._at(self.t + train_s, _TRAINED, len(runs))

    def _on_trained(self, n: int) -> None:
        self.version += 1
        self.steps_done += 1
        self.unfreed += n
        if self.steps_done % self.policy.push_every:
            self._freed(pushed=False)
            return
        for replica in self.replicas:
            replica.freeze(self.t)
        self._at(self.t + self.costs.push_s, _PUSHED)

    def _on_pushed(self, _: Any) -> None:
        for r, replica in enumerate(self.replicas):
            replica.unfreeze(self.t, self.version)
            self._schedule(r)
        self._freed(pushed=True)

    def _freed(self, pushed: bool) -> None:
        """The runtime's `Books.on_step`: the batch is trained, its capacity is free (with
        ``free_on_push``: only once the weights are pushed)."""
        if pushed or not self.policy.free_on_push:
            self.trained += self.unfreed
            self.unfreed = 0
        self.trainer_busy = False
        if self.steps_done == self.warmup:
            self._snapshot()
        if self.steps_done == self.steps:
            self.done = True
            return
        self._produce()
        self._try_train()

    # ---- measurement --------------------------------------------------------------------------------

    def _engine_totals(self) -> dict[str, float]:
        for replica in self.replicas:
            replica.advance(self.t)
        names = (
            "busy_s",
            "decode_steps",
            "tokens_generated",
            "context_tokens",
            "prefill_tokens",
            "occupancy_s",
        )
        return {name: sum(getattr(r, name) for r in self.replicas) for name in names}

    def _snapshot(self) -> None:
        self._set_in_flight(self.in_flight)
        self.window = {"t": self.t, "flight": self.flight_area, **self._engine_totals()}

    def _on_sample(self, _: Any) -> None:
        totals = self._engine_totals()
        engine = {k: v for k, v in totals.items() if k != "occupancy_s"}
        engine["running"] = float(sum(len(r.active) for r in self.replicas))
        engine["waiting"] = float(sum(len(r.waiting) for r in self.replicas))
        self.timeline.append(
            {
                "t": self.t,
                "version": self.version,
                "in_flight": self.in_flight,
                "queued": self.queued,
                "trained": self.trained,
                "engine": engine,
            }
        )
        assert self.timeline_every_s is not None
        self._at(self.t + self.timeline_every_s, _SAMPLE)

    def _result(self) -> PlanResult:
        self._set_in_flight(self.in_flight)
        totals = self._engine_totals()
        start = self.window
        window_s = max(self.t - start["t"], 1e-12)
        measured = self.steps - self.warmup
        replicas = len(self.replicas)
        return PlanResult(
            mode=self.policy.mode,
            engine_replicas=replicas,
            trainer_workers=self.layout.trainer_workers,
            gpus=self.layout.gpus,
            colocated=self.layout.colocated,
            batch_size=self.policy.batch_size,
            steps=self.steps,
            warmup_steps=self.warmup,
            window_s=window_s,
            trajectories_per_s=measured * self.policy.batch_size / window_s,
            tokens_per_s=self.tokens_window / window_s,
            step_s_mean=window_s / measured,
            train_s_mean=self.train_s_window / measured,
            push_s=self.costs.push_s,
            engine_utilisation=(totals["busy_s"] - start["busy_s"]) / (replicas * window_s),
            trainer_utilisation=self.train_s_window / window_s,
            engine_occupancy=(totals["occupancy_s"] - start["occupancy_s"]) / (replicas * window_s),
            in_flight_mean=(self.flight_area - start["flight"]) / window_s,
            lag=dist_stats(self.lag),
            age=dist_stats(self.age),
            admission=dist_stats(self.admission),
            in_flight_series=_thin(self.series, self.t),
            engine_counters={k: v for k, v in totals.items() if k != "occupancy_s"},
            timeline=self.timeline,
        )


def _thin(series: list[tuple[float, int]], end: float, points: int = 200) -> list[tuple[float, int]]:
    """The step function ``series`` read at ``points`` evenly spaced times in ``[0, end]``."""
    out, i = [], 0
    for k in range(points + 1):
        t = end * k / points
        while i + 1 < len(series) and series[i + 1][0] <= t:
            i += 1
        out.append((t, series[i][1]))
    return out


def simulate(
    workload: Workload,
    costs: StageCosts,
    layout: Layout,
    policy: Policy,
    *,
    steps: int = 12,
    warmup_steps: int = 2,
    seed: int = 0,
    timeline_every_s: float | None = None,
) -> PlanResult:
    """Simulate ``steps`` trainer steps and measure the ones after ``warmup_steps`` (see the module
    docstring). ``timeline_every_s``: also record the runtime's timeline samples (``result.timeline``)."""
    return _Simulation(
        workload,
        costs,
        layout,
        policy,
        steps=steps,
        warmup_steps=warmup_steps,
        seed=seed,
        timeline_every_s=timeline_every_s,
    ).run()
