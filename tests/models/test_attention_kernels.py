"""The attention kernels of the packed forward agree (``sdpa``, ``eager``), and GQA goes to sdpa with repeated
K/V heads exactly where ``enable_gqa`` would get torch's math kernel."""

from __future__ import annotations

import copy
import importlib.util
import itertools

import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend

from sao.models.attention import PACKED_EAGER_ATTENTION, enable_packed_attention, packed_attention_kwargs
from sao.models.attention_kernels import (
    BUCKET_MAX_TOKENS,
    bucketed_sdpa,
    gqa_operands,
    length_buckets,
    sdpa_causal,
)
from sao.models.forward import token_logprobs
from sao.models.loading import load_policy

from . import batches

BATCH = batches.make_batch([5, 19, 7, 13, 9], seed=5)


@pytest.fixture(scope="module", params=["dense", "moe"])
def sdpa_model(request, tiny_dense_dir, tiny_moe_dir) -> nn.Module:
    """A tiny float32 policy with packed sdpa attention (GQA: 4 query heads, 2 K/V heads)."""
    path = tiny_dense_dir if request.param == "dense" else tiny_moe_dir
    return enable_packed_attention(load_policy(path, dtype="float32", device="cpu"), "sdpa")


def _logprobs_and_grads(model: nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    lp, _ = token_logprobs(model, BATCH)
    (-(lp * BATCH.action_mask).sum()).backward()
    return lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


class _SdpaCalls:
    """Records (key heads, enable_gqa) of every torch sdpa call, then runs the real one."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[int, bool]] = []
        real = torch.nn.functional.scaled_dot_product_attention

        def spy(query, key, value, *args, enable_gqa=False, **kwargs):
            self.calls.append((key.shape[1], enable_gqa))
            return real(query, key, value, *args, enable_gqa=enable_gqa, **kwargs)

        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)


def test_eager_and_sdpa_give_the_same_packed_logprobs_and_gradients(sdpa_model):
    eager = enable_packed_attention(copy.deepcopy(sdpa_model), "eager")
    assert eager.config._attn_implementation == PACKED_EAGER_ATTENTION
    want_lp, want_grads = _logprobs_and_grads(sdpa_model)
    got_lp, got_grads = _logprobs_and_grads(eager)
    torch.testing.assert_close(got_lp, want_lp, atol=1e-5, rtol=0)
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_eager_and_sdpa_agree_in_bf16(sdpa_model):
    sdpa = copy.deepcopy(sdpa_model).to(torch.bfloat16)
    eager = enable_packed_attention(copy.deepcopy(sdpa), "eager")
    with torch.no_grad():
        want, got = token_logprobs(sdpa, BATCH)[0], token_logprobs(eager, BATCH)[0]
    torch.testing.assert_close(got, want, atol=5e-2, rtol=0)


@torch.no_grad()
def test_eager_outside_a_pack_is_the_stock_padded_forward(sdpa_model):
    """A padded (2, L) batch with a padding mask: the eager implementation equals stock sdpa there."""
    eager = enable_packed_attention(copy.deepcopy(sdpa_model), "eager")
    stock = copy.deepcopy(sdpa_model)
    stock.set_attn_implementation("sdpa")
    ids = torch.randint(3, 250, (2, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    got = eager(ids, attention_mask=mask, use_cache=False).logits
    want = stock(ids, attention_mask=mask, use_cache=False).logits
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], atol=1e-5, rtol=0)


def test_gqa_goes_to_sdpa_as_it_is_where_the_fused_kernel_accepts_it(sdpa_model, monkeypatch):
    """This CPU's flash kernel takes ``enable_gqa``: no K/V copy, one sdpa call per bucket and layer."""
    spy = _SdpaCalls(monkeypatch)
    with torch.no_grad():
        token_logprobs(sdpa_model, BATCH)
    kv_heads = sdpa_model.config.num_key_value_heads
    assert kv_heads < sdpa_model.config.num_attention_heads
    lengths = tuple(BATCH.cu_seqlens.diff().tolist())
    assert 1 < len(length_buckets(lengths)) < BATCH.num_sequences  # some batched, some alone
    assert len(spy.calls) == len(length_buckets(lengths)) * sdpa_model.config.num_hidden_layers
    assert set(spy.calls) == {(kv_heads, True)}


def test_gqa_repeats_kv_heads_where_enable_gqa_would_get_the_math_kernel(sdpa_model, monkeypatch):
    """torch's kernel choice as CUDA makes it for float32 in the releases that refuse GQA in the
    memory-efficient kernel (math with ``enable_gqa``, memory-efficient without): the packed forward then
    passes repeated K/V heads and no ``enable_gqa``, with the same log-probs and gradients."""
    want_lp, want_grads = _logprobs_and_grads(sdpa_model)
    real_choice = torch._fused_sdp_choice

    def cuda_fp32_choice(query, key, value, *args, enable_gqa=False, **kwargs):
        real_choice(query, key, value, *args, enable_gqa=enable_gqa, **kwargs)  # still validates
        return SDPBackend.MATH.value if enable_gqa else SDPBackend.EFFICIENT_ATTENTION.value

    monkeypatch.setattr(torch, "_fused_sdp_choice", cuda_fp32_choice)
    spy = _SdpaCalls(monkeypatch)
    got_lp, got_grads = _logprobs_and_grads(sdpa_model)
    heads = sdpa_model.config.num_attention_heads
    assert spy.calls and set(spy.calls) == {(heads, False)}
    torch.testing.assert_close(got_lp, want_lp, atol=1e-6, rtol=0)
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, atol=1e-6, rtol=1e-5, msg=name)


