"""Registries: names, lookup errors, registration, compute_advantages' decoupled λ for every preset, and the
split estimator API (pure estimate_advantages, critic_targets, update_advantage_state)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sao.algos import estimators
from sao.algos.baselines import RunningMeanBaseline, SPOTracker
from sao.algos.gae import length_adaptive_lambda, skip_observation_gae, step_gae, token_gae
from sao.algos.group import grpo_advantages
from sao.algos.losses import dis_loss, ppo_clip_loss
from sao.algos.registry import (
    ADVANTAGE_ESTIMATORS,
    POLICY_LOSSES,
    AdvantageInputs,
    AdvantageParams,
    AdvantageResult,
    CriticTargets,
    compute_advantages,
    critic_targets,
    estimate_advantages,
    get_advantage_estimator,
    get_policy_loss,
    make_advantage_state,
    prompt_sampling_weights,
    register_advantage_estimator,
    register_policy_loss,
    update_advantage_state,
)
from sao.config import AlgoConfig, load_config
from sao.presets import PRESETS

F64 = torch.float64
ESTIMATOR_NAMES = {"skip_observation_gae", "token_gae", "step_gae", "grpo", "running_mean", "spo"}


def _batch(values: bool = True) -> AdvantageInputs:
    """Two trajectories: ``prompt(2) a(2) obs(2) a(2)`` (reward 1) and ``prompt(1) a(3) obs(3)`` (reward .5).

    Trajectory 0: 4 action tokens, 6 response tokens, 2 steps; trajectory 1: 3 action tokens, 6 response
    tokens, 1 step.
    """
    mask = torch.tensor([0, 0, 1, 1, 0, 0, 1, 1, 0, 1, 1, 1, 0, 0, 0], dtype=torch.bool)  # 8 | 7 tokens
    rewards = torch.zeros(15, dtype=F64)
    rewards[7], rewards[11] = 1.0, 0.5
    vals = torch.tensor([9, 9, 0.1, 0.2, 9, 9, 0.3, 0.4, 9, 0.5, 0.6, 0.7, 9, 9, 9], dtype=F64)
    return AdvantageInputs(
        token_rewards=rewards,
        action_mask=mask,
        cu_seqlens=torch.tensor([0, 8, 15]),
        values=vals if values else None,
        prompt_ids=["p0", "p1"],
        group_ids=["g", "g"],
    )


def _direct(fn, inp, lam, **kw):
    return fn(inp.token_rewards, inp.values, inp.action_mask, inp.cu_seqlens, 1.0, lam, **kw)


# ---- registries ------------------------------------------------------------------------------------------


def test_all_builtin_names_are_registered():
    assert set(ADVANTAGE_ESTIMATORS) >= ESTIMATOR_NAMES
    assert set(POLICY_LOSSES) >= {"dis", "ppo_clip"}
    assert get_policy_loss("dis").fn is dis_loss and get_policy_loss("dis").reference == "rollout"
    assert get_policy_loss("ppo_clip").fn is ppo_clip_loss and get_policy_loss("ppo_clip").reference == "old"
    uses_critic = {n for n in ESTIMATOR_NAMES if get_advantage_estimator(n).uses_critic}
    assert uses_critic == {"skip_observation_gae", "token_gae", "step_gae"}


def test_config_choices_are_exactly_the_registered_names():
    advantage = AlgoConfig.model_fields["advantage"].annotation.__args__
    policy_loss = AlgoConfig.model_fields["policy_loss"].annotation.__args__
    assert set(advantage) <= set(ADVANTAGE_ESTIMATORS)
    assert set(policy_loss) <= set(POLICY_LOSSES)


def test_unknown_names_raise_key_error_listing_the_registered_ones():
    with pytest.raises(KeyError) as err:
        get_advantage_estimator("gae_v2")
    message = str(err.value)
    assert "gae_v2" in message and all(name in message for name in ESTIMATOR_NAMES)
    with pytest.raises(KeyError, match="dis, ppo_clip"):
        get_policy_loss("clip_everything")
    with pytest.raises(KeyError, match="gae_v2"):
        compute_advantages("gae_v2", _batch(), AdvantageParams())


def test_duplicate_registration_raises_and_keeps_the_original():
    original = ADVANTAGE_ESTIMATORS["grpo"]
    with pytest.raises(ValueError, match="already registered"):
        register_advantage_estimator("grpo", uses_critic=False)(lambda inp, params, state: None)
    assert ADVANTAGE_ESTIMATORS["grpo"] is original
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("dis", reference="rollout")(ppo_clip_loss)
    assert POLICY_LOSSES["dis"].fn is dis_loss


def test_registering_a_new_estimator_makes_it_usable_by_name():
    name = "test_constant_advantage"

    def constant(inp, params, state):
        from sao.algos.registry import AdvantageResult

        return AdvantageResult(inp.action_mask.to(F64) * state)

    try:
        register_advantage_estimator(name, uses_critic=False, make_state=lambda params: 2.0)(constant)
        inp = _batch()
        result = compute_advantages(
            name, inp, AdvantageParams(), make_advantage_state(name, AdvantageParams())
        )
        assert torch.equal(result.advantages, inp.action_mask.to(F64) * 2.0)
        assert result.metrics["adv/mean"].item() == 2.0 and result.metrics["adv/std"].item() == 0.0
    finally:
        ADVANTAGE_ESTIMATORS.pop(name, None)


# ---- compute_advantages: decoupled λ -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "fn"), [("skip_observation_gae", skip_observation_gae), ("token_gae", token_gae)]
)
def test_gae_family_uses_adaptive_policy_lambda_for_advantages_and_critic_lambda_for_returns(name, fn):
    inp = _batch()
    result = compute_advantages(name, inp, AdvantageParams(lam_policy="adaptive", lam_critic=0.9))
    # l = action tokens per trajectory = [4, 3] → λ = 1 − 1/(1.5·l) = [5/6, 7/9].
    lam = length_adaptive_lambda(torch.tensor([4, 3]), 1.5)
    torch.testing.assert_close(lam, torch.tensor([5 / 6, 7 / 9]))
    torch.testing.assert_close(result.advantages, _direct(fn, inp, lam)[0], rtol=0, atol=0)
    torch.testing.assert_close(result.returns, _direct(fn, inp, 0.9)[1], rtol=0, atol=0)
    assert result.value_mask is None
    torch.testing.assert_close(result.metrics["adv/lambda_mean"], lam.mean())
    # The decoupling matters: advantages from λ_critic differ.
    assert not torch.allclose(result.advantages, _direct(fn, inp, 0.9)[0])


def test_skip_observation_gae_returns_are_monte_carlo_with_default_critic_lambda():
    result = compute_advantages("skip_observation_gae", _batch(), AdvantageParams())
    # λ_critic = 1, γ = 1: the target on every action token is the trajectory's final reward.
    want = torch.tensor([0, 0, 1, 1, 0, 0, 1, 1, 0, 0.5, 0.5, 0.5, 0, 0, 0], dtype=F64)
    torch.testing.assert_close(result.returns, want)


def test_adaptive_length_response_counts_observation_tokens_too():
    inp = _batch()
    result = compute_advantages("skip_observation_gae", inp, AdvantageParams(adaptive_length="response"))
    # Response = first action token to the end: 6 tokens in both trajectories → λ = 1 − 1/9.
    lam = length_adaptive_lambda(torch.tensor([6, 6]), 1.5)
    torch.testing.assert_close(lam, torch.full((2,), 1 - 1 / 9))
    torch.testing.assert_close(result.advantages, _direct(skip_observation_gae, inp, lam)[0], rtol=0, atol=0)


def test_fixed_policy_lambda_and_discount_are_passed_through():
    inp = _batch()
    params = AdvantageParams(gamma=0.9, lam_policy=0.3, lam_critic=0.7)
    result = compute_advantages("skip_observation_gae", inp, params)
    args = (inp.token_rewards, inp.values, inp.action_mask, inp.cu_seqlens, 0.9)
    torch.testing.assert_close(result.advantages, skip_observation_gae(*args, 0.3)[0], rtol=0, atol=0)
    torch.testing.assert_close(result.returns, skip_observation_gae(*args, 0.7)[1], rtol=0, atol=0)


@pytest.mark.parametrize("step_value", ["average", "last_token"])
def test_step_gae_adaptive_lambda_counts_steps(step_value):
    inp = _batch()
    result = compute_advantages("step_gae", inp, AdvantageParams(step_value=step_value, lam_critic=1.0))
    # Steps per trajectory [2, 1] → λ = [1 − 1/3, 1 − 1/1.5] = [2/3, 1/3].
    lam = length_adaptive_lambda(torch.tensor([2, 1]), 1.5)
    torch.testing.assert_close(lam, torch.tensor([2 / 3, 1 / 3]))
    adv, _, _ = _direct(step_gae, inp, lam, step_value=step_value)
    _, ret, vmask = _direct(step_gae, inp, 1.0, step_value=step_value)
    torch.testing.assert_close(result.advantages, adv, rtol=0, atol=0)
    torch.testing.assert_close(result.returns, ret, rtol=0, atol=0)
    assert torch.equal(result.value_mask, vmask)
    # Counting action tokens instead ([4, 3]) would give different advantages.
    wrong = _direct(step_gae, inp, length_adaptive_lambda(torch.tensor([4, 3]), 1.5), step_value=step_value)[
        0
    ]
    assert not torch.allclose(result.advantages, wrong)


@pytest.mark.parametrize("name", ["skip_observation_gae", "token_gae", "step_gae"])
def test_critic_estimators_raise_without_values(name):
    with pytest.raises(ValueError, match="critic values"):
        compute_advantages(name, _batch(values=False), AdvantageParams())


def test_grpo_through_the_registry_broadcasts_outcomes_to_action_tokens():
    inp = dataclasses.replace(_batch(values=False), group_ids=torch.tensor([3, 3]))
    result = compute_advantages("grpo", inp, AdvantageParams())
    # Outcomes (sum of token rewards) [1, .5] in one group → ±.25 / (std √(1/8) + ε).
    per_seq = grpo_advantages(torch.tensor([1.0, 0.5]), [3, 3])
    mask = inp.action_mask
    want = torch.where(mask, per_seq[torch.tensor([0] * 8 + [1] * 7)], torch.zeros(()))
    torch.testing.assert_close(result.advantages, want)
    assert result.returns is None
    with pytest.raises(ValueError, match="group_ids"):
        compute_advantages("grpo", dataclasses.replace(inp, group_ids=None), AdvantageParams())


def test_outcome_rewards_override_the_token_reward_sum():
    inp = dataclasses.replace(_batch(values=False), outcome_rewards=torch.tensor([0.0, 1.0]))
    state = make_advantage_state("running_mean", AdvantageParams())
    result = compute_advantages("running_mean", inp, AdvantageParams(), state)
    assert result.advantages[inp.action_mask].tolist() == [0.0] * 4 + [1.0] * 3


def test_stateful_estimators_get_their_state_from_the_params():
    params = AdvantageParams(running_mean_window=128, running_mean_scope="global", spo_rho_max=0.9)
    running = make_advantage_state("running_mean", params)
    assert isinstance(running, RunningMeanBaseline) and (running.window, running.scope) == (128, "global")
    spo = make_advantage_state("spo", params)
    assert isinstance(spo, SPOTracker) and spo.rho_max == 0.9
    assert make_advantage_state("grpo", params) is None
    with pytest.raises(TypeError, match="RunningMeanBaseline"):
        compute_advantages("running_mean", _batch(), params, state=None)
    with pytest.raises(TypeError, match="SPOTracker"):
        compute_advantages("spo", _batch(), params, state=running)


def test_running_mean_and_spo_through_the_registry_match_direct_calls():
    inp = _batch(values=False)
    params = AdvantageParams()
    outcomes = torch.tensor([1.0, 0.5])
    direct_rm, direct_spo = RunningMeanBaseline(8, "prompt"), SPOTracker()
    rm, spo = make_advantage_state("running_mean", params), make_advantage_state("spo", params)
    seq = torch.tensor([0] * 8 + [1] * 7)
    for _ in range(3):  # state carries over between calls
        want_rm = direct_rm.advantages(["p0", "p1"], outcomes)[seq]
        want_spo = direct_spo.advantages(["p0", "p1"], outcomes)[seq]
        got_rm = compute_advantages("running_mean", inp, params, rm).advantages
        got_spo = compute_advantages("spo", inp, params, spo).advantages
        torch.testing.assert_close(got_rm, torch.where(inp.action_mask, want_rm, torch.zeros(())))
        torch.testing.assert_close(got_spo, torch.where(inp.action_mask, want_spo, torch.zeros(())))


def test_summary_metrics_are_masked_mean_and_std_of_advantages():
    inp = _batch()
    result = compute_advantages("skip_observation_gae", inp, AdvantageParams(lam_policy=1.0))
    adv = result.advantages[inp.action_mask]
    torch.testing.assert_close(result.metrics["adv/mean"], adv.mean())
    torch.testing.assert_close(result.metrics["adv/std"], adv.std(unbiased=False))


# ---- presets ---------------------------------------------------------------------------------------------


def test_advantage_params_fields_all_exist_in_the_algo_config():
    # from_config copies attributes by name; a field missing from AlgoConfig would silently keep its default.
    missing = set(AdvantageParams.__dataclass_fields__) - set(AlgoConfig.model_fields)
    assert not missing


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_builds_params_and_runs_its_estimator_and_loss(preset):
    cfg = load_config(None, [f"algo={preset}", "model.tiny_arch=qwen3_moe"]).algo
    params = AdvantageParams.from_config(cfg)
    for field in AdvantageParams.__dataclass_fields__:
        assert getattr(params, field) == getattr(cfg, field), field
    inp = _batch()
    result = compute_advantages(cfg.advantage, inp, params, make_advantage_state(cfg.advantage, params))
    assert result.advantages.shape == (15,)
    assert bool(result.advantages.isfinite().all())
    assert bool((result.advantages[~inp.action_mask] == 0).all())
    assert (result.returns is not None) == cfg.uses_critic
    loss = get_policy_loss(cfg.policy_loss)
    assert (loss.reference == "old") == cfg.needs_old_logprobs


def test_config_overrides_reach_the_params():
    cfg = load_config(
        None, ["algo=sao", "model.tiny_arch=qwen3_moe", "algo.lam_policy=0.9", "algo.gamma=0.99"]
    ).algo
    params = AdvantageParams.from_config(cfg)
    assert (params.lam_policy, params.gamma, params.lam_critic) == (0.9, 0.99, 1.0)


def test_step_gae_through_the_registry_honours_turn_ids():
    # Trajectory 1's three action tokens split into two turns (no observation between): 2 steps, not 1.
    turn_ids = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 0, 1, 1, 2, 3, 3, 3])
    inp = dataclasses.replace(_batch(), turn_ids=turn_ids)
    result = compute_advantages("step_gae", inp, AdvantageParams())
    lam = length_adaptive_lambda(torch.tensor([2, 2]), 1.5)
    args = (inp.token_rewards, inp.values, inp.action_mask, inp.cu_seqlens, 1.0)
    torch.testing.assert_close(
        result.advantages, step_gae(*args, lam, "average", turn_ids)[0], rtol=0, atol=0
    )
    assert result.advantages[9].item() != result.advantages[11].item()


# ---- the split API: pure estimate, critic targets, state update ----------------------------------------


def _full_batch() -> AdvantageInputs:
    """``_batch()`` with everything any estimator reads: values, groups, prompts, SPO's divergence."""
    return dataclasses.replace(_batch(), divergence=torch.tensor([0.02, 0.1]))


