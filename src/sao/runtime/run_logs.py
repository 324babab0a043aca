"""Two optional run logs for throughput analysis and the capacity planner (`sao plan`):

- ``RUN_DIR/episodes.jsonl`` (``logging.episodes=true``): one line per trained trajectory, its shape and
  timings (`episode_summary`): the planner resamples these as an empirical workload;
- ``RUN_DIR/timeline.jsonl`` (``logging.timeline_every_s=S``): every S seconds of the training loop, the
  episodes in flight, the queue, the trained count and the engine's counters (`Timeline`): occupancy over
  time for plots, and the intervals the planner's engine calibration fits.

An ``episodes.jsonl`` line::

    {"step": 3, "prompt_id": "calc-7", "trained_version": 2, "prompt_tokens": 41, "start_version": 1,
     "lag_mean": 0.8, "lag_max": 1, "lag_counts": {"0": 7, "1": 5}, "finish_reason": "stop", "reward": 1.0,
     "turns": [{"gen_tokens": 9, "obs_tokens": 6, "generate_s": 0.021, "env_s": 0.31}, ...]}

``step`` is the trainer step that trained it (after the step), ``trained_version`` the policy version the
step trained from, ``start_version`` the version of its first generated token, ``lag`` = trained_version −
token version over its action tokens (``lag_counts``: action tokens per lag); ``obs_tokens`` of a turn:
observation tokens appended after that turn's reply (0 after the last). A resumed run moves the lines of
steps it redoes to ``episodes.discarded.jsonl`` (as the metrics are); its timeline restarts ``t`` at 0.

A ``timeline.jsonl`` line::

    {"t": 12.5, "version": 4, "in_flight": 61, "queued": 3, "trained": 64,
     "engine": {"running": 58.0, "waiting": 0.0, "busy_s": 11.9, "decode_steps": 1402.0, ...}}

A trajectory recorded through the run's gateway (``data.source`` gateway/both) also has its
``session_id``; its turns have no timings (null).

``t``: seconds since the loop started; ``engine``: the engine's `stats()` (cumulative counters, plus the
instantaneous ``running``/``waiting``), numbers only.

Owns: the two files' format and writing. Does not own: what the runner trains or when it steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sao.sinks import json_number, rewind_metrics
from sao.types import Trajectory

from .observers import StepRecord

__all__ = [
    "EPISODES_FILE",
    "TIMELINE_FILE",
    "EpisodeLog",
    "Timeline",
    "episode_summary",
]

EPISODES_FILE = "episodes.jsonl"
TIMELINE_FILE = "timeline.jsonl"


def _turn_shapes(traj: Trajectory) -> tuple[int, list[tuple[int, int]]]:
    """``(prompt tokens, [(generated tokens, observation tokens after it) per action span])``."""
    spans: list[list[int]] = []  # [gen, obs] per action span
    prompt = 0
    prev_action, prev_turn = False, None
    for is_action, turn in zip(traj.action_mask, traj.turn_ids, strict=True):
        if is_action:
            if not (prev_action and turn == prev_turn):
                spans.append([0, 0])
            spans[-1][0] += 1
        elif spans:
            spans[-1][1] += 1
        else:
            prompt += 1
        prev_action, prev_turn = bool(is_action), turn
    return prompt, [(g, o) for g, o in spans]


def episode_summary(traj: Trajectory, step: int, trained_version: int) -> dict[str, Any]:
    """One ``episodes.jsonl`` record for ``traj`` (see the module docstring)."""
    prompt, shapes = _turn_shapes(traj)
    timings = traj.metadata.get("timings") or []
    turns = []
    for i, (gen, obs) in enumerate(shapes):
        timing = timings[i] if i < len(timings) else {}
        turns.append({
            "gen_tokens": gen, "obs_tokens": obs,
            "generate_s": _seconds(timing.get("generate_s")),
            "env_s": _seconds(timing.get("env_s")),
        })  # fmt: skip
    versions = [v for v, a in zip(traj.versions, traj.action_mask, strict=True) if a and v >= 0]
    lags = [trained_version - v for v in versions]
    counts: dict[str, int] = {}
    for lag in lags:
        counts[str(lag)] = counts.get(str(lag), 0) + 1
    return {
        "step": step,
        "prompt_id": traj.prompt_id,
        "trained_version": trained_version,
        "prompt_tokens": prompt,
        "start_version": versions[0] if versions else None,
        "lag_mean": sum(lags) / len(lags) if lags else 0.0,
        "lag_max": max(lags, default=0),
        "lag_counts": counts,
        "finish_reason": traj.finish_reason,
        "reward": traj.outcome_reward,
        "turns": turns,
        **({"session_id": traj.metadata["session_id"]} if "session_id" in traj.metadata else {}),
    }


def _seconds(value: Any) -> float | None:
    """A turn's timing in seconds, None when the agent loop recorded none."""
    return None if value is None else float(value)


def _json_line(record: dict[str, Any]) -> str:
    return json.dumps(record, allow_nan=False) + "\n"


class EpisodeLog:
    """Step observer: appends the summaries of the step's trajectories to ``episodes.jsonl``."""

    def __init__(self, run_dir: Path, resume_step: int | None = None) -> None:
        self.path = Path(run_dir) / EPISODES_FILE
        if resume_step is not None:
            rewind_metrics(self.path, resume_step, discarded="episodes.discarded.jsonl")

    async def on_step(self, record: StepRecord) -> None:
        trained_from = record.version - 1
        lines = [_json_line(episode_summary(t, record.step, trained_from)) for t in record.trajectories]
        with self.path.open("a", encoding="utf-8") as f:
            f.writelines(lines)


class Timeline:
    """Samples ``snapshot()`` every ``every_s`` seconds into ``timeline.jsonl`` while running.

    ``snapshot`` returns the record without ``t`` (the sampler adds it), its ``engine`` values numbers
    (non-finite ones are written as JSON allows: `sao.sinks.json_number`); it runs on the event loop, so
    it must be cheap and must not block. Use as ``async with Timeline(...):`` around the training loop.
    """

    def __init__(self, run_dir: Path, every_s: float, snapshot: Callable[[], dict[str, Any]]) -> None:
        if every_s <= 0:
            raise ValueError(f"every_s must be > 0, got {every_s}")
        self.path = Path(run_dir) / TIMELINE_FILE
        self.every_s, self.snapshot = every_s, snapshot
        self._task: asyncio.Task[None] | None = None
        self._t0 = 0.0

    def _write(self) -> None:
        record = {"t": round(time.monotonic() - self._t0, 4), **self.snapshot()}
        if "engine" in record:
            record["engine"] = {k: json_number(v) for k, v in record["engine"].items()}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(_json_line(record))

    async def _run(self) -> None:
        while True:
            self._write()
            await asyncio.sleep(self.every_s)

    async def __aenter__(self) -> Timeline:
        self._t0 = time.monotonic()
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._write()  # the end state
