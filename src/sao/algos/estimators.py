"""The built-in advantage estimators, one typed config class each (``algo.advantage.type``).

GAE family (critic): ``skip_observation_gae``, ``token_gae``, ``step_gae`` — advantages from one GAE pass
with the policy λ, critic targets from one pass with the critic's λ (the decoupled λ of docs/concepts.md).
Critic-free: ``grpo`` (group baseline), ``running_mean`` and ``spo`` (stateful baselines: advantages from the
state before the batch, `update_state` after it). The tensor math is in `sao.algos.gae`, `sao.algos.group`
and `sao.algos.baselines`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from .base import AdvantageEstimator, AdvantageInputs, AdvantageResult, CriticTargets

if TYPE_CHECKING:
    from torch import Tensor

    from .baselines import RunningMeanBaseline, SPOTracker


def _gae_module() -> Any:
    """`sao.algos.gae`, imported when an estimator first runs (the config imports these classes; torch is
    not needed to load a config). Its functions are looked up at call time, so a test can patch them."""
    return importlib.import_module("sao.algos.gae")


__all__ = ["GRPO", "SPO", "RunningMean", "SkipObservationGAE", "StepGAE", "TokenGAE"]

GaeFn = Callable[..., "tuple[Tensor, Tensor]"]


class _GAE(AdvantageEstimator):
    """The GAE family's knobs; a subclass names its GAE function."""

    uses_critic: ClassVar[bool] = True

    gamma: float = Field(1.0, ge=0, le=1, description="Discount (our reading: 1.0).")
    lam_policy: float | Literal["adaptive"] = Field(
        "adaptive", description="GAE lambda for policy advantages; 'adaptive' = clamp(1 - 1/(alpha*l), 0, 1)."
    )
    lam_critic: float = Field(1.0, ge=0, le=1, description="GAE lambda for critic targets (1 = MC returns).")
    adaptive_alpha: float = Field(1.5, gt=0, description="alpha of the length-adaptive lambda.")
    truncation: Literal["terminal", "bootstrap"] = Field(
        "terminal",
        description="A trajectory cut by the token or turn budget: 'terminal' scores it as the env did (next "
        "value 0 after its last action token; our reading), 'bootstrap' takes the critic's value at its last "
        "action token as the next value.",
    )

    @field_validator("lam_policy")
    @classmethod
    def _lam_in_unit_interval(cls, value: float | str) -> float | str:
        if not isinstance(value, str) and not 0.0 <= value <= 1.0:
            raise ValueError("must be 'adaptive' or a number in [0, 1]")
        return value

    def _gae(self) -> GaeFn:
        raise NotImplementedError

    def _lambda(self, lengths: Tensor) -> float | Tensor:
        if self.lam_policy == "adaptive":
            return _gae_module().length_adaptive_lambda(lengths, self.adaptive_alpha)
        return float(self.lam_policy)

    def _lengths(self, inp: AdvantageInputs) -> Tensor:
        """``(B,)`` l of the adaptive λ: the action tokens (or the whole response) of each trajectory."""
        from .packed import segment_count, seq_ids_from_cu_seqlens

        mask = inp.action_mask.bool()
        counted = mask if self._counts_actions() else _gae_module().response_mask(mask, inp.cu_seqlens)
        return segment_count(counted, seq_ids_from_cu_seqlens(inp.cu_seqlens), inp.cu_seqlens.numel() - 1)

    def _bootstrap(self, inp: AdvantageInputs) -> Tensor | None:
        """The trajectories whose tail bootstraps from the critic, or None."""
        if self.truncation == "terminal" or inp.truncated is None:
            return None
        return inp.truncated.bool()

    def _counts_actions(self) -> bool:
        return True

    def _args(self, inp: AdvantageInputs) -> tuple[Tensor, Tensor, Tensor, Tensor, float]:
        if inp.values is None:
            raise ValueError(f"advantage estimator {type(self).__name__} needs critic values")
        return (inp.token_rewards, inp.values, inp.action_mask, inp.cu_seqlens, self.gamma)

    def estimate(self, inputs: AdvantageInputs, state: Any) -> AdvantageResult:
        lam = self._lambda(self._lengths(inputs))
        advantages, _ = self._gae()(*self._args(inputs), lam, bootstrap=self._bootstrap(inputs))
        metrics = {"adv/lambda_mean": lam.mean()} if not isinstance(lam, float) else {}
        return AdvantageResult(advantages, metrics)

    def targets(self, inputs: AdvantageInputs) -> CriticTargets:
        _, returns = self._gae()(*self._args(inputs), self.lam_critic, bootstrap=self._bootstrap(inputs))
        return CriticTargets(returns, None)


class _TokenLevelGAE(_GAE):
    """A token-level GAE: its adaptive λ counts tokens, of actions or of the whole response."""

    adaptive_length: Literal["action", "response"] = Field(
        "action",
        description="l of the adaptive lambda: action tokens of the trajectory (our reading) or the whole "
        "response incl. observations.",
    )

    def _counts_actions(self) -> bool:
        return self.adaptive_length == "action"


# The GAE functions are looked up at call time (not captured), so a test can count the passes by patching.
class SkipObservationGAE(_TokenLevelGAE):
    """SAO's token-level GAE that skips environment-observation tokens (docs/algorithms.md)."""

    type: Literal["skip_observation_gae"] = "skip_observation_gae"

    def _gae(self) -> GaeFn:
        return _gae_module().skip_observation_gae