def _state_dict(state):
    return None if state is None else state.state_dict()


@pytest.mark.parametrize("name", ["running_mean", "spo"])
def test_estimate_advantages_never_mutates_the_state(name):
    params = AdvantageParams()
    state = make_advantage_state(name, params)
    compute_advantages(name, _full_batch(), params, state)  # some history first
    before = _state_dict(state)
    first = estimate_advantages(name, _full_batch(), params, state)
    second = estimate_advantages(name, _full_batch(), params, state)
    assert _state_dict(state) == before
    assert torch.equal(first.advantages, second.advantages)  # same state, same answer
    update_advantage_state(name, state, _full_batch(), params)
    assert _state_dict(state) != before


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_estimate_then_update_equals_compute_advantages(name):
    params = AdvantageParams()
    split_state, joint_state = make_advantage_state(name, params), make_advantage_state(name, params)
    for step in range(3):  # the state carries over between batches
        inp = dataclasses.replace(_full_batch(), outcome_rewards=torch.tensor([1.0, 0.5 * (step % 2)]))
        split = estimate_advantages(name, inp, params, split_state)
        assert split.returns is None and split.value_mask is None
        if get_advantage_estimator(name).uses_critic:
            targets = critic_targets(name, inp, params)
            split.returns, split.value_mask = targets.returns, targets.value_mask
        update_advantage_state(name, split_state, inp, params)
        joint = compute_advantages(name, inp, params, joint_state)
        assert torch.equal(split.advantages, joint.advantages)
        for a, b in ((split.returns, joint.returns), (split.value_mask, joint.value_mask)):
            assert (a is None and b is None) or torch.equal(a, b)
        assert split.metrics.keys() == joint.metrics.keys()
        assert _state_dict(split_state) == _state_dict(joint_state)


