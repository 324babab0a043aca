"""The attention kernels behind the packed implementations (`sao.models.attention`): causal attention of
one trajectory (``sdpa``, or written out as ``eager``), and trajectories of similar length batched into one
padded ``sdpa`` call (`length_buckets`).

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

Bucketing: trajectories up to `BUCKET_MAX_TOKENS` tokens are grouped by length (`length_buckets`) and each
group runs as one ``sdpa`` call on operands right-padded to its longest member, which causal attention
makes exact for every real position; the padded work is bounded by `PAD_BUDGET`.

Owns: the per-trajectory kernels, the GQA operand choice and the bucketing. Does not own: the pack, the
registration with transformers (`sao.models.attention`).
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import torch
from torch import Tensor
from torch.nn.attention import SDPBackend

__all__ = [
    "BUCKET_MAX_TOKENS",
    "PAD_BUDGET",
    "bucketed_sdpa",
    "eager_causal",
    "eager_scores",
    "eager_weights",
    "gather_plan",
    "gqa_operands",
    "length_buckets",
    "sdpa_causal",
]

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


def gather_plan(bounds: tuple[int, ...], device: torch.device) -> _Gather:
    """The `length_buckets` of the pack whose host ``cu_seqlens`` are ``bounds``, as index tensors on
    ``device`` (cached per pack and device); every ``gathers`` entry is None when no two trajectories share
    a call (then `bucketed_sdpa` gains nothing over one call per trajectory)."""
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


def bucketed_sdpa(bounds: tuple[int, ...], query: Tensor, key: Tensor, value: Tensor, dropout: float,
                  scale: float | None) -> Tensor:  # fmt: skip
    """``query (1, H, T, D)``, ``key``/``value`` ``(1, H_kv, T, D)`` → ``(1, H, T, D)``: causal sdpa within
    each trajectory, one call per length bucket on right-padded ``(count, H, longest, D)`` operands. Causal
    attention never lets a real position read a later (padding) one, so every real row is the
    per-trajectory result; the padded rows are dropped. A bucket of one trajectory is a slice (no copy).
    ``bounds``: the pack's host ``cu_seqlens``."""
    plan = gather_plan(bounds, query.device)  # cached: `sao.models.attention` built it to decide
    outputs = []
    for (count, longest, start), index in zip(plan.buckets, plan.gathers, strict=True):

        def padded(x: Tensor, count: int = count, longest: int = longest, start: int = start,
                   index: Tensor | None = index) -> Tensor:  # fmt: skip
            if index is None:
                return x[:, :, start : start + longest]
            heads, dim = x.shape[1], x.shape[3]
            return x[0].index_select(1, index).view(heads, count, longest, dim).transpose(0, 1)

        out = sdpa_causal(padded(query), padded(key), padded(value), dropout, scale)  # (count, H, L, D)
        outputs.append(out.transpose(0, 1).reshape(query.shape[1], count * longest, query.shape[3]))
    return torch.cat(outputs, dim=1).index_select(1, plan.keep).unsqueeze(0)


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


def sdpa_causal(query: Tensor, key: Tensor, value: Tensor, dropout: float, scale: float | None) -> Tensor:
    """``(1, H, L, D)`` causal attention of one trajectory by torch's sdpa."""
    key, value, gqa = gqa_operands(query, key, value, dropout, scale)
    return torch.nn.functional.scaled_dot_product_attention(
        query, key, value, dropout_p=dropout, is_causal=True, scale=scale, enable_gqa=gqa
    )


def eager_scores(query: Tensor, key: Tensor, value: Tensor, scale: float | None) -> tuple[Tensor, Tensor]:
    """(scores ``(B, H, Lq, Lk)``, value with repeated heads), transformers' eager layout."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    return torch.matmul(query, key.transpose(2, 3)) * scale, value


def eager_weights(scores: Tensor, dropout: float, dtype: torch.dtype) -> Tensor:
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)
    return torch.nn.functional.dropout(weights, p=dropout) if dropout > 0 else weights


def eager_causal(query: Tensor, key: Tensor, value: Tensor, dropout: float, scale: float | None) -> Tensor:
    """``(1, H, L, D)`` causal attention of one trajectory, written out (softmax in float32)."""
    scores, value = eager_scores(query, key, value, scale)
    length = query.shape[2]
    future = torch.ones(length, length, dtype=torch.bool, device=query.device).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    return torch.matmul(eager_weights(scores, dropout, query.dtype), value)
