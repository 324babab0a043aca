"""Packed ("varlen") attention for HF models and the attention kernel (``model.attn_implementation``).

The trainer feeds a `Batch` as one row: ``input_ids (1, T)`` and ``position_ids (1, T)`` restarting at 0 per
trajectory, with no padding. transformers detects that layout from ``position_ids`` and, for ``sdpa``, builds
a dense block-diagonal ``(1, 1, T, T)`` mask: O(T²) memory and O(T²) attention work, most of it across
trajectory boundaries and thrown away. The implementations registered here instead attend within each
trajectory's slice (one call per trajectory, never per token), so the work is Σ L_b² and no mask is
materialised:

- ``sdpa`` → ``sao_varlen``: ``scaled_dot_product_attention(is_causal=True)`` per trajectory, trajectories of
  similar length batched into one call (`length_buckets`: right-padded to the bucket's longest, which causal
  attention makes exact for every real position; padding work bounded by `PAD_BUDGET`; trajectories up to
  `BUCKET_MAX_TOKENS` only);
- ``eager`` → ``sao_varlen_eager``: softmax(QKᵀ·scale + causal mask) V per trajectory, written out (softmax in
  float32, as transformers' eager attention): a reference to check a kernel against, O(L_b²) memory;
- ``flash_attention_2`` → transformers' own ``flash_attention_2``, which reads the pack from the
  ``cu_seq_lens_*`` keywords and calls ``flash_attn_varlen_func`` (``flash_attn`` package; CUDA, bf16/fp16).

The pack is known from, in order: the ``cu_seq_lens_q`` keyword that transformers threads down to every
attention call (the flash-attn convention; gradient-checkpointed layers replay it in backward), or the
`packed_context` the caller opened. Outside both, ``sao_varlen`` is exactly the stock ``sdpa`` mask and
attention (and ``sao_varlen_eager`` a plain eager attention on the stock eager mask), so the same model
still does padded forwards and KV-cache generation.

Which kernel runs per trajectory (``sdpa``: torch chooses per call, `torch._fused_sdp_choice`, in the order
cuDNN/flash, memory-efficient, math on CUDA and flash, math on the CPU; the CPU rows were checked with the
installed torch 2.13, the CUDA rows read from torch's ``sdp_utils.cpp``):

===========  ===========  =================  ==============================================================
device       dtype        implementation     kernel
===========  ===========  =================  ==============================================================
CPU          fp32 / bf16  sdpa               flash (CPU); it accepts GQA: ``enable_gqa``, no K/V copy
CUDA sm80+   bf16 / fp16  sdpa               flash (head_dim ≤ 256) or cuDNN; both accept GQA: no K/V copy
CUDA         fp32         sdpa               memory-efficient (flash and cuDNN are bf16/fp16 only). Torch
                                             releases up to at least 2.11 refuse ``enable_gqa`` there and
                                             fall to the O(L²) math kernel: K/V heads are repeated instead
CUDA         bf16 / fp16  flash_attention_2  flash-attn varlen, one call for the whole pack
CUDA / CPU   fp32 / any   flash_attention_2  refused (`sao.models.prepare.prepare_for_training`)
any          any          eager              matmul, float32 softmax, matmul: O(L²) scores, K/V repeated
===========  ===========  =================  ==============================================================

GQA (fewer key/value heads than query heads, as Qwen3): before each per-trajectory ``sdpa`` call torch is
asked which kernel ``enable_gqa=True`` would get. When that is the math kernel but K/V with repeated heads
(``repeat_interleave``, transformers' ``repeat_kv``) would get a fused one, the heads are repeated (a copy of
that trajectory's K/V, ``H / H_kv`` times larger) and ``enable_gqa`` is not passed; otherwise K/V go as they
are. The decision follows the torch version, GPU, dtype and head size at run time, not this table.

Owns: the attention/mask registration, the kernel choice and the pack context. Does not own: model loading
or log-probs.
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
from torch.nn.attention import SDPBackend
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask, sdpa_mask

__all__ = [
    "ATTN_IMPLEMENTATIONS",
    "PACKED_ATTENTION",
    "PACKED_EAGER_ATTENTION",
    "enable_packed_attention",
    "gqa_operands",
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


PAD_BUDGET = 1.25  # a bucket's padded attention work (count × longest²) may exceed its real work by this
# Only trajectories up to this many tokens are batched: for them one kernel call each costs more than the
# attention itself; longer ones gain nothing from sharing a call, and their padded copies of q, k, v
# (saved for backward) would add activation memory the planner's per-token model does not count.
BUCKET_MAX_TOKENS = 128


def length_buckets(lengths: tuple[int, ...], budget: float = PAD_BUDGET) -> list[list[int]]:
    """Trajectories grouped for one padded attention call each: indices into ``lengths``, shortest first;
    a bucket takes the next longer trajectory while ``count × longest² <= budget × Σ length²`` (the causal
    attention work of the padded call against that of the per-trajectory calls) and it has at most
    `BUCKET_MAX_TOKENS` tokens; a longer trajectory is a bucket of its own (a slice, no copy)."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    buckets: list[list[int]] = []
    work = 0
    for i in order:
        length = lengths[i]
        if (
            buckets
            and length <= BUCKET_MAX_TOKENS
            and (len(buckets[-1]) + 1) * length**2 <= budget * (work + length**2)
        ):
            buckets[-1].append(i)
            work += length**2
        else:
            buckets.append([i])
            work = length**2
    return buckets