@pytest.mark.parametrize("name", ["skip_observation_gae", "token_gae", "step_gae"])
@pytest.mark.parametrize("step_value", ["average", "last_token"])
def test_critic_targets_equal_compute_advantages_returns(name, step_value):
    params = AdvantageParams(lam_critic=0.8, gamma=0.95, step_value=step_value)
    targets = critic_targets(name, _batch(), params)
    assert isinstance(targets, CriticTargets)
    joint = compute_advantages(name, _batch(), params)
    assert torch.equal(targets.returns, joint.returns)
    assert (targets.value_mask is None) == (joint.value_mask is None) == (name != "step_gae")
    if name == "step_gae":
        assert torch.equal(targets.value_mask, joint.value_mask)


@pytest.mark.parametrize("name", ["grpo", "running_mean", "spo"])
def test_critic_targets_raise_for_critic_free_estimators(name):
    with pytest.raises(ValueError, match="does not use a critic"):
        critic_targets(name, _batch(), AdvantageParams())


def test_critic_targets_need_values():
    with pytest.raises(ValueError, match="critic values"):
        critic_targets("skip_observation_gae", _batch(values=False), AdvantageParams())
    with pytest.raises(ValueError, match="critic values"):
        estimate_advantages("skip_observation_gae", _batch(values=False), AdvantageParams())


