"""The `Trajectory`: one episode, token in / token out, with its invariants and JSONL I/O.

Conventions
-----------
- A trajectory is one token sequence ``prompt, a_0, o_0, a_1, o_1, …, a_n``. ``action_mask`` is 1 on the
  tokens the model generated (the a_i) and 0 on prompt and observation tokens.
- ``turn_ids`` is -1 on prompt tokens; turn i covers action span a_i and the observation o_i after it.
- An *action span* is a maximal run of consecutive action tokens with the same turn id; ``num_turns`` counts
  them (two back-to-back actions with different turn ids are two turns).
- ``rewards[-1]`` is the outcome reward. One entry means outcome only; one entry per action span means
  per-turn rewards (``rewards[i]`` belongs to span i). Any other length is invalid.
- ``token_rewards()`` puts reward i on the last token of span i (outcome only: on the last action token) and
  0 everywhere else; this is the per-token reward vector the advantage estimators consume.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import numbers
import os
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor

from sao.algos.packed import action_span_bounds
from sao.jsonl import iter_jsonl

__all__ = [
    "TRUNCATED_FINISH_REASONS",
    "Trajectory",
    "TrajectoryError",
    "load_jsonl",
    "save_jsonl",
]

# finish_reason values of an episode cut by a budget rather than ended by the env (see
# sao.rollout.agent_loop): "length" = the token budget (max_total_tokens, or the engine's context) cut the
# last turn; "max_turns" = the turn budget ran out before the env said done.
TRUNCATED_FINISH_REASONS: frozenset[str] = frozenset({"length", "max_turns"})


class TrajectoryError(ValueError):
    """A trajectory breaks an invariant; the message names the trajectory and field (also in ``field``)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


_PER_TOKEN_LISTS = ("action_mask", "rollout_logprobs", "versions", "turn_ids")
_LIST_FIELDS = ("token_ids", *_PER_TOKEN_LISTS, "rewards")


class _TokenTensors(NamedTuple):
    token_ids: Tensor  # (n,) long
    action: Tensor  # (n,) bool
    logprobs: Tensor  # (n,) float64
    versions: Tensor  # (n,) long
    turn_ids: Tensor  # (n,) long
    token_rewards: Tensor  # (n,) float64


def _first_bad_token(action: Tensor, logprobs: Tensor, versions: Tensor) -> tuple[str, int, str] | None:
    """The first token breaking a per-token rule, as ``(field, index, reason)``; None if all hold.

    ``action`` (n,) bool; ``logprobs`` (n,) float; ``versions`` (n,) integer.
    """
    rules = (
        ("rollout_logprobs", action & ~torch.isfinite(logprobs), "action token has a non-finite log-prob"),
        ("rollout_logprobs", action & (logprobs > 0), "action token has a positive log-prob"),
        ("versions", action & (versions < 0), "action token has no policy version (< 0)"),
        ("versions", ~action & (versions != -1), "non-action token has a version other than -1"),
    )
    for name, bad, reason in rules:
        hits = bad.nonzero()
        if hits.numel():
            t = int(hits[0, 0])
            value = (logprobs if name == "rollout_logprobs" else versions)[t].item()
            return name, t, f"{reason} (value {value})"
    return None


