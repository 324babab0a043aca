"""Core data types: a `Trajectory` per episode, and a `Batch` of trajectories packed for the trainer.

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

`Batch` packs B trajectories into T tokens, 1-D and without padding: sequence b occupies
``cu_seqlens[b]:cu_seqlens[b + 1]`` (the flash-attn varlen layout). `PaddedBatch` is the ``(B, L)`` layout for
backends that need it; `Batch.pad` / `Batch.unpad` convert any per-token tensor between the two.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import numbers
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple, NoReturn

import torch
from torch import Tensor

from sao.jsonl import iter_jsonl

__all__ = ["Batch", "BatchError", "PaddedBatch", "Trajectory", "TrajectoryError", "load_jsonl", "save_jsonl"]

PadSide = Literal["left", "right"]


class TrajectoryError(ValueError):
    """A trajectory breaks an invariant; the message names the trajectory and field (also in ``field``)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class BatchError(TrajectoryError):
    """A packed `Batch` is inconsistent; the message names the batch index, its traj_id and the field."""


_PER_TOKEN_LISTS = ("action_mask", "rollout_logprobs", "versions", "turn_ids")
_LIST_FIELDS = ("token_ids", *_PER_TOKEN_LISTS, "rewards")


class _TokenTensors(NamedTuple):
    token_ids: Tensor  # (n,) long
    action: Tensor  # (n,) bool
    logprobs: Tensor  # (n,) float64
    versions: Tensor  # (n,) long
    turn_ids: Tensor  # (n,) long
    token_rewards: Tensor  # (n,) float64


def _action_span_ends(action: Tensor, turn_ids: Tensor) -> Tensor:
    """Sorted indices (long) of the last token of each action span. ``action`` (n,) bool; ``turn_ids`` (n,)"""
    next_continues_span = torch.zeros_like(action)
    next_continues_span[:-1] = action[1:] & (turn_ids[1:] == turn_ids[:-1])
    return (action & ~next_continues_span).nonzero().squeeze(-1)


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
        return _action_span_ends(self._action_tensor(), self._tensor("turn_ids", torch.long))

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
        span_ends = _action_span_ends(action, turn_ids)
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


@dataclasses.dataclass(eq=False)  # tensors have no boolean ==
class PaddedBatch:
    """A `Batch` in the padded ``(B, L)`` layout, ``L = max_seqlen``, padded on the side it was built with.

    ``input_ids`` long (pad = pad_token_id); ``attention_mask`` long, 1 on real tokens (the HF convention);
    ``action_mask`` bool; ``rollout_logprobs`` float32 (pad 0); ``versions`` long (pad -1); ``token_rewards``
    float32 (pad 0); ``position_ids`` long (pad 0).
    """

    input_ids: Tensor
    attention_mask: Tensor
    action_mask: Tensor
    rollout_logprobs: Tensor
    versions: Tensor
    token_rewards: Tensor
    position_ids: Tensor

    def to_packed_values(self, x: Tensor) -> Tensor:
        """``(B, L, ...)`` → packed ``(T, ...)``, sequences and tokens in order (either padding side)."""
        if tuple(x.shape[:2]) != tuple(self.attention_mask.shape):
            raise ValueError(
                f"expected a tensor of shape {tuple(self.attention_mask.shape)}, got {tuple(x.shape)}"
            )
        return x[self.attention_mask.bool()]


# The Batch fields of shape (T,).
_TOKEN_FIELDS = ("token_ids", *_PER_TOKEN_LISTS, "token_rewards", "position_ids")
_TENSOR_FIELDS = (*_TOKEN_FIELDS, "seq_ids", "cu_seqlens", "outcome_rewards")