@pytest.mark.parametrize("name", ["skip_observation_gae", "token_gae", "step_gae"])
def test_gae_family_runs_one_gae_pass_in_fn_and_one_in_targets(monkeypatch, name):
    calls: list[object] = []
    real = getattr(estimators, name)

    def counting(*args, **kwargs):
        calls.append(args[5])  # λ
        return real(*args, **kwargs)

    monkeypatch.setattr(estimators, name, counting)
    params = AdvantageParams(lam_policy=0.3, lam_critic=0.9)
    estimate_advantages(name, _batch(), params)
    assert calls == [0.3]
    critic_targets(name, _batch(), params)
    assert calls == [0.3, 0.9]
    calls.clear()
    compute_advantages(name, _batch(), params)
    assert calls == [0.3, 0.9]


def test_update_advantage_state_is_a_no_op_for_stateless_estimators():
    for name in ("grpo", "skip_observation_gae", "token_gae", "step_gae"):
        assert get_advantage_estimator(name).update_state is None
        update_advantage_state(name, None, _batch(), AdvantageParams())  # does not raise


def test_spo_update_reads_the_divergence_and_only_spo_needs_it():
    assert {n for n in ESTIMATOR_NAMES if get_advantage_estimator(n).needs_divergence} == {"spo"}
    params = AdvantageParams()
    state, direct = make_advantage_state("spo", params), SPOTracker()
    inp = _full_batch()
    estimate_advantages("spo", inp, params, state)
    update_advantage_state("spo", state, inp, params)
    direct.update(["p0", "p1"], torch.tensor([1.0, 0.5]), torch.tensor([0.02, 0.1]))
    assert state.state_dict() == direct.state_dict()
    # Without a divergence the update uses D = 0 (ρ = ρ_max), a different state.
    no_d = make_advantage_state("spo", params)
    update_advantage_state("spo", no_d, dataclasses.replace(inp, divergence=None), params)
    assert no_d.state_dict() != state.state_dict()


