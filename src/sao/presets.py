"""Algorithm presets (docs/algorithms.md): plain data, applied by `sao.config.load_config` before the YAML and
overrides.

A preset is a partial run config `{"algo": {"advantage": {"type": ...}, "loss": {"type": ...}, ...},
"critic": {...}}`: a named typed config. It fixes the advantage estimator, the policy loss and its band, the
critic schedule and the group size; anything it leaves out keeps the class's default. YAML values and dotted
overrides win over a preset (a YAML or override that names another ``type`` starts that class afresh).
"""

from __future__ import annotations

from typing import Any

# The paper's math-with-Python-tool DIS band (0.7, 6.0); coding agents use eps_low=0.8, eps_high=3.0.
_DIS_MATH = {"type": "dis", "eps_low": 0.3, "eps_high": 5.0}
# DAPO clip-higher, the GRPO and VAPO baselines' PPO band.
_CLIP_HIGHER = {"type": "ppo_clip", "eps_low": 0.2, "eps_high": 0.28}
_ADAPTIVE_GAE = {"lam_policy": "adaptive", "adaptive_alpha": 1.5, "lam_critic": 1.0}

_SAO_ALGO: dict[str, Any] = {
    "advantage": {"type": "skip_observation_gae", **_ADAPTIVE_GAE},
    "loss": dict(_DIS_MATH),
    "k_critic": 2,
    "group_size": 1,
    "value_pretrain": True,
}
_FROZEN_ATTENTION = {"freeze": "attention"}
_FULL_CRITIC = {"freeze": "none"}
_NO_CRITIC = {"k_critic": 1, "value_pretrain": False}


def _step_gae(step_value: str) -> dict[str, Any]:
    return {**_SAO_ALGO, "advantage": {"type": "step_gae", **_ADAPTIVE_GAE, "step_value": step_value}}


def _running_mean(window: int, scope: str) -> dict[str, Any]:
    advantage = {"type": "running_mean", "window": window, "scope": scope}
    return {"advantage": advantage, "loss": dict(_DIS_MATH), "group_size": 1, **_NO_CRITIC}


PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "sao": {"algo": dict(_SAO_ALGO), "critic": dict(_FROZEN_ATTENTION)},
    "grpo": {
        "algo": {"advantage": {"type": "grpo", "normalize_std": True}, "loss": dict(_CLIP_HIGHER),
                 "group_size": 8, **_NO_CRITIC},
    },
    "grpo_dis": {
        "algo": {"advantage": {"type": "grpo", "normalize_std": True}, "loss": dict(_DIS_MATH),
                 "group_size": 8, **_NO_CRITIC},
    },
    "sao_dis_only": {"algo": {**_SAO_ALGO, "k_critic": 1}, "critic": dict(_FULL_CRITIC)},
    "sao_k1": {"algo": {**_SAO_ALGO, "k_critic": 1}, "critic": dict(_FROZEN_ATTENTION)},
    "sao_full_critic": {"algo": dict(_SAO_ALGO), "critic": dict(_FULL_CRITIC)},
    "vapo": {
        "algo": {
            "advantage": {"type": "token_gae", **_ADAPTIVE_GAE},
            "loss": {**_CLIP_HIGHER, "nll_coef": 0.1},
            "group_size": 8,
            "k_critic": 1,
            "value_pretrain": True,
        },
        "critic": dict(_FULL_CRITIC),
    },
    "running_mean_8": {"algo": _running_mean(8, "prompt")},
    "running_mean_128": {"algo": _running_mean(128, "global")},
    "spo": {"algo": {"advantage": {"type": "spo"}, "loss": dict(_DIS_MATH), "group_size": 1, **_NO_CRITIC}},
    "step_average": {"algo": _step_gae("average"), "critic": dict(_FROZEN_ATTENTION)},
    "step_last_token": {"algo": _step_gae("last_token"), "critic": dict(_FROZEN_ATTENTION)},
}  # fmt: skip

PRESET_DESCRIPTIONS: dict[str, str] = {
    "sao": "SAO: single rollout, skip-observation GAE, DIS, K=2 frozen-attention critic, value pretraining",
    "grpo": "GRPO: group of 8, (R - mean)/std advantages, PPO clip-higher against pi_old",
    "grpo_dis": "GRPO advantages (group of 8) with the DIS loss against rollout log-probs",
    "sao_dis_only": "Ablation: single rollout, plain critic (K=1, full-parameter), DIS",
    "sao_k1": "Ablation: SAO with one critic update per actor update",
    "sao_full_critic": "Ablation: SAO with full-parameter critic training",
    "vapo": "VAPO without DIS: token GAE, adaptive lambda, clip-higher vs pi_old, NLL 0.1, group of 8",
    "running_mean_8": "Single rollout, baseline = mean of the prompt's 8 most recent rewards",
    "running_mean_128": "Single rollout, baseline = mean of the 128 most recent rewards overall",
    "spo": "Single rollout, per-prompt Beta tracker baseline (SPO), prioritised sampling",
    "step_average": "Step-wise GAE, one advantage per turn; step value = mean of its token values",
    "step_last_token": "Step-wise GAE, one advantage per turn; step value = value at the step's last token",
}
