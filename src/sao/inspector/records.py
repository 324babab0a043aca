"""Inspection records: one trajectory with what the trainer computed for it, token by token, as plain JSON.

A record (``kind`` "train"; built by `train_records` from a `Batch`, its `StepCapture` and trajectories)::

    {"kind": "train", "step": 12, "trained_version": 11, "index": 5, "traj_id": "…", "prompt_id": "…",
     "group_id": "…" | null, "group": [{"traj_id": "…", "reward": 1.0}, …] | null,
     "reward": 1.0, "rewards": [1.0], "finish_reason": "stop", "truncated": false,
     "length": 311, "action_tokens": 57, "turns": 2, "lag_mean": 0.8, "lag_max": 2,
     "masked_frac": 0.02 | null, "actor_updated": true,
     "tokens": {"id": […], "text": […], "role": "pppaaoo…", "turn": […], "rollout_logprob": […],
                "version": […], "token_reward": […], "logprob": […], "ratio": […], "state": […],
                "entropy": […], "advantage": […], "value_before": […], "value_after": […],
                "return": […], "value_mask": […]}}

Per-token lists are aligned with ``tokens.id``; ``role`` is one character per token (``p`` prompt, ``a``
action, ``o`` observation); ``version`` is −1 off action tokens; ``ratio`` is exp(logprob − reference) (the
reference the loss used: the rollout log-prob for DIS, π_old for PPO-clip) and ``state`` the loss's
per-token state (−1/0/+1, `sao.algos.dis_band_state` / `ppo_clip_state`), both on action tokens only (null
elsewhere). A trainer field the step did not compute is absent (critic-free presets: no values/returns).
``masked_frac``: the share of action tokens with a non-zero state. ``lag`` = trained_version − version.

Records of trajectories without trainer fields (``kind`` "trajectory": `sao serve --out` sessions; "eval":
`sao eval --transcripts` samples) come from `trajectory_record`, with the same layout minus those fields.
Floats are rounded to 7 significant digits (float32 precision).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from sao.train.capture import StepCapture
from sao.types import Batch, Trajectory

__all__ = ["roles", "token_texts", "train_records", "trajectory_record"]


def _num(x: float) -> float | None:
    """A JSON number at float32 precision; None for NaN/Inf (JSON has no such numbers)."""
    x = float(x)
    return float(f"{x:.7g}") if math.isfinite(x) else None


def _nums(xs: Tensor | Sequence[float]) -> list[float | None]:
    values = xs.tolist() if isinstance(xs, Tensor) else list(xs)
    return [_num(v) for v in values]


def roles(action_mask: Sequence[int], turn_ids: Sequence[int]) -> str:
    """One character per token: ``a`` action, ``p`` prompt (turn −1), ``o`` observation."""
    return "".join("a" if a else ("p" if t < 0 else "o") for a, t in zip(action_mask, turn_ids, strict=True))


def token_texts(tokenizer: Any, token_ids: Sequence[int]) -> list[str]:
    """Each token decoded alone (special tokens kept). A token holding part of a multi-byte character
    decodes to U+FFFD, as it does alone."""
    if tokenizer is None:
        return [f"<{i}>" for i in token_ids]
    return list(tokenizer.batch_decode([[int(i)] for i in token_ids], skip_special_tokens=False))


def _shape(traj: Trajectory, trained_version: int | None) -> dict[str, Any]:
    """The per-trajectory summary fields every record kind has."""
    versions = [v for v, a in zip(traj.versions, traj.action_mask, strict=True) if a]
    summary: dict[str, Any] = {
        "traj_id": traj.traj_id,
        "prompt_id": traj.prompt_id,
        "group_id": traj.group_id,
        "reward": _num(traj.outcome_reward),
        "rewards": _nums(traj.rewards),
        "finish_reason": traj.finish_reason,
        "length": len(traj.token_ids),
        "action_tokens": len(versions),
        "turns": traj.num_turns,
        "version_min": min(versions, default=None),
        "version_max": max(versions, default=None),
    }
    if trained_version is not None:
        lags = [trained_version - v for v in versions]
        summary["lag_mean"] = _num(sum(lags) / len(lags)) if lags else 0.0
        summary["lag_max"] = max(lags, default=0)
    return summary


def _tokens(traj: Trajectory, tokenizer: Any) -> dict[str, Any]:
    return {
        "id": list(traj.token_ids),
        "text": token_texts(tokenizer, traj.token_ids),
        "role": roles(traj.action_mask, traj.turn_ids),
        "turn": list(traj.turn_ids),
        "rollout_logprob": [
            _num(lp) if a else None for lp, a in zip(traj.rollout_logprobs, traj.action_mask, strict=True)
        ],
        "version": list(traj.versions),
        "token_reward": _nums(traj.token_rewards()),
    }


def trajectory_record(
    traj: Trajectory, tokenizer: Any, kind: str = "trajectory", **extra: Any
) -> dict[str, Any]:
    """A record of ``traj`` without trainer fields (module docstring); ``extra`` keys are added as given."""
    return {"kind": kind, **_shape(traj, None), **extra, "tokens": _tokens(traj, tokenizer)}


def train_records(
    batch: Batch,
    capture: StepCapture,
    trajectories: Sequence[Trajectory],
    indices: Sequence[int],
    tokenizer: Any,
) -> list[dict[str, Any]]:
    """The records of ``trajectories[i]`` for ``i`` in ``indices`` (batch order; ``trajectories`` are the
    batch's, in order), with the trainer's per-token quantities from ``capture``."""
    if len(trajectories) != batch.num_sequences:
        raise ValueError(f"{len(trajectories)} trajectories for a batch of {batch.num_sequences}")
    cu = batch.cu_seqlens.tolist()
    outcome = batch.outcome_rewards.tolist()
    groups: dict[Any, list[dict[str, Any]]] = {}
    for i, gid in enumerate(batch.group_ids):
        if gid is not None:
            groups.setdefault(gid, []).append({"traj_id": batch.traj_ids[i], "reward": _num(outcome[i])})
    ratio = state = None
    if capture.logprobs is not None and capture.reference is not None:
        ratio = torch.exp((capture.logprobs - capture.reference).clamp(-20.0, 20.0))
    if capture.token_state is not None:
        state = capture.token_state
    records = []
    for i in indices:
        traj = trajectories[i]
        sl = slice(cu[i], cu[i + 1])
        action = batch.action_mask[sl].bool().cpu()
        record: dict[str, Any] = {
            "kind": "train", "step": capture.step, "trained_version": capture.policy_version, "index": int(i),
            **_shape(traj, capture.policy_version),
            "group": groups.get(traj.group_id) if traj.group_id is not None else None,
            "truncated": bool(batch.truncated[i]), "actor_updated": capture.actor_updated,
            "masked_frac": None,
        }  # fmt: skip
        tokens = _tokens(traj, tokenizer)
        if state is not None and capture.advantages is not None:
            s = state[sl]
            n = int(action.sum())
            record["masked_frac"] = _num(float((s[action] != 0).sum()) / n) if n else 0.0
            tokens["state"] = [
                int(v) if a else None for v, a in zip(s.tolist(), action.tolist(), strict=True)
            ]
        if ratio is not None:
            tokens["ratio"] = [
                v if a else None for v, a in zip(_nums(ratio[sl]), action.tolist(), strict=True)
            ]
        for name, value in (
            ("logprob", capture.logprobs), ("entropy", capture.entropy), ("advantage", capture.advantages),
            ("value_before", capture.values_before), ("value_after", capture.values_after),
            ("return", capture.returns),
        ):  # fmt: skip
            if value is not None:
                tokens[name] = _nums(value[sl])
        if capture.value_mask is not None:
            tokens["value_mask"] = [int(v) for v in capture.value_mask[sl].tolist()]
        record["tokens"] = tokens
        records.append(record)
    return records
