"""The policy backbone and the critic: `ModelConfig`, `CriticConfig`, `ValuePretrainConfig`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from .section import Section

__all__ = ["CriticConfig", "ModelConfig", "ValuePretrainConfig"]


class ModelConfig(Section):
    """The policy backbone (the critic shares it): a local HF checkpoint or a tiny random model; its tokenizer
    and chat template; how the trainer holds and computes it (docs/models.md)."""

    path: str | None = Field(
        None, description="Local Hugging Face checkpoint directory. Exclusive with tiny_arch."
    )
    tiny_arch: Literal["qwen3_moe", "qwen3"] | None = Field(
        None,
        description="Build a tiny randomly initialised model of this architecture instead of loading one.",
    )
    tiny_size: Literal["test", "small"] = Field(
        "test", description="Tiny model size: 'test' (unit tests) or 'small' (CPU quickstart)."
    )
    tiny_tokenizer: Literal["byte", "bpe"] = Field(
        "byte",
        description="Tokenizer of a tiny model: 'byte' (256 byte tokens, no merges) or 'bpe' (byte-level BPE "
        "with ~4k tokens, trained locally on sao's env text). Only with tiny_arch.",
    )
    chat_template: str | None = Field(
        None,
        description="Chat template override: a .jinja file, or a template shipped with sao ('qwen3', "
        "'hermes', 'qwen3_coder', 'sao'); used for every rendering (episodes, gateway, evaluation). null: "
        "the checkpoint's.",
    )
    enable_thinking: bool | None = Field(
        None,
        description="Passed to the chat template as enable_thinking (Qwen3: false adds an empty think block "
        "to each generation prompt); null passes nothing.",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="Compute dtype of the trainer's forward and backward; 'auto' = bfloat16 on GPU, float32 "
        "on CPU. float16 is refused (it needs loss scaling, which sao does not do).",
    )
    master_dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="Dtype of the trainer's weights, gradients, gradient reduction and AdamW state "
        "(float32: master weights; bfloat16: pure bf16, where small updates round away).",
    )
    attn_implementation: Literal["sdpa", "flash_attention_2", "eager"] = Field(
        "sdpa",
        description="Attention kernel of the trainer's packed forward (per trajectory): 'sdpa' (torch's "
        "scaled_dot_product_attention), 'flash_attention_2' (needs the flash_attn package), 'eager'.",
    )
    gradient_checkpointing: bool | None = Field(
        None,
        description="Activation checkpointing per decoder layer (actor and critic); null = on when the "
        "trainer runs on CUDA, off on CPU.",
    )
    device: str = Field(
        "auto", description="'auto' (cuda if available, else cpu), 'cpu', 'cuda' or 'cuda:N'."
    )
    rope_scaling: dict[str, Any] | None = Field(
        None,
        description="RoPE scaling as Hugging Face's rope_scaling dict, e.g. {rope_type: yarn, factor: 4.0, "
        "original_max_position_embeddings: 32768}; merged into the checkpoint's rope parameters (keeping its "
        "rope_theta) in one derived checkpoint that the trainer, the local engine and launched vLLM / SGLang "
        "servers all load (servers also get it as --hf-overrides / --json-model-override-args). null: the "
        "checkpoint's own.",
    )

    @field_validator("rope_scaling")
    @classmethod
    def _rope_scaling_names_a_type(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and not isinstance(value.get("rope_type", value.get("type")), str):
            raise ValueError("model.rope_scaling needs a rope_type, e.g. {rope_type: yarn, factor: 4.0, ...}")
        return value

    @model_validator(mode="after")
    def _exactly_one_source(self) -> ModelConfig:
        if (self.path is None) == (self.tiny_arch is None):
            raise ValueError("set exactly one of model.path and model.tiny_arch")
        if self.tiny_arch is None and self.tiny_tokenizer != "byte":
            raise ValueError("model.tiny_tokenizer applies to tiny models (model.tiny_arch), not model.path")
        if self.dtype == "float16":
            raise ValueError(
                "model.dtype=float16: half-precision training needs loss scaling, which sao does not do; "
                "use bfloat16 (engine.dtype may be float16)"
            )
        return self


class ValuePretrainConfig(Section):
    """Critic pretraining on Monte-Carlo returns of the frozen initial policy (docs/models.md)."""

    enabled: bool | None = Field(
        None, description="Pretrain the critic before RL; null follows the preset (algo.value_pretrain)."
    )
    corpus_size: int = Field(1024, ge=1, description="Trajectories sampled from the initial policy.")
    max_steps: int = Field(200, ge=1, description="Upper bound on critic optimizer steps.")
    ev_patience: int = Field(
        10, ge=1, description="Stop after this many held-out evaluations (one every 5 steps) without EV gain."
    )
    ev_min_delta: float = Field(0.01, ge=0, description="Explained-variance gain that counts as improvement.")


class CriticConfig(Section):
    """The learned value model V_phi: same backbone as the policy plus a scalar head (docs/models.md)."""

    freeze: Literal["attention", "none"] | list[str] = Field(
        "attention",
        description="Critic parameters frozen during RL: 'attention' (q/k/v/o projections and q/k norms), "
        "'none' (full-parameter critic), or a list of regular expressions matched against parameter names.",
    )
    lr: float = Field(5e-6, gt=0, description="Critic learning rate (paper: 5e-6 on a 30B MoE model).")
    lr_warmup_steps: int = Field(
        0,
        ge=0,
        description="Linear critic lr warm-up; one reading of the paper's '10-step warmup' (our reading).",
    )
    warmup_steps: int = Field(
        0,
        ge=0,
        description="Critic-only steps before the actor trains; the other reading of the '10-step warmup' "
        "(our reading).",
    )
    value_clip: float | None = Field(
        None, gt=0, description="PPO-style value clipping range; null = unclipped masked MSE (our reading)."
    )
    recompute_values: bool = Field(
        True, description="Recompute V with the updated critic before the policy advantages (our reading)."
    )
    grad_clip: float = Field(1.0, gt=0, description="Critic gradient-norm clip.")
    head_init: Literal["zero", "normal"] = Field("zero", description="Value head initialisation.")
    pretrain: ValuePretrainConfig = Field(
        default_factory=ValuePretrainConfig, description="Value pretraining."
    )