def test_gqa_operands_copy_nothing_when_every_choice_is_the_math_kernel():
    """With only the math kernel enabled, repeating heads would cost memory for nothing."""
    from torch.nn.attention import sdpa_kernel

    q, k, v = torch.randn(1, 4, 6, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    with sdpa_kernel([SDPBackend.MATH]):
        key, value, gqa = gqa_operands(q, k, v)
    assert key is k and value is v and gqa
    key, value, gqa = gqa_operands(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))
    assert key.shape[1] == 4 and not gqa  # as many K/V heads as query heads: nothing to decide


@torch.no_grad()
def test_the_kernels_agree_on_a_single_packed_forward(sdpa_model):
    """The whole-model outputs (not only log-probs) of one packed row."""
    eager = enable_packed_attention(copy.deepcopy(sdpa_model), "eager")
    kwargs = packed_attention_kwargs(BATCH.cu_seqlens, BATCH.max_seqlen)
    args = (BATCH.token_ids[None],)
    want = sdpa_model(*args, position_ids=BATCH.position_ids[None], use_cache=False, **kwargs).logits
    got = eager(*args, position_ids=BATCH.position_ids[None], use_cache=False, **kwargs).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is not None, reason="flash_attn is installed")
def test_flash_attention_2_without_the_package_names_the_key(sdpa_model):
    with pytest.raises(ImportError, match=r"model.attn_implementation='flash_attention_2'.*flash_attn"):
        enable_packed_attention(copy.deepcopy(sdpa_model), "flash_attention_2")


def test_an_unknown_implementation_is_refused(sdpa_model):
    with pytest.raises(ValueError, match="choose one of sdpa, eager, flash_attention_2"):
        enable_packed_attention(sdpa_model, "flex_attention")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_no_packed_sdpa_call_lands_on_the_math_kernel(tiny_dense_dir, monkeypatch):
    """float32 and bfloat16 on the GPU: every per-trajectory sdpa call gets a fused kernel (repeated heads
    where the memory-efficient kernel refuses GQA)."""
    real = torch.nn.functional.scaled_dot_product_attention
    chosen: list[int] = []

    def spy(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        chosen.append(
            torch._fused_sdp_choice(
                query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
            )
        )
        return real(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    batch = BATCH.to("cuda")
    for dtype in ("float32", "bfloat16"):
        model = enable_packed_attention(load_policy(tiny_dense_dir, dtype=dtype, device="cuda"))
        chosen.clear()
        with torch.no_grad():
            token_logprobs(model, batch)
        assert chosen and SDPBackend.MATH.value not in chosen, dtype


@pytest.mark.parametrize(
    "lengths", [(5, 19, 7, 13, 9), (8, 8, 8, 8), (1, 2, 3, 300, 301, 40), (17,), (200, 200), (128, 128)]
)
def test_length_buckets_batch_padded_calls_within_the_padding_budget(lengths):
    buckets = length_buckets(lengths)
    assert sorted(i for b in buckets for i in b) == list(range(len(lengths)))  # each trajectory once
    for bucket in buckets:
        longest = max(lengths[i] for i in bucket)
        assert len(bucket) * longest**2 <= 1.25 * sum(lengths[i] ** 2 for i in bucket)
        assert len(bucket) == 1 or longest <= BUCKET_MAX_TOKENS  # long ones alone: no padded copies
    if len(set(lengths)) == 1 and lengths[0] <= BUCKET_MAX_TOKENS:
        assert len(buckets) == 1  # equal short lengths: one call


@pytest.mark.parametrize("lengths", [(5, 19, 7, 13, 9), (6, 6, 6), (30, 2, 29, 31, 1)])
def test_bucketed_sdpa_equals_one_call_per_trajectory(lengths):
    """Right padding under a causal mask leaves every real row as the per-trajectory call computes it (up to
    float rounding: the kernel blocks a longer row differently)."""
    gen = torch.Generator().manual_seed(0)
    total = sum(lengths)
    q = torch.randn(1, 4, total, 16, generator=gen, requires_grad=True)
    k = torch.randn(1, 2, total, 16, generator=gen, requires_grad=True)
    v = torch.randn(1, 2, total, 16, generator=gen, requires_grad=True)
    bounds = (0, *itertools.accumulate(lengths))
    got = bucketed_sdpa(bounds, q, k, v, 0.0, None)
    want = torch.cat([sdpa_causal(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], 0.0, None)
                      for a, b in itertools.pairwise(bounds)], dim=2)  # fmt: skip
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    upstream = torch.randn_like(want)
    got_grads = torch.autograd.grad(got, (q, k, v), upstream)
    want_grads = torch.autograd.grad(want, (q, k, v), upstream)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-5)
