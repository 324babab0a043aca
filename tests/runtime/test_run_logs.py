"""The throughput logs: episode summaries (hand-built trajectories), their rewind on resume, the timeline."""

from __future__ import annotations

import asyncio
import json
import math

from sao.runtime.observers import StepRecord
from sao.runtime.run_logs import EpisodeLog, Timeline, episode_summary
from sao.types import Trajectory


def _traj() -> Trajectory:
    # prompt (3) | reply turn 0 (2) | observation (4) | reply turn 1 (3)
    mask = [0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 1]
    return Trajectory(
        prompt_id="p",
        token_ids=list(range(12)),
        action_mask=mask,
        rollout_logprobs=[0.0 if m == 0 else -1.0 for m in mask],
        versions=[-1, -1, -1, 3, 3, -1, -1, -1, -1, 4, 5, 5],
        turn_ids=[0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1],
        rewards=[0.0, 1.0],
        finish_reason="stop",
        metadata={"timings": [{"generate_s": 0.5, "env_s": 0.25}, {"generate_s": 0.125, "env_s": 0.0}]},
    )


def test_episode_summary_counts_prompt_reply_and_observation_tokens_and_the_lag():
    s = episode_summary(_traj(), step=7, trained_version=6)
    assert s["prompt_tokens"] == 3 and s["start_version"] == 3
    assert s["turns"] == [
        {"gen_tokens": 2, "obs_tokens": 4, "generate_s": 0.5, "env_s": 0.25},
        {"gen_tokens": 3, "obs_tokens": 0, "generate_s": 0.125, "env_s": 0.0},
    ]
    # lags 3,3,2,1,1 over the five action tokens
    assert math.isclose(s["lag_mean"], 10 / 5) and s["lag_max"] == 3
    assert s["lag_counts"] == {"3": 2, "2": 1, "1": 2}
    assert (s["step"], s["trained_version"], s["reward"], s["finish_reason"]) == (7, 6, 1.0, "stop")


def test_a_turn_without_timings_is_written_as_null(tmp_path):
    traj = _traj()
    traj.metadata = {}
    log = EpisodeLog(tmp_path)
    asyncio.run(log.on_step(StepRecord(1, 1, None, 0.0, 0.0, trajectories=[traj])))  # type: ignore[arg-type]
    line = json.loads((tmp_path / "episodes.jsonl").read_text())
    assert line["turns"][0]["generate_s"] is None and line["trained_version"] == 0


def test_a_resumed_run_sets_aside_the_episodes_of_the_steps_it_redoes(tmp_path):
    path = tmp_path / "episodes.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3, 3)) + '{"step": 4, "tu')
    EpisodeLog(tmp_path, resume_step=2)
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2]
    assert len((tmp_path / "episodes.discarded.jsonl").read_text().splitlines()) == 3


def test_the_timeline_samples_while_running_and_writes_the_end_state(tmp_path):
    state = {"n": 0}

    async def main() -> None:
        snapshot = lambda: {"in_flight": state["n"], "engine": {"latency": float("nan"), "busy_s": 1.5}}  # noqa: E731
        async with Timeline(tmp_path, 0.01, snapshot):
            for i in range(5):
                state["n"] = i
                await asyncio.sleep(0.02)
        state["n"] = 99  # after the context: no more samples

    asyncio.run(main())
    rows = [json.loads(x) for x in (tmp_path / "timeline.jsonl").read_text().splitlines()]
    assert len(rows) >= 4 and rows[0]["in_flight"] == 0 and rows[-1]["in_flight"] == 4
    assert [r["t"] for r in rows] == sorted(r["t"] for r in rows)
    assert rows[-1]["engine"] == {"latency": None, "busy_s": 1.5}  # NaN (no update yet) is JSON null
