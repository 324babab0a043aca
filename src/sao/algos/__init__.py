"""The SAO algorithm library: pure tensor functions on the packed layout, registered by name.

Advantage estimators (``gae``, ``group``, ``baselines``), policy losses (``losses``), the value loss and
explained variance (``value``), masked reductions (``aggregate``), the registries (``registry``) and the
built-in entries in them (``estimators``).
Nothing here touches models, engines or I/O.
"""

from . import estimators  # noqa: F401  (registers the built-in estimators and losses)
from .aggregate import AGG_MODES, aggregate, masked_mean, masked_var, masked_whiten
from .baselines import RunningMeanBaseline, SPOTracker
from .gae import length_adaptive_lambda, response_mask, skip_observation_gae, step_gae, step_spans, token_gae
from .group import broadcast_to_tokens, grpo_advantages
from .losses import dis_band_state, dis_loss, positive_nll_loss, ppo_clip_loss, ppo_clip_state
from .registry import (
    ADVANTAGE_ESTIMATORS,
    POLICY_LOSSES,
    AdvantageEstimator,
    AdvantageInputs,
    AdvantageParams,
    AdvantageResult,
    CriticTargets,
    compute_advantages,
    critic_targets,
    estimate_advantages,
    get_advantage_estimator,
    get_policy_loss,
    make_advantage_state,
    prompt_sampling_weights,
    register_advantage_estimator,
    register_policy_loss,
    update_advantage_state,
)
from .scan import discounted_cumsum, reverse_discounted_cumsum
from .value import explained_variance, value_loss

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGG_MODES",
    "POLICY_LOSSES",
    "AdvantageEstimator",
    "AdvantageInputs",
    "AdvantageParams",
    "AdvantageResult",
    "CriticTargets",
    "RunningMeanBaseline",
    "SPOTracker",
    "aggregate",
    "broadcast_to_tokens",
    "compute_advantages",
    "critic_targets",
    "dis_band_state",
    "dis_loss",
    "discounted_cumsum",
    "estimate_advantages",
    "explained_variance",
    "get_advantage_estimator",
    "get_policy_loss",
    "grpo_advantages",
    "length_adaptive_lambda",
    "make_advantage_state",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "positive_nll_loss",
    "ppo_clip_loss",
    "ppo_clip_state",
    "prompt_sampling_weights",
    "register_advantage_estimator",
    "register_policy_loss",
    "response_mask",
    "reverse_discounted_cumsum",
    "skip_observation_gae",
    "step_gae",
    "step_spans",
    "token_gae",
    "update_advantage_state",
    "value_loss",
]
