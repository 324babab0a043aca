"""The built-in advantage estimators as typed classes: the decoupled λ of the GAE family (one pass with the
policy λ in ``estimate``, one with the critic λ in ``targets``), the critic-free baselines, the summary
metrics, every preset's estimator and loss, and the split stateful API (pure ``estimate``, ``update_state``,
``sampling_weights``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sao.algos import (
    GRPO,
    SPO,
    AdvantageEstimator,
    AdvantageInputs,
    CriticTargets,
    LossInputs,
    PolicyLoss,
    RunningMean,
    RunningMeanBaseline,
    SkipObservationGAE,
    SPOTracker,
    StepGAE,
    TokenGAE,
    gae,
    grpo_advantages,
)
from sao.algos.gae import length_adaptive_lambda, skip_observation_gae, step_gae, token_gae
from sao.config import load_config
from sao.presets import PRESETS

F64 = torch.float64
GAE_CLASSES = {"skip_observation_gae": SkipObservationGAE, "token_gae": TokenGAE, "step_gae": StepGAE}
CRITIC_FREE = {"grpo": GRPO, "running_mean": RunningMean, "spo": SPO}
ALL_CLASSES = {**GAE_CLASSES, **CRITIC_FREE}


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


def _full_batch() -> AdvantageInputs:
    """``_batch()`` with everything any estimator reads: values, groups, prompts, SPO's divergence."""
    return dataclasses.replace(_batch(), divergence=torch.tensor([0.02, 0.1]))


def _direct(fn, inp, lam, gamma=1.0, **kw):
    return fn(inp.token_rewards, inp.values, inp.action_mask, inp.cu_seqlens, gamma, lam, **kw)


def _on_tokens(per_seq: torch.Tensor, inp: AdvantageInputs) -> torch.Tensor:
    seq = torch.tensor([0] * 8 + [1] * 7)
    return torch.where(inp.action_mask, per_seq[seq], torch.zeros(()))


# ---- the GAE family: decoupled λ -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "fn"), [("skip_observation_gae", skip_observation_gae), ("token_gae", token_gae)]
)
def test_gae_family_uses_adaptive_policy_lambda_for_advantages_and_critic_lambda_for_targets(name, fn):
    inp = _batch()
    est = GAE_CLASSES[name](lam_policy="adaptive", lam_critic=0.9)
    result = est.advantages(inp)
    # l = action tokens per trajectory = [4, 3] → λ = 1 − 1/(1.5·l) = [5/6, 7/9].
    lam = length_adaptive_lambda(torch.tensor([4, 3]), 1.5)
    torch.testing.assert_close(lam, torch.tensor([5 / 6, 7 / 9]))
    torch.testing.assert_close(result.advantages, _direct(fn, inp, lam)[0], rtol=0, atol=0)
    targets = est.targets(inp)
    torch.testing.assert_close(targets.returns, _direct(fn, inp, 0.9)[1], rtol=0, atol=0)
    assert targets.value_mask is None
    torch.testing.assert_close(result.metrics["adv/lambda_mean"], lam.mean())
    # The decoupling matters: advantages from λ_critic differ.
    assert not torch.allclose(result.advantages, _direct(fn, inp, 0.9)[0])


def test_skip_observation_gae_targets_are_monte_carlo_with_default_critic_lambda():
    targets = SkipObservationGAE().targets(_batch())
    # λ_critic = 1, γ = 1: the target on every action token is the trajectory's final reward.
    want = torch.tensor([0, 0, 1, 1, 0, 0, 1, 1, 0, 0.5, 0.5, 0.5, 0, 0, 0], dtype=F64)
    torch.testing.assert_close(targets.returns, want)


def test_adaptive_length_response_counts_observation_tokens_too():
    inp = _batch()
    result = SkipObservationGAE(adaptive_length="response").advantages(inp)
    # Response = first action token to the end: 6 tokens in both trajectories → λ = 1 − 1/9.
    lam = length_adaptive_lambda(torch.tensor([6, 6]), 1.5)
    torch.testing.assert_close(lam, torch.full((2,), 1 - 1 / 9))
    torch.testing.assert_close(result.advantages, _direct(skip_observation_gae, inp, lam)[0], rtol=0, atol=0)


def test_fixed_policy_lambda_and_discount_are_passed_through():
    inp = _batch()
    est = SkipObservationGAE(gamma=0.9, lam_policy=0.3, lam_critic=0.7)
    args = (inp.token_rewards, inp.values, inp.action_mask, inp.cu_seqlens, 0.9)
    torch.testing.assert_close(
        est.advantages(inp).advantages, skip_observation_gae(*args, 0.3)[0], rtol=0, atol=0
    )
    torch.testing.assert_close(est.targets(inp).returns, skip_observation_gae(*args, 0.7)[1], rtol=0, atol=0)
    assert "adv/lambda_mean" not in est.advantages(inp).metrics  # a fixed λ has no per-trajectory mean


