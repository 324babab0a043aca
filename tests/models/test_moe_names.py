"""Fused (in-memory) <-> per-expert (checkpoint) MoE weight names: checked against what save_pretrained
writes, against the experts' own forward, and as exact inverses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.nn import functional as F
from transformers import AutoModelForCausalLM

from sao.models.moe_names import checkpoint_names, fuse_experts, unfuse_experts
from sao.models.tiny import build_tiny_model, tiny_config


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for name, tensor in a.items():
        assert tensor.dtype == b[name].dtype and torch.equal(tensor, b[name]), name


def test_unfused_state_equals_the_saved_checkpoint(tiny_moe_dir: Path) -> None:
    model = build_tiny_model("qwen3_moe", "test", seed=0)  # the fixture's weights
    on_disk = load_file(tiny_moe_dir / "model.safetensors")
    unfused = unfuse_experts(model.state_dict())
    assert "model.layers.1.mlp.experts.3.up_proj.weight" in unfused
    assert unfused["model.layers.0.mlp.experts.0.gate_proj.weight"].shape == (64, 64)  # (I, H)
    _assert_same(unfused, on_disk)
    assert checkpoint_names(model) == {name: tuple(t.shape) for name, t in on_disk.items()}


def test_fuse_inverts_unfuse_bit_for_bit(tiny_moe_dir: Path) -> None:
    state = build_tiny_model("qwen3_moe", "test", seed=0).state_dict()
    round_trip = fuse_experts(unfuse_experts(state))
    assert list(round_trip) == list(state)  # same names, same order
    _assert_same(round_trip, state)
    _assert_same(fuse_experts(load_file(tiny_moe_dir / "model.safetensors")), state)


def test_per_expert_weights_reproduce_the_fused_expert_forward() -> None:
    """Pins the layout independently of transformers' own converter: gate first, then up, in gate_up_proj."""
    model = build_tiny_model("qwen3_moe", "test", seed=0)
    experts = model.model.layers[0].mlp.experts
    unfused = unfuse_experts(model.state_dict())
    x = torch.randn(5, experts.gate_up_proj.shape[-1], generator=torch.Generator().manual_seed(0))  # (N, H)
    expert = 2
    with torch.no_grad():
        fused_out = experts(x, torch.full((5, 1), expert), torch.ones(5, 1))  # top-1 routing, weight 1
    prefix = f"model.layers.0.mlp.experts.{expert}"
    gate, up, down = (unfused[f"{prefix}.{p}.weight"] for p in ("gate_proj", "up_proj", "down_proj"))
    reference = F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)
    torch.testing.assert_close(fused_out, reference, atol=1e-6, rtol=1e-6)


def test_dense_model_passes_through_unchanged(tiny_dense_dir: Path) -> None:
    model = build_tiny_model("qwen3", "test", seed=0)
    state = model.state_dict()
    for converted in (unfuse_experts(state), fuse_experts(state)):
        assert list(converted) == list(state)
        assert all(converted[name] is tensor for name, tensor in state.items())
    on_disk = load_file(tiny_dense_dir / "model.safetensors")
    assert checkpoint_names(model) == {name: tuple(t.shape) for name, t in on_disk.items()}


def test_checkpoint_names_drop_tied_lm_head(tmp_path: Path) -> None:
    config = tiny_config("qwen3", "test")
    config.tie_word_embeddings = True
    model = AutoModelForCausalLM.from_config(config)
    names = checkpoint_names(model)
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names
    model.save_pretrained(tmp_path)
    assert names == {name: tuple(t.shape) for name, t in load_file(tmp_path / "model.safetensors").items()}


def test_fuse_names_a_missing_expert_tensor(tiny_moe_dir: Path) -> None:
    state = load_file(tiny_moe_dir / "model.safetensors")
    del state["model.layers.1.mlp.experts.2.up_proj.weight"]
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.experts\.2\.up_proj\.weight is missing"):
        fuse_experts(state)
