"""`Batch`: trajectories packed for the trainer, and its padded ``(B, L)`` view `PaddedBatch`.

`Batch` packs B trajectories into T tokens, 1-D and without padding: sequence b occupies
``cu_seqlens[b]:cu_seqlens[b + 1]`` (the flash-attn varlen layout). `PaddedBatch` is the ``(B, L)`` layout for
backends that need it; `Batch.pad` / `Batch.unpad` convert any per-token tensor between the two.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Literal, NoReturn

import torch
from torch import Tensor

from sao.algos.packed import action_span_bounds
from sao.trajectory import (
    _PER_TOKEN_LISTS,
    Trajectory,
    TrajectoryError,
    _first_bad_token,
    _TokenTensors,
)

__all__ = ["Batch", "BatchError", "PaddedBatch"]

PadSide = Literal["left", "right"]


class BatchError(TrajectoryError):
    """A packed `Batch` is inconsistent; the message names the batch index, its traj_id and the field."""


@dataclasses.dataclass(eq=False)  # tensors have no boolean ==
class PaddedBatch:
    """A `Batch` in the padded ``(B, L)`` layout, ``L = max_seqlen``, padded on the side it was built with.

    ``input_ids`` long (pad = pad_token_id); ``attention_mask`` long, 1 on real tokens (the HF convention);
    ``action_mask`` bool; ``rollout_logprobs`` float32 (pad 0); ``versions`` long (pad -1); ``token_rewards``
    float32 (pad 0); ``position_ids`` long (pad 0). `Batch.unpad` takes any of them back to packed ``(T,)``.
    """

    input_ids: Tensor
    attention_mask: Tensor
    action_mask: Tensor
    rollout_logprobs: Tensor
    versions: Tensor
    token_rewards: Tensor
    position_ids: Tensor


def _flat(trajs: Sequence[Trajectory], name: str, dtype: torch.dtype | None = None) -> Tensor | None:
    """The trajectories' ``name`` lists concatenated into one 1-D tensor; None if they are not flat lists of
    numbers of the field's kind (integers unless ``dtype`` is floating)."""
    values = list(itertools.chain.from_iterable(getattr(t, name) for t in trajs))
    try:
        t = torch.tensor(values, dtype=dtype) if dtype is not None else torch.tensor(values)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        return None
    if t.dim() != 1 or (dtype is None and t.is_floating_point()):
        return None
    return t


def _pack_checked(trajs: Sequence[Trajectory]) -> tuple[_TokenTensors, list[int]] | None:
    """The whole batch's token tensors (concatenated, as `Trajectory` validates them one by one) and the
    lengths, checked with a few whole-batch operations instead of ~20 per trajectory; None when any
    trajectory breaks a rule, so that the per-trajectory check names it."""
    lengths = []
    for traj in trajs:
        n = len(traj.token_ids)
        if n == 0 or any(len(getattr(traj, name)) != n for name in _PER_TOKEN_LISTS):
            return None
        lengths.append(n)
    token_ids, mask, versions, turn_ids = (_flat(trajs, n) for n in ("token_ids", "action_mask", "versions",
                                                                      "turn_ids"))  # fmt: skip
    logprobs = _flat(trajs, "rollout_logprobs", torch.float64)
    if token_ids is None or mask is None or versions is None or turn_ids is None or logprobs is None:
        return None
    if bool((token_ids < 0).any()) or bool(((mask != 0) & (mask != 1)).any()):
        return None
    action = mask.bool()
    if _first_bad_token(action, logprobs, versions) is not None:
        return None
    counts = torch.tensor(lengths)
    seq_ids = torch.repeat_interleave(torch.arange(len(trajs)), counts)
    ends = action_span_bounds(action, turn_ids, seq_ids)[1].nonzero().squeeze(-1)  # every span's last token
    spans = torch.bincount(seq_ids[ends], minlength=len(trajs)).tolist()
    placed: list[float] = []  # the reward on each span end, in order
    for traj, n_spans in zip(trajs, spans, strict=True):
        try:
            traj._check_turns_and_rewards(n_spans)  # the trajectory's own rule on turns and rewards
        except TrajectoryError:
            return None
        rewards = traj.rewards
        placed.extend(
            [0.0] * (n_spans - 1) + [float(rewards[0])] if len(rewards) == 1 else map(float, rewards)
        )
    token_rewards = torch.zeros(len(action), dtype=torch.float64)
    token_rewards[ends] = torch.tensor(placed, dtype=torch.float64)
    return _TokenTensors(
        token_ids.long(), action, logprobs, versions.long(), turn_ids.long(), token_rewards
    ), lengths