class _Gather(NamedTuple):
    """Index tensors of one pack's bucketed attention (built once per pack and device)."""

    buckets: tuple[tuple[int, int, int], ...]  # per bucket: (count, longest, start of its first trajectory)
    gathers: tuple[Tensor | None, ...]  # per bucket: (count × longest,) packed positions, padded by repeats;
    # None for a bucket of one trajectory, which is sliced, not copied
    keep: Tensor  # (T,) rows of the concatenated padded outputs that are real positions, in packed order


_GATHER_CACHE: dict[tuple[tuple[int, ...], str], _Gather] = {}


def _gather_plan(bounds: tuple[int, ...], device: torch.device) -> _Gather:
    key = (bounds, str(device))
    plan = _GATHER_CACHE.get(key)
    if plan is not None:
        return plan
    if len(_GATHER_CACHE) > 64:  # one entry per distinct pack: micro-batches of recent steps
        _GATHER_CACHE.clear()
    starts, lengths = bounds[:-1], tuple(b - a for a, b in itertools.pairwise(bounds))
    buckets = length_buckets(lengths)
    if all(len(b) == 1 for b in buckets):  # nothing shares a call: one slice per trajectory, no index
        plan = _Gather((), (None,) * len(buckets), torch.empty(0, dtype=torch.long))
        _GATHER_CACHE[key] = plan
        return plan
    shapes, gathers, rows = [], [], [0] * bounds[-1]
    offset = 0  # rows of the concatenated bucket outputs so far
    for bucket in buckets:
        longest = max(lengths[i] for i in bucket)
        index = []
        for slot, i in enumerate(bucket):
            a, n = starts[i], lengths[i]
            index.extend(a + min(j, n - 1) for j in range(longest))  # padding repeats the last position
            for j in range(n):
                rows[a + j] = offset + slot * longest + j
        shapes.append((len(bucket), longest, starts[bucket[0]]))
        gathers.append(torch.tensor(index, dtype=torch.long, device=device) if len(bucket) > 1 else None)
        offset += len(bucket) * longest
    plan = _Gather(tuple(shapes), tuple(gathers), torch.tensor(rows, dtype=torch.long, device=device))
    _GATHER_CACHE[key] = plan
    return plan


