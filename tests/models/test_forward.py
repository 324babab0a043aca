"""Packed attention and the packed log-prob forward: equal to per-sequence forwards, isolated per trajectory,
chunked head equal to the full one (values and gradients), entropy, temperature, micro-batches."""

from __future__ import annotations

import pytest
import torch
from torch.autograd.graph import saved_tensors_hooks
from transformers.cache_utils import DynamicCache

from sao.models.attention import (
    PACKED_ATTENTION,
    enable_packed_attention,
    packed_attention_kwargs,
    packed_context,
)
from sao.models.forward import token_logprobs
from sao.models.loading import load_policy
from sao.types import Batch

from . import batches

LENGTHS = (2, 19, 7, 13, 5)


def _load(path, attn=PACKED_ATTENTION):
    return load_policy(path, dtype="float32", device="cpu", attn_implementation=attn).eval()


@pytest.fixture(params=["moe", "dense"])
def model(request, tiny_moe_dir, tiny_dense_dir):
    return _load(tiny_moe_dir if request.param == "moe" else tiny_dense_dir)


def make_batch(lengths=LENGTHS, seed=0, vocab=300) -> Batch:
    return batches.make_batch(lengths, seed, vocab)


def full_logits(model, batch: Batch, temperature=1.0) -> torch.Tensor:
    """(T, V) fp32 logits of the packed batch in one unchunked pass (the reference)."""
    out = model(
        batch.token_ids[None],
        position_ids=batch.position_ids[None],
        use_cache=False,
        **packed_attention_kwargs(batch.cu_seqlens, batch.max_seqlen),
    )
    return out.logits[0].float() / temperature