@pytest.mark.parametrize("step_value", ["average", "last_token"])
def test_step_gae_adaptive_lambda_counts_steps(step_value):
    inp = _batch()
    est = StepGAE(step_value=step_value, lam_critic=1.0)
    # Steps per trajectory [2, 1] → λ = [1 − 1/3, 1 − 1/1.5] = [2/3, 1/3].
    lam = length_adaptive_lambda(torch.tensor([2, 1]), 1.5)
    torch.testing.assert_close(lam, torch.tensor([2 / 3, 1 / 3]))
    adv, _, _ = _direct(step_gae, inp, lam, step_value=step_value)
    _, ret, vmask = _direct(step_gae, inp, 1.0, step_value=step_value)
    result = est.advantages(inp)
    torch.testing.assert_close(result.advantages, adv, rtol=0, atol=0)
    targets = est.targets(inp)
    torch.testing.assert_close(targets.returns, ret, rtol=0, atol=0)
    assert torch.equal(targets.value_mask, vmask)
    # Counting action tokens instead ([4, 3]) would give different advantages.
    wrong_lam = length_adaptive_lambda(torch.tensor([4, 3]), 1.5)
    assert not torch.allclose(result.advantages, _direct(step_gae, inp, wrong_lam, step_value=step_value)[0])


def test_step_gae_honours_turn_ids():
    # Trajectory 1's three action tokens split into two turns (no observation between): 2 steps, not 1.
    turn_ids = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 0, 1, 1, 2, 3, 3, 3])
    inp = dataclasses.replace(_batch(), turn_ids=turn_ids)
    result = StepGAE().advantages(inp)
    lam = length_adaptive_lambda(torch.tensor([2, 2]), 1.5)
    args = (inp.token_rewards, inp.values, inp.action_mask, inp.cu_seqlens, 1.0)
    torch.testing.assert_close(
        result.advantages, step_gae(*args, lam, "average", turn_ids)[0], rtol=0, atol=0
    )
    assert result.advantages[9].item() != result.advantages[11].item()
    targets = StepGAE(step_value="last_token").targets(inp)
    assert targets.value_mask.nonzero().squeeze(1).tolist() == [3, 7, 10, 11]  # each step's last token


@pytest.mark.parametrize("name", sorted(GAE_CLASSES))
@pytest.mark.parametrize("step_value", ["average", "last_token"])
def test_critic_targets_are_one_pass_with_the_critic_lambda(name, step_value):
    kw = {"step_value": step_value} if name == "step_gae" else {}
    targets = GAE_CLASSES[name](lam_critic=0.8, gamma=0.95, **kw).targets(_batch())
    assert isinstance(targets, CriticTargets)
    fn = getattr(gae, name)
    want = _direct(fn, _batch(), 0.8, gamma=0.95, **kw)
    torch.testing.assert_close(targets.returns, want[1], rtol=0, atol=0)
    assert (targets.value_mask is None) == (name != "step_gae")
    if name == "step_gae":
        assert torch.equal(targets.value_mask, want[2])


@pytest.mark.parametrize("name", sorted(GAE_CLASSES))
def test_critic_estimators_raise_without_values(name):
    with pytest.raises(ValueError, match="critic values"):
        GAE_CLASSES[name]().advantages(_batch(values=False))
    with pytest.raises(ValueError, match="critic values"):
        GAE_CLASSES[name]().targets(_batch(values=False))


@pytest.mark.parametrize("name", sorted(CRITIC_FREE))
def test_critic_free_estimators_have_no_critic_targets(name):
    assert not CRITIC_FREE[name].uses_critic
    with pytest.raises(NotImplementedError, match="uses no critic"):
        CRITIC_FREE[name]().targets(_batch())


def test_only_the_gae_family_uses_a_critic_and_only_spo_needs_the_divergence():
    assert {n for n, cls in ALL_CLASSES.items() if cls.uses_critic} == set(GAE_CLASSES)
    assert {n for n, cls in ALL_CLASSES.items() if cls.needs_divergence} == {"spo"}


@pytest.mark.parametrize("name", sorted(GAE_CLASSES))
def test_gae_family_runs_one_gae_pass_in_estimate_and_one_in_targets(monkeypatch, name):
    calls: list[object] = []
    real = getattr(gae, name)

    def counting(*args, **kwargs):
        calls.append(args[5])  # λ
        return real(*args, **kwargs)

    monkeypatch.setattr(gae, name, counting)
    est = GAE_CLASSES[name](lam_policy=0.3, lam_critic=0.9)
    est.estimate(_batch(), None)
    assert calls == [0.3]
    est.targets(_batch())
    assert calls == [0.3, 0.9]
    calls.clear()
    est.advantages(_batch())  # the summary metrics add no pass
    assert calls == [0.3]


