"""scripts/shaped_checkpoint.py: random-init checkpoints with a real model's shape, sharded as published ones
are, with sao's BPE tokenizer and a shipped chat template."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from sao.plan.architecture import KNOWN_ARCHITECTURES, Architecture, parameter_sizes

ROOT = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "shaped_checkpoint", ROOT / "scripts" / "shaped_checkpoint.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shaped_config_is_the_published_config_with_the_tokenizers_special_ids() -> None:
    from sao.models.bpe import build_bpe_tokenizer

    config = _script().shaped_config("qwen3-0.6b")
    published = KNOWN_ARCHITECTURES["Qwen/Qwen3-0.6B"]
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
            "intermediate_size", "vocab_size", "tie_word_embeddings", "max_position_embeddings")  # fmt: skip
    for key in keys:
        assert getattr(config, key) == published[key], key
    arch = Architecture.from_hf_config(config.to_dict())
    assert sum(parameter_sizes(arch).values()) == 596_049_920
    tokenizer = build_bpe_tokenizer()
    assert config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>") < len(tokenizer)
    assert config.pad_token_id == tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert _script().shaped_config("qwen3-8b", layers=2).num_hidden_layers == 2


def test_tiny_checkpoint_is_sharded_bf16_and_loads_with_its_template(tmp_path: Path) -> None:
    import torch
    from safetensors import safe_open

    from sao.models.loading import load_policy, load_tokenizer
    from sao.models.templates import load_chat_template

    written = _script().write_shaped_checkpoint(tmp_path, "qwen3-0.6b", tiny=True, shard_size="200KB")
    assert len(written["files"]) >= 2  # sharded, with an index naming every tensor's file
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(written["files"])
    with safe_open(str(tmp_path / written["files"][0]), framework="pt") as f:
        assert all(f.get_slice(name).get_dtype() == "BF16" for name in f.keys())  # noqa: SIM118
    model = load_policy(tmp_path, dtype="float32", device="cpu")
    assert model.num_parameters() == written["parameters"]
    assert model.config.vocab_size == 4096 and model.config.tie_word_embeddings  # the tokenizer's vocabulary
    assert load_tokenizer(tmp_path).chat_template == load_chat_template("qwen3")
    again = _script().write_shaped_checkpoint(tmp_path / "again", "qwen3-0.6b", tiny=True)
    reloaded = load_policy(tmp_path / "again", dtype="float32", device="cpu")
    for (name, a), (_, b) in zip(model.state_dict().items(), reloaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name  # the seed fixes the weights
    assert again["files"] == ["model.safetensors"]


def test_tiny_moe_keeps_its_family(tmp_path: Path) -> None:
    config = _script().shaped_config("Qwen/Qwen3-30B-A3B", tiny=True)
    assert (config.model_type, config.num_experts, config.num_experts_per_tok) == ("qwen3_moe", 4, 2)
    assert _script().shaped_config("qwen3-0.6b", tiny=True).model_type == "qwen3"


def test_unknown_architecture_is_an_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert _script().main(["--arch", "qwen3-9b", "--out", str(tmp_path)]) == 2
    assert "unknown architecture 'qwen3-9b'" in capsys.readouterr().err