@dataclasses.dataclass(eq=False)  # tensors have no boolean ==
class Batch:
    """B trajectories packed into T tokens (1-D, no padding). Build it with `Batch.from_trajectories`.

    Per token, shape ``(T,)``: ``token_ids`` long, ``action_mask`` bool, ``rollout_logprobs`` float32,
    ``versions`` long, ``turn_ids`` long, ``token_rewards`` float32, ``position_ids`` long (0 at each sequence
    start), ``seq_ids`` long (sequence index of each token). Per sequence: ``cu_seqlens`` ``(B + 1,)`` int32
    (starts at 0, ends at T), ``outcome_rewards`` ``(B,)`` float32, and the lists ``prompt_ids``,
    ``group_ids``, ``traj_ids``. ``max_seqlen`` is the longest sequence.
    """

    token_ids: Tensor
    action_mask: Tensor
    rollout_logprobs: Tensor
    versions: Tensor
    turn_ids: Tensor
    token_rewards: Tensor
    position_ids: Tensor
    seq_ids: Tensor
    cu_seqlens: Tensor
    outcome_rewards: Tensor
    prompt_ids: list[str]
    group_ids: list[str | None]
    traj_ids: list[str]
    max_seqlen: int

    @classmethod
    def from_trajectories(
        cls, trajs: Sequence[Trajectory], device: torch.device | str | None = None
    ) -> Batch:
        """Validate and pack ``trajs`` in order. Errors name the batch index and the field; a repeated traj_id
        is an error (a trajectory is trained on at most once)."""
        if len(trajs) == 0:
            raise ValueError("Batch.from_trajectories needs at least one trajectory")
        parts = []
        first_index: dict[str, int] = {}
        for i, traj in enumerate(trajs):
            try:
                parts.append(traj._validated_tensors())
            except TrajectoryError as e:
                raise TrajectoryError(f"batch index {i}: {e}", e.field) from e
            j = first_index.setdefault(traj.traj_id, i)
            if j != i:
                raise TrajectoryError(
                    f"batch index {i}: traj_id: {traj.traj_id} already at index {j}", "traj_id"
                )
        lengths = torch.tensor([p.token_ids.numel() for p in parts])
        cu_seqlens = torch.zeros(len(parts) + 1, dtype=torch.int32)
        cu_seqlens[1:] = lengths.cumsum(0)
        seq_ids = torch.repeat_interleave(torch.arange(len(parts)), lengths)
        batch = cls(
            token_ids=torch.cat([p.token_ids for p in parts]),
            action_mask=torch.cat([p.action for p in parts]),
            rollout_logprobs=torch.cat([p.logprobs for p in parts]).float(),
            versions=torch.cat([p.versions for p in parts]),
            turn_ids=torch.cat([p.turn_ids for p in parts]),
            token_rewards=torch.cat([p.token_rewards for p in parts]).float(),
            position_ids=torch.arange(int(lengths.sum())) - cu_seqlens[:-1].long()[seq_ids],
            seq_ids=seq_ids,
            cu_seqlens=cu_seqlens,
            outcome_rewards=torch.tensor([float(t.rewards[-1]) for t in trajs], dtype=torch.float32),
            prompt_ids=[t.prompt_id for t in trajs],
            group_ids=[t.group_id for t in trajs],
            traj_ids=[t.traj_id for t in trajs],
            max_seqlen=int(lengths.max()),
        )
        return batch if device is None else batch.to(device)

    @property
    def num_sequences(self) -> int:
        return len(self.traj_ids)

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def seq_lengths(self) -> Tensor:
        """``(B,)`` long: tokens per sequence."""
        return (self.cu_seqlens[1:] - self.cu_seqlens[:-1]).long()

    def validate(self) -> None:
        """Raise `BatchError` if the packed tensors are inconsistent or break a per-token invariant."""
        B, T, device = self.num_sequences, self.num_tokens, self.token_ids.device

        def fail(name: str, detail: str, seq: int | None = None) -> NoReturn:
            where = "batch" if seq is None else f"batch index {seq} (traj_id={self.traj_ids[seq]})"
            raise BatchError(f"{where}: {name}: {detail}", name)

        for name in ("prompt_ids", "group_ids"):
            if len(getattr(self, name)) != B:
                fail(name, f"has {len(getattr(self, name))} entries but traj_ids has {B}")
        expected_shapes = {name: (T,) for name in (*_TOKEN_FIELDS, "seq_ids")}
        expected_shapes |= {"cu_seqlens": (B + 1,), "outcome_rewards": (B,)}
        for name, shape in expected_shapes.items():
            if tuple(getattr(self, name).shape) != shape:
                fail(name, f"has shape {tuple(getattr(self, name).shape)}, expected {shape}")
        if self.action_mask.dtype != torch.bool:
            fail("action_mask", f"must be bool, got {self.action_mask.dtype}")
        cu = self.cu_seqlens.long()
        if int(cu[0]) != 0 or int(cu[-1]) != T:
            fail("cu_seqlens", f"must run from 0 to T={T}, got {int(cu[0])}..{int(cu[-1])}")
        lengths = cu[1:] - cu[:-1]
        if (lengths <= 0).any():
            fail(
                "cu_seqlens", "sequence is empty or has negative length", int((lengths <= 0).nonzero()[0, 0])
            )
        seq_ids = torch.repeat_interleave(torch.arange(B, device=device), lengths)
        position_ids = torch.arange(T, device=device) - cu[:-1][seq_ids]
        for name, expected in (("seq_ids", seq_ids), ("position_ids", position_ids)):
            wrong = (getattr(self, name) != expected).nonzero()
            if wrong.numel():
                fail(
                    name, f"disagrees with cu_seqlens at token {int(wrong[0, 0])}", int(seq_ids[wrong[0, 0]])
                )
        if self.max_seqlen != int(lengths.max()):
            fail("max_seqlen", f"is {self.max_seqlen}, longest sequence has {int(lengths.max())} tokens")
        actions_per_seq = torch.zeros(B, dtype=torch.long, device=device).index_add_(
            0, seq_ids, self.action_mask.long()
        )
        if (actions_per_seq == 0).any():
            fail("action_mask", "sequence has no action tokens", int((actions_per_seq == 0).nonzero()[0, 0]))
        bad = _first_bad_token(self.action_mask, self.rollout_logprobs, self.versions)
        if bad is not None:
            name, t, reason = bad
            seq = int(seq_ids[t])
            fail(name, f"position {t - int(cu[seq])}: {reason}", seq)
        for name, per_seq in (
            ("token_rewards", self.token_rewards),
            ("outcome_rewards", self.outcome_rewards),
        ):
            bad_rewards = (~torch.isfinite(per_seq)).nonzero()
            if bad_rewards.numel():
                i = int(bad_rewards[0, 0])
                fail(name, "non-finite reward", int(seq_ids[i]) if name == "token_rewards" else i)

    def _pad_columns(self, side: PadSide, length: int) -> Tensor:
        if side == "right":
            return self.position_ids
        if side == "left":
            return self.position_ids + (length - self.seq_lengths)[self.seq_ids]
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")

    def pad(self, x: Tensor, side: PadSide = "right", fill: float = 0) -> Tensor:
        """Packed ``(T, ...)`` → padded ``(B, L, ...)`` with ``L = max_seqlen``, filled with ``fill``."""
        if x.shape[0] != self.num_tokens:
            raise ValueError(f"expected a ({self.num_tokens}, ...) packed tensor, got shape {tuple(x.shape)}")
        out = x.new_full((self.num_sequences, self.max_seqlen, *x.shape[1:]), fill)
        out[self.seq_ids, self._pad_columns(side, self.max_seqlen)] = x
        return out

    def unpad(self, x: Tensor, side: PadSide = "right") -> Tensor:
        """Padded ``(B, L, ...)`` → packed ``(T, ...)``; any ``L >= max_seqlen`` padded on ``side`` works."""
        if x.dim() < 2 or x.shape[0] != self.num_sequences or x.shape[1] < self.max_seqlen:
            raise ValueError(
                f"expected a ({self.num_sequences}, >={self.max_seqlen}, ...) tensor, got {tuple(x.shape)}"
            )
        return x[self.seq_ids, self._pad_columns(side, x.shape[1])]

    def to_padded(self, pad_token_id: int = 0, side: PadSide = "right") -> PaddedBatch:
        """The ``(B, max_seqlen)`` layout; see `PaddedBatch` for dtypes and pad values."""
        return PaddedBatch(
            input_ids=self.pad(self.token_ids, side, fill=pad_token_id),
            attention_mask=self.pad(torch.ones_like(self.token_ids), side),
            action_mask=self.pad(self.action_mask, side),
            rollout_logprobs=self.pad(self.rollout_logprobs, side),
            versions=self.pad(self.versions, side, fill=-1),
            token_rewards=self.pad(self.token_rewards, side),
            position_ids=self.pad(self.position_ids, side),
        )

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """A copy with every tensor on ``device``."""
        moved = {name: getattr(self, name).to(device, non_blocking=non_blocking) for name in _TENSOR_FIELDS}
        lists = {name: list(getattr(self, name)) for name in ("prompt_ids", "group_ids", "traj_ids")}
        return dataclasses.replace(self, **moved, **lists)

    def select(self, indices: Sequence[int] | Tensor) -> Batch:
        """A new batch of the sequences at ``indices`` (1-D, in that order; negatives count from the end)."""
        B, device = self.num_sequences, self.token_ids.device
        idx = torch.as_tensor(indices, dtype=torch.long).to(device)
        if idx.dim() != 1 or idx.numel() == 0:
            raise ValueError(f"select needs a non-empty 1-D list of indices, got shape {tuple(idx.shape)}")
        if ((idx < -B) | (idx >= B)).any():
            raise IndexError(f"select: index out of range for a batch of {B} sequences")
        idx = idx % B
        lengths = self.seq_lengths[idx]
        cu_seqlens = torch.zeros(idx.numel() + 1, dtype=torch.int32, device=device)
        cu_seqlens[1:] = lengths.cumsum(0)
        seq_ids = torch.repeat_interleave(torch.arange(idx.numel(), device=device), lengths)
        starts = self.cu_seqlens[:-1].long()[idx]
        new_positions = torch.arange(seq_ids.numel(), device=device) - cu_seqlens[:-1].long()[seq_ids]
        gather = starts[seq_ids] + new_positions
        rows = idx.tolist()
        return Batch(
            **{name: getattr(self, name)[gather] for name in _TOKEN_FIELDS},
            seq_ids=seq_ids,
            cu_seqlens=cu_seqlens,
            outcome_rewards=self.outcome_rewards[idx],
            prompt_ids=[self.prompt_ids[i] for i in rows],
            group_ids=[self.group_ids[i] for i in rows],
            traj_ids=[self.traj_ids[i] for i in rows],
            max_seqlen=int(lengths.max()),
        )

    def split(self, max_tokens: int) -> list[Batch]:
        """Micro-batches of at most ``max_tokens`` tokens, in order, never splitting a sequence; a sequence
        longer than the budget gets a micro-batch of its own."""
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        groups: list[list[int]] = [[]]
        used = 0
        for i, n in enumerate(self.seq_lengths.tolist()):
            if groups[-1] and used + n > max_tokens:
                groups.append([])
                used = 0
            groups[-1].append(i)
            used += n
        return [self.select(g) for g in groups]
