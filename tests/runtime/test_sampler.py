"""Prompt sampler: epochs, groups, weighted (SPO) sampling, resume."""

from __future__ import annotations

from collections import Counter

import pytest

from sao.envs.base import Task
from sao.runtime.sampler import PromptSampler

TASKS = [Task(id=f"t{i}", prompt=f"p{i}") for i in range(5)]


def test_each_epoch_visits_every_task_once_in_a_seeded_order():
    s = PromptSampler(TASKS, seed=3)
    first = [s.next().task.id for _ in range(5)]
    second = [s.next().task.id for _ in range(5)]
    assert sorted(first) == sorted(second) == [t.id for t in TASKS]
    assert first != second  # a fresh permutation each epoch (deterministic for this seed)
    again = PromptSampler(TASKS, seed=3)
    assert [again.next().task.id for _ in range(5)] == first


def test_groups_share_an_id_and_singletons_have_none():
    start = PromptSampler(TASKS, group_size=8).next()
    assert start.size == 8 and start.group_id is not None and start.group_id.startswith(start.task.id)
    assert PromptSampler(TASKS).next().group_id is None
    s = PromptSampler(TASKS, group_size=2)
    assert s.next().group_id != s.next().group_id  # each start is its own group


def test_weighted_sampling_follows_the_weights():
    weights = {"t0": 0.0, "t1": 0.0, "t2": 1.0, "t3": 3.0, "t4": 0.0}
    s = PromptSampler(TASKS, seed=0, weights=lambda ids: [weights[i] for i in ids])
    counts = Counter(s.next().task.id for _ in range(2000))
    assert set(counts) == {"t2", "t3"}
    assert 2.5 < counts["t3"] / counts["t2"] < 3.5


def test_resume_continues_the_same_sequence():
    s = PromptSampler(TASKS, seed=1)
    for _ in range(7):
        s.next()
    state = s.state_dict()
    expected = [s.next().task.id for _ in range(6)]
    resumed = PromptSampler(TASKS, seed=1)
    resumed.load_state_dict(state)
    assert [resumed.next().task.id for _ in range(6)] == expected


def test_bad_inputs_raise():
    with pytest.raises(ValueError):
        PromptSampler([])
    with pytest.raises(ValueError):
        PromptSampler(TASKS, group_size=0)
    with pytest.raises(ValueError, match="non-negative"):
        PromptSampler(TASKS, weights=lambda ids: [0.0] * len(ids)).next()