# The Batch fields of shape (T,).
_TOKEN_FIELDS = ("token_ids", *_PER_TOKEN_LISTS, "token_rewards", "position_ids")
_TENSOR_FIELDS = (*_TOKEN_FIELDS, "seq_ids", "cu_seqlens", "outcome_rewards", "truncated")


@dataclasses.dataclass(eq=False)  # tensors have no boolean ==
class Batch:
    """B trajectories packed into T tokens (1-D, no padding). Build it with `Batch.from_trajectories`.

    Per token, shape ``(T,)``: ``token_ids`` long, ``action_mask`` bool, ``rollout_logprobs`` float32,
    ``versions`` long, ``turn_ids`` long, ``token_rewards`` float32, ``position_ids`` long (0 at each sequence
    start), ``seq_ids`` long (sequence index of each token). Per sequence: ``cu_seqlens`` ``(B + 1,)`` int32
    (starts at 0, ends at T), ``outcome_rewards`` ``(B,)`` float32, ``truncated`` ``(B,)`` bool (the token or
    turn budget cut the episode: `Trajectory.truncated`), and the lists ``prompt_ids``, ``group_ids``,
    ``traj_ids``. ``max_seqlen`` is the longest sequence.
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
    truncated: Tensor
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
        first_index: dict[str, int] = {}
        for i, traj in enumerate(trajs):
            j = first_index.setdefault(traj.traj_id, i)
            if j != i:
                raise TrajectoryError(
                    f"batch index {i}: traj_id: {traj.traj_id} already at index {j}", "traj_id"
                )
        checked = _pack_checked(trajs)
        if checked is not None:
            packed, sizes = checked
        else:  # some trajectory breaks a rule: the per-trajectory check names the first one
            parts = []
            for i, traj in enumerate(trajs):
                try:
                    parts.append(traj._validated_tensors())
                except TrajectoryError as e:
                    raise TrajectoryError(f"batch index {i}: {e}", e.field) from e
            packed = _TokenTensors(*(torch.cat(fields) for fields in zip(*parts, strict=True)))
            sizes = [p.token_ids.numel() for p in parts]
        lengths = torch.tensor(sizes)
        cu_seqlens = torch.zeros(len(trajs) + 1, dtype=torch.int32)
        cu_seqlens[1:] = lengths.cumsum(0)
        seq_ids = torch.repeat_interleave(torch.arange(len(trajs)), lengths)
        batch = cls(
            token_ids=packed.token_ids,
            action_mask=packed.action,
            rollout_logprobs=packed.logprobs.float(),
            versions=packed.versions,
            turn_ids=packed.turn_ids,
            token_rewards=packed.token_rewards.float(),
            position_ids=torch.arange(int(lengths.sum())) - cu_seqlens[:-1].long()[seq_ids],
            seq_ids=seq_ids,
            cu_seqlens=cu_seqlens,
            outcome_rewards=torch.tensor([float(t.rewards[-1]) for t in trajs], dtype=torch.float32),
            truncated=torch.tensor([t.truncated for t in trajs], dtype=torch.bool),
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
        expected_shapes |= {"cu_seqlens": (B + 1,), "outcome_rewards": (B,), "truncated": (B,)}
        for name, shape in expected_shapes.items():
            if tuple(getattr(self, name).shape) != shape:
                fail(name, f"has shape {tuple(getattr(self, name).shape)}, expected {shape}")
        for name in ("action_mask", "truncated"):
            if getattr(self, name).dtype != torch.bool:
                fail(name, f"must be bool, got {getattr(self, name).dtype}")
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
            truncated=self.truncated[idx],
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