# ---- critic-free estimators ----------------------------------------------------------------------------


def test_grpo_broadcasts_group_advantages_to_action_tokens():
    inp = dataclasses.replace(_batch(values=False), group_ids=torch.tensor([3, 3]))
    result = GRPO().advantages(inp)
    # Outcomes (sum of token rewards) [1, .5] in one group → ±.25 / (std √(1/8) + ε).
    per_seq = grpo_advantages(torch.tensor([1.0, 0.5]), [3, 3])
    torch.testing.assert_close(result.advantages, _on_tokens(per_seq, inp))
    with pytest.raises(ValueError, match="group_ids"):
        GRPO().advantages(dataclasses.replace(inp, group_ids=None))


def test_outcome_rewards_override_the_token_reward_sum():
    inp = dataclasses.replace(_batch(values=False), outcome_rewards=torch.tensor([0.0, 1.0]))
    est = RunningMean()
    result = est.advantages(inp, est.make_state())
    assert result.advantages[inp.action_mask].tolist() == [0.0] * 4 + [1.0] * 3


def test_stateful_estimators_make_their_state_from_their_own_fields():
    running = RunningMean(window=128, scope="global").make_state()
    assert isinstance(running, RunningMeanBaseline) and (running.window, running.scope) == (128, "global")
    spo = SPO(rho_max=0.9, d_half=0.1, rho_min=0.5, sampling_floor=0.2).make_state()
    assert isinstance(spo, SPOTracker)
    assert (spo.rho_max, spo.d_half, spo.rho_min, spo.sampling_floor) == (0.9, 0.1, 0.5, 0.2)
    for cls in (GRPO, *GAE_CLASSES.values()):
        assert cls().make_state() is None
    with pytest.raises(TypeError, match="RunningMeanBaseline"):
        RunningMean().advantages(_batch(), None)
    with pytest.raises(TypeError, match="SPOTracker"):
        SPO().advantages(_batch(), running)


def test_running_mean_and_spo_match_direct_calls_across_batches():
    inp = _batch(values=False)
    outcomes = torch.tensor([1.0, 0.5])
    direct_rm, direct_spo = RunningMeanBaseline(8, "prompt"), SPOTracker()
    rm, spo = RunningMean(), SPO()
    rm_state, spo_state = rm.make_state(), spo.make_state()
    for _ in range(3):  # state carries over between calls
        want_rm = direct_rm.advantages(["p0", "p1"], outcomes)
        want_spo = direct_spo.advantages(["p0", "p1"], outcomes)
        got_rm = rm.advantages(inp, rm_state).advantages
        got_spo = spo.advantages(inp, spo_state).advantages
        rm.update_state(rm_state, inp)
        spo.update_state(spo_state, inp)
        torch.testing.assert_close(got_rm, _on_tokens(want_rm, inp))
        torch.testing.assert_close(got_spo, _on_tokens(want_spo, inp))


def test_summary_metrics_are_masked_mean_and_std_of_advantages():
    inp = _batch()
    result = SkipObservationGAE(lam_policy=1.0).advantages(inp)
    adv = result.advantages[inp.action_mask]
    torch.testing.assert_close(result.metrics["adv/mean"], adv.mean())
    torch.testing.assert_close(result.metrics["adv/std"], adv.std(unbiased=False))


# ---- presets ---------------------------------------------------------------------------------------------


def _loss_inputs() -> LossInputs:
    inp = _batch()
    logprobs = torch.linspace(-2.0, -0.1, 15, dtype=F64).requires_grad_(True)
    reference = logprobs.detach() + torch.linspace(-1.5, 1.5, 15, dtype=F64)  # ratios on both sides of 1
    return LossInputs(
        logprobs=logprobs,
        reference=reference,
        advantages=SkipObservationGAE().advantages(inp).advantages,
        action_mask=inp.action_mask,
        cu_seqlens=inp.cu_seqlens,
        positive=torch.tensor([True] * 8 + [False] * 7),
    )


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_builds_and_runs_its_estimator_and_loss(preset):
    algo = load_config(None, [f"algo={preset}", "model.tiny_arch=qwen3_moe"]).algo
    est, loss = algo.advantage.build(), algo.loss.build()
    assert isinstance(est, AdvantageEstimator) and isinstance(loss, PolicyLoss)
    assert algo.uses_critic == est.uses_critic == (algo.advantage.type in GAE_CLASSES)
    inp = _full_batch()
    state = est.make_state()
    result = est.advantages(inp, state)
    assert result.advantages.shape == (15,)
    assert bool(result.advantages.isfinite().all())
    assert bool((result.advantages[~inp.action_mask] == 0).all())
    assert {"adv/mean", "adv/std"} <= set(result.metrics)
    if est.uses_critic:
        assert bool(est.targets(inp).returns.isfinite().all())
    est.update_state(state, inp)
    out = loss(_loss_inputs())
    assert out.loss.ndim == 0 and bool(out.loss.isfinite())
    out.loss.backward()
    assert loss.reference == ("old" if algo.loss.type == "ppo_clip" else "rollout")


