"""Packed ("varlen") attention for HF models and the attention kernel (``model.attn_implementation``).

The trainer feeds a `Batch` as one row: ``input_ids (1, T)`` and ``position_ids (1, T)`` restarting at 0 per
trajectory, with no padding. transformers detects that layout from ``position_ids`` and, for ``sdpa``, builds
a dense block-diagonal ``(1, 1, T, T)`` mask: O(T²) memory and O(T²) attention work, most of it across
trajectory boundaries and thrown away. The implementations registered here instead attend within each
trajectory's slice (one call per trajectory, never per token), so the work is Σ L_b² and no mask is
materialised:

- ``sdpa`` → ``sao_varlen``: ``scaled_dot_product_attention(is_causal=True)`` per trajectory, trajectories of
  similar length batched into one call (`sao.models.attention_kernels.length_buckets`);
- ``eager`` → ``sao_varlen_eager``: softmax(QKᵀ·scale + causal mask) V per trajectory, written out (softmax in
  float32, as transformers' eager attention): a reference to check a kernel against, O(L_b²) memory;
- ``flash_attention_2`` → transformers' own ``flash_attention_2``, which reads the pack from the
  ``cu_seq_lens_*`` keywords and calls ``flash_attn_varlen_func`` (``flash_attn`` package; CUDA, bf16/fp16).

The pack is known from, in order: the ``cu_seq_lens_q`` keyword that transformers threads down to every
attention call (the flash-attn convention; gradient-checkpointed layers replay it in backward), or the
`packed_context` the caller opened. Outside both, ``sao_varlen`` is exactly the stock ``sdpa`` mask and
attention (and ``sao_varlen_eager`` a plain eager attention on the stock eager mask), so the same model
still does padded forwards and KV-cache generation.

Which kernel runs per trajectory, how GQA reaches it and how short trajectories share one call:
`sao.models.attention_kernels`.

Owns: the attention/mask registration and the pack context. Does not own: the kernels
(`sao.models.attention_kernels`), model loading or log-probs.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask, sdpa_mask

from sao.models.attention_kernels import (
    bucketed_sdpa,
    eager_causal,
    eager_scores,
    eager_weights,
    gather_plan,
    sdpa_causal,
)

__all__ = [
    "ATTN_IMPLEMENTATIONS",
    "PACKED_ATTENTION",
    "PACKED_EAGER_ATTENTION",
    "enable_packed_attention",
    "packed_attention_kwargs",
    "packed_context",
]

PACKED_ATTENTION = "sao_varlen"
PACKED_EAGER_ATTENTION = "sao_varlen_eager"
# model.attn_implementation -> the name registered with transformers
ATTN_IMPLEMENTATIONS: dict[str, str] = {
    "sdpa": PACKED_ATTENTION,
    "eager": PACKED_EAGER_ATTENTION,
    "flash_attention_2": "flash_attention_2",
}


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
    """While active, the packed implementations treat every ``(1, T)`` forward as ``len(cu_seqlens) - 1``
    independent causal sequences, sequence b at ``cu_seqlens[b]:cu_seqlens[b + 1]`` (``(B + 1,)`` int, 0 … T).

    Context-local (a `ContextVar`): threads and asyncio tasks each see their own pack. Nests.
    """
    token = _PACK.set(_Pack(cu_seqlens, _host_bounds(cu_seqlens)))
    try:
        yield
    finally:
        _PACK.reset(token)


def packed_attention_kwargs(cu_seqlens: Tensor, max_seqlen: int) -> dict[str, Any]:
    """The flash-attn varlen keywords for a packed forward: ``model(..., **packed_attention_kwargs(...))``.

    transformers passes them to every attention call (and gradient checkpointing replays them), so the
    packed implementations and ``flash_attention_2`` all find the pack even when backward recomputes a
    layer after `packed_context` has closed.
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


# ---- the registered implementations --------------------------------------------------------------------

_Kernel = Callable[[Tensor, Tensor, Tensor, float, float | None], Tensor]


def _per_trajectory(
    kernel: _Kernel, pack: _Pack, module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
    dropout: float, scaling: float | None, kwargs: dict[str, Any],
) -> tuple[Tensor, None]:  # fmt: skip
    """``query`` ``(1, H, T, D)``, ``key``/``value`` ``(1, H_kv, T, D)`` → ``((1, T, H, D), None)``:
    ``kernel`` on each trajectory of ``pack``."""
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
    if kernel is sdpa_causal and any(g is not None for g in gather_plan(pack.bounds, query.device).gathers):
        out = bucketed_sdpa(pack.bounds, query, key, value, dropout, scaling)
        return out.transpose(1, 2).contiguous(), None
    outputs = [
        kernel(query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], dropout, scaling)
        for a, b in itertools.pairwise(pack.bounds)
    ]
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


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
    """Attention function of ``sao_varlen``: per-trajectory sdpa inside a pack, transformers'
    ``sdpa_attention_forward`` outside (same layouts)."""
    pack = _current_pack(kwargs)
    if pack is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    return _per_trajectory(sdpa_causal, pack, module, query, key, value, dropout, scaling, kwargs)


def _packed_eager_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """Attention function of ``sao_varlen_eager``: per-trajectory eager attention inside a pack; outside,
    eager attention under transformers' additive eager mask ``(B, 1, Lq, Lk)``."""
    pack = _current_pack(kwargs)
    if pack is not None:
        return _per_trajectory(eager_causal, pack, module, query, key, value, dropout, scaling, kwargs)
    scores, value = eager_scores(query, key, value, scaling)
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, : scores.shape[-1]]
    out = torch.matmul(eager_weights(scores, dropout, query.dtype), value)
    return out.transpose(1, 2).contiguous(), None


def _packed_mask(stock: Callable[..., Tensor | None]) -> Callable[..., Tensor | None]:
    """A mask function: none inside `packed_context`, ``stock``'s mask outside."""

    def mask(*args: Any, **kwargs: Any) -> Tensor | None:
        return None if _PACK.get() is not None else stock(*args, **kwargs)

    return mask


AttentionInterface.register(PACKED_ATTENTION, _packed_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(PACKED_ATTENTION, _packed_mask(sdpa_mask))
AttentionInterface.register(PACKED_EAGER_ATTENTION, _packed_eager_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(PACKED_EAGER_ATTENTION, _packed_mask(eager_mask))


def enable_packed_attention(model: PreTrainedModel, implementation: str = "sdpa") -> PreTrainedModel:
    """Switch ``model`` (and its sub-models) in place to the packed form of ``implementation``
    (``model.attn_implementation``: ``sdpa``, ``eager`` or ``flash_attention_2``; `ATTN_IMPLEMENTATIONS`)
    and return it. Raises ValueError for an unknown name or a model that refuses a custom implementation,
    ImportError for ``flash_attention_2`` without the ``flash_attn`` package."""
    if implementation not in ATTN_IMPLEMENTATIONS:
        raise ValueError(
            f"model.attn_implementation={implementation!r}: choose one of {', '.join(ATTN_IMPLEMENTATIONS)}"
        )
    if implementation == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        raise ImportError(
            "model.attn_implementation='flash_attention_2' needs the flash_attn package, which is not "
            "installed (pip install flash-attn, CUDA only); use model.attn_implementation='sdpa'"
        )
    name = ATTN_IMPLEMENTATIONS[implementation]
    model.set_attn_implementation(name)
    if model.config._attn_implementation != name:
        raise ValueError(f"{type(model).__name__} does not accept the attention implementation {name!r}")
    return model
