"""Tiny randomly initialised Qwen3 / Qwen3-MoE checkpoints for tests and the CPU quickstart.

A tiny checkpoint is an ordinary Hugging Face directory (safetensors weights, config, generation config and
a tokenizer: the byte-level one of `sao.models.tokenizer` by default, or the BPE one of `sao.models.bpe`),
so every code path that loads a real model loads it too. Weights are a pure function of (arch, size, seed,
tokenizer): the model's own initialisation under a fixed seed, on CPU in float32. The tokenizer sets the
vocabulary (its size padded to a multiple of 64) and the pad / eos ids.

Sizes with the byte tokenizer (parameters, embeddings and an untied LM head included; vocab 320):

=========  ======  ======  =======  =================  =========
arch       size    hidden  layers   experts (top-2)    params
=========  ======  ======  =======  =================  =========
qwen3_moe  test    64      2        4 x 64             164,736
qwen3_moe  small   128     3        8 x 192            2,003,008
qwen3      test    64      2        dense MLP 256      164,224
qwen3      small   128     3        dense MLP 1536     1,999,936
=========  ======  ======  =======  =================  =========

The dense models' MLP width is experts x expert width, so both architectures hold the same weights per
layer (the MoE adds only its router). The BPE tokenizer's vocab of 4096 adds 2 x 3776 x hidden parameters
(embeddings and LM head): ~0.48M for ``test``, ~0.97M for ``small``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3MoeConfig,
)

from sao.models.tokenizer import (
    EOS_TOKEN,
    PAD_TOKEN,
    TOKENIZER_KINDS,
    TokenizerKind,
    build_tokenizer,
    padded_vocab_size,
)

__all__ = [
    "TINY_ARCHS",
    "TINY_SIZES",
    "TinyArch",
    "TinySize",
    "build_named_tokenizer",
    "build_tiny_model",
    "count_parameters",
    "tiny_checkpoint",
    "tiny_config",
]

TinyArch = Literal["qwen3_moe", "qwen3"]
TinySize = Literal["test", "small"]
TINY_ARCHS: tuple[str, ...] = ("qwen3_moe", "qwen3")
TINY_SIZES: tuple[str, ...] = ("test", "small")

_SHAPES: dict[str, dict[str, int]] = {
    "test": {
        "hidden": 64,
        "layers": 2,
        "heads": 4,
        "kv_heads": 2,
        "head_dim": 16,
        "experts": 4,
        "expert_width": 64,
    },
    "small": {
        "hidden": 128,
        "layers": 3,
        "heads": 4,
        "kv_heads": 2,
        "head_dim": 32,
        "experts": 8,
        "expert_width": 192,
    },
}
_TOP_K = 2
_MAX_POSITIONS = 4096
_ROPE = {"rope_type": "default", "rope_theta": 1_000_000.0}


def build_named_tokenizer(kind: TokenizerKind, chat_template: str | None = None) -> PreTrainedTokenizerFast:
    """A new tokenizer of ``kind``: ``"byte"`` (`sao.models.tokenizer.build_tokenizer`, default template its
    `CHAT_TEMPLATE`) or ``"bpe"`` (`sao.models.bpe.build_bpe_tokenizer`, default template the shipped
    ``qwen3``).
    ``chat_template``: template text replacing the default. Raises ValueError for an unknown kind."""
    if kind == "byte":
        tokenizer = build_tokenizer()
        if chat_template is not None:
            tokenizer.chat_template = chat_template
        return tokenizer
    if kind == "bpe":
        from sao.models.bpe import build_bpe_tokenizer

        return build_bpe_tokenizer(chat_template)
    raise ValueError(f"unknown tokenizer {kind!r}; choose one of {', '.join(TOKENIZER_KINDS)}")


def _special_ids(tokenizer_kind: TokenizerKind) -> dict[str, int]:
    tokenizer = build_named_tokenizer(tokenizer_kind)
    pad = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    return {"vocab_size": padded_vocab_size(tokenizer), "pad": pad, "eos": eos}


def tiny_config(
    arch: TinyArch = "qwen3_moe", size: TinySize = "test", tokenizer: TokenizerKind = "byte"
) -> PretrainedConfig:
    """The config of a tiny model: `Qwen3MoeConfig` (``arch="qwen3_moe"``) or `Qwen3Config` (``"qwen3"``).

    Vocab is the size of ``tokenizer`` (``"byte"`` or ``"bpe"``, `build_named_tokenizer`) padded to a
    multiple of 64; bos = pad = ``<|endoftext|>``, eos = ``<|im_end|>`` (Qwen3's choice), their ids from
    that tokenizer; 4096 positions; untied LM head (as Qwen3-30B-A3B). Raises ValueError for an unknown
    arch, size or tokenizer.
    """
    if arch not in TINY_ARCHS:
        raise ValueError(f"unknown tiny arch {arch!r}; choose one of {', '.join(TINY_ARCHS)}")
    if size not in TINY_SIZES:
        raise ValueError(f"unknown tiny size {size!r}; choose one of {', '.join(TINY_SIZES)}")
    if tokenizer not in TOKENIZER_KINDS:
        raise ValueError(f"unknown tiny tokenizer {tokenizer!r}; choose one of {', '.join(TOKENIZER_KINDS)}")
    shape, ids = _SHAPES[size], _special_ids(tokenizer)
    dense_width = shape["experts"] * shape["expert_width"]
    common: dict[str, Any] = {
        "vocab_size": ids["vocab_size"],
        "hidden_size": shape["hidden"],
        "num_hidden_layers": shape["layers"],
        "num_attention_heads": shape["heads"],
        "num_key_value_heads": shape["kv_heads"],
        "head_dim": shape["head_dim"],
        "intermediate_size": dense_width,
        "max_position_embeddings": _MAX_POSITIONS,
        "rope_parameters": dict(_ROPE),
        "tie_word_embeddings": False,
        "bos_token_id": ids["pad"],
        "eos_token_id": ids["eos"],
        "pad_token_id": ids["pad"],
    }
    if arch == "qwen3":
        return Qwen3Config(**common)
    return Qwen3MoeConfig(
        **common,
        num_experts=shape["experts"],
        num_experts_per_tok=_TOP_K,
        moe_intermediate_size=shape["expert_width"],
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )


def count_parameters(config: PretrainedConfig) -> int:
    """Number of parameters of the causal LM ``config`` describes (built on the meta device, no memory)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return model.num_parameters()


def _generation_config(config: PretrainedConfig) -> GenerationConfig:
    # As Qwen3's generation config: stop at the end of a turn or at end-of-text.
    return GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=[config.eos_token_id, config.pad_token_id],
        pad_token_id=config.pad_token_id,
    )


