"""The built-in advantage estimators and policy losses, registered by name (`sao.algos.registry`).

GAE family (critic): ``skip_observation_gae``, ``token_gae``, ``step_gae`` — ``fn`` one GAE pass with the
policy λ, ``targets`` one pass with the critic's λ. Critic-free: ``grpo`` (group baseline), ``running_mean``
and ``spo`` (stateful baselines: pure ``fn`` from the state before the batch, ``update_state`` after it).
Losses: ``dis`` (against rollout log-probs), ``ppo_clip`` (against π_old).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

from torch import Tensor

from .baselines import RunningMeanBaseline, SPOTracker
from .gae import length_adaptive_lambda, response_mask, skip_observation_gae, step_gae, step_spans, token_gae
from .group import broadcast_to_tokens, grpo_advantages
from .losses import dis_band_state, dis_loss, ppo_clip_loss, ppo_clip_state
from .packed import segment_count, seq_ids_from_cu_seqlens
from .registry import (
    AdvantageInputs,
    AdvantageParams,
    AdvantageResult,
    CriticTargets,
    register_advantage_estimator,
    register_policy_loss,
)


def _policy_lambda(params: AdvantageParams, lengths: Tensor) -> float | Tensor:
    if params.lam_policy == "adaptive":
        return length_adaptive_lambda(lengths, params.adaptive_alpha)
    return float(params.lam_policy)


def _adaptive_lengths(inp: AdvantageInputs, params: AdvantageParams) -> Tensor:
    mask = inp.action_mask.bool()
    counted = mask if params.adaptive_length == "action" else response_mask(mask, inp.cu_seqlens)
    return segment_count(counted, seq_ids_from_cu_seqlens(inp.cu_seqlens), inp.cu_seqlens.numel() - 1)


def _bootstrap(inp: AdvantageInputs, params: AdvantageParams) -> Tensor | None:
    """The trajectories whose tail bootstraps from the critic (``truncation="bootstrap"``), or None."""
    if params.truncation not in ("terminal", "bootstrap"):
        raise ValueError(f"truncation must be 'terminal' or 'bootstrap', got {params.truncation!r}")
    if params.truncation == "terminal" or inp.truncated is None:
        return None
    return inp.truncated.bool()


def _gae_args(inp: AdvantageInputs, params: AdvantageParams) -> tuple[Tensor, Tensor, Tensor, Tensor, float]:
    assert inp.values is not None
    return (inp.token_rewards, inp.values, inp.action_mask, inp.cu_seqlens, params.gamma)


GaeFn = Callable[..., tuple[Tensor, Tensor]]


def _gae_advantages(gae: GaeFn, inp: AdvantageInputs, params: AdvantageParams) -> AdvantageResult:
    lam = _policy_lambda(params, _adaptive_lengths(inp, params))
    advantages, _ = gae(*_gae_args(inp, params), lam, bootstrap=_bootstrap(inp, params))
    metrics = {"adv/lambda_mean": lam.mean()} if isinstance(lam, Tensor) else {}
    return AdvantageResult(advantages, None, None, metrics)


def _gae_targets(gae: GaeFn, inp: AdvantageInputs, params: AdvantageParams) -> CriticTargets:
    _, returns = gae(*_gae_args(inp, params), params.lam_critic, bootstrap=_bootstrap(inp, params))
    return CriticTargets(returns, None)


# The GAE functions are named at call time (not captured), so a test can count the passes by patching them.
def _skip_observation_targets(inp: AdvantageInputs, params: AdvantageParams) -> CriticTargets:
    return _gae_targets(skip_observation_gae, inp, params)


@register_advantage_estimator("skip_observation_gae", uses_critic=True, targets=_skip_observation_targets)
def _skip_observation(inp: AdvantageInputs, params: AdvantageParams, state: Any) -> AdvantageResult:
    return _gae_advantages(skip_observation_gae, inp, params)


def _token_gae_targets(inp: AdvantageInputs, params: AdvantageParams) -> CriticTargets:
    return _gae_targets(token_gae, inp, params)


@register_advantage_estimator("token_gae", uses_critic=True, targets=_token_gae_targets)
def _token_gae(inp: AdvantageInputs, params: AdvantageParams, state: Any) -> AdvantageResult:
    return _gae_advantages(token_gae, inp, params)


def _step_gae_targets(inp: AdvantageInputs, params: AdvantageParams) -> CriticTargets:
    args = _gae_args(inp, params)
    boot = _bootstrap(inp, params)
    _, returns, value_mask = step_gae(
        *args, params.lam_critic, params.step_value, inp.turn_ids, bootstrap=boot
    )
    return CriticTargets(returns, value_mask)


@register_advantage_estimator("step_gae", uses_critic=True, targets=_step_gae_targets)
def _step_gae(inp: AdvantageInputs, params: AdvantageParams, state: Any) -> AdvantageResult:
    args = _gae_args(inp, params)
    _, step_cu, _ = step_spans(inp.action_mask, inp.cu_seqlens, inp.turn_ids)
    lam = _policy_lambda(params, step_cu[1:] - step_cu[:-1])  # the adaptive rule counts steps here
    boot = _bootstrap(inp, params)
    advantages, _, _ = step_gae(*args, lam, params.step_value, inp.turn_ids, bootstrap=boot)
    return AdvantageResult(advantages)


def _per_trajectory(inp: AdvantageInputs, adv: Tensor) -> AdvantageResult:
    return AdvantageResult(broadcast_to_tokens(adv.float(), inp.action_mask, inp.cu_seqlens))


@register_advantage_estimator("grpo", uses_critic=False)
def _grpo(inp: AdvantageInputs, params: AdvantageParams, state: Any) -> AdvantageResult:
    if inp.group_ids is None:
        raise ValueError("grpo advantages need group_ids")
    return _per_trajectory(inp, grpo_advantages(inp.outcomes(), inp.group_ids, params.normalize_std))


def _make_running_mean(params: AdvantageParams) -> RunningMeanBaseline:
    return RunningMeanBaseline(params.running_mean_window, params.running_mean_scope)


def _running_mean_state(state: Any) -> RunningMeanBaseline:
    if not isinstance(state, RunningMeanBaseline):
        raise TypeError("running_mean needs its RunningMeanBaseline state (make_advantage_state)")
    return state


def _update_running_mean(state: Any, inp: AdvantageInputs, params: AdvantageParams) -> None:
    _running_mean_state(state).update(list(inp.prompt_ids), inp.outcomes())


@register_advantage_estimator(
    "running_mean", uses_critic=False, make_state=_make_running_mean, update_state=_update_running_mean
)
def _running_mean(inp: AdvantageInputs, params: AdvantageParams, state: Any) -> AdvantageResult:
    return _per_trajectory(inp, _running_mean_state(state).estimate(list(inp.prompt_ids), inp.outcomes()))


def _make_spo(params: AdvantageParams) -> SPOTracker:
    return SPOTracker(params.spo_d_half, params.spo_rho_min, params.spo_rho_max, params.spo_sampling_floor)


def _spo_state(state: Any) -> SPOTracker:
    if not isinstance(state, SPOTracker):
        raise TypeError("spo needs its SPOTracker state (make_advantage_state)")
    return state


def _update_spo(state: Any, inp: AdvantageInputs, params: AdvantageParams) -> None:
    _spo_state(state).update(list(inp.prompt_ids), inp.outcomes(), inp.divergence)


def _spo_sampling_weights(state: Any, prompt_ids: Sequence[Hashable]) -> Tensor:
    return _spo_state(state).sampling_weights(prompt_ids)


@register_advantage_estimator(
    "spo",
    uses_critic=False,
    make_state=_make_spo,
    update_state=_update_spo,
    needs_divergence=True,
    sampling_weights=_spo_sampling_weights,
)
def _spo(inp: AdvantageInputs, params: AdvantageParams, state: Any) -> AdvantageResult:
    return _per_trajectory(inp, _spo_state(state).estimate(list(inp.prompt_ids), inp.outcomes()))


register_policy_loss(
    "dis", reference="rollout", token_state=lambda lp, ref, adv, lo, hi: dis_band_state(lp, ref, lo, hi)
)(dis_loss)
register_policy_loss("ppo_clip", reference="old", token_state=ppo_clip_state)(ppo_clip_loss)
