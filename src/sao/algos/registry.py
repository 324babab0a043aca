"""Name → algorithm registries with one shared signature per family (the verl idea, split by family).

* Advantage estimators: ``fn(inputs: AdvantageInputs, params: AdvantageParams, state) -> AdvantageResult``.
  ``state`` is the estimator's persistent object (running-mean history, SPO tracker) or None; make it with
  :func:`make_advantage_state`. GAE-family estimators return the critic's targets too, computed with the
  critic's λ (decoupled λ, SPEC §2.5), while the advantages use the policy's λ.
* Policy losses: ``fn(logprobs, ref_logprobs, advantages, action_mask, eps_low, eps_high, agg, cu_seqlens,
  denominator=...) -> (loss, metrics)``; ``reference`` says which log-probs ``ref_logprobs`` must be
  (``"rollout"``: recorded by the engine; ``"old"``: π_old recomputed before the update).

Presets in ``sao.presets`` refer to these names; users register their own with the decorators.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

from .aggregate import masked_mean, masked_var
from .baselines import RunningMeanBaseline, SPOTracker
from .gae import length_adaptive_lambda, response_mask, skip_observation_gae, step_gae, step_spans, token_gae
from .group import broadcast_to_tokens, grpo_advantages
from .losses import dis_loss, ppo_clip_loss
from .packed import segment_count, segment_sum, seq_ids_from_cu_seqlens

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "POLICY_LOSSES",
    "AdvantageEstimator",
    "AdvantageInputs",
    "AdvantageParams",
    "AdvantageResult",
    "PolicyLoss",
    "compute_advantages",
    "get_advantage_estimator",
    "get_policy_loss",
    "make_advantage_state",
    "register_advantage_estimator",
    "register_policy_loss",
]


@dataclass(frozen=True)
class AdvantageInputs:
    """A packed batch as the estimators see it (``T`` tokens, ``B`` trajectories)."""

    token_rewards: Tensor  # (T,) reward on action tokens (outcome on the last one)
    action_mask: Tensor  # (T,) 1 on model-generated tokens
    cu_seqlens: Tensor  # (B+1,)
    values: Tensor | None = None  # (T,) critic values, for the GAE family
    outcome_rewards: Tensor | None = None  # (B,); default: sum of token_rewards per trajectory
    prompt_ids: Sequence[Hashable] = ()  # (B,) for running-mean and SPO state
    group_ids: Tensor | Sequence[Hashable] | None = None  # (B,) for GRPO
    divergence: Tensor | None = None  # (B,) SPO's D per trajectory
    turn_ids: Tensor | None = None  # (T,) splits step_gae's steps at turn changes

    def outcomes(self) -> Tensor:
        if self.outcome_rewards is not None:
            return self.outcome_rewards
        seq_ids = seq_ids_from_cu_seqlens(self.cu_seqlens)
        return segment_sum(self.token_rewards.float(), seq_ids, self.cu_seqlens.numel() - 1)


@dataclass(frozen=True)
class AdvantageParams:
    """Hyper-parameters shared by the estimators (field names match ``sao.config.AlgoConfig``)."""

    gamma: float = 1.0
    lam_policy: float | Literal["adaptive"] = "adaptive"
    lam_critic: float = 1.0
    adaptive_alpha: float = 1.5
    adaptive_length: Literal["action", "response"] = "action"
    step_value: Literal["average", "last_token"] = "average"
    normalize_std: bool = True
    running_mean_window: int = 8
    running_mean_scope: Literal["prompt", "global"] = "prompt"
    spo_d_half: float = 0.06
    spo_rho_min: float = 0.875
    spo_rho_max: float = 0.96
    spo_sampling_floor: float = 0.05

    @classmethod
    def from_config(cls, cfg: Any) -> AdvantageParams:
        """Build from any object with the same attribute names (e.g. ``AlgoConfig``)."""
        names = cls.__dataclass_fields__
        return cls(**{n: getattr(cfg, n) for n in names if hasattr(cfg, n)})


@dataclass
class AdvantageResult:
    """``advantages`` ``(T,)`` (0 off action tokens); ``returns`` ``(T,)`` critic targets or None;
    ``value_mask`` ``(T,)`` the tokens the critic trains on (None: the action tokens); ``metrics``."""

    advantages: Tensor
    returns: Tensor | None = None
    value_mask: Tensor | None = None
    metrics: dict[str, Tensor] = field(default_factory=dict)


EstimatorFn = Callable[[AdvantageInputs, AdvantageParams, Any], AdvantageResult]


@dataclass(frozen=True)
class AdvantageEstimator:
    fn: EstimatorFn
    uses_critic: bool
    make_state: Callable[[AdvantageParams], Any] | None = None


@dataclass(frozen=True)
class PolicyLoss:
    fn: Callable[..., tuple[Tensor, dict[str, Tensor]]]
    reference: Literal["rollout", "old"]


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {}
POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_advantage_estimator(
    name: str, *, uses_critic: bool, make_state: Callable[[AdvantageParams], Any] | None = None
) -> Callable[[EstimatorFn], EstimatorFn]:
    """Decorator: register an advantage estimator under ``name`` (an existing name is an error)."""

    def deco(fn: EstimatorFn) -> EstimatorFn:
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ADVANTAGE_ESTIMATORS[name] = AdvantageEstimator(fn, uses_critic, make_state)
        return fn

    return deco


def register_policy_loss(
    name: str, *, reference: Literal["rollout", "old"]
) -> Callable[[Callable], Callable]:
    """Decorator: register a policy loss under ``name`` with the log-probs its ratio is taken to."""

    def deco(fn: Callable) -> Callable:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is already registered")
        POLICY_LOSSES[name] = PolicyLoss(fn, reference)
        return fn

    return deco


def _lookup(table: dict[str, Any], name: str, kind: str) -> Any:
    try:
        return table[name]
    except KeyError:
        raise KeyError(f"unknown {kind} {name!r}; registered: {', '.join(sorted(table))}") from None


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    return _lookup(ADVANTAGE_ESTIMATORS, name, "advantage estimator")


def get_policy_loss(name: str) -> PolicyLoss:
    return _lookup(POLICY_LOSSES, name, "policy loss")


def make_advantage_state(name: str, params: AdvantageParams) -> Any:
    """The persistent state object an estimator needs (None for stateless ones)."""
    est = get_advantage_estimator(name)
    return est.make_state(params) if est.make_state else None


def compute_advantages(
    name: str, inputs: AdvantageInputs, params: AdvantageParams, state: Any = None
) -> AdvantageResult:
    """Run the estimator registered as ``name`` and add summary metrics (``adv/*``)."""
    est = get_advantage_estimator(name)
    if est.uses_critic and inputs.values is None:
        raise ValueError(f"advantage estimator {name!r} needs critic values")
    result = est.fn(inputs, params, state)
    mask = inputs.action_mask.bool()
    with torch.no_grad():
        result.metrics.setdefault("adv/mean", masked_mean(result.advantages.detach(), mask))
        result.metrics.setdefault("adv/std", masked_var(result.advantages.detach(), mask).sqrt())
    return result


# ---- the built-in estimators -------------------------------------------------------------------------


def _policy_lambda(params: AdvantageParams, lengths: Tensor) -> float | Tensor:
    if params.lam_policy == "adaptive":
        return length_adaptive_lambda(lengths, params.adaptive_alpha)
    return float(params.lam_policy)


def _adaptive_lengths(inp: AdvantageInputs, params: AdvantageParams) -> Tensor:
    mask = inp.action_mask.bool()
    counted = mask if params.adaptive_length == "action" else response_mask(mask, inp.cu_seqlens)
    return segment_count(counted, seq_ids_from_cu_seqlens(inp.cu_seqlens), inp.cu_seqlens.numel() - 1)


def _decoupled_gae(fn: Callable[..., tuple[Tensor, Tensor]]) -> EstimatorFn:
    def estimator(inp: AdvantageInputs, params: AdvantageParams, state: Any) -> AdvantageResult:
        assert inp.values is not None
        args = (inp.token_rewards, inp.values, inp.action_mask, inp.cu_seqlens, params.gamma)
        lam = _policy_lambda(params, _adaptive_lengths(inp, params))
        advantages, _ = fn(*args, lam)
        _, returns = fn(*args, params.lam_critic)
        metrics = {}
        if isinstance(lam, Tensor):
            metrics["adv/lambda_mean"] = lam.mean()
        return AdvantageResult(advantages, returns, None, metrics)

    return estimator


register_advantage_estimator("skip_observation_gae", uses_critic=True)(_decoupled_gae(skip_observation_gae))
register_advantage_estimator("token_gae", uses_critic=True)(_decoupled_gae(token_gae))


@register_advantage_estimator("step_gae", uses_critic=True)
def _step_gae(inp: AdvantageInputs, params: AdvantageParams, state: Any) -> AdvantageResult:
    assert inp.values is not None
    args = (inp.token_rewards, inp.values, inp.action_mask, inp.cu_seqlens, params.gamma)
    _, step_cu, _ = step_spans(inp.action_mask, inp.cu_seqlens, inp.turn_ids)
    lam = _policy_lambda(params, step_cu[1:] - step_cu[:-1])  # the adaptive rule counts steps here
    advantages, _, _ = step_gae(*args, lam, params.step_value, inp.turn_ids)
    _, returns, value_mask = step_gae(*args, params.lam_critic, params.step_value, inp.turn_ids)
    return AdvantageResult(advantages, returns, value_mask)


def _per_trajectory(inp: AdvantageInputs, adv: Tensor) -> AdvantageResult:
    return AdvantageResult(broadcast_to_tokens(adv.float(), inp.action_mask, inp.cu_seqlens))


@register_advantage_estimator("grpo", uses_critic=False)
def _grpo(inp: AdvantageInputs, params: AdvantageParams, state: Any) -> AdvantageResult:
    if inp.group_ids is None:
        raise ValueError("grpo advantages need group_ids")
    return _per_trajectory(inp, grpo_advantages(inp.outcomes(), inp.group_ids, params.normalize_std))


def _make_running_mean(params: AdvantageParams) -> RunningMeanBaseline:
    return RunningMeanBaseline(params.running_mean_window, params.running_mean_scope)


@register_advantage_estimator("running_mean", uses_critic=False, make_state=_make_running_mean)
def _running_mean(inp: AdvantageInputs, params: AdvantageParams, state: Any) -> AdvantageResult:
    if not isinstance(state, RunningMeanBaseline):
        raise TypeError("running_mean needs its RunningMeanBaseline state (make_advantage_state)")
    return _per_trajectory(inp, state.advantages(list(inp.prompt_ids), inp.outcomes()))


def _make_spo(params: AdvantageParams) -> SPOTracker:
    return SPOTracker(params.spo_d_half, params.spo_rho_min, params.spo_rho_max, params.spo_sampling_floor)


@register_advantage_estimator("spo", uses_critic=False, make_state=_make_spo)
def _spo(inp: AdvantageInputs, params: AdvantageParams, state: Any) -> AdvantageResult:
    if not isinstance(state, SPOTracker):
        raise TypeError("spo needs its SPOTracker state (make_advantage_state)")
    return _per_trajectory(inp, state.advantages(list(inp.prompt_ids), inp.outcomes(), inp.divergence))


register_policy_loss("dis", reference="rollout")(dis_loss)
register_policy_loss("ppo_clip", reference="old")(ppo_clip_loss)
