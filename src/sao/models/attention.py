"""Packed ("varlen") attention for HF models on CPU or any device without flash-attn.

The trainer feeds a `Batch` as one row: ``input_ids (1, T)`` and ``position_ids (1, T)`` restarting at 0 per
trajectory, with no padding. transformers detects that layout from ``position_ids`` and, for ``sdpa``, builds
a dense block-diagonal ``(1, 1, T, T)`` mask: O(T²) memory and O(T²) attention work, most of it across
trajectory boundaries and thrown away. The ``sao_varlen`` implementation registered here instead runs
``scaled_dot_product_attention(is_causal=True)`` on each trajectory's slice (one call per trajectory, never
per token), so the work is Σ L_b² and no mask is materialised.

The pack is known from, in order: the ``cu_seq_lens_q`` keyword that transformers threads down to every
attention call (the flash-attn convention; gradient-checkpointed layers replay it in backward), or the
`packed_context` the caller opened. Outside both, ``sao_varlen`` is exactly the stock ``sdpa`` mask and
attention, so the same model still does padded forwards and KV-cache generation.

Owns: the attention/mask registration and the pack context. Does not own: model loading or log-probs.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

__all__ = ["PACKED_ATTENTION", "enable_packed_attention", "packed_attention_kwargs", "packed_context"]

PACKED_ATTENTION = "sao_varlen"


class _Pack(NamedTuple):
    cu_seqlens: Tensor  # (B + 1,) int
    bounds: tuple[int, ...]  # the same on the host, so attention layers never sync with the device


_PACK: ContextVar[_Pack | None] = ContextVar("sao_packed_cu_seqlens", default=None)


def _host_bounds(cu_seqlens: Tensor) -> tuple[int, ...]:
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(
            f"cu_seqlens must be 1-D with B + 1 >= 2 entries, got shape {tuple(cu_seqlens.shape)}"
        )
    bounds = tuple(int(x) for x in cu_seqlens.tolist())
    if bounds[0] != 0 or any(b <= a for a, b in itertools.pairwise(bounds)):
        raise ValueError(f"cu_seqlens must start at 0 and increase strictly, got {list(bounds)}")
    return bounds


@contextlib.contextmanager
def packed_context(cu_seqlens: Tensor) -> Iterator[None]:
    """While active, ``sao_varlen`` treats every ``(1, T)`` forward as ``len(cu_seqlens) - 1`` independent
    causal sequences, sequence b at ``cu_seqlens[b]:cu_seqlens[b + 1]`` (``(B + 1,)`` int, 0 … T).

    Context-local (a `ContextVar`): threads and asyncio tasks each see their own pack. Nests.
    """
    token = _PACK.set(_Pack(cu_seqlens, _host_bounds(cu_seqlens)))
    try:
        yield
    finally:
        _PACK.reset(token)


def packed_attention_kwargs(cu_seqlens: Tensor, max_seqlen: int) -> dict[str, Any]:
    """The flash-attn varlen keywords for a packed forward: ``model(..., **packed_attention_kwargs(...))``.

    transformers passes them to every attention call (and gradient checkpointing replays them), so
    ``sao_varlen`` and ``flash_attention_2`` both find the pack even when backward recomputes a layer after
    `packed_context` has closed.
    """
    return {
        "cu_seq_lens_q": cu_seqlens,
        "cu_seq_lens_k": cu_seqlens,
        "max_length_q": max_seqlen,
        "max_length_k": max_seqlen,
    }


def _current_pack(kwargs: dict[str, Any]) -> _Pack | None:
    active = _PACK.get()
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        return active
    if active is not None and cu is active.cu_seqlens:
        return active
    return _Pack(cu, _host_bounds(cu))


def _packed_mask(*args: Any, **kwargs: Any) -> Tensor | None:
    """Mask function of ``sao_varlen``: none inside `packed_context`, the stock sdpa mask outside."""
    if _PACK.get() is not None:
        return None
    return sdpa_mask(*args, **kwargs)


def _packed_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """Attention function of ``sao_varlen``.

    ``query`` ``(1, H, T, D)``, ``key``/``value`` ``(1, H_kv, T, D)`` → ``((1, T, H, D), None)``, the layout
    of transformers' ``sdpa_attention_forward``, to which it delegates when no pack is active.
    """
    pack = _current_pack(kwargs)
    if pack is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    total = pack.bounds[-1]
    if query.shape[0] != 1 or query.shape[2] != total or key.shape[2] != total:
        raise ValueError(
            f"packed attention expects query and key of shape (1, heads, {total}, head_dim) matching "
            f"cu_seqlens (no batch dimension, no KV cache); got query {tuple(query.shape)}, "
            f"key {tuple(key.shape)}"
        )
    if kwargs.get("sliding_window") is not None or not getattr(module, "is_causal", True):
        raise NotImplementedError(f"{PACKED_ATTENTION} implements full causal attention only")
    # A mask here can only be transformers' own block-diagonal one (the pack was passed as keywords outside
    # packed_context); cu_seqlens describe the same pattern, so it is not needed.
    gqa = query.shape[1] != key.shape[1]
    outputs = [
        torch.nn.functional.scaled_dot_product_attention(
            query[:, :, start:end],
            key[:, :, start:end],
            value[:, :, start:end],
            dropout_p=dropout,
            is_causal=True,
            scale=scaling,
            enable_gqa=gqa,
        )
        for start, end in itertools.pairwise(pack.bounds)
    ]
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


AttentionInterface.register(PACKED_ATTENTION, _packed_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(PACKED_ATTENTION, _packed_mask)


def enable_packed_attention(model: PreTrainedModel) -> PreTrainedModel:
    """Switch ``model`` (and its sub-models) to ``sao_varlen`` in place and return it."""
    model.set_attn_implementation(PACKED_ATTENTION)
    if model.config._attn_implementation != PACKED_ATTENTION:
        raise ValueError(f"{type(model).__name__} does not accept a custom attention implementation")
    return model
