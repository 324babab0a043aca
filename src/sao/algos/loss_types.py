"""The built-in policy losses, one typed config class each (``algo.loss.type``): their fields are the YAML
keys under ``algo.loss``; the tensor math is in `sao.algos.losses` (imported when a loss first runs, so a
config loads without torch).

* ``dis``: SAO's DIS against the rollout log-probs, tokens outside the strict band (1 − eps_low, 1 + eps_high)
  dropped;
* ``ppo_clip``: PPO's clipped surrogate against π_old, asymmetric bounds.

Both add VAPO's ``nll_coef`` × positive-example NLL when it is set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from .base import LossInputs, LossOutput, PolicyLoss

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["DIS", "PPOClip"]


class _BandLoss(PolicyLoss):
    """A ratio loss with a band (1 − eps_low, 1 + eps_high) and VAPO's optional positive-example NLL."""

    eps_low: float = Field(0.3, gt=0, lt=1, description="Lower band edge 1 - eps_low.")
    eps_high: float = Field(5.0, gt=0, description="Upper band edge 1 + eps_high.")
    nll_coef: float = Field(0.0, ge=0, description="VAPO positive-example NLL loss weight (0: off).")

    def _surrogate(self, x: LossInputs) -> tuple[Tensor, dict[str, Tensor]]:
        raise NotImplementedError

    def __call__(self, inputs: LossInputs) -> LossOutput:
        loss, metrics = self._surrogate(inputs)
        metrics = dict(metrics)
        terms = {}
        if self.nll_coef > 0:
            from .losses import positive_nll_loss

            if inputs.positive is None:
                raise ValueError("nll_coef > 0 needs LossInputs.positive")
            nll, nll_metrics = positive_nll_loss(
                inputs.logprobs, inputs.action_mask, inputs.positive, self.agg, inputs.cu_seqlens,
                denominator=inputs.positive_denominator,
            )  # fmt: skip
            loss = loss + self.nll_coef * nll
            metrics.update(nll_metrics)
            terms["nll/loss"] = nll.detach()
        return LossOutput(loss, metrics, terms)


class DIS(_BandLoss):
    """SAO's DIS loss against the rollout log-probs; the band is strict (paper: math 0.3 / 5.0, coding
    0.8 / 3.0)."""

    type: Literal["dis"] = "dis"
    reference: ClassVar[Literal["rollout", "old"]] = "rollout"

    def _surrogate(self, x: LossInputs) -> tuple[Tensor, dict[str, Tensor]]:
        from .losses import dis_loss

        return dis_loss(x.logprobs, x.reference, x.advantages, x.action_mask, self.eps_low, self.eps_high,
                        self.agg, x.cu_seqlens, denominator=x.denominator)  # fmt: skip

    def token_state(self, logprobs: Tensor, reference: Tensor, advantages: Tensor) -> Tensor:
        from .losses import dis_band_state

        return dis_band_state(logprobs, reference, self.eps_low, self.eps_high)


class PPOClip(_BandLoss):
    """PPO's clipped surrogate against π_old, asymmetric bounds (DAPO clip-higher: 0.2 / 0.28)."""

    type: Literal["ppo_clip"] = "ppo_clip"
    reference: ClassVar[Literal["rollout", "old"]] = "old"
    eps_low: float = Field(0.2, gt=0, lt=1, description="Lower clip bound 1 - eps_low.")
    eps_high: float = Field(0.28, gt=0, description="Upper clip bound 1 + eps_high.")

    def _surrogate(self, x: LossInputs) -> tuple[Tensor, dict[str, Tensor]]:
        from .losses import ppo_clip_loss

        return ppo_clip_loss(x.logprobs, x.reference, x.advantages, x.action_mask, self.eps_low,
                             self.eps_high, self.agg, x.cu_seqlens, denominator=x.denominator)  # fmt: skip

    def token_state(self, logprobs: Tensor, reference: Tensor, advantages: Tensor) -> Tensor:
        from .losses import ppo_clip_state

        return ppo_clip_state(logprobs, reference, advantages, self.eps_low, self.eps_high)
