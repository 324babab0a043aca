"""Slot KV cache and the ``sao_engine`` attention that reads and writes it during one engine step.

Layout. Each running sequence owns one *slot* ``s`` (``0 <= s < B``, the running sequences always occupy
slots ``0 .. B-1``; a finished sequence's slot is refilled by moving the last one in). Per layer the cache
holds ``keys`` and ``values`` of shape ``(slots, H_kv, capacity, D)``; row ``s`` holds the post-RoPE keys of
sequence ``s`` at positions ``0 .. len - 1``. The buffers are allocated lazily by the first forward (their
shape comes from the model's own key tensors, so any HF attention layout works) and grow by doubling up to
the context limit.

One engine step is one forward of a packed row ``input_ids (1, T)``: first the *prefill* segments (the
tokens of newly admitted or re-prefilled sequences whose KV is not cached yet, each a contiguous run with
positions ``start .. start + n - 1``), then exactly one *decode* token per running sequence, in slot order.
Position ids are per sequence. In every layer, the ``sao_engine`` attention function

1. writes the new keys/values of the step into each sequence's slot at its positions;
2. prefill segment: one causal SDPA call of its queries over its own slot's keys (no cross-sequence
   attention);
3. decode: one batched SDPA call of the ``B`` decode queries ``(B, H, 1, D)`` over
   ``keys[:B, :, :L]`` with a boolean mask ``(B, 1, 1, L)`` that hides each row's positions beyond its own
   length. Masked keys contribute exactly zero, so a row's output is the one-sequence forward's output up
   to float summation order (tested against teacher forcing at 1e-4 and batched-vs-alone at 1e-5).

The step layout reaches the attention layers through a `ContextVar` (`StepPlan.active`), so only the
engine's own thread sees it. Outside a plan ``sao_engine`` is exactly ``sao_varlen`` (packed training
forwards, stock SDPA for padded batches and HF KV-cache generation): a model switched to it still serves the
trainer.

Owns: the KV buffers, the per-step plan and the attention/mask registration. Does not own: which sequences
run (`local_scheduler`) or sampling.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.nn.functional import scaled_dot_product_attention
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from sao.models.attention import PACKED_ATTENTION

__all__ = ["ENGINE_ATTENTION", "PrefillSegment", "SlotKVCache", "StepPlan"]

ENGINE_ATTENTION = "sao_engine"
_MIN_CAPACITY = 64


class SlotKVCache:
    """Per-layer ``(slots, H_kv, capacity, D)`` key and value buffers, one row per running sequence.

    ``max_len`` bounds the capacity (the engine's context limit). Not thread-safe: only the engine loop
    touches it.
    """

    def __init__(self, slots: int, max_len: int) -> None:
        self.slots = slots
        self.max_len = max_len
        self.capacity = 0  # positions every layer buffer holds once allocated
        self._keys: list[Tensor | None] = []
        self._values: list[Tensor | None] = []

    def reserve(self, length: int) -> None:
        """Make room for positions ``0 .. length - 1`` (doubling; existing rows are kept)."""
        if length > self.max_len:
            raise ValueError(f"KV length {length} exceeds the context limit {self.max_len}")
        if length <= self.capacity:
            return
        capacity = max(self.capacity, _MIN_CAPACITY)
        while capacity < length:
            capacity *= 2
        self.capacity = min(capacity, self.max_len)
        self._keys = [None if k is None else self._grown(k) for k in self._keys]
        self._values = [None if v is None else self._grown(v) for v in self._values]

    def _grown(self, buf: Tensor) -> Tensor:
        new = buf.new_zeros(*buf.shape[:2], self.capacity, buf.shape[-1])
        new[:, :, : buf.shape[2]] = buf
        return new

    def layer(self, index: int, like: Tensor) -> tuple[Tensor, Tensor]:
        """``(keys, values)`` buffers of layer ``index``, allocated on first use with the head count, head
        size, dtype and device of ``like`` ``(1, H_kv, T, D)``."""
        while len(self._keys) <= index:
            self._keys.append(None)
            self._values.append(None)
        if self._keys[index] is None:
            shape = (self.slots, like.shape[1], self.capacity, like.shape[-1])
            self._keys[index] = like.new_zeros(shape)
            self._values[index] = like.new_zeros(shape)
        return self._keys[index], self._values[index]  # type: ignore[return-value]

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy positions ``0 .. length - 1`` of slot ``src`` into slot ``dst`` in every layer."""
        if src == dst or length == 0:
            return
        for buf in (*self._keys, *self._values):
            if buf is not None:
                buf[dst, :, :length] = buf[src, :, :length]

    def save(self, slot: int, length: int) -> tuple[list[Tensor], list[Tensor]]:
        """Copies of positions ``0 .. length - 1`` of ``slot``: per layer ``(H_kv, length, D)`` keys and
        values (for `prefix_store`)."""
        if not self._keys or length > self.capacity or any(k is None for k in self._keys):
            raise ValueError(f"slot {slot} holds no {length} cached positions")
        keys = [k[slot, :, :length].clone() for k in self._keys]  # type: ignore[index]
        values = [v[slot, :, :length].clone() for v in self._values]  # type: ignore[index]
        return keys, values

    def load(self, slot: int, keys: list[Tensor], values: list[Tensor]) -> None:
        """Write per-layer ``(H_kv, L, D)`` ``keys`` / ``values`` (from `save`) into positions ``0 .. L - 1``
        of ``slot``, allocating the buffers if the cache was cleared."""
        length = keys[0].shape[1]
        self.reserve(length)
        for index, (k, v) in enumerate(zip(keys, values, strict=True)):
            key_buf, value_buf = self.layer(index, k[None])
            key_buf[slot, :, :length] = k
            value_buf[slot, :, :length] = v

    def clear(self) -> None:
        """Free every buffer (the engine is idle)."""
        self.capacity = 0
        self._keys, self._values = [], []


class PrefillSegment(NamedTuple):
    """A contiguous run of ``length`` tokens of the sequence in ``slot``, at positions ``start ..``."""

    slot: int
    start: int
    length: int


_PLAN: ContextVar[StepPlan | None] = ContextVar("sao_engine_step_plan", default=None)


@dataclass(frozen=True)
class StepPlan:
    """The layout of one engine forward: ``prefill`` segments first, then one decode token per slot
    ``0 .. B-1`` at ``decode_positions``. Build with `StepPlan.build`."""

    cache: SlotKVCache
    prefill: tuple[PrefillSegment, ...]
    decode_rows: Tensor  # (B,) long: 0 .. B-1
    decode_positions: Tensor  # (B,) long: where each decode token's key goes (= its position id)
    decode_mask: Tensor  # (B, 1, 1, L) bool: True where a row may attend; L = max position + 1
    prefill_tokens: int

    @classmethod
    def build(
        cls,
        cache: SlotKVCache,
        prefill: Sequence[PrefillSegment],
        decode_positions: Sequence[int],
        device: torch.device,
    ) -> StepPlan:
        """Reserve cache room for the step and precompute the decode mask (once per step, not per layer)."""
        lengths = [p + 1 for p in decode_positions] + [s.start + s.length for s in prefill]
        cache.reserve(max(lengths))
        positions = torch.tensor(list(decode_positions), dtype=torch.long, device=device)
        span = int(max(decode_positions, default=-1)) + 1
        mask = torch.arange(span, device=device)[None, :] <= positions[:, None]
        return cls(
            cache=cache,
            prefill=tuple(prefill),
            decode_rows=torch.arange(len(decode_positions), device=device),
            decode_positions=positions,
            decode_mask=mask[:, None, None, :],
            prefill_tokens=sum(s.length for s in prefill),
        )

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """While active, every ``sao_engine`` attention call in this thread runs this plan."""
        token = _PLAN.set(self)
        try:
            yield
        finally:
            _PLAN.reset(token)


def _prefill_attention(
    plan: StepPlan, query: Tensor, keys: Tensor, values: Tensor, scale: Any
) -> list[Tensor]:
    """One causal SDPA per prefill segment; each output ``(1, H, n, D)``."""
    outputs, offset = [], 0
    gqa = query.shape[1] != keys.shape[1]
    for seg in plan.prefill:
        q = query[:, :, offset : offset + seg.length]
        end = seg.start + seg.length
        k, v = keys[seg.slot : seg.slot + 1, :, :end], values[seg.slot : seg.slot + 1, :, :end]
        if seg.start == 0:
            out = scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
        else:  # continuing a cached prefix: query i sits at position start + i
            rows = torch.arange(seg.start, end, device=q.device)[:, None]
            mask = torch.arange(end, device=q.device)[None, :] <= rows
            out = scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
        outputs.append(out)
        offset += seg.length
    return outputs


def _engine_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """Attention function of ``sao_engine``: ``query (1, H, T, D)``, ``key``/``value`` ``(1, H_kv, T, D)``
    → ``((1, T, H, D), None)``. Runs the active `StepPlan`, or ``sao_varlen`` when none is active."""
    plan = _PLAN.get()
    if plan is None:
        fallback = ALL_ATTENTION_FUNCTIONS[PACKED_ATTENTION]
        return fallback(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    if kwargs.get("sliding_window") is not None or not getattr(module, "is_causal", True):
        raise NotImplementedError(f"{ENGINE_ATTENTION} implements full causal attention only")
    layer = getattr(module, "layer_idx", None)
    if layer is None:
        raise NotImplementedError(f"{type(module).__name__} has no layer_idx; {ENGINE_ATTENTION} needs one")
    keys, values = plan.cache.layer(layer, key)
    new_k, new_v = key[0], value[0]  # (H_kv, T, D)
    offset = 0
    for seg in plan.prefill:
        keys[seg.slot, :, seg.start : seg.start + seg.length] = new_k[:, offset : offset + seg.length]
        values[seg.slot, :, seg.start : seg.start + seg.length] = new_v[:, offset : offset + seg.length]
        offset += seg.length
    outputs = _prefill_attention(plan, query, keys, values, scaling)
    batch = plan.decode_rows.numel()
    if batch:
        keys[plan.decode_rows, :, plan.decode_positions] = new_k[:, offset:].transpose(0, 1)
        values[plan.decode_rows, :, plan.decode_positions] = new_v[:, offset:].transpose(0, 1)
        span = plan.decode_mask.shape[-1]
        out = scaled_dot_product_attention(
            query[0, :, offset:].transpose(0, 1).unsqueeze(2),  # (B, H, 1, D)
            keys[:batch, :, :span],
            values[:batch, :, :span],
            attn_mask=plan.decode_mask,
            scale=scaling,
            enable_gqa=query.shape[1] != key.shape[1],
        )
        outputs.append(out.squeeze(2).transpose(0, 1).unsqueeze(0))  # (1, H, B, D)
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


def _engine_mask(*args: Any, **kwargs: Any) -> Tensor | None:
    """Mask function of ``sao_engine``: none inside a plan (the plan is the mask), sao_varlen's outside."""
    if _PLAN.get() is not None:
        return None
    return ALL_MASK_ATTENTION_FUNCTIONS[PACKED_ATTENTION](*args, **kwargs)


AttentionInterface.register(ENGINE_ATTENTION, _engine_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(ENGINE_ATTENTION, _engine_mask)