def shift_to_tokens(per_position: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Reference alignment: out[t] = per_position[t - 1] within a trajectory, 0 at its first token."""
    shifted = torch.cat([per_position.new_zeros(1), per_position[:-1]])
    return torch.where(batch.position_ids > 0, shifted, torch.zeros_like(shifted))


def reference_logprobs(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """log p(token_t | prefix) from full (T, V) logits, aligned to token t."""
    logp = torch.log_softmax(logits, dim=-1)
    next_token = torch.cat([batch.token_ids[1:], batch.token_ids[:1]])
    return shift_to_tokens(logp.gather(-1, next_token[:, None]).squeeze(-1), batch)


def padded_logprobs(model, batch: Batch) -> torch.Tensor:
    """Per-sequence reference: the (B, L) right-padded batch with an attention mask, stock sdpa."""
    padded = batch.to_padded()
    logits = model(padded.input_ids, attention_mask=padded.attention_mask, use_cache=False).logits.float()
    logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, padded.input_ids[:, 1:, None]).squeeze(-1)
    logp = torch.cat([logp.new_zeros(logp.shape[0], 1), logp], dim=1)
    return batch.unpad(logp)


@torch.no_grad()
def test_packed_logprobs_equal_per_sequence_padded_forward(model):
    batch = make_batch()
    stock = _load(model.name_or_path, attn="sdpa")
    packed, _ = token_logprobs(model, batch)
    assert packed.shape == (batch.num_tokens,)
    torch.testing.assert_close(packed, padded_logprobs(stock, batch), atol=1e-5, rtol=0)


@torch.no_grad()
def test_logprob_of_token_t_conditions_on_its_own_prefix_only(model):
    """The alignment convention: logprobs[t] = log π(token_t | tokens before t of the same trajectory)."""
    batch = make_batch()
    packed, _ = token_logprobs(model, batch)
    for b, t in [(1, 1), (1, 18), (3, 6), (4, 4)]:
        start = int(batch.cu_seqlens[b])
        prefix = batch.token_ids[start : start + t]
        logits = model(prefix[None], use_cache=False).logits[0, -1]
        expected = torch.log_softmax(logits, -1)[batch.token_ids[start + t]]
        torch.testing.assert_close(packed[start + t], expected, atol=1e-5, rtol=0)
    assert (packed[batch.position_ids == 0] == 0).all()


@torch.no_grad()
def test_changing_one_trajectory_leaves_the_others_unchanged(model):
    batch = make_batch()
    changed = make_batch()
    s, e = int(batch.cu_seqlens[1]), int(batch.cu_seqlens[2])
    changed.token_ids[s:e] = (changed.token_ids[s:e] + 7) % 300
    before, _ = token_logprobs(model, batch, with_entropy=True)
    after, _ = token_logprobs(model, changed, with_entropy=True)
    others = batch.seq_ids != 1
    torch.testing.assert_close(after[others], before[others], atol=1e-6, rtol=0)
    assert not torch.allclose(after[~others], before[~others])


@torch.no_grad()
def test_padded_and_kv_cache_calls_match_stock_sdpa(tiny_moe_dir):
    ours, stock = _load(tiny_moe_dir), _load(tiny_moe_dir, attn="sdpa")
    input_ids = torch.randint(0, 300, (3, 9), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :4] = 0  # left padding
    attention_mask[2, :1] = 0
    for m in (ours, stock):
        m.generation_config.pad_token_id = 0
    results = []
    for m in (ours, stock):
        padded = m(input_ids, attention_mask=attention_mask).logits
        cache = DynamicCache(config=m.config)
        prefill = m(input_ids[:, :6], attention_mask=attention_mask[:, :6], past_key_values=cache).logits
        step = m(input_ids[:, 6:], attention_mask=attention_mask, past_key_values=cache).logits
        generated = m.generate(input_ids, attention_mask=attention_mask, max_new_tokens=4, do_sample=False)
        results.append((padded, prefill, step, generated))
    assert ours.config._attn_implementation == PACKED_ATTENTION
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


def test_chunked_head_matches_unchunked_reference_values_and_gradients(model):
    batch = make_batch()
    weights = torch.randn(batch.num_tokens, generator=torch.Generator().manual_seed(2))

    def grads_of(fn):
        model.zero_grad()
        out = fn()
        (out * weights).sum().backward()
        return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    ours, ours_grads = grads_of(lambda: token_logprobs(model, batch, chunk_tokens=5)[0])
    ref, ref_grads = grads_of(lambda: reference_logprobs(full_logits(model, batch), batch))
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)
    assert ours_grads.keys() == ref_grads.keys() and "lm_head.weight" in ours_grads
    for name in ref_grads:
        torch.testing.assert_close(ours_grads[name], ref_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_forward_never_saves_full_vocab_logits(model):
    batch = make_batch()
    vocab, chunk = model.config.vocab_size, 4
    rows = []  # rows of every (n, V)-shaped tensor autograd keeps for backward

    def pack(t):
        if t.dim() >= 1 and t.shape[-1] == vocab:
            rows.append(t.numel() // vocab)
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        lp, ent = token_logprobs(model, batch, with_entropy=True, chunk_tokens=chunk)
    (lp.sum() + ent.sum()).backward()
    assert sum(rows) <= chunk < batch.num_tokens


@torch.no_grad()
def test_entropy_equals_reference(model):
    batch = make_batch()
    logits = full_logits(model, batch)
    logp = torch.log_softmax(logits, -1)
    expected = shift_to_tokens(-(logp.exp() * logp).sum(-1), batch)
    _, entropy = token_logprobs(model, batch, with_entropy=True, chunk_tokens=3)
    torch.testing.assert_close(entropy, expected, atol=1e-5, rtol=0)
    assert token_logprobs(model, batch)[1] is None


@torch.no_grad()
def test_temperature_divides_logits_before_the_softmax(model):
    batch = make_batch()
    for temperature in (0.5, 1.7):
        expected = reference_logprobs(full_logits(model, batch, temperature), batch)
        got, _ = token_logprobs(model, batch, temperature=temperature)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert not torch.allclose(
        token_logprobs(model, batch, temperature=0.5)[0], token_logprobs(model, batch)[0]
    )


def test_micro_batches_give_the_same_logprobs_and_gradients(model):
    batch = make_batch()

    def run(**kwargs):
        model.zero_grad()
        lp, ent = token_logprobs(model, batch, with_entropy=True, **kwargs)
        (lp.sum() + ent.sum()).backward()
        return lp.detach(), ent.detach(), model.lm_head.weight.grad.clone()

    whole = run()
    split = run(micro_batch_tokens=20)  # budgets of 20 tokens: [2], [19], [7, 13], [5] → four passes
    assert len(batch.split(20)) == 4
    for a, b in zip(whole, split, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_gradient_checkpointed_backbone_stays_packed_in_backward(tiny_moe_dir):
    """Recomputed layers run after packed_context has closed; the pack must reach them anyway."""
    batch = make_batch()
    results = []
    for checkpointing in (False, True):
        model = _load(tiny_moe_dir).train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        lp, _ = token_logprobs(model, batch)
        lp.sum().backward()
        results.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    for name, grad in results[0].items():
        torch.testing.assert_close(results[1][name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_action_token_without_prefix_is_an_error(tiny_moe_dir):
    batch = make_batch()
    batch.action_mask[int(batch.cu_seqlens[2])] = True
    with pytest.raises(ValueError, match=r"batch index 2.*no prefix"):
        token_logprobs(_load(tiny_moe_dir), batch)


def test_enable_packed_attention_switches_the_implementation(tiny_dense_dir):
    model = _load(tiny_dense_dir, attn="sdpa")
    assert enable_packed_attention(model) is model
    assert model.config._attn_implementation == PACKED_ATTENTION


@torch.no_grad()
def test_packed_context_rejects_a_pack_that_does_not_match_the_input(tiny_moe_dir):
    model = _load(tiny_moe_dir)
    with pytest.raises(ValueError, match="increase strictly"):
        packed_context(torch.tensor([0, 4, 4, 9])).__enter__()
    with (
        packed_context(torch.tensor([0, 4, 9])),
        pytest.raises(ValueError, match=r"\(1, heads, 9, head_dim\)"),
    ):
        model(torch.zeros(2, 9, dtype=torch.long), use_cache=False)  # a (2, 9) batch is not one packed row
    model(torch.zeros(1, 9, dtype=torch.long))  # the context is closed again: an ordinary forward


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@torch.no_grad()
def test_packed_logprobs_on_cuda_match_the_padded_forward_in_bf16_and_fp32(tiny_moe_dir):
    batch = make_batch().to("cuda")
    for dtype, atol in (("float32", 1e-4), ("bfloat16", 5e-2)):
        packed_model = load_policy(
            tiny_moe_dir, dtype=dtype, device="cuda", attn_implementation=PACKED_ATTENTION
        ).eval()
        stock = load_policy(tiny_moe_dir, dtype=dtype, device="cuda", attn_implementation="sdpa").eval()
        packed, _ = token_logprobs(packed_model, batch)
        torch.testing.assert_close(packed, padded_logprobs(stock, batch).float(), atol=atol, rtol=0)
