"""`prepare_for_training`: activation checkpointing per decoder layer (on in eval mode, in the packed forward,
for the critic; the same gradients; layers recomputed in backward) and the attention kernel choice."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks

from sao.models.attention import PACKED_ATTENTION, PACKED_EAGER_ATTENTION
from sao.models.critic import CriticModel, load_critic
from sao.models.forward import token_logprobs, token_values
from sao.models.loading import load_policy
from sao.models.precision import cast_for_compute
from sao.models.prepare import (
    checkpointing_enabled,
    disable_checkpointing,
    enable_checkpointing,
    prepare_for_training,
    wants_checkpointing,
)
from sao.runtime.args import ComputeArgs

from . import batches

BATCH = batches.make_batch([5, 19, 7, 13, 9], seed=4)


@pytest.fixture(scope="module", params=["dense", "moe"])
def policy(request, tiny_dense_dir, tiny_moe_dir) -> nn.Module:
    """A tiny float32 policy in eval mode, as loaded (copy before changing it)."""
    path = tiny_dense_dir if request.param == "dense" else tiny_moe_dir
    return load_policy(path, dtype="float32", device="cpu", attn_implementation=PACKED_ATTENTION)


@pytest.fixture(scope="module")
def critic(tiny_dense_dir) -> CriticModel:
    return load_critic(tiny_dense_dir, freeze="none", dtype="float32", device="cpu", head_init="normal")


def _actor_loss(model: nn.Module) -> torch.Tensor:
    lp, _ = token_logprobs(model, BATCH, chunk_tokens=16)
    return -(lp * BATCH.action_mask).sum()


def _critic_loss(model: nn.Module) -> torch.Tensor:
    return token_values(model, BATCH).square().sum()


def _grads(model: nn.Module, loss) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss(model).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _compute(**overrides) -> ComputeArgs:
    fields = {"dtype": "float32", "master_dtype": "float32", "device": "cpu", "attn_implementation": "sdpa",
              "gradient_checkpointing": None} | overrides  # fmt: skip
    return ComputeArgs(**fields)


def _assert_same_gradients(model: nn.Module, loss) -> None:
    """Checkpointed and plain copies of ``model`` (its decoder layers in eval mode, as the trainer runs
    them, where transformers' own checkpointing would be off) give the same float32 gradients."""
    plain = copy.deepcopy(model)
    assert not any(layer.training for layer in plain.modules() if type(layer).__name__.endswith("Layer"))
    checkpointed = copy.deepcopy(model)
    enable_checkpointing(checkpointed)
    want, got = _grads(plain, loss), _grads(checkpointed, loss)
    assert want.keys() == got.keys() and len(want) > 0
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-6, rtol=0, msg=name)


def test_checkpointed_actor_gradients_equal_the_plain_ones(policy):
    """The packed log-prob forward, the LM head in chunks."""
    _assert_same_gradients(policy, _actor_loss)


def test_checkpointed_critic_gradients_equal_the_plain_ones(critic):
    _assert_same_gradients(critic, _critic_loss)


def test_checkpointing_recomputes_every_layer_in_backward_and_saves_fewer_tensors(policy):
    """Each layer's attention runs twice per backward step (forward, recompute) and once without gradients;
    autograd saves a fraction of the tensors it saves without checkpointing."""
    model = copy.deepcopy(policy)
    layers = model.model.layers
    calls = [0]
    for layer in layers:
        layer.self_attn.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))

    def saved_bytes(loss_of) -> tuple[int, torch.Tensor]:
        total = [0]

        def pack(t):
            total[0] += t.numel() * t.element_size()
            return t

        with saved_tensors_hooks(pack, lambda t: t):
            loss = loss_of()
        return total[0], loss

    plain, _ = saved_bytes(lambda: _actor_loss(model))
    enable_checkpointing(model)
    assert checkpointing_enabled(model) and not model.training
    calls[0] = 0
    saved, loss = saved_bytes(lambda: _actor_loss(model))
    assert calls[0] == len(layers)
    loss.backward()
    assert calls[0] == 2 * len(layers)
    assert saved < 0.5 * plain
    calls[0] = 0
    with torch.no_grad():
        _actor_loss(model)
    assert calls[0] == len(layers)  # no-grad forwards are not checkpointed


def test_checkpointing_composes_with_bf16_compute(critic):
    """The recomputed layer casts its parameters again: the same gradients as without checkpointing."""
    plain = copy.deepcopy(critic)
    cast_for_compute(plain, torch.bfloat16)
    checkpointed = copy.deepcopy(critic)
    enable_checkpointing(checkpointed)
    cast_for_compute(checkpointed, torch.bfloat16)
    want, got = _grads(plain, _critic_loss), _grads(checkpointed, _critic_loss)
    for name in want:
        assert got[name].dtype == torch.float32
        torch.testing.assert_close(got[name], want[name], atol=1e-6, rtol=0, msg=name)


def test_checkpointing_is_undone_and_a_deep_copy_checkpoints_itself(policy):
    model = copy.deepcopy(policy)
    enable_checkpointing(model)
    enable_checkpointing(model)  # idempotent
    twin = copy.deepcopy(model)
    assert checkpointing_enabled(twin)
    assert all(layer.forward.__self__ is layer for layer in twin.model.layers)
    disable_checkpointing(model)
    assert not checkpointing_enabled(model) and "forward" not in model.model.layers[0].__dict__
    assert sorted(model.state_dict()) == sorted(policy.state_dict())


def test_prepare_for_training_applies_the_kernel_and_checkpointing(policy, critic):
    model = prepare_for_training(copy.deepcopy(policy), _compute(attn_implementation="eager"))
    assert model.config._attn_implementation == PACKED_EAGER_ATTENTION
    assert not checkpointing_enabled(model)  # None: off on the CPU
    model = prepare_for_training(copy.deepcopy(policy), _compute(gradient_checkpointing=True))
    assert model.config._attn_implementation == PACKED_ATTENTION and checkpointing_enabled(model)
    wrapped = prepare_for_training(copy.deepcopy(critic), _compute(gradient_checkpointing=True))
    assert isinstance(wrapped, CriticModel) and checkpointing_enabled(wrapped.model)
    assert wants_checkpointing(_compute(device="auto")) == torch.cuda.is_available()
    assert not wants_checkpointing(_compute(gradient_checkpointing=False))


def test_flash_attention_2_is_refused_off_cuda_naming_the_key(policy):
    with pytest.raises(ValueError, match=r"model.attn_implementation='flash_attention_2'.*on cpu"):
        prepare_for_training(copy.deepcopy(policy), _compute(attn_implementation="flash_attention_2"))


def test_prepare_runs_on_a_meta_device_model(tiny_dense_dir):
    """The sharded loaders call it before any weight exists."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_dense_dir))
    prepare_for_training(model, _compute(gradient_checkpointing=True))
    assert checkpointing_enabled(model) and model.config._attn_implementation == PACKED_ATTENTION