def build_tiny_model(
    arch: TinyArch = "qwen3_moe", size: TinySize = "test", seed: int = 0, tokenizer: TokenizerKind = "byte"
) -> PreTrainedModel:
    """A tiny causal LM on CPU in float32 (vocab of ``tokenizer``, see `tiny_config`), initialised by the
    model's own ``init_weights`` under ``torch.manual_seed(seed)``; the global RNG state is left as it was."""
    config = tiny_config(arch, size, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = _generation_config(config)
    return model


def tiny_checkpoint(
    out_dir: str | Path,
    arch: TinyArch = "qwen3_moe",
    size: TinySize = "test",
    seed: int = 0,
    tokenizer: TokenizerKind = "byte",
    chat_template: str | None = None,
) -> Path:
    """Write a tiny checkpoint (model.safetensors, config, generation config, tokenizer) into ``out_dir``
    (created if missing) and return its path. Same (arch, size, seed, tokenizer), same bytes of weights.

    ``tokenizer``: ``"byte"`` or ``"bpe"``. ``chat_template``: the saved tokenizer's template, a shipped name
    or a file (`sao.models.templates.load_chat_template`); None keeps the tokenizer's default (``sao`` for
    byte, ``qwen3`` for bpe). Raises ValueError for an unknown template before writing anything."""
    from sao.models.templates import load_chat_template

    template = None if chat_template is None else load_chat_template(chat_template)
    built_tokenizer = build_named_tokenizer(tokenizer, template)
    model = build_tiny_model(arch, size, seed, tokenizer)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    built_tokenizer.save_pretrained(out)
    return out
