"""Mixed precision in one process (`sao.models.precision`): float32 master weights keep an update at lr 1e-6
that pure bfloat16 rounds away; `cast_for_compute` computes exactly as a bfloat16 copy of the weights while
the parameters, their gradients, the state dict and the optimizer stay float32."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from sao.models.attention import PACKED_ATTENTION, packed_attention_kwargs
from sao.models.critic import load_critic
from sao.models.forward import token_logprobs, token_values
from sao.models.loading import load_policy
from sao.models.precision import Precision, cast_for_compute, compute_dtype_of, fsdp_policy

from . import batches

BATCH = batches.make_batch([5, 19, 7, 13, 9], seed=3)


def _load(path, dtype) -> nn.Module:
    return load_policy(path, dtype=dtype, device="cpu", attn_implementation=PACKED_ATTENTION)


@pytest.fixture(scope="module")
def fp32_policy(tiny_dense_dir) -> nn.Module:
    """The tiny dense policy in float32 (copy before changing it)."""
    return _load(tiny_dense_dir, torch.float32)


def _loss(model: nn.Module) -> torch.Tensor:
    """Mean negative log-prob of the action tokens (the LM head in one chunk)."""
    lp, _ = token_logprobs(model, BATCH)
    return -(lp * BATCH.action_mask).sum() / BATCH.action_mask.sum()


def _bf16_weights(model: nn.Module) -> nn.Module:
    """A copy whose parameters (not buffers) are rounded to bfloat16: what FSDP's all-gather computes with."""
    copied = copy.deepcopy(model)
    for param in copied.parameters():
        param.data = param.data.to(torch.bfloat16)
    return copied


def test_precision_resolves_the_pair_and_the_fsdp_policy():
    mixed = Precision.resolve("bfloat16", "float32", "cpu")
    assert (mixed.compute, mixed.master, mixed.reduce) == (torch.bfloat16, torch.float32, torch.float32)
    policy = fsdp_policy(mixed)
    assert policy is not None
    assert (policy.param_dtype, policy.reduce_dtype, policy.cast_forward_inputs) == (
        torch.bfloat16,
        torch.float32,
        True,
    )
    assert Precision.resolve("auto", "float32", "cpu").compute == torch.float32  # auto: fp32 off CUDA
    assert fsdp_policy(Precision.resolve("bfloat16", "bfloat16")) is None  # one dtype: no policy
    upcast = Precision.resolve("float32", "bfloat16")
    assert upcast.reduce == torch.float32 and fsdp_policy(upcast).reduce_dtype == torch.float32
    with pytest.raises(ValueError, match="loss scaling"):
        Precision.resolve("float16", "float32")
    with pytest.raises(ValueError, match="unknown dtype"):
        Precision.resolve("float8", "float32")


@pytest.mark.parametrize("master", ["float32", "bfloat16"])
def test_an_adamw_step_at_lr_1e6_survives_in_fp32_master_weights_not_in_bf16(master, tiny_dense_dir):
    """bf16 compute either way; float32 master weights move by ≈ lr wherever there is a gradient, pure
    bfloat16 weights (spacing ≈ 4e-5 near 0.01) keep almost all of their values."""
    precision = Precision.resolve("bfloat16", master, "cpu")
    model = _load(tiny_dense_dir, precision.master)
    cast_for_compute(model, precision.compute)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optim = torch.optim.AdamW(model.parameters(), lr=1e-6)
    _loss(model).backward()
    optim.step()
    changed = total = 0
    for name, param in model.named_parameters():
        assert param.dtype == precision.master
        touched = param.grad != 0
        changed += int((param.detach() != before[name])[touched].sum())
        total += int(touched.sum())
    fraction = changed / total
    if master == "float32":
        assert fraction > 0.99
    else:
        assert fraction < 0.05


def test_cast_for_compute_computes_as_a_bf16_copy_of_the_weights_and_keeps_fp32_state(fp32_policy):
    """Bit for bit: log-probs equal those of a copy with bfloat16 parameters (and float32 buffers, as FSDP
    leaves them), gradients equal that copy's, upcast, and land on the float32 parameters; names, dtypes,
    buffers and the optimizer's state stay float32."""
    model = copy.deepcopy(fp32_policy)
    names = {n: v.dtype for n, v in model.state_dict().items()}
    cast_for_compute(model, torch.bfloat16)
    assert compute_dtype_of(model) == torch.bfloat16
    reference = _bf16_weights(fp32_policy)
    lp, _ = token_logprobs(model, BATCH)
    want, _ = token_logprobs(reference, BATCH)
    assert torch.equal(lp, want)
    _loss(model).backward()
    _loss(reference).backward()
    for (name, param), ref in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert param.dtype == param.grad.dtype == torch.float32, name
        assert torch.equal(param.grad, ref.grad.float()), name
    assert {n: v.dtype for n, v in model.state_dict().items()} == names
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    optim.step()
    assert {s["exp_avg"].dtype for s in optim.state.values()} == {torch.float32}


def test_bf16_compute_loss_is_within_tolerance_of_fp32(fp32_policy):
    model = copy.deepcopy(fp32_policy)
    with torch.no_grad():
        fp32 = float(_loss(model))
        cast_for_compute(model, torch.bfloat16)
        bf16 = float(_loss(model))
    assert bf16 != fp32  # it did compute in bfloat16
    assert bf16 == pytest.approx(fp32, rel=1e-2)


