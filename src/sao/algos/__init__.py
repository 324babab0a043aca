"""The SAO algorithm library: typed algorithm configs that own their code, over pure tensor functions.

An estimator or a loss is a pydantic class (`base`: `AdvantageEstimator`, `PolicyLoss`); the built-in ones
are in ``estimators`` and ``loss_types``, a user's own is loaded by ``custom``. The tensor math on the packed
layout: GAE (``gae``, ``scan``, ``kernels``), group and stateful baselines (``group``, ``baselines``), the
policy losses (``losses``), the value loss and explained variance (``value``), masked reductions
(``reductions``), engine/trainer mismatch (``mismatch``). Nothing here touches models, engines or I/O.

Names are imported on first use (PEP 562), so the config, which imports the classes, loads without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULES: dict[str, tuple[str, ...]] = {
    "reductions": ("AGG_MODES", "aggregate", "masked_mean", "masked_var"),
    "base": ("AdvantageEstimator", "AdvantageInputs", "AdvantageResult", "AlgoPart", "CriticTargets",
             "LossAgg", "LossInputs", "LossOutput", "PolicyLoss"),
    "baselines": ("RunningMeanBaseline", "SPOTracker"),
    "custom": ("CustomEstimator", "CustomLoss"),
    "estimators": ("GRPO", "SPO", "RunningMean", "SkipObservationGAE", "StepGAE", "TokenGAE"),
    "gae": ("length_adaptive_lambda", "response_mask", "skip_observation_gae", "step_gae", "step_spans",
            "token_gae"),
    "group": ("broadcast_to_tokens", "grpo_advantages"),
    "loss_types": ("DIS", "PPOClip"),
    "losses": ("dis_band_state", "dis_loss", "positive_nll_loss", "ppo_clip_loss", "ppo_clip_state"),
    "scan": ("discounted_cumsum",),
    "value": ("explained_variance", "value_loss"),
}  # fmt: skip
_WHERE = {name: module for module, names in _MODULES.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'sao.algos' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"sao.algos.{module}"), name)
    globals()[name] = value
    return value
