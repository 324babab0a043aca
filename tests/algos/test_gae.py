"""Token, skip-observation and step-wise GAE on the packed layout: hand cases, textbook loops, invariants."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sao.algos.gae import (
    length_adaptive_lambda,
    response_mask,
    skip_observation_gae,
    step_gae,
    step_spans,
    token_gae,
)

from .strategies import (
    SPECIAL_LAMBDAS,
    Packed,
    build_packed,
    gammas,
    lambda_args,
    packed_batches,
    reference_skip_observation_gae,
    reference_step_gae,
    reference_token_gae,
)

F64 = torch.float64
TIGHT = {"rtol": 1e-9, "atol": 1e-9}
FLOAT32 = {"rtol": 1e-5, "atol": 1e-4}  # the TD errors carry ×10 junk values, so atol is on that scale
# ``gae_path`` (conftest) patches the dispatch once per test, not per example.
PROPERTY = {"deadline": None, "suppress_health_check": [HealthCheck.function_scoped_fixture]}


def _t(xs, dtype=F64):
    return torch.tensor(xs, dtype=dtype)


def two_turn(rewards=None) -> Packed:
    """``prompt(2) action(2) obs(2) action(2)``; junk 9.0 on prompt/obs values, reward on the last token."""
    r = rewards if rewards is not None else [0, 0, 0, 0, 0, 0, 0, 1.0]
    return Packed(
        rewards=_t(r),
        values=_t([9.0, 9.0, 0.1, 0.2, 9.0, 9.0, 0.3, 0.4]),
        action_mask=torch.tensor([0, 0, 1, 1, 0, 0, 1, 1], dtype=torch.bool),
        cu_seqlens=torch.tensor([0, 8]),
    )


def _call(p: Packed, fn, gamma, lam, **kw):
    return fn(p.rewards, p.values, p.action_mask, p.cu_seqlens, gamma, lam, **kw)


def _on_actions(a):
    """Expand the 4 action-token values of ``two_turn`` to the 8 packed positions."""
    return _t([0.0, 0.0, a[0], a[1], 0.0, 0.0, a[2], a[3]])


# ---- hand-computed cases --------------------------------------------------------------------------------


def test_skip_observation_gae_lambda_one_is_reward_to_go_minus_value(gae_path):
    # γ=λ=1: Â_t = (sum of later rewards) − V(s_t) = 1 − V over the action tokens [.1, .2, .3, .4]; the
    # junk 9.0 on prompt/obs never enters. Returns Â + V = 1 on action tokens, 0 elsewhere.
    adv, ret = _call(two_turn(), skip_observation_gae, 1.0, 1.0)
    torch.testing.assert_close(adv, _on_actions([0.9, 0.8, 0.7, 0.6]))
    torch.testing.assert_close(ret, _on_actions([1.0, 1.0, 1.0, 1.0]))


def test_skip_observation_gae_lambda_half_jumps_over_the_observation(gae_path):
    # Compact chain V = [.1, .2, .3, .4], next V = [.2, .3, .4, 0], r = [0, 0, 0, 1]:
    # δ = [.1, .1, .1, .6]; Â_4 = .6, Â_3 = .1 + .5·.6 = .4, Â_2 = .1 + .5·.4 = .3, Â_1 = .1 + .5·.3 = .25.
    # δ_2 (last token of turn 1) bootstraps from V(a_{1,0}) = .3, not from the observation's 9.0.
    adv, ret = _call(two_turn(), skip_observation_gae, 1.0, 0.5)
    torch.testing.assert_close(adv, _on_actions([0.25, 0.3, 0.4, 0.6]))
    torch.testing.assert_close(ret, _on_actions([0.35, 0.5, 0.7, 1.0]))


def test_skip_observation_gae_discount_below_one(gae_path):
    # γ=.9, λ=1: δ = [.9·.2−.1, .9·.3−.2, .9·.4−.3, 1−.4] = [.08, .07, .06, .6];
    # Â_4 = .6, Â_3 = .06 + .9·.6 = .6, Â_2 = .07 + .9·.6 = .61, Â_1 = .08 + .9·.61 = .629
    # (= γ^(steps to the reward) − V: .729−.1, .81−.2, .9−.3, 1−.4).
    adv, ret = _call(two_turn(), skip_observation_gae, 0.9, 1.0)
    torch.testing.assert_close(adv, _on_actions([0.629, 0.61, 0.6, 0.6]))
    torch.testing.assert_close(ret, _on_actions([0.729, 0.81, 0.9, 1.0]))


def test_skip_observation_gae_per_turn_rewards_on_each_turns_last_action_token(gae_path):
    # Rewards .5 at the end of turn 1 (pos 3) and 1 at the end of turn 2 (pos 7); γ=1, λ=0:
    # δ = [.2−.1, .5+.3−.2, .4−.3, 1−.4] = [.1, .6, .1, .6].
    # λ=1: Â = reward-to-go − V = [1.5−.1, 1.5−.2, 1−.3, 1−.4].
    p = two_turn([0, 0, 0, 0.5, 0, 0, 0, 1.0])
    adv0, _ = _call(p, skip_observation_gae, 1.0, 0.0)
    adv1, ret1 = _call(p, skip_observation_gae, 1.0, 1.0)
    torch.testing.assert_close(adv0, _on_actions([0.1, 0.6, 0.1, 0.6]))
    torch.testing.assert_close(adv1, _on_actions([1.4, 1.3, 0.7, 0.6]))
    torch.testing.assert_close(ret1, _on_actions([1.5, 1.5, 1.0, 1.0]))


def test_token_gae_chains_through_observation_values(gae_path):
    # Chain = positions 2..7 (first action token to the end), V = [.1, .2, 9, 9, .3, .4]; λ=0 so Â = δ:
    # pos 2: 0 + .2 − .1 = .1; pos 3: 0 + V(obs)=9 − .2 = 8.8; pos 6: .4 − .3 = .1; pos 7: 1 − .4 = .6.
    adv, ret = _call(two_turn(), token_gae, 1.0, 0.0)
    torch.testing.assert_close(adv, _on_actions([0.1, 8.8, 0.1, 0.6]))
    torch.testing.assert_close(ret, _on_actions([0.2, 9.0, 0.4, 1.0]))


def test_token_gae_lambda_one_telescopes_but_discount_sees_the_observation_tokens(gae_path):
    # γ=1, λ=1: every δ telescopes, Â = 1 − V exactly as skip-obs (the obs values cancel).
    adv, _ = _call(two_turn(), token_gae, 1.0, 1.0)
    torch.testing.assert_close(adv, _on_actions([0.9, 0.8, 0.7, 0.6]))
    # γ=.9, λ=1: Â_t = γ^(positions to the reward) − V; pos 2 is 5 positions before pos 7, pos 3 is 4.
    adv, _ = _call(two_turn(), token_gae, 0.9, 1.0)
    torch.testing.assert_close(adv, _on_actions([0.9**5 - 0.1, 0.9**4 - 0.2, 0.9 - 0.3, 1.0 - 0.4]))


def test_step_gae_average_hand_case(gae_path):
    # Steps: {2,3} and {6,7}; V(S_1) = (.1+.2)/2 = .15, V(S_2) = (.3+.4)/2 = .35; R = [0, 1].
    # λ=1: δ_1 = 0 + .35 − .15 = .2, δ_2 = 1 − .35 = .65; Â_2 = .65, Â_1 = .2 + .65 = .85.
    # Returns Â + V(S) = 1 on every token of both steps; the value loss trains on all action tokens.
    adv, ret, vmask = _call(two_turn(), step_gae, 1.0, 1.0, step_value="average")
    torch.testing.assert_close(adv, _on_actions([0.85, 0.85, 0.65, 0.65]))
    torch.testing.assert_close(ret, _on_actions([1.0, 1.0, 1.0, 1.0]))
    assert vmask.tolist() == [False, False, True, True, False, False, True, True]


def test_step_gae_last_token_hand_case(gae_path):
    # V(S_1) = V(pos 3) = .2, V(S_2) = V(pos 7) = .4; λ=0: Â_1 = 0 + .4 − .2 = .2, Â_2 = 1 − .4 = .6.
    # Returns Â + V(S) only on each step's last token: .2 + .2 = .4 at pos 3, .6 + .4 = 1 at pos 7.
    adv, ret, vmask = _call(two_turn(), step_gae, 1.0, 0.0, step_value="last_token")
    torch.testing.assert_close(adv, _on_actions([0.2, 0.2, 0.6, 0.6]))
    torch.testing.assert_close(ret, _t([0, 0, 0, 0.4, 0, 0, 0, 1.0]))
    assert vmask.tolist() == [False, False, False, True, False, False, False, True]


def test_step_gae_discount_and_per_turn_rewards_are_summed_per_step(gae_path):
    # Step rewards R_1 = .25 + .25 = .5 (two rewarded tokens in step 1), R_2 = 1; γ=.5, λ=.5, average:
    # δ_1 = .5 + .5·.35 − .15 = .525, δ_2 = 1 − .35 = .65; Â_2 = .65, Â_1 = .525 + .25·.65 = .6875.
    p = two_turn([0, 0, 0.25, 0.25, 0, 0, 0, 1.0])
    adv, ret, _ = _call(p, step_gae, 0.5, 0.5, step_value="average")
    torch.testing.assert_close(adv, _on_actions([0.6875, 0.6875, 0.65, 0.65]))
    torch.testing.assert_close(ret, _on_actions([0.8375, 0.8375, 1.0, 1.0]))


def test_two_trajectories_are_independent_in_hand_case(gae_path):
    # The two-turn trajectory, then a one-token trajectory [prompt, action] with V = .5, reward 2.
    p1 = two_turn()
    p = Packed(
        rewards=torch.cat([p1.rewards, _t([0.0, 2.0])]),
        values=torch.cat([p1.values, _t([9.0, 0.5])]),
        action_mask=torch.cat([p1.action_mask, torch.tensor([False, True])]),
        cu_seqlens=torch.tensor([0, 8, 10]),
    )
    adv, _ = _call(p, skip_observation_gae, 1.0, 0.5)
    # The last action token of trajectory 0 must not bootstrap from trajectory 1 (next value 0 → .6).
    torch.testing.assert_close(adv, _t([0, 0, 0.25, 0.3, 0, 0, 0.4, 0.6, 0, 1.5]))


def test_lambda_per_trajectory_tensor(gae_path):
    p = Packed(
        rewards=torch.cat([two_turn().rewards] * 2),
        values=torch.cat([two_turn().values] * 2),
        action_mask=torch.cat([two_turn().action_mask] * 2),
        cu_seqlens=torch.tensor([0, 8, 16]),
    )
    adv, _ = _call(p, skip_observation_gae, 1.0, torch.tensor([1.0, 0.5]))
    torch.testing.assert_close(
        adv, torch.cat([_on_actions([0.9, 0.8, 0.7, 0.6]), _on_actions([0.25, 0.3, 0.4, 0.6])])
    )


# ---- property tests against the per-token loops ---------------------------------------------------------


@st.composite
def gae_cases(draw, dtype=F64):
    p = draw(packed_batches(dtype))
    return p, draw(gammas()), draw(lambda_args(p.num_seqs))


def _check(got, want, dtype):
    torch.testing.assert_close(got.double(), want, **(TIGHT if dtype == F64 else FLOAT32))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@settings(max_examples=60, **PROPERTY)
@given(data=st.data())
def test_skip_observation_gae_matches_reference_loop(gae_path, dtype, data):
    p, gamma, lam = data.draw(gae_cases(dtype))
    adv, ret = _call(p, skip_observation_gae, gamma, lam)
    want_adv, want_ret = reference_skip_observation_gae(p, gamma, lam)
    assert adv.dtype == dtype and ret.dtype == dtype
    _check(adv, want_adv, dtype)
    _check(ret, want_ret, dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@settings(max_examples=60, **PROPERTY)
@given(data=st.data())
def test_token_gae_matches_reference_loop(gae_path, dtype, data):
    p, gamma, lam = data.draw(gae_cases(dtype))
    adv, ret = _call(p, token_gae, gamma, lam)
    want_adv, want_ret = reference_token_gae(p, gamma, lam)
    assert adv.dtype == dtype and ret.dtype == dtype
    _check(adv, want_adv, dtype)
    _check(ret, want_ret, dtype)


@pytest.mark.parametrize("step_value", ["average", "last_token"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@settings(max_examples=50, **PROPERTY)
@given(data=st.data())
def test_step_gae_matches_reference_loop(gae_path, dtype, step_value, data):
    p, gamma, lam = data.draw(gae_cases(dtype))
    adv, ret, vmask = _call(p, step_gae, gamma, lam, step_value=step_value)
    want_adv, want_ret, want_vmask = reference_step_gae(p, gamma, lam, step_value)
    assert adv.dtype == dtype and ret.dtype == dtype
    _check(adv, want_adv, dtype)
    _check(ret, want_ret, dtype)
    assert torch.equal(vmask, want_vmask)


def _long_batch(dtype) -> Packed:
    # One trajectory with ~4600 action tokens in 23 turns (4 scan levels: 16^3 < 4600), one with ~1300
    # response tokens, and a short one, so rows of very different widths share the padded layout.
    def turns(n_turns, action, obs):
        return [False] * 5 + ([True] * action + [False] * obs) * n_turns

    return build_packed([turns(23, 200, 37), turns(13, 60, 40), turns(2, 3, 2)], seed=7, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("lam", SPECIAL_LAMBDAS)
def test_long_trajectories_match_reference_loops(gae_path, dtype, lam):
    p = _long_batch(dtype)
    for gamma in (1.0, 0.999):
        _check(
            _call(p, skip_observation_gae, gamma, lam)[0],
            reference_skip_observation_gae(p, gamma, lam)[0],
            dtype,
        )
        _check(_call(p, token_gae, gamma, lam)[0], reference_token_gae(p, gamma, lam)[0], dtype)
    _check(
        _call(p, step_gae, 1.0, lam, step_value="average")[0],
        reference_step_gae(p, 1.0, lam, "average")[0],
        dtype,
    )


def test_long_trajectories_with_per_trajectory_lambda_near_zero_and_one(gae_path):
    p = _long_batch(F64)
    lam = torch.tensor([1.0 - 1e-9, 1e-13, 0.005], dtype=F64)
    _check(_call(p, skip_observation_gae, 1.0, lam)[0], reference_skip_observation_gae(p, 1.0, lam)[0], F64)
    _check(_call(p, token_gae, 1.0, lam)[0], reference_token_gae(p, 1.0, lam)[0], F64)


# ---- invariants ------------------------------------------------------------------------------------------


ESTIMATORS = {
    "skip_observation_gae": lambda p, g, lam: _call(p, skip_observation_gae, g, lam)[:2],
    "token_gae": lambda p, g, lam: _call(p, token_gae, g, lam)[:2],
    "step_average": lambda p, g, lam: _call(p, step_gae, g, lam, step_value="average")[:2],
    "step_last_token": lambda p, g, lam: _call(p, step_gae, g, lam, step_value="last_token")[:2],
}


@pytest.mark.parametrize("name", list(ESTIMATORS))
@settings(max_examples=40, **PROPERTY)
@given(data=st.data())
def test_advantages_and_returns_are_exactly_zero_off_action_tokens(gae_path, name, data):
    p, gamma, lam = data.draw(gae_cases())
    adv, ret = ESTIMATORS[name](p, gamma, lam)
    off = ~p.action_mask
    assert bool((adv[off] == 0).all()) and bool((ret[off] == 0).all())


@pytest.mark.parametrize("name", list(ESTIMATORS))
@settings(max_examples=40, **PROPERTY)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_changing_one_trajectory_leaves_the_others_unchanged(gae_path, name, data, seed):
    p, gamma, lam = data.draw(gae_cases())
    victim = data.draw(st.integers(0, p.num_seqs - 1))
    s, e = p.bounds()[victim]
    gen = torch.Generator().manual_seed(seed)
    values, rewards = p.values.clone(), p.rewards.clone()
    values[s:e] = torch.randn(e - s, generator=gen, dtype=F64) * 5
    rewards[s:e] = torch.where(p.action_mask[s:e], torch.randn(e - s, generator=gen, dtype=F64), 0.0)
    changed = Packed(rewards, values, p.action_mask, p.cu_seqlens)
    before, after = ESTIMATORS[name](p, gamma, lam), ESTIMATORS[name](changed, gamma, lam)
    others = torch.ones_like(p.action_mask)
    others[s:e] = False
    for x, y in zip(before, after, strict=True):
        assert torch.equal(x[others], y[others])


@pytest.mark.parametrize("name", list(ESTIMATORS))
@settings(max_examples=30, **PROPERTY)
@given(data=st.data())
def test_trajectory_result_does_not_depend_on_the_rest_of_the_batch(gae_path, name, data):
    p, gamma, lam = data.draw(gae_cases())
    lam_list = lam.tolist() if isinstance(lam, torch.Tensor) else [lam] * p.num_seqs
    adv, ret = ESTIMATORS[name](p, gamma, lam)
    for b, (s, e) in enumerate(p.bounds()):
        if not bool(p.action_mask[s:e].any()):
            continue  # covered by test_trajectories_without_action_tokens_get_zeros
        alone = Packed(p.rewards[s:e], p.values[s:e], p.action_mask[s:e], torch.tensor([0, e - s]))
        adv_b, ret_b = ESTIMATORS[name](alone, gamma, lam_list[b])
        torch.testing.assert_close(adv_b, adv[s:e], **TIGHT)
        torch.testing.assert_close(ret_b, ret[s:e], **TIGHT)


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_reward_on_a_non_action_token_raises(gae_path, name):
    p = two_turn([0, 0, 0, 0, 1.0, 0, 0, 1.0])  # reward on an observation token
    with pytest.raises(ValueError, match="rewards must be 0 on non-action tokens"):
        ESTIMATORS[name](p, 1.0, 1.0)


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_inputs_are_not_mutated_and_values_are_detached(gae_path, name):
    p = two_turn()
    values = p.values.clone().requires_grad_(True)
    before = (p.rewards.clone(), values.detach().clone(), p.action_mask.clone())
    adv, ret = ESTIMATORS[name](Packed(p.rewards, values, p.action_mask, p.cu_seqlens), 1.0, 0.7)
    assert not adv.requires_grad and not ret.requires_grad
    assert torch.equal(p.rewards, before[0]) and torch.equal(values.detach(), before[1])
    assert torch.equal(p.action_mask, before[2])


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_trajectories_without_action_tokens_get_zeros(gae_path, name):
    # A batch where no trajectory produced an action token (e.g. every generation failed before its
    # first token): nothing to estimate, every output is 0.
    p = Packed(_t([0.0] * 5), _t([3.0] * 5), torch.zeros(5, dtype=torch.bool), torch.tensor([0, 2, 5]))
    adv, ret = ESTIMATORS[name](p, 1.0, 1.0)
    assert torch.equal(adv, torch.zeros(5, dtype=F64)) and torch.equal(ret, torch.zeros(5, dtype=F64))


@pytest.mark.parametrize("lam", [-0.1, 1.1, float("nan")])
def test_lambda_outside_unit_interval_raises(lam):
    with pytest.raises(ValueError, match="lam"):
        _call(two_turn(), skip_observation_gae, 1.0, lam)


def test_lambda_tensor_of_wrong_length_raises():
    with pytest.raises(ValueError, match="lam"):
        _call(two_turn(), skip_observation_gae, 1.0, torch.tensor([0.5, 0.5]))


def test_mismatched_shapes_raise():
    p = two_turn()
    with pytest.raises(ValueError, match="values"):
        skip_observation_gae(p.rewards, p.values[:-1], p.action_mask, p.cu_seqlens)
    with pytest.raises(ValueError, match="cu_seqlens"):
        skip_observation_gae(p.rewards, p.values, p.action_mask, torch.tensor([1, 8]))


def test_step_value_must_be_known():
    with pytest.raises(ValueError, match="step_value"):
        _call(two_turn(), step_gae, 1.0, 1.0, step_value="first_token")


# ---- helpers: λ rule, response mask, step spans ---------------------------------------------------------


def test_length_adaptive_lambda_hand_values():
    # 1 − 1/(1.5·l): l=0 → 0 (clamped from −inf), l=1 → 1 − 2/3 = 1/3, l=2 → 2/3, l=100 → 1 − 1/150.
    lam = length_adaptive_lambda(torch.tensor([0, 1, 2, 100]), 1.5)
    assert lam.dtype == torch.float32
    torch.testing.assert_close(lam, torch.tensor([0.0, 1 / 3, 2 / 3, 1 - 1 / 150]))
    # Small α makes 1 − 1/(αl) negative: clamped to 0.
    torch.testing.assert_close(length_adaptive_lambda(torch.tensor([1, 4]), 0.5), torch.tensor([0.0, 0.5]))


@settings(max_examples=50, **PROPERTY)
@given(
    lengths=st.lists(st.integers(0, 100_000), min_size=1, max_size=8),
    alpha=st.floats(0.01, 100.0),
)
def test_length_adaptive_lambda_is_the_clamped_formula(lengths, alpha):
    want = [0.0 if n == 0 else min(max(1.0 - 1.0 / (alpha * n), 0.0), 1.0) for n in lengths]
    got = length_adaptive_lambda(torch.tensor(lengths), alpha)
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float32))
    assert bool(((got >= 0) & (got <= 1)).all())


def test_length_adaptive_lambda_rejects_non_positive_alpha():
    with pytest.raises(ValueError, match="alpha"):
        length_adaptive_lambda(torch.tensor([3]), 0.0)


def test_response_mask_runs_from_first_action_token_to_trajectory_end():
    mask = torch.tensor([0, 1, 0, 1, 0, 0, 0, 1, 0], dtype=torch.bool)
    cu = torch.tensor([0, 5, 7, 9])  # second trajectory has no action token
    assert response_mask(mask, cu).tolist() == [False, True, True, True, True, False, False, True, True]


def test_step_spans_split_at_observations_and_trajectory_boundaries():
    # Trajectory 0: [p, a, a, o, a]; trajectory 1 starts with an action right after trajectory 0's
    # last action: [a, a] must be a new step although the tokens are adjacent in the packed axis.
    mask = torch.tensor([0, 1, 1, 0, 1, 1, 1], dtype=torch.bool)
    step_of_token, step_cu, is_last = step_spans(mask, torch.tensor([0, 5, 7]))
    assert step_of_token.tolist() == [-1, 0, 0, -1, 1, 2, 2]
    assert step_cu.tolist() == [0, 2, 3]
    assert is_last.tolist() == [False, False, True, False, True, False, True]


def test_turn_ids_split_back_to_back_turns_into_separate_steps(gae_path):
    # [prompt, a, a, a, a] where the action tokens are two turns (turn ids 1, 1, 2, 2) with no
    # observation between. With turn ids: steps {1,2}, {3,4}, V(S) = .15, .35, λ=1 → Â = .85, .65 as in the
    # two-turn hand case. Without: one step with V = .25 → Â = 1 − .25 = .75 everywhere.
    rewards = _t([0, 0, 0, 0, 1.0])
    values = _t([9.0, 0.1, 0.2, 0.3, 0.4])
    mask = torch.tensor([0, 1, 1, 1, 1], dtype=torch.bool)
    cu = torch.tensor([0, 5])
    turn_ids = torch.tensor([0, 1, 1, 2, 2])
    adv, _, _ = step_gae(rewards, values, mask, cu, 1.0, 1.0, "average", turn_ids)
    torch.testing.assert_close(adv, _t([0, 0.85, 0.85, 0.65, 0.65]))
    adv, _, _ = step_gae(rewards, values, mask, cu, 1.0, 1.0, "average")
    torch.testing.assert_close(adv, _t([0, 0.75, 0.75, 0.75, 0.75]))
    step_of_token, step_cu, is_last = step_spans(mask, cu, turn_ids)
    assert step_of_token.tolist() == [-1, 0, 0, 1, 1]
    assert step_cu.tolist() == [0, 2]
    assert is_last.tolist() == [False, False, True, False, True]


def test_concurrent_calls_from_threads_give_identical_results(gae_path):
    # The async runtime may compute advantages from several threads; the CPU kernel's launches must not
    # interfere (numba's default threading layer aborts on concurrent parallel launches without a lock).
    import threading

    gen = torch.Generator().manual_seed(0)
    total = 40_000
    mask = torch.rand(total, generator=gen) > 0.2
    cu = torch.arange(0, total + 1, 1000)
    mask[cu[1:] - 1] = True
    rewards = torch.zeros(total)
    rewards[cu[1:] - 1] = 1.0
    values = torch.randn(total, generator=gen)
    expected = skip_observation_gae(rewards, values, mask, cu, 1.0, 0.9)[0]
    mismatches: list[int] = []

    def worker() -> None:
        for _ in range(10):
            if not torch.equal(skip_observation_gae(rewards, values, mask, cu, 1.0, 0.9)[0], expected):
                mismatches.append(1)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not mismatches


def test_the_numba_kernel_keeps_to_the_torch_thread_budget_and_does_not_spin():
    """numba's default OpenMP pool uses every core and its idle threads spin: a 1-thread trainer would burn
    a second core. The kernel runs on the sleeping workqueue pool with at most torch's thread count."""
    from sao.algos.kernels import chain_gae_cpu, numba_available

    if not numba_available():
        pytest.skip("numba is not installed (or SAO_NUMBA=0)")
    import numba

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        ones = torch.ones(4, dtype=torch.bool)
        rewards = torch.tensor([0.0, 0.0, 0.0, 1.0])
        adv, _ = chain_gae_cpu(rewards, torch.zeros(4), ones, ones, torch.tensor([0, 4]), 1.0, torch.ones(1))
        assert adv.tolist() == [1.0, 1.0, 1.0, 1.0]
        assert numba.threading_layer() == "workqueue" and numba.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
