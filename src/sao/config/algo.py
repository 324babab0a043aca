"""The RL algorithm section: which advantage estimator and policy loss (typed classes that own their code,
chosen by ``type``), and the critic schedule.

    algo:
      preset: sao
      advantage: {type: skip_observation_gae, lam_policy: adaptive, ...}   # sao.algos.estimators
      loss: {type: dis, eps_low: 0.3, eps_high: 5.0}                       # sao.algos.loss_types
      k_critic: 2
      group_size: 1
      value_pretrain: true

A user's own class: ``{type: custom, path: my_algo.py:MyLoss, ...its fields}`` (sao.algos.custom).
`MOVED_KEYS` maps the flat keys of earlier versions to their place here (loading refuses them with it).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from sao.algos.custom import CustomEstimator, CustomLoss
from sao.algos.estimators import GRPO, SPO, RunningMean, SkipObservationGAE, StepGAE, TokenGAE
from sao.algos.loss_types import DIS, PPOClip

from .section import Section

__all__ = ["DEFAULT_PRESET", "FLAT_DEFAULTS", "MOVED_KEYS", "Advantage", "AlgoConfig", "Loss"]

DEFAULT_PRESET = "sao"

Advantage = Annotated[
    SkipObservationGAE | TokenGAE | StepGAE | GRPO | RunningMean | SPO | CustomEstimator,
    Field(discriminator="type"),
]
Loss = Annotated[DIS | PPOClip | CustomLoss, Field(discriminator="type")]

# flat key of earlier versions -> its place now (a value -> "type" means the old value is the new type)
MOVED_KEYS: dict[str, str] = {
    "policy_loss": "loss.type",
    "eps_low": "loss.eps_low",
    "eps_high": "loss.eps_high",
    "loss_agg": "loss.agg",
    "nll_coef": "loss.nll_coef",
    "gamma": "advantage.gamma",
    "lam_policy": "advantage.lam_policy",
    "lam_critic": "advantage.lam_critic",
    "adaptive_alpha": "advantage.adaptive_alpha",
    "adaptive_length": "advantage.adaptive_length",
    "truncation": "advantage.truncation",
    "step_value": "advantage.step_value",
    "normalize_std": "advantage.normalize_std",
    "running_mean_window": "advantage.window",
    "running_mean_scope": "advantage.scope",
    "spo_d_half": "advantage.d_half",
    "spo_rho_min": "advantage.rho_min",
    "spo_rho_max": "advantage.rho_max",
    "spo_sampling_floor": "advantage.sampling_floor",
    "spo_prioritized_sampling": "advantage.prioritized_sampling",
}

# The flat section's defaults (the sao preset's): what `sao config --migrate` and the sweep's run keys
# (`sao.sweep.legacy_keys`) compare flat values with.
FLAT_DEFAULTS: dict[str, Any] = {
    "preset": DEFAULT_PRESET, "advantage": "skip_observation_gae", "step_value": "average",
    "policy_loss": "dis", "eps_low": 0.3, "eps_high": 5.0, "loss_agg": "token-mean", "nll_coef": 0.0,
    "gamma": 1.0, "lam_critic": 1.0, "lam_policy": "adaptive", "adaptive_alpha": 1.5,
    "adaptive_length": "action", "k_critic": 2, "group_size": 1, "normalize_std": True,
    "running_mean_window": 8, "running_mean_scope": "prompt", "spo_d_half": 0.06, "spo_rho_min": 0.875,
    "spo_rho_max": 0.96, "spo_sampling_floor": 0.05, "spo_prioritized_sampling": True,
    "value_pretrain": True, "truncation": "terminal",
}  # fmt: skip


class AlgoConfig(Section):
    """The RL algorithm: advantage estimator, policy loss, critic schedule, sampling (docs/algorithms.md).

    Defaults are the `sao` preset."""

    preset: str = Field(DEFAULT_PRESET, description="Preset this config started from (see `sao presets`).")
    advantage: Advantage = Field(
        default_factory=SkipObservationGAE,
        description="Advantage estimator, chosen by its type: skip_observation_gae, token_gae, step_gae "
        "(critic), grpo, running_mean, spo, or custom (a class of yours: path + its fields).",
    )
    loss: Loss = Field(
        default_factory=DIS,
        description="Policy loss, chosen by its type: dis (band mask on the ratio to the rollout log-probs), "
        "ppo_clip (clip against pi_old), or custom (a class of yours: path + its fields).",
    )
    k_critic: int = Field(2, ge=1, description="Critic optimizer steps per actor step, targets fixed (K).")
    group_size: int = Field(1, ge=1, description="Rollouts per prompt (1 = single rollout).")
    value_pretrain: bool = Field(True, description="Whether this algorithm pretrains the critic before RL.")

    @property
    def uses_critic(self) -> bool:
        """True when the estimator needs a learned value model (the GAE family)."""
        return bool(self.advantage.uses_critic)

    @model_validator(mode="after")
    def _consistent(self) -> AlgoConfig:
        if isinstance(self.advantage, GRPO) and self.group_size < 2:
            raise ValueError(
                f"algo.group_size must be >= 2 for algo.advantage.type='grpo' (got {self.group_size}): "
                "the baseline is the mean of the group"
            )
        return self
