"""Name → algorithm registries with one shared signature per family (the verl idea, split by family).

* Advantage estimators: an :class:`AdvantageEstimator` bundles a *pure* ``fn(inputs, params, state) ->
  AdvantageResult`` (advantages only; it reads ``state`` and never changes it) with optional
  ``make_state`` (the persistent object: running-mean history, SPO tracker), ``update_state`` (records a
  trained batch in it), ``targets`` (critic estimators: the critic's targets, computed with the critic's
  λ, the decoupled λ of docs/algorithms.md, "Skip-observation GAE", while ``fn`` uses the policy's λ)
  and ``sampling_weights`` (prompt priorities from the state). The trainer calls
  :func:`estimate_advantages`, :func:`critic_targets` and :func:`update_advantage_state` separately, so
  each GAE pass runs once and the state records a batch only when it is trained on;
  :func:`compute_advantages` is the one-call convenience of all three.
* Policy losses: ``fn(logprobs, ref_logprobs, advantages, action_mask, eps_low, eps_high, agg, cu_seqlens,
  denominator=...) -> (loss, metrics)``; ``reference`` says which log-probs ``ref_logprobs`` must be
  (``"rollout"``: recorded by the engine; ``"old"``: π_old recomputed before the update).

Presets in ``sao.presets`` refer to these names; the built-in entries are in `sao.algos.estimators`; users
register their own with the decorators.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

from .aggregate import masked_mean, masked_var
from .packed import segment_sum, seq_ids_from_cu_seqlens

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "POLICY_LOSSES",
    "AdvantageEstimator",
    "AdvantageInputs",
    "AdvantageParams",
    "AdvantageResult",
    "CriticTargets",
    "PolicyLoss",
    "compute_advantages",
    "critic_targets",
    "estimate_advantages",
    "get_advantage_estimator",
    "get_policy_loss",
    "make_advantage_state",
    "prompt_sampling_weights",
    "register_advantage_estimator",
    "register_policy_loss",
    "update_advantage_state",
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
    divergence: Tensor | None = None  # (B,) SPO's D per trajectory (read by update_state)
    turn_ids: Tensor | None = None  # (T,) splits step_gae's steps at turn changes
    truncated: Tensor | None = None  # (B,) bool, cut by the token/turn budget (None: none was)

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
    truncation: Literal["terminal", "bootstrap"] = "terminal"

    @classmethod
    def from_config(cls, cfg: Any) -> AdvantageParams:
        """Build from any object with the same attribute names (e.g. ``AlgoConfig``)."""
        names = cls.__dataclass_fields__
        return cls(**{n: getattr(cfg, n) for n in names if hasattr(cfg, n)})


@dataclass
class AdvantageResult:
    """``advantages`` ``(T,)`` (0 off action tokens); ``returns`` ``(T,)`` critic targets or None;
    ``value_mask`` ``(T,)`` the tokens the critic trains on (None: the action tokens); ``metrics``.

    :func:`estimate_advantages` leaves ``returns``/``value_mask`` None for the built-in estimators;
    :func:`compute_advantages` fills them from :func:`critic_targets`."""

    advantages: Tensor
    returns: Tensor | None = None
    value_mask: Tensor | None = None
    metrics: dict[str, Tensor] = field(default_factory=dict)


@dataclass
class CriticTargets:
    """``returns`` ``(T,)`` critic targets (0 off the value mask); ``value_mask`` ``(T,)`` the tokens the
    critic trains on (None: the action tokens)."""

    returns: Tensor
    value_mask: Tensor | None = None


EstimatorFn = Callable[[AdvantageInputs, AdvantageParams, Any], AdvantageResult]
StateFactory = Callable[[AdvantageParams], Any]
StateUpdate = Callable[[Any, AdvantageInputs, AdvantageParams], None]
TargetsFn = Callable[[AdvantageInputs, AdvantageParams], CriticTargets]
SamplingWeightsFn = Callable[[Any, Sequence[Hashable]], Tensor]


@dataclass(frozen=True)
class AdvantageEstimator:
    """A registered estimator.

    ``fn`` computes advantages and is pure (it never mutates ``state``); ``update_state(state, inputs,
    params)`` records a trained batch; ``targets(inputs, params)`` gives a critic estimator's targets
    (one GAE pass with ``lam_critic``); ``needs_divergence``: ``update_state`` reads
    ``inputs.divergence`` (SPO's D); ``sampling_weights(state, prompt_ids)`` ``(B,)`` prompt priorities.
    """

    fn: EstimatorFn
    uses_critic: bool
    make_state: StateFactory | None = None
    update_state: StateUpdate | None = None
    targets: TargetsFn | None = None
    needs_divergence: bool = False
    sampling_weights: SamplingWeightsFn | None = None


TokenStateFn = Callable[[Tensor, Tensor, Tensor, float, float], Tensor]


@dataclass(frozen=True)
class PolicyLoss:
    """A registered policy loss: ``fn`` (see `sao.algos.losses`), the log-probs its ratio is taken to, and
    optionally ``token_state(logprobs, reference, advantages, eps_low, eps_high)`` → ``(T,)`` int8 (−1/0/+1:
    what the loss did with each token, e.g. DIS's band; kept for the trajectory inspector)."""

    fn: Callable[..., tuple[Tensor, dict[str, Tensor]]]
    reference: Literal["rollout", "old"]
    token_state: TokenStateFn | None = None


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {}
POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_advantage_estimator(
    name: str,
    *,
    uses_critic: bool,
    make_state: StateFactory | None = None,
    update_state: StateUpdate | None = None,
    targets: TargetsFn | None = None,
    needs_divergence: bool = False,
    sampling_weights: SamplingWeightsFn | None = None,
) -> Callable[[EstimatorFn], EstimatorFn]:
    """Decorator: register an advantage estimator under ``name`` (an existing name is an error).

    The decorated function is the pure ``fn``; the keywords fill the other :class:`AdvantageEstimator`
    fields."""

    def deco(fn: EstimatorFn) -> EstimatorFn:
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ADVANTAGE_ESTIMATORS[name] = AdvantageEstimator(
            fn, uses_critic, make_state, update_state, targets, needs_divergence, sampling_weights
        )
        return fn

    return deco


def register_policy_loss(
    name: str, *, reference: Literal["rollout", "old"], token_state: TokenStateFn | None = None
) -> Callable[[Callable], Callable]:
    """Decorator: register a policy loss under ``name`` with the log-probs its ratio is taken to (and its
    per-token state function, `PolicyLoss`)."""

    def deco(fn: Callable) -> Callable:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is already registered")
        POLICY_LOSSES[name] = PolicyLoss(fn, reference, token_state)
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


def _check_values(name: str, est: AdvantageEstimator, inputs: AdvantageInputs) -> None:
    if est.uses_critic and inputs.values is None:
        raise ValueError(f"advantage estimator {name!r} needs critic values")


def estimate_advantages(
    name: str, inputs: AdvantageInputs, params: AdvantageParams, state: Any = None
) -> AdvantageResult:
    """Advantages from the estimator registered as ``name``, with summary metrics (``adv/*``).

    Pure: ``state`` is read, never changed (record the batch with :func:`update_advantage_state`). For
    critic estimators this is one GAE pass with the policy's λ; the targets come from
    :func:`critic_targets` (``returns`` stays None here)."""
    est = get_advantage_estimator(name)
    _check_values(name, est, inputs)
    result = est.fn(inputs, params, state)
    mask = inputs.action_mask.bool()
    with torch.no_grad():
        result.metrics.setdefault("adv/mean", masked_mean(result.advantages.detach(), mask))
        result.metrics.setdefault("adv/std", masked_var(result.advantages.detach(), mask).sqrt())
    return result


def critic_targets(name: str, inputs: AdvantageInputs, params: AdvantageParams) -> CriticTargets:
    """The critic's targets for ``inputs`` (one GAE pass with ``lam_critic``); ``ValueError`` for an
    estimator without a critic.

    A critic estimator registered without ``targets`` (the older convention, returns from ``fn``) falls
    back to ``fn``'s ``returns`` and ``value_mask`` (``fn`` gets ``state=None``)."""
    est = get_advantage_estimator(name)
    if not est.uses_critic:
        raise ValueError(f"advantage estimator {name!r} does not use a critic: it has no critic targets")
    _check_values(name, est, inputs)
    if est.targets is not None:
        return est.targets(inputs, params)
    result = est.fn(inputs, params, None)
    if result.returns is None:
        raise ValueError(f"advantage estimator {name!r} gives no critic targets (register it with targets=)")
    return CriticTargets(result.returns, result.value_mask)


def update_advantage_state(name: str, state: Any, inputs: AdvantageInputs, params: AdvantageParams) -> None:
    """Record a trained batch in the estimator's state (SPO reads ``inputs.divergence`` when
    ``needs_divergence``; None counts as D = 0); a no-op for stateless estimators."""
    est = get_advantage_estimator(name)
    if est.update_state is not None:
        est.update_state(state, inputs, params)


def prompt_sampling_weights(name: str, state: Any, prompt_ids: Sequence[Hashable]) -> Tensor | None:
    """``(B,)`` unnormalised prompt priorities from the estimator's state (SPO), or None when the
    estimator has none."""
    est = get_advantage_estimator(name)
    return None if est.sampling_weights is None else est.sampling_weights(state, prompt_ids)


def compute_advantages(
    name: str, inputs: AdvantageInputs, params: AdvantageParams, state: Any = None
) -> AdvantageResult:
    """The one-call convenience: :func:`estimate_advantages`, then (critic estimators)
    :func:`critic_targets` into ``returns``/``value_mask``, then :func:`update_advantage_state`."""
    est = get_advantage_estimator(name)
    result = estimate_advantages(name, inputs, params, state)
    if est.uses_critic and est.targets is not None:
        targets = est.targets(inputs, params)
        result.returns, result.value_mask = targets.returns, targets.value_mask
    update_advantage_state(name, state, inputs, params)
    return result
