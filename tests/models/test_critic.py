"""The critic (value head on the policy backbone) and the freezing rules of the frozen-attention critic."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sao.models.critic import CriticModel, load_critic
from sao.models.forward import token_values
from sao.models.freezing import apply_freeze, trainable_parameters
from sao.types import Batch

from . import batches


@pytest.fixture(params=["moe", "dense"])
def policy_dir(request, tiny_moe_dir, tiny_dense_dir):
    return tiny_moe_dir if request.param == "moe" else tiny_dense_dir


def make_batch(lengths=(3, 11, 6), seed=0) -> Batch:
    """Outcome reward = trajectory index."""
    return batches.make_batch(lengths, seed, rewards=range(len(lengths)))


def value_step(critic: CriticModel, optimizer: torch.optim.Optimizer, batch: Batch) -> None:
    """One masked-MSE critic step towards the outcome reward on action tokens."""
    optimizer.zero_grad()
    values = token_values(critic, batch)
    target = batch.outcome_rewards[batch.seq_ids]
    ((values - target)[batch.action_mask] ** 2).mean().backward()
    optimizer.step()


def test_zero_initialised_head_gives_values_exactly_zero(policy_dir):
    critic = load_critic(policy_dir)
    batch = make_batch()
    values = token_values(critic, batch)
    assert values.shape == (batch.num_tokens,) and values.dtype == torch.float32
    assert torch.equal(values, torch.zeros_like(values))
    assert critic.head.out_features == 1 and not critic.model.dropout.p


@torch.no_grad()
def test_value_of_token_t_is_the_critic_output_before_it(tiny_moe_dir):
    """The alignment convention: values[t] = V(s_t) = the critic's output at position t - 1 of its own
    trajectory, and 0 at each trajectory's first token; micro-batching does not change it."""
    critic = load_critic(tiny_moe_dir, head_init="normal")
    batch = make_batch()
    values = token_values(critic, batch)
    for b in range(batch.num_sequences):
        start, end = int(batch.cu_seqlens[b]), int(batch.cu_seqlens[b + 1])
        alone = critic(batch.token_ids[None, start:end])[0]
        assert values[start] == 0
        torch.testing.assert_close(values[start + 1 : end], alone[:-1], atol=1e-5, rtol=0)
    torch.testing.assert_close(token_values(critic, batch, micro_batch_tokens=12), values, atol=1e-6, rtol=0)


def test_frozen_attention_critic_trains_mlp_and_head_only(policy_dir):
    critic = load_critic(policy_dir, freeze="attention")
    report = critic.freeze_report
    named = dict(critic.model.named_parameters())
    assert report.frozen_names and all(".self_attn." in n for n in report.frozen_names)
    assert {n.rsplit(".", 2)[-2] for n in report.frozen_names} == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "q_norm",
        "k_norm",
    }
    assert report.trainable + report.frozen == sum(p.numel() for p in named.values())
    assert report.frozen == sum(named[n].numel() for n in report.frozen_names)

    before = {n: p.detach().clone() for n, p in named.items()}
    # no weight decay: every change below comes from a gradient
    optimizer = torch.optim.AdamW(trainable_parameters(critic), lr=1e-2, weight_decay=0.0)
    batch = make_batch()
    value_step(critic, optimizer, batch)  # the zero head passes no gradient to the backbone yet
    value_step(critic, optimizer, batch)

    frozen = set(report.frozen_names)
    state_ids = {id(p) for p in optimizer.state}
    for name, param in named.items():
        changed = not torch.equal(param, before[name])
        if name in frozen:
            assert param.grad is None and not changed and id(param) not in state_ids, name
        elif "mlp" in name or name.startswith("score."):
            assert changed, name  # experts, router / dense MLP, and the value head learn
    assert any("mlp" in n for n in named) and "score.weight" in named


def test_freeze_none_and_pattern_lists(tiny_moe_dir):
    critic = load_critic(tiny_moe_dir, freeze="none")
    assert critic.freeze_report.frozen == 0 and critic.freeze_report.frozen_names == []
    report = apply_freeze(critic.model, [r"\.mlp\.gate\.", r"^model\.embed_tokens\."])
    assert sorted(report.frozen_names) == sorted(
        ["model.embed_tokens.weight"] + [f"model.layers.{i}.mlp.gate.weight" for i in range(2)]
    )
    assert not critic.model.model.embed_tokens.weight.requires_grad
    assert critic.model.model.layers[0].self_attn.q_proj.weight.requires_grad  # the previous rule is replaced


def test_freeze_rule_matching_nothing_names_the_model():
    class NoAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = nn.Linear(2, 2)

    with pytest.raises(ValueError, match="NoAttention"):
        apply_freeze(NoAttention(), "attention")
    with pytest.raises(ValueError, match="NoAttention"):
        apply_freeze(NoAttention(), [r"\.attention\."])
    with pytest.raises(ValueError, match="attention"):
        apply_freeze(NoAttention(), "everything")
    assert apply_freeze(NoAttention(), []).frozen == 0


def test_saved_critic_loads_back_bit_identical_with_its_trained_head(policy_dir, tmp_path):
    critic = load_critic(policy_dir)
    optimizer = torch.optim.AdamW(trainable_parameters(critic), lr=1e-2)
    batch = make_batch()
    value_step(critic, optimizer, batch)
    assert critic.head.weight.abs().sum() > 0
    critic.save_pretrained(tmp_path / "critic")

    loaded = load_critic(tmp_path / "critic")  # head_init="zero" must not touch a saved head
    assert type(loaded.model) is type(critic.model)
    saved, restored = critic.model.state_dict(), loaded.model.state_dict()
    assert saved.keys() == restored.keys()
    for name, tensor in saved.items():
        assert torch.equal(tensor, restored[name]), name
    with torch.no_grad():
        assert torch.equal(token_values(loaded, batch), token_values(critic, batch))
    assert loaded.freeze_report.frozen_names == critic.freeze_report.frozen_names
