"""The tool_latency env: seeded heavy tails (turns, latency), wall time without CPU, the letter rule."""

from __future__ import annotations

import asyncio
import random
import statistics
import time

import pytest

from sao.envs import make_env
from sao.envs.tool_latency import ToolLatencyEnv, draw_latency, draw_turns, make_tasks, optimal_policy


def play(env: ToolLatencyEnv, replies):
    async def run():
        await env.reset(make_tasks(1, seed=0)[0])
        results = []
        for text in replies:
            results.append(await env.step(text))
            if results[-1].done:
                break
        return results

    return asyncio.run(run())


def test_turn_counts_are_a_truncated_power_law():
    rng = random.Random(0)
    turns = [draw_turns(rng, 50, 1.6) for _ in range(20000)]
    assert min(turns) == 1 and max(turns) == 50
    assert 0.60 < sum(t <= 2 for t in turns) / len(turns) < 0.65  # 62.5 % by the formula
    assert 0.02 < sum(t >= 30 for t in turns) / len(turns) < 0.037  # 2.8 %
    assert 4.3 < statistics.fmean(turns) < 5.1  # 4.72


def test_latency_is_lognormal_with_the_given_median_and_capped():
    rng = random.Random(1)
    lat = sorted(draw_latency(rng, 0.3, 1.0, 8.0) for _ in range(20000))
    assert 0.28 < lat[10000] < 0.32 and 0.95 < lat[18000] < 1.2  # median 0.3, p90 1.08
    assert lat[-1] <= 8.0 and draw_latency(rng, 0.0, 1.0, 8.0) == 0.0


def test_an_episode_waits_on_the_tool_without_using_the_cpu_and_is_deterministic():
    env = make_env("tool_latency", latency_median_s=0.05, latency_sigma=0.0, max_turns=3, turns_alpha=0.0)
    wall, cpu = time.perf_counter(), time.process_time()
    results = play(env, ["e1", "x", "e", "e", "never"])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    again = play(env, ["e1", "x", "e", "e", "never"])
    assert [r.done for r in results] == [r.done for r in again]
    n = len(results)
    assert 1 <= n <= 3 and results[-1].done and [r.info["latency_s"] for r in results] == [0.05] * n
    assert wall >= 0.05 * n and cpu < 0.05 * n  # wall time on the tool, little CPU
    hits = sum(r.info["hit"] for r in results)
    assert results[-1].reward == hits / n and all(r.reward == 0.0 for r in results[:-1])
    assert all(r.observation[0]["role"] == "tool" for r in results[:-1]) and results[-1].observation == []


def test_optimal_policy_scores_one_and_bad_arguments_are_refused():
    env = make_env("tool_latency", latency_median_s=0.0)
    task = make_tasks(1, seed=0)[0]
    results = play(env, [optimal_policy([], task)] * 50)
    assert results[-1].done and results[-1].reward == 1.0
    with pytest.raises(ValueError, match="max_turns"):
        ToolLatencyEnv(max_turns=0)
    with pytest.raises(ValueError, match="latency"):
        ToolLatencyEnv(latency_median_s=-1)