def _bucketed_sdpa(pack: _Pack, query: Tensor, key: Tensor, value: Tensor, dropout: float,
                   scale: float | None) -> Tensor:  # fmt: skip
    """``query (1, H, T, D)``, ``key``/``value`` ``(1, H_kv, T, D)`` → ``(1, H, T, D)``: causal sdpa within
    each trajectory, one call per length bucket on right-padded ``(count, H, longest, D)`` operands. Causal
    attention never lets a real position read a later (padding) one, so every real row is the
    per-trajectory result; the padded rows are dropped. A bucket of one trajectory is a slice (no copy)."""
    plan = _gather_plan(pack.bounds, query.device)  # cached: the check in `_per_trajectory` built it
    outputs = []
    for (count, longest, start), index in zip(plan.buckets, plan.gathers, strict=True):

        def padded(x: Tensor, count: int = count, longest: int = longest, start: int = start,
                   index: Tensor | None = index) -> Tensor:  # fmt: skip
            if index is None:
                return x[:, :, start : start + longest]
            heads, dim = x.shape[1], x.shape[3]
            return x[0].index_select(1, index).view(heads, count, longest, dim).transpose(0, 1)

        out = _sdpa_causal(padded(query), padded(key), padded(value), dropout, scale)  # (count, H, L, D)
        outputs.append(out.transpose(0, 1).reshape(query.shape[1], count * longest, query.shape[3]))
    return torch.cat(outputs, dim=1).index_select(1, plan.keep).unsqueeze(0)


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


# ---- one trajectory --------------------------------------------------------------------------------------


def _fused(query: Tensor, key: Tensor, value: Tensor, dropout: float, scale: float | None, gqa: bool) -> bool:
    """Whether torch would run a fused (non-math) kernel for this causal sdpa call."""
    choice = torch._fused_sdp_choice(query, key, value, None, dropout, True, scale=scale, enable_gqa=gqa)
    return choice != SDPBackend.MATH.value


def gqa_operands(
    query: Tensor, key: Tensor, value: Tensor, dropout: float = 0.0, scale: float | None = None
) -> tuple[Tensor, Tensor, bool]:
    """``(key, value, enable_gqa)`` for one causal sdpa call: ``query (1, H, L, D)``, ``key``/``value``
    ``(1, H_kv, L, D)``. K/V heads are repeated (``(1, H, L, D)`` copies, enable_gqa False) exactly when
    ``enable_gqa`` would get torch's math kernel and repeated heads a fused one (module docstring)."""
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads == kv_heads:
        return key, value, False
    if _fused(query, key, value, dropout, scale, gqa=True):
        return key, value, True
    groups = heads // kv_heads
    key_x, value_x = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    if _fused(query, key_x, value_x, dropout, scale, gqa=False):
        return key_x, value_x, False
    return key, value, True  # the math kernel either way: no copies


def _sdpa_causal(query: Tensor, key: Tensor, value: Tensor, dropout: float, scale: float | None) -> Tensor:
    """``(1, H, L, D)`` causal attention of one trajectory by torch's sdpa."""
    key, value, gqa = gqa_operands(query, key, value, dropout, scale)
    return torch.nn.functional.scaled_dot_product_attention(
        query, key, value, dropout_p=dropout, is_causal=True, scale=scale, enable_gqa=gqa
    )


def _eager_scores(query: Tensor, key: Tensor, value: Tensor, scale: float | None) -> tuple[Tensor, Tensor]:
    """(scores ``(B, H, Lq, Lk)``, value with repeated heads), transformers' eager layout."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    return torch.matmul(query, key.transpose(2, 3)) * scale, value


def _eager_weights(scores: Tensor, dropout: float, dtype: torch.dtype) -> Tensor:
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)
    return torch.nn.functional.dropout(weights, p=dropout) if dropout > 0 else weights


def _eager_causal(query: Tensor, key: Tensor, value: Tensor, dropout: float, scale: float | None) -> Tensor:
    """``(1, H, L, D)`` causal attention of one trajectory, written out (softmax in float32)."""
    scores, value = _eager_scores(query, key, value, scale)
    length = query.shape[2]
    future = torch.ones(length, length, dtype=torch.bool, device=query.device).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    return torch.matmul(_eager_weights(scores, dropout, query.dtype), value)


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
    if kernel is _sdpa_causal and any(g is not None for g in _gather_plan(pack.bounds, query.device).gathers):
        return _bucketed_sdpa(pack, query, key, value, dropout, scaling).transpose(1, 2).contiguous(), None
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
    return _per_trajectory(_sdpa_causal, pack, module, query, key, value, dropout, scaling, kwargs)


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
        return _per_trajectory(_eager_causal, pack, module, query, key, value, dropout, scaling, kwargs)
    scores, value = _eager_scores(query, key, value, scaling)
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, : scores.shape[-1]]
    out = torch.matmul(_eager_weights(scores, dropout, query.dtype), value)
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
