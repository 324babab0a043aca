"""Workloads: the runtime's episodes.jsonl, parametric budgets, and the distribution text form."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from sao.plan import (
    EmpiricalWorkload,
    Fixed,
    LogNormal,
    ParametricWorkload,
    PowerLaw,
    WorkloadError,
    load_episodes,
    parse_dist,
    summarize,
)

RECORD = {
    "step": 3,
    "trained_version": 3,
    "prompt_tokens": 120,
    "turns": [
        {"gen_tokens": 40, "obs_tokens": 15, "generate_s": 0.5, "env_s": 1.5},
        {"gen_tokens": 60, "obs_tokens": 0, "generate_s": 0.7, "env_s": 0.0},
    ],
    "lag_mean": 0.4,
    "lag_max": 1,
    "finish_reason": "stop",
    "reward": 1.0,
}


def test_episodes_file_in_the_runtime_format_loads(tmp_path: Path) -> None:
    (tmp_path / "episodes.jsonl").write_text(json.dumps(RECORD) + "\n\n")
    workload = EmpiricalWorkload.from_run_dir(tmp_path)
    [episode] = workload.episodes
    assert episode.prompt_tokens == 120 and [t.gen_tokens for t in episode.turns] == [40, 60]
    assert episode.total_tokens == 120 + 40 + 15 + 60 and episode.env_s == 1.5
    assert "1 episodes" in workload.describe()


def test_resampling_is_seeded_and_keeps_whole_episodes(tmp_path: Path) -> None:
    records = [{**RECORD, "prompt_tokens": n} for n in range(1, 21)]
    (tmp_path / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    workload = EmpiricalWorkload.from_run_dir(tmp_path)
    draw = [workload.sample(random.Random(5)).prompt_tokens for _ in range(3)]
    assert len(set(draw)) == 1  # same seed, same draw
    assert {workload.sample(random.Random(s)) for s in range(50)} <= set(workload.episodes)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", r"episodes\.jsonl:1: invalid JSON"),
        (
            json.dumps({**RECORD, "turns": []}),
            r"episodes\.jsonl:1: expected an object with a non-empty 'turns'",
        ),
        (json.dumps({**RECORD, "prompt_tokens": -1}), r"episodes\.jsonl:1: 'prompt_tokens' must be"),
        (
            json.dumps({**RECORD, "turns": [{"gen_tokens": 5, "obs_tokens": 0, "env_s": "slow"}]}),
            r":1: turns\[0\]: 'env_s'",
        ),
    ],
)
def test_a_malformed_episode_names_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    (tmp_path / "episodes.jsonl").write_text(line + "\n")
    with pytest.raises(WorkloadError, match=message):
        load_episodes(tmp_path / "episodes.jsonl")


def test_a_missing_episodes_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match=r"episodes\.jsonl: no such file"):
        EmpiricalWorkload.from_run_dir(tmp_path)


def test_parametric_episodes_stay_within_the_budgets() -> None:
    workload = ParametricWorkload(
        turns=PowerLaw(1.2, 1, 80),
        gen_tokens=LogNormal(300, 1.0),
        obs_tokens=Fixed(40),
        prompt_tokens=Fixed(100),
        max_turns=50,
        max_new_tokens=1000,
        max_total_tokens=4000,
    )
    rng = random.Random(0)
    for _ in range(500):
        episode = workload.sample(rng)
        assert 1 <= len(episode.turns) <= 50
        assert all(1 <= t.gen_tokens <= 1000 for t in episode.turns)
        assert episode.total_tokens <= 4000 and episode.turns[-1].obs_tokens == 0


def test_parametric_sampling_is_seeded() -> None:
    workload = ParametricWorkload(turns=PowerLaw(1.5, 1, 20), gen_tokens=LogNormal(200, 0.5))
    assert workload.sample(random.Random(3)) == workload.sample(random.Random(3))


def test_summary_reports_means() -> None:
    s = summarize(
        ParametricWorkload(turns=Fixed(2), gen_tokens=Fixed(10), obs_tokens=Fixed(5), prompt_tokens=Fixed(7)),
        n=10,
    )
    assert (s.turns_mean, s.gen_tokens_mean, s.total_tokens_mean) == (2, 20, 7 + 20 + 5)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("12", Fixed(12.0)),
        ("fixed:3", Fixed(3.0)),
        ("lognormal:median=800,sigma=0.7,max=4096", LogNormal(800, 0.7, 0.0, 4096)),
        ("power:alpha=1.5,max=50", PowerLaw(1.5, 1, 50)),
    ],
)
def test_distribution_text_form(text: str, expected: object) -> None:
    assert parse_dist(text) == expected


@pytest.mark.parametrize(
    "text", ["gamma:k=2", "lognormal:median=5", "power:alpha=2", "lognormal:mu=1,sigma=1"]
)
def test_bad_distribution_text_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="bad distribution"):
        parse_dist(text)


def test_power_law_has_its_heavy_tail() -> None:
    dist, rng = PowerLaw(1.5, 1, 50), random.Random(0)
    draws = [dist.sample(rng) for _ in range(20000)]
    assert min(draws) == 1 and max(draws) == 50
    assert sum(draws) / len(draws) == pytest.approx(dist.mean(), rel=0.05)
