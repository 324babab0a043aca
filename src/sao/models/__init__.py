"""Models: the policy and critic networks, their tokenizers and chat templates, and how the trainer runs
them. Knows nothing of RL algorithms.

- Checkpoints: `loading` (a policy and its tokenizer from a directory; the directory a run's ``model``
  section names), `tiny` (tiny Qwen3 / Qwen3-MoE checkpoints), `critic` (the backbone with a value head),
  `moe_names` (fused <-> per-expert expert weights), `sharding` and `sharded_loading` (FSDP2).
- Tokens: `tokenizer` (the local byte-level tokenizer) and `bpe` (a locally trained BPE one), `templates`
  (chat templates by name or file), `chat` (conversations -> token ids with action masks), `chat_delta`
  (token-in/token-out with any chat template).
- Training forwards: `forward` (per-token log-probs, entropies and values on a packed batch), `attention`
  and `attention_kernels` (packed attention), `precision` (master and compute dtypes), `prepare` (kernel
  and activation checkpointing), `freezing` (which parameters train).
"""

from __future__ import annotations

from sao.models.attention import (
    PACKED_ATTENTION,
    enable_packed_attention,
    packed_attention_kwargs,
    packed_context,
)
from sao.models.critic import CriticModel, load_critic
from sao.models.forward import token_logprobs, token_values
from sao.models.freezing import ATTENTION_MARKER, FreezeReport, FreezeRule, apply_freeze, trainable_parameters
from sao.models.loading import load_policy, load_tokenizer, model_from_config, resolve_device, resolve_dtype
from sao.models.moe_names import checkpoint_names, fuse_experts, unfuse_experts
from sao.models.tiny import (
    TINY_ARCHS,
    TINY_SIZES,
    build_tiny_model,
    count_parameters,
    tiny_checkpoint,
    tiny_config,
)
from sao.models.tokenizer import build_tokenizer, padded_vocab_size

__all__ = [
    "ATTENTION_MARKER",
    "PACKED_ATTENTION",
    "TINY_ARCHS",
    "TINY_SIZES",
    "CriticModel",
    "FreezeReport",
    "FreezeRule",
    "apply_freeze",
    "build_tiny_model",
    "build_tokenizer",
    "checkpoint_names",
    "count_parameters",
    "enable_packed_attention",
    "fuse_experts",
    "load_critic",
    "load_policy",
    "load_tokenizer",
    "model_from_config",
    "packed_attention_kwargs",
    "packed_context",
    "padded_vocab_size",
    "resolve_device",
    "resolve_dtype",
    "tiny_checkpoint",
    "tiny_config",
    "token_logprobs",
    "token_values",
    "trainable_parameters",
    "unfuse_experts",
]
