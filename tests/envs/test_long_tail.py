"""The long_tail env: deterministic heavy-tailed turn counts, the letter rule, episode ends on time."""

from __future__ import annotations

import asyncio
from collections import Counter

from sao.envs import make_env
from sao.envs.base import Task
from sao.envs.long_tail import MAX_TURNS, NEXT, OPTIMAL_SCORE, LongTailEnv, make_tasks, optimal_policy


def play(env: LongTailEnv, task: Task, replies: list[str]):
    async def run():
        first = await env.reset(task)
        results = []
        for text in replies:
            results.append(await env.step(text))
            if results[-1].done:
                break
        return first, results

    return asyncio.run(run())


def test_tasks_are_deterministic_and_long_tailed():
    tasks = make_tasks(2000, seed=3)
    assert [t.prompt for t in tasks[:50]] == [t.prompt for t in make_tasks(50, seed=3)]
    counts = Counter(t.metadata["turns"] for t in tasks)
    assert set(counts) <= set(range(1, MAX_TURNS + 1))
    assert (counts[1] + counts[2]) / 2000 > 0.65
    assert 0.05 < sum(counts[k] for k in (6, 7, 8)) / 2000 < 0.16
    assert f"Turns: {tasks[0].metadata['turns']}." in tasks[0].prompt


def test_episode_runs_the_drawn_turns_and_scores_the_letter_fraction():
    task = Task(id="t", prompt="p", answer="e", metadata={"turns": 3})
    env = make_env("long_tail")
    assert isinstance(env, LongTailEnv)
    _, results = play(env, task, ["hello", "xyz", "EEL", "never reached"])
    assert len(results) == 3
    assert [r.done for r in results] == [False, False, True]
    assert results[0].observation == [{"role": "user", "content": NEXT}]
    assert [r.reward for r in results[:2]] == [0.0, 0.0]
    assert results[-1].reward == 2 / 3 and results[-1].observation == []
    assert asyncio.run(env.step("late")).info["error"]


def test_optimal_policy_scores_one():
    for task in make_tasks(20, seed=0):
        env = LongTailEnv()
        first, results = play(env, task, [optimal_policy([], task)] * MAX_TURNS)
        assert first[-1]["content"] == task.prompt
        assert len(results) == task.metadata["turns"]
        assert results[-1].reward == OPTIMAL_SCORE


def test_episode_mode_draws_the_turn_count_per_episode_from_the_first_reply():
    task = make_tasks(1, seed=0)[0]

    def turns(first_reply: str) -> int:
        _, results = play(LongTailEnv(turns="episode"), task, [first_reply] + ["e"] * MAX_TURNS)
        assert results[-1].done
        return len(results)

    counts = Counter(turns(f"reply {i}") for i in range(2000))
    assert [turns(f"reply {i}") for i in range(20)] == [turns(f"reply {i}") for i in range(20)]
    assert len(counts) >= 5  # one prompt, many lengths
    assert (counts[1] + counts[2]) / 2000 > 0.65 and 0.05 < (counts[6] + counts[7] + counts[8]) / 2000 < 0.16


def test_env_kwargs_reach_the_env_and_bad_ones_fail_clearly():
    import pytest

    from sao.envs.base import EnvError

    assert make_env("long_tail", turns="episode").turns == "episode"
    with pytest.raises(EnvError, match="turns must be 'task' or 'episode'"):
        make_env("long_tail", turns="sometimes")
    with pytest.raises(EnvError, match="cannot build environment 'long_tail'"):
        make_env("long_tail", colour="red")
