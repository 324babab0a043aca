"""The event loop: sync barriers, the trainer bound, the staleness capacity rule, groups, versions, scale."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sao.plan import Episode, Fixed, Layout, LogNormal, ParametricWorkload, Policy, Turn, simulate

from .helpers import Cycle, costs, single_turn


def test_one_episode_on_one_replica_finishes_at_the_hand_computed_time() -> None:
    # prefill 10 tokens (p), 100 steps of one sequence (t0 + t1), then train a and push.
    c = costs(t0=0.01, t1=0.001, p=1e-4, a=1.0, push_s=0.5)
    result = simulate(
        Cycle([single_turn(100, prompt=10)]),
        c,
        Layout(1, 1),
        Policy("sync", 1, max_in_flight=1),
        steps=1,
        warmup_steps=0,
    )
    assert result.step_s_mean == pytest.approx(10 * 1e-4 + 100 * 0.011 + 1.0 + 0.5, rel=1e-12)


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_without_a_prefix_cache_every_turn_prefills_the_whole_context(prefix_cache: bool) -> None:
    # prompt 10; turn 1 generates 5, then 7 observation tokens; turn 2 generates 5. Only prefill costs.
    episode = Episode(10, (Turn(5, 7, 0.0), Turn(5, 0, 0.0)))
    c = costs(t0=1e-12, p=1e-3, a=1e-12)  # the step is the episode: train and push ~0
    policy = Policy("sync", 1, max_in_flight=1, prefix_cache=prefix_cache)
    result = simulate(Cycle([episode]), c, Layout(1, 1), policy, steps=1, warmup_steps=0)
    prefill = 10 + (7 if prefix_cache else 10 + 5 + 7)  # turn 2 re-reads prompt + reply + observation
    assert result.step_s_mean == pytest.approx(prefill * 1e-3, rel=1e-6)


def test_sync_step_is_the_slowest_episode_then_train_then_push() -> None:
    # Three replicas, one episode each (the router spreads them): gen·t0 + env, different per episode.
    episodes = [single_turn(10, env_s=1.0), single_turn(40, env_s=0.5), single_turn(20, env_s=3.0)]
    c = costs(t0=0.1, a=2.0, b=0.01, push_s=0.5)
    result = simulate(
        Cycle(episodes), c, Layout(3, 1), Policy("sync", 3, max_in_flight=3), steps=4, warmup_steps=1
    )
    slowest = max(10 * 0.1 + 1.0, 40 * 0.1 + 0.5, 20 * 0.1 + 3.0)
    assert result.step_s_mean == pytest.approx(slowest + 2.0 + 0.01 * 70 + 0.5, rel=1e-9)
    assert result.lag.max == 0 and result.age.max == 0  # one version per batch
    assert result.trainer_utilisation == pytest.approx(2.7 / result.step_s_mean)


def test_async_with_free_engines_is_trainer_bound() -> None:
    # Engines ~instant, capacity to spare: a batch is always waiting, so a step is train + push.
    episode = Episode(100, (Turn(400, 50, 0.0), Turn(450, 0, 0.0)))  # 1000 tokens
    c = costs(t0=1e-9, a=2.0, b=1e-3, push_s=0.5)
    policy = Policy("async", batch_size=8, max_staleness=2, max_in_flight=64, max_running=64)
    result = simulate(Cycle([episode]), c, Layout(4, 1), policy, steps=10, warmup_steps=2)
    assert result.trajectories_per_s == pytest.approx(8 / (2.0 + 1e-3 * 8 * 1000 + 0.5), rel=1e-6)
    assert result.trainer_utilisation == pytest.approx(10.0 / 10.5, rel=1e-6)


def test_sync_mode_uses_one_batch_of_capacity_whatever_the_config_says() -> None:
    policy = Policy("sync", batch_size=4, max_staleness=3, max_in_flight=100)
    assert policy.capacity == 4 and policy.effective.max_in_flight == 4
    assert Policy("async", batch_size=4, max_staleness=3).capacity == 16


def _long_first(long: int = 2000, short: int = 10) -> Cycle:
    return Cycle([single_turn(long)] + [single_turn(short)] * 15)


@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_capacity_bounds_how_far_ahead_an_episode_starts(k: int) -> None:
    policy = Policy("async", batch_size=2, max_staleness=k, max_in_flight=64, max_running=64)
    result = simulate(
        _long_first(), costs(t0=0.01, a=0.3, push_s=0.05), Layout(4, 1), policy, steps=20, warmup_steps=0
    )
    assert result.admission.max <= k
    if k == 0:  # one batch at a time: generated and trained by the same version
        assert result.lag.max == 0


def test_lag_at_training_is_not_bounded_by_max_staleness() -> None:
    # The first episode runs for ~20 s while short ones are trained every ~0.35 s around it.
    policy = Policy("async", batch_size=2, max_staleness=1, max_in_flight=64, max_running=64)
    result = simulate(
        _long_first(), costs(t0=0.01, a=0.3, push_s=0.05), Layout(4, 1), policy, steps=40, warmup_steps=0
    )
    assert result.admission.max <= 1
    assert result.lag.max > 1 and result.age.max > 1


def test_a_group_is_trained_only_when_all_its_members_finished() -> None:
    # Group of 2 (one short, one long member): the batch waits for the long one.
    c = costs(t0=0.01, a=1.0)
    policy = Policy("async", batch_size=2, group_size=2, max_staleness=0, max_in_flight=2, max_running=4)
    result = simulate(
        Cycle([single_turn(10), single_turn(300)]), c, Layout(2, 1), policy, steps=3, warmup_steps=0
    )
    assert result.step_s_mean == pytest.approx(300 * 0.01 + 1.0)
    assert {n for _, n in result.in_flight_series} <= {0, 2}  # a group enters and leaves whole


def test_max_in_flight_bounds_the_episodes_running() -> None:
    policy = Policy("async", batch_size=4, max_staleness=4, max_in_flight=6, max_running=64)
    result = simulate(
        Cycle([single_turn(50, env_s=0.2)]), costs(t0=0.01, a=0.5), Layout(2, 1), policy, steps=8
    )
    assert max(n for _, n in result.in_flight_series) <= 6
    assert 0 < result.in_flight_mean <= 6


def test_push_every_k_steps_keeps_the_engine_version_for_k_steps() -> None:
    policy = Policy("async", batch_size=2, max_staleness=3, max_in_flight=8, max_running=8, push_every=3)
    result = simulate(
        Cycle([single_turn(20)]),
        costs(t0=0.01, a=0.1, push_s=0.05),
        Layout(2, 1),
        policy,
        steps=12,
        warmup_steps=0,
    )
    assert result.lag.max >= 2  # trained up to 2 versions after the weights the engines hold


def test_a_colocated_layout_refuses_async_mode() -> None:
    with pytest.raises(ValueError, match="sync mode only"):
        simulate(
            Cycle([single_turn(10)]), costs(), Layout.colocated_pool(8, 1, 1), Policy("async", 2), steps=2
        )


def test_paper_scale_run_finishes_quickly() -> None:
    # batch 128, 50 turns of ~1000 tokens, 32 replicas: event count grows with turns, not tokens.
    workload = ParametricWorkload(
        turns=Fixed(50),
        gen_tokens=Fixed(1000),
        obs_tokens=Fixed(200),
        prompt_tokens=Fixed(500),
        env_s=LogNormal(1.0, 1.0, hi=30.0),
    )
    c = costs(t0=0.02, t1=1e-4, c=1e-8, p=1e-5, a=30.0, b=1e-5, push_s=5.0)
    policy = Policy("async", batch_size=128, max_staleness=1, max_in_flight=256, max_running=64)
    result = simulate(workload, c, Layout(32, 8), policy, steps=3, warmup_steps=1)
    assert result.lag.count == pytest.approx(2 * 128 * 50 * 1000)  # every generated token of 2 batches
    assert 0 < result.engine_utilisation <= 1 and 0 < result.trainer_utilisation <= 1
    assert result.engine_occupancy <= 64


def test_the_planner_imports_no_torch_or_transformers() -> None:
    code = (
        "import sys, sao.plan, sao.plan.peers, sao.plan.report, sao.cli.plan; "
        "print(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