class TokenGAE(_TokenLevelGAE):
    """Plain token-level GAE over every response token, observations included (VAPO)."""

    type: Literal["token_gae"] = "token_gae"

    def _gae(self) -> GaeFn:
        return _gae_module().token_gae


class StepGAE(_GAE):
    """Step-wise GAE: one advantage per turn (step); the adaptive λ counts steps."""

    type: Literal["step_gae"] = "step_gae"
    step_value: Literal["average", "last_token"] = Field(
        "average", description="Step value: mean of its token values, or its last token's value."
    )

    def estimate(self, inputs: AdvantageInputs, state: Any) -> AdvantageResult:
        gae = _gae_module()
        _, step_cu, _ = gae.step_spans(inputs.action_mask, inputs.cu_seqlens, inputs.turn_ids)
        lam = self._lambda(step_cu[1:] - step_cu[:-1])  # the adaptive rule counts steps here
        advantages, _, _ = gae.step_gae(
            *self._args(inputs), lam, self.step_value, inputs.turn_ids, bootstrap=self._bootstrap(inputs)
        )
        return AdvantageResult(advantages)

    def targets(self, inputs: AdvantageInputs) -> CriticTargets:
        _, returns, value_mask = _gae_module().step_gae(
            *self._args(inputs), self.lam_critic, self.step_value, inputs.turn_ids,
            bootstrap=self._bootstrap(inputs),
        )  # fmt: skip
        return CriticTargets(returns, value_mask)


def _per_trajectory(inp: AdvantageInputs, adv: Tensor) -> AdvantageResult:
    from .group import broadcast_to_tokens

    return AdvantageResult(broadcast_to_tokens(adv.float(), inp.action_mask, inp.cu_seqlens))


class GRPO(AdvantageEstimator):
    """Group baseline: (R − mean of the group) / std of the group, one advantage per trajectory."""

    type: Literal["grpo"] = "grpo"
    normalize_std: bool = Field(True, description="Divide the group-centred reward by the group std.")

    def estimate(self, inputs: AdvantageInputs, state: Any) -> AdvantageResult:
        if inputs.group_ids is None:
            raise ValueError("grpo advantages need group_ids")
        from .group import grpo_advantages

        return _per_trajectory(
            inputs, grpo_advantages(inputs.outcomes(), inputs.group_ids, self.normalize_std)
        )


class RunningMean(AdvantageEstimator):
    """Single-rollout baseline: the mean of the most recent rewards, per prompt or over all prompts."""

    type: Literal["running_mean"] = "running_mean"
    window: int = Field(8, ge=1, description="Number of recent rewards averaged.")
    scope: Literal["prompt", "global"] = Field(
        "prompt", description="Rewards of the same prompt, or of all prompts."
    )

    def make_state(self) -> RunningMeanBaseline:
        from .baselines import RunningMeanBaseline

        return RunningMeanBaseline(self.window, self.scope)

    def estimate(self, inputs: AdvantageInputs, state: Any) -> AdvantageResult:
        baseline = _state(state, "RunningMeanBaseline")
        return _per_trajectory(inputs, baseline.estimate(list(inputs.prompt_ids), inputs.outcomes()))

    def update_state(self, state: Any, inputs: AdvantageInputs) -> None:
        _state(state, "RunningMeanBaseline").update(list(inputs.prompt_ids), inputs.outcomes())


class SPO(AdvantageEstimator):
    """SPO: a per-prompt Beta tracker of the success rate, forgetting by the policy's divergence D, and
    prioritised prompt sampling."""

    type: Literal["spo"] = "spo"
    needs_divergence: ClassVar[bool] = True
    d_half: float = Field(0.06, gt=0, description="D_half of rho = clamp(2^(-D/D_half), rho_min, rho_max).")
    rho_min: float = Field(0.875, gt=0, le=1, description="Lower clamp of the tracker decay rho.")
    rho_max: float = Field(0.96, gt=0, le=1, description="Upper clamp of the tracker decay rho.")
    sampling_floor: float = Field(0.05, ge=0, description="Prioritised sampling weight sqrt(p(1-p)) + floor.")
    prioritized_sampling: bool = Field(True, description="Sample prompts by the weight above.")

    @model_validator(mode="after")
    def _rho_ordered(self) -> SPO:
        if self.rho_min > self.rho_max:
            raise ValueError("rho_min must be <= rho_max")
        return self

    @property
    def prioritizes_prompts(self) -> bool:
        return self.prioritized_sampling

    def make_state(self) -> SPOTracker:
        from .baselines import SPOTracker

        return SPOTracker(self.d_half, self.rho_min, self.rho_max, self.sampling_floor)

    def estimate(self, inputs: AdvantageInputs, state: Any) -> AdvantageResult:
        tracker = _state(state, "SPOTracker")
        return _per_trajectory(inputs, tracker.estimate(list(inputs.prompt_ids), inputs.outcomes()))

    def update_state(self, state: Any, inputs: AdvantageInputs) -> None:
        _state(state, "SPOTracker").update(list(inputs.prompt_ids), inputs.outcomes(), inputs.divergence)

    def sampling_weights(self, state: Any, prompt_ids: Sequence[Hashable]) -> Tensor | None:
        return _state(state, "SPOTracker").sampling_weights(prompt_ids) if self.prioritized_sampling else None


def _state(state: Any, kind: str) -> Any:
    from . import baselines

    if not isinstance(state, getattr(baselines, kind)):
        raise TypeError(f"expected the estimator's {kind} state (make_state()), got {type(state).__name__}")
    return state