def test_config_overrides_reach_the_estimator():
    algo = load_config(
        None,
        [
            "algo=sao",
            "model.tiny_arch=qwen3_moe",
            "algo.advantage.lam_policy=0.9",
            "algo.advantage.gamma=0.99",
        ],
    ).algo
    est = algo.advantage.build()
    assert (est.lam_policy, est.gamma, est.lam_critic) == (0.9, 0.99, 1.0)
    inp = _batch()
    want = _direct(skip_observation_gae, inp, 0.9, gamma=0.99)[0]
    torch.testing.assert_close(est.advantages(inp).advantages, want, rtol=0, atol=0)


# ---- the split API: pure estimate, state update, sampling weights --------------------------------------


@pytest.mark.parametrize("name", ["running_mean", "spo"])
def test_estimate_never_mutates_the_state(name):
    est = ALL_CLASSES[name]()
    state = est.make_state()
    est.update_state(state, _full_batch())  # some history first
    before = state.state_dict()
    first = est.estimate(_full_batch(), state)
    second = est.advantages(_full_batch(), state)
    assert state.state_dict() == before
    assert torch.equal(first.advantages, second.advantages)  # same state, same answer
    est.update_state(state, _full_batch())
    assert state.state_dict() != before


@pytest.mark.parametrize("name", sorted(ALL_CLASSES))
def test_advantages_is_estimate_plus_summary_metrics(name):
    est = ALL_CLASSES[name]()
    state = est.make_state()
    for step in range(3):  # the state carries over between batches
        inp = dataclasses.replace(_full_batch(), outcome_rewards=torch.tensor([1.0, 0.5 * (step % 2)]))
        raw = est.estimate(inp, state)
        full = est.advantages(inp, state)
        assert torch.equal(raw.advantages, full.advantages)
        assert set(full.metrics) == set(raw.metrics) | {"adv/mean", "adv/std"}
        est.update_state(state, inp)


def test_update_state_is_a_no_op_for_stateless_estimators():
    for cls in (GRPO, *GAE_CLASSES.values()):
        est = cls()
        assert type(est).update_state is AdvantageEstimator.update_state
        est.update_state(None, _batch())  # does not raise


def test_spo_update_reads_the_divergence():
    est = SPO()
    state, direct = est.make_state(), SPOTracker()
    inp = _full_batch()
    est.estimate(inp, state)
    est.update_state(state, inp)
    direct.update(["p0", "p1"], torch.tensor([1.0, 0.5]), torch.tensor([0.02, 0.1]))
    assert state.state_dict() == direct.state_dict()
    # Without a divergence the update uses D = 0 (ρ = ρ_max), a different state.
    no_d = est.make_state()
    est.update_state(no_d, dataclasses.replace(inp, divergence=None))
    assert no_d.state_dict() != state.state_dict()


def test_running_mean_update_records_the_outcomes():
    est = RunningMean()
    state = est.make_state()
    est.update_state(state, _batch())
    assert state.baseline(["p0", "p1"]).tolist() == [1.0, 0.5]
    with pytest.raises(TypeError, match="RunningMeanBaseline"):
        est.update_state(None, _batch())


def test_prompt_sampling_weights_come_from_the_spo_state_only():
    spo = SPO()
    state = spo.make_state()
    state.load_state_dict({"prior": [0.5, 0.5], "trackers": [["p0", 5.0, 20.0], ["p1", 12.5, 12.5]]})
    assert spo.prioritizes_prompts
    ids = ["p0", "p1"]
    torch.testing.assert_close(spo.sampling_weights(state, ids), state.sampling_weights(ids))
    for cls in (GRPO, RunningMean, SkipObservationGAE):
        est = cls()
        assert not est.prioritizes_prompts
        assert est.sampling_weights(est.make_state(), ["p0"]) is None
    with pytest.raises(TypeError, match="SPOTracker"):
        spo.sampling_weights(None, ["p0"])
    off = SPO(prioritized_sampling=False)
    assert not off.prioritizes_prompts and off.sampling_weights(state, ids) is None
