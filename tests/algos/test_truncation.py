"""Truncated trajectories: ``algo.advantage.truncation`` "terminal" (default) vs "bootstrap" (GAE family).

With "bootstrap", a trajectory cut by the token or turn budget takes the critic's value at its last action
token as the next value after it: ``δ_last = r_last + γ·V_last − V_last`` (instead of ``r_last − V_last``).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sao.algos import GRPO, AdvantageInputs, SkipObservationGAE, StepGAE, TokenGAE
from sao.algos.gae import skip_observation_gae, step_gae, token_gae

from .strategies import (
    Packed,
    gammas,
    lambda_args,
    packed_batches,
    reference_skip_observation_gae,
    reference_step_gae,
    reference_token_gae,
)

F64 = torch.float64
PROPERTY = {"deadline": None, "suppress_health_check": [HealthCheck.function_scoped_fixture]}

# Two trajectories, observation tokens inside both (junk value 9 on prompt/observation tokens):
#   0 (terminal):  P a a O a      V = [9, .5, .6, 9, .7]          reward 1 on its last action token
#   1 (truncated): P a a O O a a  V = [9, .2, .4, 9, 9, .5, .8]   reward .5 on its last action token
# Action positions: 1, 2, 4 | 6, 7, 10, 11. Trajectory 1's last action token has V_last = .8.
ACTIONS = [1, 2, 4, 6, 7, 10, 11]
TRUNCATED = torch.tensor([False, True])


def _packed() -> Packed:
    return Packed(
        rewards=torch.tensor([0, 0, 0, 0, 1.0, 0, 0, 0, 0, 0, 0, 0.5], dtype=F64),
        values=torch.tensor([9, 0.5, 0.6, 9, 0.7, 9, 0.2, 0.4, 9, 9, 0.5, 0.8], dtype=F64),
        action_mask=torch.tensor([0, 1, 1, 0, 1, 0, 1, 1, 0, 0, 1, 1], dtype=torch.bool),
        cu_seqlens=torch.tensor([0, 5, 12]),
    )


def _on_actions(xs: list[float]) -> torch.Tensor:
    out = torch.zeros(12, dtype=F64)
    out[ACTIONS] = torch.tensor(xs, dtype=F64)
    return out


def _call(fn, gamma, lam, bootstrap, **kw):
    p = _packed()
    return fn(p.rewards, p.values, p.action_mask, p.cu_seqlens, gamma, lam, bootstrap=bootstrap, **kw)


# Skip-observation GAE, advantages and returns (= Â + V) on the 7 action tokens. Trajectory 0 is the same
# in both modes. Trajectory 1, chain V = [.2, .4, .5, .8], r = [0, 0, 0, .5]:
#   terminal  δ = [γ·.4 − .2, γ·.5 − .4, γ·.8 − .5, .5 − .8]
#   bootstrap δ_last = .5 + γ·.8 − .8 (the rest unchanged), so Â_t gains γ·.8·(γλ)^(3−t).
# γ=1, λ=1:   Â = G − V with G = .5 (terminal) or .5 + .8 = 1.3 (bootstrap).
# γ=1, λ=.5:  terminal δ = [.2, .1, .3, −.3] → Â_3 = −.3, Â_2 = .3 − .15 = .15, Â_1 = .1 + .075 = .175,
#             Â_0 = .2 + .0875 = .2875; bootstrap δ_3 = .5 → Â = [.3875, .375, .55, .5].
# γ=.9, λ=1:  terminal Â = .5·.9^(3−t) − V = [.1645, .005, −.05, −.3];
#             bootstrap adds .72·.9^(3−t) = [.52488, .5832, .648, .72] → [.68938, .5882, .598, .42].
# γ=.9, λ=.5: terminal δ = [.16, .05, .22, −.3] → Â_3 = −.3, Â_2 = .22 − .135 = .085,
#             Â_1 = .05 + .45·.085 = .08825, Â_0 = .16 + .45·.08825 = .1997125;
#             bootstrap adds .72·.45^(3−t) = [.06561, .1458, .324, .72] → [.2653225, .23405, .409, .42].
# Trajectory 0 (V = [.5, .6, .7], r = [0, 0, 1]): γ=1, λ=1: [.5, .4, .3]; γ=1, λ=.5: δ = [.1, .1, .3] →
# [.225, .25, .3]; γ=.9, λ=1: .9^(2−t) − V = [.31, .3, .3]; γ=.9, λ=.5: δ = [.04, .03, .3] →
# [.11425, .165, .3].
SKIP_OBS_CASES = {
    (1.0, 1.0): {
        "terminal": ([0.5, 0.4, 0.3, 0.3, 0.1, 0.0, -0.3], [1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5]),
        "bootstrap": ([0.5, 0.4, 0.3, 1.1, 0.9, 0.8, 0.5], [1.0, 1.0, 1.0, 1.3, 1.3, 1.3, 1.3]),
    },
    (1.0, 0.5): {
        "terminal": (
            [0.225, 0.25, 0.3, 0.2875, 0.175, 0.15, -0.3],
            [0.725, 0.85, 1.0, 0.4875, 0.575, 0.65, 0.5],
        ),
        "bootstrap": (
            [0.225, 0.25, 0.3, 0.3875, 0.375, 0.55, 0.5],
            [0.725, 0.85, 1.0, 0.5875, 0.775, 1.05, 1.3],
        ),
    },
    (0.9, 1.0): {
        "terminal": (
            [0.31, 0.3, 0.3, 0.1645, 0.005, -0.05, -0.3],
            [0.81, 0.9, 1.0, 0.3645, 0.405, 0.45, 0.5],
        ),
        "bootstrap": (
            [0.31, 0.3, 0.3, 0.68938, 0.5882, 0.598, 0.42],
            [0.81, 0.9, 1.0, 0.88938, 0.9882, 1.098, 1.22],
        ),
    },
    (0.9, 0.5): {
        "terminal": (
            [0.11425, 0.165, 0.3, 0.1997125, 0.08825, 0.085, -0.3],
            [0.61425, 0.765, 1.0, 0.3997125, 0.48825, 0.585, 0.5],
        ),
        "bootstrap": (
            [0.11425, 0.165, 0.3, 0.2653225, 0.23405, 0.409, 0.42],
            [0.61425, 0.765, 1.0, 0.4653225, 0.63405, 0.909, 1.22],
        ),
    },
}


@pytest.mark.parametrize(("gamma", "lam"), list(SKIP_OBS_CASES))
def test_skip_observation_gae_terminal_vs_bootstrap_hand_cases(gae_path, gamma, lam):
    for mode, bootstrap in (("terminal", None), ("terminal", torch.tensor([False, False]))):
        adv, ret = _call(skip_observation_gae, gamma, lam, bootstrap)
        want_adv, want_ret = SKIP_OBS_CASES[(gamma, lam)][mode]
        torch.testing.assert_close(adv, _on_actions(want_adv))
        torch.testing.assert_close(ret, _on_actions(want_ret))
    adv, ret = _call(skip_observation_gae, gamma, lam, TRUNCATED)
    want_adv, want_ret = SKIP_OBS_CASES[(gamma, lam)]["bootstrap"]
    torch.testing.assert_close(adv, _on_actions(want_adv))
    torch.testing.assert_close(ret, _on_actions(want_ret))


def test_token_gae_bootstrap_hand_case(gae_path):
    # γ=.9, λ=1: returns are discounted Monte-Carlo along the chain, which here includes trajectory 1's two
    # observation tokens (positions 8, 9): positions 6, 7, 10, 11 are 5, 4, 1, 0 chain steps before the
    # reward → terminal .5·.9^k = [.295245, .32805, .45, .5]; bootstrap adds .8·.9^(k+1) =
    # [.4251528, .472392, .648, .72]. Trajectory 0 (chain 1..4): [.9^3, .9^2, 1] = [.729, .81, 1].
    v_actions = [0.5, 0.6, 0.7, 0.2, 0.4, 0.5, 0.8]
    terminal = [0.729, 0.81, 1.0, 0.295245, 0.32805, 0.45, 0.5]
    bootstrap = [0.729, 0.81, 1.0, 0.7203978, 0.800442, 1.098, 1.22]
    for bootstrap_mask, want in ((None, terminal), (TRUNCATED, bootstrap)):
        adv, ret = _call(token_gae, 0.9, 1.0, bootstrap_mask)
        torch.testing.assert_close(ret, _on_actions(want))
        torch.testing.assert_close(adv, _on_actions([r - v for r, v in zip(want, v_actions, strict=True)]))


def test_token_gae_bootstraps_from_the_last_token_of_the_chain():
    # A trailing observation (not produced by the agent loop, which cuts after the last action token): the
    # chain ends on it, so the next value after it is its own value. P a O, V = [9, .5, .3], r = 1 on a:
    # γ=λ=1: return at a = 1 + 0 (obs reward) + V(O) = 1.3 when bootstrapped, 1 when terminal.
    args = (
        torch.tensor([0, 1.0, 0], dtype=F64),
        torch.tensor([9, 0.5, 0.3], dtype=F64),
        torch.tensor([0, 1, 0], dtype=torch.bool),
        torch.tensor([0, 3]),
        1.0,
        1.0,
    )
    assert token_gae(*args)[1].tolist() == pytest.approx([0, 1.0, 0])
    assert token_gae(*args, bootstrap=torch.tensor([True]))[1].tolist() == pytest.approx([0, 1.3, 0])


@pytest.mark.parametrize(
    ("step_value", "gamma", "lam", "mode", "want_adv", "want_ret"),
    [
        # Steps: trajectory 0 {1, 2}, {4}; trajectory 1 {6, 7}, {10, 11}. Average step values: [.55, .7] and
        # [.3, .65]; last-token step values: [.6, .7] and [.4, .8]. Step rewards [0, 1] and [0, .5].
        # γ=λ=1, average: terminal traj 1 Â = [.65 − .3 + (.5 − .65), .5 − .65] = [.2, −.15], return .5;
        # bootstrap the last step's next value is V(S_2) = .65: Â = [.85, .5], return 1.15.
        (
            "average",
            1.0,
            1.0,
            "terminal",
            [0.45, 0.45, 0.3, 0.2, 0.2, -0.15, -0.15],
            [1, 1, 1, 0.5, 0.5, 0.5, 0.5],
        ),
        ("average", 1.0, 1.0, "bootstrap", [0.45, 0.45, 0.3, 0.85, 0.85, 0.5, 0.5], [1, 1, 1] + [1.15] * 4),
        # γ=.9, λ=.5, average, traj 1: δ_1 = .9·.65 − .3 = .285; terminal δ_2 = .5 − .65 = −.15,
        # Â_1 = .285 − .45·.15 = .2175; bootstrap δ_2 = .5 + .9·.65 − .65 = .435, Â_1 = .285 + .45·.435
        # = .48075. Traj 0: δ = [.9·.7 − .55, 1 − .7] = [.08, .3] → Â = [.215, .3].
        (
            "average",
            0.9,
            0.5,
            "terminal",
            [0.215, 0.215, 0.3, 0.2175, 0.2175, -0.15, -0.15],
            [0.765, 0.765, 1.0, 0.5175, 0.5175, 0.5, 0.5],
        ),
        (
            "average",
            0.9,
            0.5,
            "bootstrap",
            [0.215, 0.215, 0.3, 0.48075, 0.48075, 0.435, 0.435],
            [0.765, 0.765, 1.0, 0.78075, 0.78075, 1.085, 1.085],
        ),
        # last_token, γ=λ=1, traj 1: terminal Â = [.8 − .4 − .3, .5 − .8] = [.1, −.3]; bootstrap next
        # value V(S_2) = .8: Â = [.9, .5]; targets only on each step's last token (positions 7, 11).
        (
            "last_token",
            1.0,
            1.0,
            "terminal",
            [0.4, 0.4, 0.3, 0.1, 0.1, -0.3, -0.3],
            [0, 1, 1, 0, 0.5, 0, 0.5],
        ),
        ("last_token", 1.0, 1.0, "bootstrap", [0.4, 0.4, 0.3, 0.9, 0.9, 0.5, 0.5], [0, 1, 1, 0, 1.3, 0, 1.3]),
    ],
)
def test_step_gae_terminal_vs_bootstrap_hand_cases(
    gae_path, step_value, gamma, lam, mode, want_adv, want_ret
):
    bootstrap = TRUNCATED if mode == "bootstrap" else None
    adv, ret, _ = _call(step_gae, gamma, lam, bootstrap, step_value=step_value)
    torch.testing.assert_close(adv, _on_actions(want_adv))
    torch.testing.assert_close(ret, _on_actions([float(x) for x in want_ret]))


def test_bootstrap_of_the_wrong_shape_raises():
    with pytest.raises(ValueError, match="bootstrap"):
        _call(skip_observation_gae, 1.0, 1.0, torch.tensor([True]))


@st.composite
def bootstrap_cases(draw):
    p = draw(packed_batches())
    boot = torch.tensor(draw(st.lists(st.booleans(), min_size=p.num_seqs, max_size=p.num_seqs)))
    return p, draw(gammas()), draw(lambda_args(p.num_seqs)), boot


@settings(max_examples=50, **PROPERTY)
@given(data=st.data())
def test_bootstrap_matches_the_reference_loops(gae_path, data):
    p, gamma, lam, boot = data.draw(bootstrap_cases())
    args = (p.rewards, p.values, p.action_mask, p.cu_seqlens, gamma, lam)
    tight = {"rtol": 1e-9, "atol": 1e-9}
    for got, want in (
        (skip_observation_gae(*args, bootstrap=boot), reference_skip_observation_gae(p, gamma, lam, boot)),
        (token_gae(*args, bootstrap=boot), reference_token_gae(p, gamma, lam, boot)),
    ):
        torch.testing.assert_close(got[0], want[0], **tight)
        torch.testing.assert_close(got[1], want[1], **tight)
    for step_value in ("average", "last_token"):
        got = step_gae(*args, step_value=step_value, bootstrap=boot)
        want = reference_step_gae(p, gamma, lam, step_value, boot)
        torch.testing.assert_close(got[0], want[0], **tight)
        torch.testing.assert_close(got[1], want[1], **tight)


@settings(max_examples=30, **PROPERTY)
@given(data=st.data())
def test_skip_observation_bootstrap_equals_adding_gamma_v_last_to_the_last_reward(gae_path, data):
    p, gamma, lam, boot = data.draw(bootstrap_cases())
    rewards = p.rewards.clone()
    for b, (s, e) in enumerate(p.bounds()):
        actions = [t for t in range(s, e) if p.action_mask[t]]
        if boot[b] and actions:
            rewards[actions[-1]] += gamma * p.values[actions[-1]]
    got = skip_observation_gae(p.rewards, p.values, p.action_mask, p.cu_seqlens, gamma, lam, bootstrap=boot)
    want = skip_observation_gae(rewards, p.values, p.action_mask, p.cu_seqlens, gamma, lam)
    torch.testing.assert_close(got[0], want[0], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(got[1], want[1], rtol=1e-9, atol=1e-9)


# ---- through the estimators: algo.advantage.truncation ------------------------------------------------

GAE_CLASSES = {"skip_observation_gae": SkipObservationGAE, "token_gae": TokenGAE, "step_gae": StepGAE}


def _inputs(truncated: torch.Tensor | None = TRUNCATED) -> AdvantageInputs:
    p = _packed()
    return AdvantageInputs(
        token_rewards=p.rewards,
        action_mask=p.action_mask,
        cu_seqlens=p.cu_seqlens,
        values=p.values,
        prompt_ids=["p0", "p1"],
        group_ids=["g", "g"],
        truncated=truncated,
    )


@pytest.mark.parametrize("cls", GAE_CLASSES.values())
def test_default_truncation_is_terminal(cls):
    assert cls().truncation == "terminal"


@pytest.mark.parametrize(("gamma", "lam"), list(SKIP_OBS_CASES))
def test_truncation_mode_reaches_advantages_and_critic_targets(gae_path, gamma, lam):
    # Policy λ = lam, critic λ = lam: the advantages and the targets are the hand cases above.
    for mode in ("terminal", "bootstrap"):
        est = SkipObservationGAE(gamma=gamma, lam_policy=lam, lam_critic=lam, truncation=mode)
        want_adv, want_ret = SKIP_OBS_CASES[(gamma, lam)][mode]
        torch.testing.assert_close(est.estimate(_inputs(), None).advantages, _on_actions(want_adv))
        torch.testing.assert_close(est.advantages(_inputs()).advantages, _on_actions(want_adv))
        targets = est.targets(_inputs())
        torch.testing.assert_close(targets.returns, _on_actions(want_ret))
        assert targets.value_mask is None


def test_decoupled_lambda_with_bootstrap():
    # Advantages with the policy λ = .5, targets with the critic λ = 1 (γ = 1): Monte-Carlo 1.3 for the
    # truncated trajectory (.5 + V_last .8), 1 for the terminal one.
    est = SkipObservationGAE(lam_policy=0.5, lam_critic=1.0, truncation="bootstrap")
    advantages = est.advantages(_inputs()).advantages
    torch.testing.assert_close(advantages, _on_actions(SKIP_OBS_CASES[(1.0, 0.5)]["bootstrap"][0]))
    torch.testing.assert_close(est.targets(_inputs()).returns, _on_actions([1, 1, 1, 1.3, 1.3, 1.3, 1.3]))


def test_step_gae_bootstrap_targets_and_value_mask():
    est = StepGAE(lam_policy=1.0, step_value="last_token", truncation="bootstrap")
    targets = est.targets(_inputs())
    torch.testing.assert_close(targets.returns, _on_actions([0, 1, 1, 0, 1.3, 0, 1.3]))
    assert targets.value_mask.nonzero().squeeze(1).tolist() == [2, 4, 7, 11]


@pytest.mark.parametrize("name", sorted(GAE_CLASSES))
def test_bootstrap_without_truncation_flags_or_in_terminal_mode_changes_nothing(name):
    def run(inputs, mode):
        est = GAE_CLASSES[name](lam_policy=0.5, truncation=mode)
        return est.advantages(inputs).advantages, est.targets(inputs).returns

    base_adv, base_ret = run(_inputs(None), "terminal")
    for inputs, mode in ((_inputs(None), "bootstrap"), (_inputs(), "terminal")):
        adv, ret = run(inputs, mode)
        assert torch.equal(adv, base_adv) and torch.equal(ret, base_ret)
    boot_adv, boot_ret = run(_inputs(), "bootstrap")
    assert not torch.equal(boot_adv, base_adv) and not torch.equal(boot_ret, base_ret)
    traj0 = slice(0, 5)  # the terminal trajectory is unaffected
    assert torch.equal(boot_adv[traj0], base_adv[traj0])


def test_critic_free_estimators_ignore_truncation():
    inputs = dataclasses.replace(_inputs(), values=None)
    flagged = GRPO().advantages(inputs)
    unflagged = GRPO().advantages(dataclasses.replace(inputs, truncated=None))
    assert torch.equal(flagged.advantages, unflagged.advantages)
