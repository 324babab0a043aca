"""What an algorithm is: typed config classes that own their code.

An advantage estimator and a policy loss are each a pydantic model: its fields are the YAML keys under
``algo.advantage`` / ``algo.loss`` (selected by ``type``), its methods are the algorithm. The trainer knows
only the two base classes below:

* `AdvantageEstimator`: ``estimate(inputs, state)`` → advantages (pure: reads ``state``, never changes it);
  a critic estimator (``uses_critic``) also gives ``targets(inputs)`` for the critic; a stateful one makes
  its state (``make_state``), records a trained batch in it (``update_state``) and may give prompt
  priorities (``sampling_weights``).
* `PolicyLoss`: ``__call__(LossInputs)`` → `LossOutput` on one micro-batch; ``reference`` says which
  log-probs ``LossInputs.reference`` holds (``"rollout"``: recorded by the engine; ``"old"``: π_old).

The built-in ones are in `sao.algos.estimators` and `sao.algos.losses`; a user's own is a subclass in a file
of theirs, named in the YAML as ``{type: custom, path: my_algo.py:MyLoss, ...its fields}``
(`sao.algos.custom`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from torch import Tensor

# The aggregation modes of a loss (`sao.algos.reductions`). The classes here import no torch (the config
# imports them; the tensor math is imported where it runs).
LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]

__all__ = [
    "AdvantageEstimator",
    "AdvantageInputs",
    "AdvantageResult",
    "AlgoPart",
    "CriticTargets",
    "LossAgg",
    "LossInputs",
    "LossOutput",
    "PolicyLoss",
]


class AlgoPart(BaseModel):
    """A typed algorithm config: unknown keys are refused, assignments validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    def build(self) -> AlgoPart:
        """The object the trainer uses: this one (a ``custom`` entry gives the user's)."""
        return self


# ---- advantage estimators ------------------------------------------------------------------------------


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
        from .packed import segment_sum, seq_ids_from_cu_seqlens

        seq_ids = seq_ids_from_cu_seqlens(self.cu_seqlens)
        return segment_sum(self.token_rewards.float(), seq_ids, self.cu_seqlens.numel() - 1)


@dataclass
class AdvantageResult:
    """``advantages`` ``(T,)`` (0 off action tokens) and summary ``metrics`` (0-d tensors)."""

    advantages: Tensor
    metrics: dict[str, Tensor] = field(default_factory=dict)


@dataclass
class CriticTargets:
    """``returns`` ``(T,)`` critic targets (0 off the value mask); ``value_mask`` ``(T,)`` the tokens the
    critic trains on (None: the action tokens)."""

    returns: Tensor
    value_mask: Tensor | None = None


class AdvantageEstimator(AlgoPart):
    """Base of every advantage estimator (``algo.advantage``).

    Subclasses set ``uses_critic`` (the trainer then trains a critic and passes ``inputs.values``) and
    ``needs_divergence`` (``update_state`` reads ``inputs.divergence``, SPO's D), and implement `estimate`
    (and `targets` when they use a critic)."""

    uses_critic: ClassVar[bool] = False
    needs_divergence: ClassVar[bool] = False

    def estimate(self, inputs: AdvantageInputs, state: Any) -> AdvantageResult:
        """Advantages of the batch; pure (``state`` is read, never changed)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement estimate()")

    def targets(self, inputs: AdvantageInputs) -> CriticTargets:
        """The critic's targets (critic estimators only)."""
        raise NotImplementedError(f"{type(self).__name__} uses no critic: it has no critic targets")

    def make_state(self) -> Any:
        """The persistent state (running-mean history, SPO tracker; it has ``state_dict`` /
        ``load_state_dict``), or None for a stateless estimator."""
        return None

    def update_state(self, state: Any, inputs: AdvantageInputs) -> None:
        """Record a trained batch in ``state``; a no-op for stateless estimators."""

    def sampling_weights(self, state: Any, prompt_ids: Sequence[Hashable]) -> Tensor | None:
        """``(B,)`` unnormalised prompt priorities from ``state``, or None (uniform prompts)."""
        return None

    @property
    def prioritizes_prompts(self) -> bool:
        """Whether `sampling_weights` is overridden (the sampler then asks for priorities)."""
        return type(self).sampling_weights is not AdvantageEstimator.sampling_weights

    def advantages(self, inputs: AdvantageInputs, state: Any = None) -> AdvantageResult:
        """`estimate` with ``adv/mean`` and ``adv/std`` added to the metrics (what the trainer calls)."""
        if self.uses_critic and inputs.values is None:
            raise ValueError(f"advantage estimator {type(self).__name__} needs critic values")
        import torch

        from .reductions import masked_mean, masked_var

        result = self.estimate(inputs, state)
        mask = inputs.action_mask.bool()
        with torch.no_grad():
            result.metrics.setdefault("adv/mean", masked_mean(result.advantages.detach(), mask))
            result.metrics.setdefault("adv/std", masked_var(result.advantages.detach(), mask).sqrt())
        return result


# ---- policy losses -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LossInputs:
    """One micro-batch of the actor's step (``T`` tokens, ``B`` trajectories of the micro-batch).

    ``denominator`` / ``positive_denominator``: the whole batch's count the aggregation divides by (for
    ``agg``: action tokens, or trajectories with one), so the micro-batches' losses add up to the batch's."""

    logprobs: Tensor  # (T,) log π_θ of the taken tokens (with grad)
    reference: Tensor  # (T,) the log-probs the ratio is taken to (PolicyLoss.reference)
    advantages: Tensor  # (T,) Â (constants)
    action_mask: Tensor  # (T,) 1 on action tokens
    cu_seqlens: Tensor  # (B+1,)
    denominator: float | None = None
    positive: Tensor | None = None  # (T,) bool: tokens of trajectories rewarded > 0
    positive_denominator: float | None = None


@dataclass
class LossOutput:
    """``loss`` (0-d, to minimise); ``metrics``: 0-d detached per-micro-batch means over its action tokens;
    ``terms``: 0-d detached additive parts of ``loss`` (logged like the loss: summed over micro-batches)."""

    loss: Tensor
    metrics: dict[str, Tensor] = field(default_factory=dict)
    terms: dict[str, Tensor] = field(default_factory=dict)


class PolicyLoss(AlgoPart):
    """Base of every policy loss (``algo.loss``): ``agg`` is how per-token terms are aggregated (the trainer
    counts ``LossInputs.denominator`` with it); ``reference`` which log-probs the ratio is taken to."""

    reference: ClassVar[Literal["rollout", "old"]] = "rollout"
    agg: LossAgg = Field(
        "token-mean",
        description="Loss aggregation: 'token-mean' (over the batch's action tokens; band-masked tokens stay "
        "in the denominator, our reading), 'seq-mean-token-mean' or 'seq-mean-token-sum'.",
    )

    def __call__(self, inputs: LossInputs) -> LossOutput:
        raise NotImplementedError(f"{type(self).__name__} does not implement __call__()")

    def token_state(self, logprobs: Tensor, reference: Tensor, advantages: Tensor) -> Tensor | None:
        """``(T,)`` int8 −1/0/+1: what the loss did with each token (kept for the trajectory inspector), or
        None when the loss has no such notion."""
        return None