@dataclasses.dataclass
class Trajectory:
    """One episode, token in / token out. All per-token lists have ``len(token_ids)`` entries.

    ``action_mask``: 1 = model-generated, 0 = prompt/observation. ``rollout_logprobs``: the engine's sampling
    log-prob on action tokens, 0.0 elsewhere. ``versions``: policy version per action token, -1 elsewhere.
    ``turn_ids``, ``rewards``: see the module docstring.
    """

    prompt_id: str
    token_ids: list[int]
    action_mask: list[int]
    rollout_logprobs: list[float]
    versions: list[int]
    turn_ids: list[int]
    rewards: list[float]
    finish_reason: str = "stop"  # "stop" | "length" | "max_turns" | "error" | …
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    group_id: str | None = None
    traj_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_action_tokens(self) -> int:
        return sum(1 for m in self.action_mask if m)

    @property
    def response_length(self) -> int:
        """Tokens from the first action token to the end (0 without action tokens)."""
        first = next((i for i, m in enumerate(self.action_mask) if m), None)
        return 0 if first is None else len(self.token_ids) - first

    @property
    def truncated(self) -> bool:
        """True when the token or turn budget cut the episode (``finish_reason`` in
        `TRUNCATED_FINISH_REASONS`): its last state is not terminal. ``stop`` and ``error`` are not."""
        return self.finish_reason in TRUNCATED_FINISH_REASONS

    @property
    def num_turns(self) -> int:
        """Number of action spans."""
        return int(self._span_ends().numel())

    @property
    def outcome_reward(self) -> float:
        if not self.rewards:
            raise self._error("rewards", "is empty")
        return float(self.rewards[-1])

    def validate(self) -> None:
        """Raise `TrajectoryError` naming this trajectory and the first field that breaks an invariant."""
        self._validated_tensors()

    def token_rewards(self) -> list[float]:
        """Per-token rewards: reward i on the last token of action span i (outcome only: on the last action
        token), 0.0 elsewhere. Checks the turn/reward layout, not the other per-token fields."""
        span_ends = self._span_ends()
        self._check_turns_and_rewards(span_ends.numel())
        return self._place_rewards(span_ends).tolist()

    def _error(self, field: str, detail: str) -> TrajectoryError:
        return TrajectoryError(
            f"trajectory {self.traj_id} (prompt_id={self.prompt_id!r}): {field}: {detail}", field
        )

    def _check_lengths(self) -> None:
        n = len(self.token_ids)
        for name in _PER_TOKEN_LISTS:
            if len(getattr(self, name)) != n:
                raise self._error(name, f"has {len(getattr(self, name))} entries but token_ids has {n}")
        if n == 0:
            raise self._error("token_ids", "is empty")

    def _tensor(self, name: str, dtype: torch.dtype) -> Tensor:
        values = getattr(self, name)
        try:
            t = torch.tensor(values, dtype=dtype) if dtype.is_floating_point else torch.tensor(values)
        except (TypeError, ValueError, RuntimeError, OverflowError) as e:
            raise self._error(name, f"is not a flat list of numbers ({e})") from e
        if t.dim() != 1 or (t.is_floating_point() and not dtype.is_floating_point):
            raise self._error(
                name, f"must be a flat list of {'floats' if dtype.is_floating_point else 'ints'}"
            )
        return t.to(dtype)

    def _action_tensor(self) -> Tensor:
        mask = self._tensor("action_mask", torch.long)
        if ((mask != 0) & (mask != 1)).any():
            raise self._error("action_mask", "values must be 0 or 1")
        return mask.bool()

    def _span_ends(self) -> Tensor:
        self._check_lengths()
        _, ends = action_span_bounds(self._action_tensor(), self._tensor("turn_ids", torch.long))
        return ends.nonzero().squeeze(-1)

    def _check_turns_and_rewards(self, num_turns: int) -> None:
        if num_turns == 0:
            raise self._error("action_mask", "has no action tokens (nothing to train on)")
        if len(self.rewards) == 0:
            raise self._error("rewards", "is empty; it needs at least the outcome reward")
        for i, r in enumerate(self.rewards):
            if not isinstance(r, numbers.Real) or not math.isfinite(r):
                raise self._error("rewards", f"rewards[{i}] = {r!r} is not a finite number")
        if len(self.rewards) not in (1, num_turns):
            raise self._error(
                "rewards",
                f"has {len(self.rewards)} entries; expected 1 (outcome) or {num_turns} (one per turn)",
            )

    def _place_rewards(self, span_ends: Tensor) -> Tensor:
        out = torch.zeros(len(self.token_ids), dtype=torch.float64)
        if len(self.rewards) == 1:
            out[span_ends[-1]] = float(self.rewards[0])
        else:
            out[span_ends] = torch.tensor([float(r) for r in self.rewards], dtype=torch.float64)
        return out

    def _validated_tensors(self) -> _TokenTensors:
        self._check_lengths()
        token_ids = self._tensor("token_ids", torch.long)
        if (token_ids < 0).any():
            raise self._error("token_ids", "contains a negative token id")
        action = self._action_tensor()
        logprobs = self._tensor("rollout_logprobs", torch.float64)
        versions = self._tensor("versions", torch.long)
        turn_ids = self._tensor("turn_ids", torch.long)
        span_ends = action_span_bounds(action, turn_ids)[1].nonzero().squeeze(-1)
        self._check_turns_and_rewards(span_ends.numel())
        bad = _first_bad_token(action, logprobs, versions)
        if bad is not None:
            name, t, reason = bad
            raise self._error(name, f"token {t}: {reason}")
        return _TokenTensors(token_ids, action, logprobs, versions, turn_ids, self._place_rewards(span_ends))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict of plain Python values (copies; ``metadata`` must itself be JSON-serialisable)."""
        return {
            "traj_id": self.traj_id,
            "prompt_id": self.prompt_id,
            "group_id": self.group_id,
            "token_ids": [int(x) for x in self.token_ids],
            "action_mask": [int(x) for x in self.action_mask],
            "rollout_logprobs": [float(x) for x in self.rollout_logprobs],
            "versions": [int(x) for x in self.versions],
            "turn_ids": [int(x) for x in self.turn_ids],
            "rewards": [float(x) for x in self.rewards],
            "finish_reason": self.finish_reason,
            "metadata": copy.deepcopy(self.metadata),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Trajectory:
        """Inverse of `to_dict` (copies values, does not `validate`). Unknown or missing keys are errors."""
        if not isinstance(data, Mapping):
            raise TrajectoryError(f"expected a JSON object, got {type(data).__name__}")
        where = f"trajectory {data.get('traj_id')} (prompt_id={data.get('prompt_id')!r})"
        kwargs = dict(data)
        for name in _LIST_FIELDS:
            if name in kwargs:
                if not isinstance(kwargs[name], list):
                    raise TrajectoryError(f"{where}: {name}: must be a list", name)
                kwargs[name] = list(kwargs[name])
        kwargs["metadata"] = copy.deepcopy(kwargs.get("metadata", {}))
        try:
            return cls(**kwargs)
        except TypeError as e:  # an unknown or a missing key; the message names it
            raise TrajectoryError(f"{where}: {e}") from e


def save_jsonl(path: str | os.PathLike[str], trajs: Iterable[Trajectory]) -> None:
    """One trajectory per line, to a temporary file renamed at the end: readers never see half a file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            for traj in trajs:
                f.write(json.dumps(traj.to_dict(), ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_jsonl(path: str | os.PathLike[str], validate: bool = True) -> list[Trajectory]:
    """Read trajectories written by `save_jsonl` (blank lines are skipped).

    A line that is not valid JSON, not a trajectory, or (with ``validate``) not a valid one raises
    `TrajectoryError` naming the file and line number.
    """
    path = Path(path)
    trajs = []
    for lineno, data in iter_jsonl(path, TrajectoryError):
        try:
            traj = Trajectory.from_dict(data)
            if validate:
                traj.validate()
        except TrajectoryError as e:
            raise TrajectoryError(f"{path}:{lineno}: {e}", e.field) from e
        trajs.append(traj)
    return trajs