def test_running_mean_update_records_the_outcomes():
    params = AdvantageParams()
    state = make_advantage_state("running_mean", params)
    update_advantage_state("running_mean", state, _batch(), params)
    assert state.baseline(["p0", "p1"]).tolist() == [1.0, 0.5]
    with pytest.raises(TypeError, match="RunningMeanBaseline"):
        update_advantage_state("running_mean", None, _batch(), params)


def test_prompt_sampling_weights_come_from_the_spo_state_only():
    params = AdvantageParams()
    spo = make_advantage_state("spo", params)
    spo.initialize(["p0", "p1"], [0.2, 0.5])
    torch.testing.assert_close(
        prompt_sampling_weights("spo", spo, ["p0", "p1"]), spo.sampling_weights(["p0", "p1"])
    )
    for name in ("grpo", "running_mean", "skip_observation_gae"):
        assert prompt_sampling_weights(name, make_advantage_state(name, params), ["p0"]) is None
    with pytest.raises(TypeError, match="SPOTracker"):
        prompt_sampling_weights("spo", None, ["p0"])


def test_a_registered_estimator_gets_the_new_hooks():
    name = "test_counting_estimator"

    def fn(inp, params, state):
        return AdvantageResult(inp.action_mask.to(F64) * state["calls"])

    def update(state, inp, params):
        state["calls"] += 1

    try:
        register_advantage_estimator(
            name,
            uses_critic=False,
            make_state=lambda params: {"calls": 1},
            update_state=update,
            needs_divergence=True,
            sampling_weights=lambda state, ids: torch.ones(len(ids)),
        )(fn)
        est = get_advantage_estimator(name)
        assert est.update_state is update and est.needs_divergence and est.targets is None
        state = make_advantage_state(name, AdvantageParams())
        assert estimate_advantages(name, _batch(), AdvantageParams(), state).advantages.max() == 1
        assert state == {"calls": 1}
        assert compute_advantages(name, _batch(), AdvantageParams(), state).advantages.max() == 1
        assert state == {"calls": 2}
        assert prompt_sampling_weights(name, state, ["a", "b"]).tolist() == [1.0, 1.0]
    finally:
        ADVANTAGE_ESTIMATORS.pop(name, None)


def test_a_critic_estimator_registered_without_targets_keeps_its_own_returns():
    # The older convention: fn returns the targets itself; compute_advantages and critic_targets use them.
    name = "test_legacy_critic"

    def fn(inp, params, state):
        return AdvantageResult(inp.action_mask.to(F64), returns=inp.values * 2)

    try:
        register_advantage_estimator(name, uses_critic=True)(fn)
        inp = _batch()
        assert torch.equal(compute_advantages(name, inp, AdvantageParams()).returns, inp.values * 2)
        assert torch.equal(critic_targets(name, inp, AdvantageParams()).returns, inp.values * 2)
    finally:
        ADVANTAGE_ESTIMATORS.pop(name, None)
