"""Single-rollout baselines: running-mean rewards (per prompt / global) and SPO's Beta tracker."""

from __future__ import annotations

import math

import pytest
import torch

from sao.algos.baselines import RunningMeanBaseline, SPOTracker

F64 = torch.float64


def _r(*xs):
    return torch.tensor(xs, dtype=torch.float32)


def _spo(**beta: tuple[float, float]) -> SPOTracker:
    """A default tracker whose prompts start at the given ``(α, β)``."""
    spo = SPOTracker()
    spo.load_state_dict({"prior": [0.5, 0.5], "trackers": [[k, a, b] for k, (a, b) in beta.items()]})
    return spo


# ---- RunningMeanBaseline -------------------------------------------------------------------------------


def test_running_mean_uses_only_history_from_before_the_batch():
    base = RunningMeanBaseline(window=8, scope="prompt")
    # Empty history: baseline 0 for every trajectory, also for the second "a" of the same batch.
    assert base.advantages(["a", "a", "b"], _r(1.0, 0.0, 1.0)).tolist() == [1.0, 0.0, 1.0]
    # Now a has [1, 0] (mean .5), b has [1].
    assert base.advantages(["a", "b", "c"], _r(1.0, 0.0, 0.25)).tolist() == [0.5, -1.0, 0.25]
    torch.testing.assert_close(base.baseline(["a", "b", "c", "d"]), _r(2 / 3, 0.5, 0.25, 0.0))


def test_running_mean_window_evicts_the_oldest_rewards():
    base = RunningMeanBaseline(window=8, scope="prompt")
    for k in range(10):
        base.update(["p"], _r(float(k)))
    # The 8 most recent rewards are 2..9.
    assert base.baseline(["p"]).item() == pytest.approx(5.5)
    # One batch with more rewards than the window keeps the last 8 in batch order.
    base.update(["q"] * 10, torch.arange(10, dtype=torch.float32))
    assert base.baseline(["q"]).item() == pytest.approx(5.5)


def test_running_mean_global_scope_pools_all_prompts_with_window_128():
    base = RunningMeanBaseline(window=128, scope="global")
    rewards = torch.arange(130, dtype=torch.float32)
    base.update([f"p{k % 7}" for k in range(130)], rewards)
    want = float(rewards[2:].mean())  # the 128 most recent, whatever their prompt
    torch.testing.assert_close(base.baseline(["p0", "never-seen"]), _r(want, want))
    assert base.advantages(["x"], _r(100.0)).item() == pytest.approx(100.0 - want)


def test_running_mean_empty_history_gives_empty_value():
    base = RunningMeanBaseline(window=4, scope="prompt", empty_value=0.5)
    assert base.advantages(["new"], _r(1.0)).tolist() == [0.5]


def test_running_mean_state_dict_round_trip_gives_identical_future_outputs():
    base = RunningMeanBaseline(window=3, scope="prompt", empty_value=0.25)
    base.update(["a", "b", "a", 7, "a", "a"], _r(1.0, 0.0, 0.5, 1.0, 0.0, 1.0))
    restored = RunningMeanBaseline(window=3, scope="prompt")
    restored.load_state_dict(base.state_dict())
    for ids, rewards in [(["a", "b", 7, "z"], _r(0.0, 1.0, 1.0, 0.5)), (["a", "z", "b"], _r(1.0, 0.0, 0.0))]:
        assert torch.equal(base.advantages(ids, rewards), restored.advantages(ids, rewards))
    assert base.state_dict() == restored.state_dict()


def test_running_mean_rejects_a_state_for_another_window_or_scope():
    state = RunningMeanBaseline(window=8, scope="prompt").state_dict()
    with pytest.raises(ValueError, match="window"):
        RunningMeanBaseline(window=128, scope="prompt").load_state_dict(state)
    with pytest.raises(ValueError, match="scope"):
        RunningMeanBaseline(window=8, scope="global").load_state_dict(state)


@pytest.mark.parametrize(("window", "scope"), [(0, "prompt"), (8, "batch")])
def test_running_mean_rejects_bad_settings(window, scope):
    with pytest.raises(ValueError):
        RunningMeanBaseline(window=window, scope=scope)


# ---- SPOTracker ----------------------------------------------------------------------------------------


def test_spo_advantage_is_z_normalised_reward_minus_prior_estimate():
    spo = SPOTracker()
    # Prior Beta(.5, .5): p̂ = .5. raw = r − p̂ = [.5, −.5, .5], mean 1/6, centred [1/3, −2/3, 1/3],
    # population std √((1/9 + 4/9 + 1/9)/3) = √(2/9).
    adv = spo.advantages(["a", "b", "c"], _r(1.0, 0.0, 1.0))
    want = torch.tensor([1 / 3, -2 / 3, 1 / 3], dtype=F64) / (math.sqrt(2 / 9) + 1e-6)
    assert adv.dtype == torch.float32
    torch.testing.assert_close(adv.double(), want, rtol=1e-6, atol=1e-6)
    assert float(adv.double().mean()) == pytest.approx(0.0, abs=1e-6)


def test_spo_update_with_no_divergence_uses_rho_max():
    spo = SPOTracker()
    spo.advantages(["a", "b"], _r(1.0, 0.0))
    # ρ = clamp(2^0, .875, .96) = .96: a: α = .96·.5 + 1 = 1.48, β = .96·.5 = .48; b: α = .48, β = 1.48.
    torch.testing.assert_close(spo.p_hat(["a", "b"]), _r(1.48 / 1.96, 0.48 / 1.96))
    assert dict((k, (a, b)) for k, a, b in spo.state_dict()["trackers"]) == {
        "a": pytest.approx((1.48, 0.48)),
        "b": pytest.approx((0.48, 1.48)),
    }