def test_floating_inputs_of_a_unit_are_cast_as_fsdp_casts_them(fp32_policy):
    """``inputs_embeds`` given in float32 reach the decoder layers in bfloat16 (FSDP's cast_forward_inputs);
    without the cast the layers would mix float32 activations with bfloat16 weights."""
    model = copy.deepcopy(fp32_policy)
    cast_for_compute(model, torch.bfloat16)
    seen = []
    model.model.layers[0].register_forward_pre_hook(lambda module, args: seen.append(args[0].dtype))
    embeds = torch.randn(1, 6, model.config.hidden_size)
    with torch.no_grad():
        out = model.model(inputs_embeds=embeds, use_cache=False).last_hidden_state
    assert seen == [torch.bfloat16] and out.dtype == torch.bfloat16


def test_removing_the_cast_restores_fp32_compute(fp32_policy):
    model = copy.deepcopy(fp32_policy)
    with torch.no_grad():
        want = float(_loss(model))
        cast_for_compute(model, torch.bfloat16).remove()
        assert float(_loss(model)) == want
    assert compute_dtype_of(model) is None
    cast_for_compute(model, torch.bfloat16)  # may be applied again once removed
    with pytest.raises(ValueError, match="already computes"):
        cast_for_compute(model, torch.bfloat16)


def test_a_forward_failing_inside_a_module_leaves_its_fp32_parameters_in_place(fp32_policy):
    """The embedding raises on an out-of-range id while its bfloat16 copy stands in for its weight."""
    model = copy.deepcopy(fp32_policy)
    cast_for_compute(model, torch.bfloat16)
    with pytest.raises(IndexError), torch.no_grad():
        model.model(torch.tensor([[model.config.vocab_size + 5]]), use_cache=False)
    params = dict(model.named_parameters())
    assert params and all(isinstance(p, nn.Parameter) and p.dtype == torch.float32 for p in params.values())
    with torch.no_grad():
        assert float(_loss(model)) == float(_loss(_bf16_weights(fp32_policy)))  # and it still works


def test_the_critic_computes_values_in_bf16_with_fp32_gradients(tiny_dense_dir):
    critic = load_critic(tiny_dense_dir, freeze="none", dtype="float32", device="cpu", head_init="normal")
    with torch.no_grad():
        fp32 = token_values(critic, BATCH)
    cast_for_compute(critic, torch.bfloat16)
    values = token_values(critic, BATCH)
    assert values.dtype == torch.bfloat16
    torch.testing.assert_close(values.float(), fp32, atol=3e-2, rtol=3e-2)
    values.float().square().sum().backward()
    assert {p.grad.dtype for p in critic.parameters()} == {torch.float32}
    assert critic.head.weight.grad.abs().sum() > 0


def test_a_moe_policy_computes_in_bf16_close_to_fp32(tiny_moe_dir):
    model = _load(tiny_moe_dir, torch.float32)
    kwargs = packed_attention_kwargs(BATCH.cu_seqlens, BATCH.max_seqlen)
    with torch.no_grad():
        fp32 = model(BATCH.token_ids[None], position_ids=BATCH.position_ids[None], **kwargs).logits
        cast_for_compute(model, torch.bfloat16)
        bf16 = model(BATCH.token_ids[None], position_ids=BATCH.position_ids[None], **kwargs).logits
    assert bf16.dtype == torch.bfloat16
    torch.testing.assert_close(bf16.float(), fp32, atol=5e-2, rtol=0)


# ---- the weight push ----------------------------------------------------------------------------------


def test_the_push_casts_to_the_engine_dtype_and_leaves_the_trainer_weights_alone(tiny_dense_dir, fp32_policy):
    """float32 master weights → a bfloat16 `LocalEngine`: the engine gets the weights rounded to bfloat16 (as
    the trainer's compute copies are), never a reference to the trainer's tensors, which stay float32."""
    import asyncio

    from sao.engine.local import LocalEngine
    from sao.runtime.weight_sync import InprocSync, push_dtype

    actor = copy.deepcopy(fp32_policy)
    with torch.no_grad():
        for param in actor.parameters():
            param.add_(1e-3)  # a trained step: not the checkpoint the engine loaded
    before = {n: (v.data_ptr(), v.clone()) for n, v in actor.state_dict().items()}
    dtype = push_dtype("local", "bfloat16", "cpu")
    assert dtype == torch.bfloat16 and push_dtype("local", "auto", "cpu") == torch.float32
    assert push_dtype("vllm", "auto", "cpu") is None  # a server's own choice: not guessed

    async def push() -> dict[str, torch.Tensor]:
        engine = LocalEngine(tiny_dense_dir, device="cpu", dtype="bfloat16", max_running=2)
        try:
            await InprocSync(engine, actor, dtype).push(1)
            return {n: v.detach().clone() for n, v in engine.model.state_dict().items()}
        finally:
            await engine.close()

    served = asyncio.run(push())
    for name, (ptr, value) in before.items():
        now = actor.state_dict()[name]
        assert now.dtype == torch.float32 and now.data_ptr() == ptr and torch.equal(now, value), name
        if name in served:
            assert torch.equal(served[name], value.to(torch.bfloat16)), name


def test_cast_state_dict_casts_floating_tensors_into_new_ones():
    from sao.engine.weights import cast_state_dict

    weight, steps = torch.randn(3, 4), torch.arange(3)
    state = {"w": weight, "steps": steps, "half": weight.to(torch.bfloat16)}
    out = cast_state_dict(state, torch.bfloat16)
    assert out["w"].dtype == torch.bfloat16 and out["w"].data_ptr() != weight.data_ptr()
    assert torch.equal(out["w"], weight.to(torch.bfloat16)) and state["w"] is weight
    assert out["steps"].dtype == torch.int64 and out["half"].data_ptr() == state["half"].data_ptr()
    assert cast_state_dict(state, None)["w"].data_ptr() == weight.data_ptr()
    with pytest.raises(ValueError, match="not a tensor"):
        cast_state_dict({"x": 1.0}, torch.bfloat16)