def test_spo_forgetting_factor_is_clamped_power_of_two():
    spo = SPOTracker(d_half=0.06, rho_min=0.875, rho_max=0.96)
    d = torch.tensor([0.0, 0.003, 0.01, 0.06, 1.0])
    # 2^(−D/.06): 1 → .96 (clamped), 2^(−.05) ≈ .9659 → .96, 2^(−1/6) ≈ .8909, 2^−1 = .5 → .875, tiny → .875.
    want = torch.tensor([0.96, 0.96, 2 ** (-1 / 6), 0.875, 0.875], dtype=F64)
    torch.testing.assert_close(spo.forgetting(d), want)


def test_spo_update_uses_the_per_trajectory_divergence():
    spo = _spo(a=(2.0, 2.0))
    rho = 2 ** (-1 / 6)  # D = .01
    spo.advantages(["a"], _r(1.0), divergence=torch.tensor([0.01]))
    a, b = rho * 2 + 1, rho * 2
    torch.testing.assert_close(spo.p_hat(["a"]), _r(a / (a + b)))


def test_spo_repeated_prompt_in_a_batch_uses_the_state_before_the_batch_then_updates_in_turn():
    spo = SPOTracker()
    adv = spo.advantages(["a", "a"], _r(1.0, 0.0))
    # Both see p̂ = .5: raw [.5, −.5] → z = ±1 (up to ε).
    torch.testing.assert_close(adv, _r(1.0, -1.0), rtol=1e-5, atol=1e-5)
    # Sequential updates with ρ = .96: (.96·.5 + 1, .96·.5) = (1.48, .48), then (.96·1.48, .96·.48 + 1).
    a, b = 0.96 * 1.48, 0.96 * 0.48 + 1
    torch.testing.assert_close(spo.p_hat(["a"]), _r(a / (a + b)))


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan")])
def test_spo_rejects_rewards_outside_unit_interval(bad):
    spo = SPOTracker()
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        spo.advantages(["a", "b"], _r(0.5, bad))
    assert spo.state_dict()["trackers"] == []  # nothing was updated


def test_spo_sampling_weights():
    spo = _spo(a=(5.0, 20.0), b=(12.5, 12.5))
    # √(p(1 − p)) + .05: .2 → .4 + .05, .5 (and the unseen prior .5) → .5 + .05.
    torch.testing.assert_close(spo.sampling_weights(["a", "b", "new"]), _r(0.45, 0.55, 0.55))


def test_spo_state_dict_round_trip_gives_identical_future_outputs():
    spo = _spo(a=(7.5, 17.5))
    spo.advantages(["a", "b", "c"], _r(1.0, 0.0, 1.0), divergence=torch.tensor([0.02, 0.0, 0.1]))
    restored = SPOTracker()
    restored.load_state_dict(spo.state_dict())
    for ids, rewards in [(["a", "b", "d"], _r(0.0, 1.0, 1.0)), (["c", "a"], _r(1.0, 1.0))]:
        assert torch.equal(spo.advantages(ids, rewards), restored.advantages(ids, rewards))
    assert torch.equal(
        spo.sampling_weights(["a", "b", "c", "d"]), restored.sampling_weights(["a", "b", "c", "d"])
    )


@pytest.mark.parametrize(
    "kwargs",
    [{"rho_min": 0.97, "rho_max": 0.96}, {"rho_min": 0.0}, {"d_half": 0.0}, {"prior_alpha": 0.0}],
)
def test_spo_rejects_bad_settings(kwargs):
    with pytest.raises(ValueError):
        SPOTracker(**kwargs)


# ---- estimate (pure) + update = advantages ---------------------------------------------------------------


def test_running_mean_estimate_is_pure_and_estimate_then_update_is_advantages():
    split, joint = RunningMeanBaseline(window=2), RunningMeanBaseline(window=2)
    for ids, rewards in [(["a", "b"], _r(1.0, 0.0)), (["a", "a"], _r(0.5, 0.0)), (["b", "a"], _r(1.0, 1.0))]:
        before = split.state_dict()
        adv = split.estimate(ids, rewards)
        assert split.state_dict() == before
        split.update(ids, rewards)
        assert torch.equal(adv, joint.advantages(ids, rewards))
        assert split.state_dict() == joint.state_dict()


def test_spo_estimate_is_pure_and_estimate_then_update_is_advantages():
    split, joint = SPOTracker(), SPOTracker()
    d = torch.tensor([0.01, 0.2, 0.0])
    for rewards in (_r(1.0, 0.0, 1.0), _r(0.0, 0.0, 1.0), _r(1.0, 1.0, 0.5)):
        before = split.state_dict()
        adv = split.estimate(["a", "b", "a"], rewards)
        assert split.state_dict() == before
        assert torch.equal(adv, split.estimate(["a", "b", "a"], rewards))
        split.update(["a", "b", "a"], rewards, d)
        assert torch.equal(adv, joint.advantages(["a", "b", "a"], rewards, d))
        assert split.state_dict() == joint.state_dict()


def test_spo_update_without_divergence_uses_rho_max_and_checks_rewards():
    spo = SPOTracker()
    spo.update(["a"], _r(1.0))
    assert spo.state_dict()["trackers"] == [["a", pytest.approx(1.48), pytest.approx(0.48)]]
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        spo.update(["a"], _r(2.0))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        spo.estimate(["a"], _r(-1.0))
