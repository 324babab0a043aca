"""Typed run configuration: one pydantic model per section, and `RunConfig` holding them all.

`sao.config.loading` builds and validates a `RunConfig`. Fields marked "our reading" are choices we make where
the paper is silent (docs/config.md); each is an option so it can be ablated.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DEFAULT_PRESET = "sao"
CRITIC_ADVANTAGES = ("skip_observation_gae", "token_gae", "step_gae")


class ConfigError(ValueError):
    """A config that cannot be loaded; the message names the offending dotted key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    def changed(self) -> list[str]:
        """Names of the fields whose value differs from the default (a dumped config sets them all)."""
        return [name for name, info in type(self).model_fields.items() if getattr(self, name) != info.default]


class ModelConfig(_Section):
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
        "'hermes', 'sao'); used for every rendering (episodes, gateway, evaluation). null: the checkpoint's.",
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


class ValuePretrainConfig(_Section):
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


class CriticConfig(_Section):
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


class EngineConfig(_Section):
    """Rollout generation (the paper evaluates at temperature 1.0, top-p 1.0)."""

    backend: Literal["local", "process", "vllm", "sglang"] = Field(
        "local",
        description="Inference engine: 'local' in the trainer's process (a thread), 'process' the same "
        "engine in a child process of its own (no shared interpreter lock), 'vllm'/'sglang' servers "
        "(launched on the run's model, or engine.attach).",
    )
    threads: int | None = Field(
        None,
        ge=1,
        description="backend=local/process, local runtime: intra-op torch threads of the engine (its loop "
        "thread, or its process); null: half the cores this process may use, at least 1 (torch's own "
        "setting when OMP_NUM_THREADS is set). Logged as runtime/engine_threads.",
    )
    temperature: float = Field(1.0, ge=0, description="Sampling temperature; DIS ratios are exact at 1.0.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    top_k: int = Field(-1, ge=-1, description="Top-k sampling; -1 disables.")
    max_new_tokens: int = Field(2048, ge=1, description="Tokens generated per model turn.")
    max_concurrent: int = Field(64, ge=1, description="Sequences the engine decodes at once.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="Dtype of the engine's weights (independent of the trainer's; weights are cast inside "
        "each push); 'auto' = bfloat16 on GPU, float32 on CPU.",
    )
    python: str | None = Field(
        None,
        description="backend=vllm/sglang: python of the virtualenv with the server "
        "(null: $SAO_VLLM_PYTHON / $SAO_SGLANG_PYTHON, else this one).",
    )
    attach: str | None = Field(
        None,
        description="backend=vllm/sglang: URL of a running server to use instead of launching one; it must "
        "read this machine's files (weights are handed over as directories).",
    )
    server_args: list[str] = Field(
        default_factory=list, description="backend=vllm/sglang: extra command-line arguments of the server."
    )
    max_restarts: int = Field(
        3,
        ge=0,
        description="Restarts of an engine process or server that died, with no trained step in between, "
        "before the run stops with a checkpoint (episodes lost in a crash are dropped as engine_crash).",
    )
    enforce_eager: bool | None = Field(
        None,
        description="backend=vllm/sglang: run the server without CUDA graphs (vLLM --enforce-eager, SGLang "
        "--disable-cuda-graph); null: on when the server has no GPU (runtime.backend=ray with "
        "cluster.engine_gpus=0, or the local runtime with model.device resolving to cpu), off on GPU.",
    )
    max_model_len: int | None = Field(
        None,
        ge=1,
        description="backend=vllm/sglang: the server's context limit in tokens (vLLM --max-model-len, SGLang "
        "--context-length); null: data.max_total_tokens. A server whose limit is below data.max_total_tokens "
        "is refused at start.",
    )
    gpu_memory_fraction: float | None = Field(
        None,
        gt=0,
        le=1,
        description="backend=vllm/sglang: share of the GPU's memory the server may use, weights and KV cache "
        "(vLLM --gpu-memory-utilization, SGLang --mem-fraction-static); null: the server's default.",
    )
    prefix_cache_tokens: int | None = Field(
        None,
        ge=0,
        description="backend=local/process (and Ray LocalEngine replicas): KV positions each engine keeps "
        "for the later turns of episodes (a finished turn's KV, taken by the next turn, which then prefills "
        "only its new tokens); least recently kept evicted first; null: the engine's KV budget (65536).",
    )
    prefix_caching: bool = Field(
        True,
        description="Reuse an episode's earlier turns' KV. local/process: LocalEngine keeps it "
        "(engine.prefix_cache_tokens). backend=vllm/sglang: the server's prefix cache (vLLM automatic "
        "prefix caching, SGLang radix cache), reused across an episode's turns; requests are salted with "
        "the weight version, so a request never reads KV computed by older weights than those it started "
        "under. false: nothing kept (servers: --no-enable-prefix-caching / --disable-radix-cache).",
    )

    @model_validator(mode="after")
    def _backend_options(self) -> EngineConfig:
        if self.threads is not None and self.backend not in ("local", "process"):
            raise ValueError(
                f"engine.threads applies to backends 'local' and 'process', not {self.backend!r}"
            )
        server = ("python", "attach", "server_args")
        if self.backend not in ("vllm", "sglang") and any(getattr(self, k) for k in server):
            name = next(k for k in server if getattr(self, k))
            raise ValueError(f"engine.{name} applies to backends 'vllm' and 'sglang', not {self.backend!r}")
        if self.attach and (self.python or self.server_args):
            raise ValueError("engine.attach uses a running server: engine.python and server_args are unused")
        if self.prefix_cache_tokens is not None and self.backend not in ("local", "process"):
            raise ValueError(
                f"engine.prefix_cache_tokens applies to backends 'local' and 'process' (LocalEngine), not "
                f"{self.backend!r}; a server sizes its own prefix cache"
            )
        if self.prefix_cache_tokens and not self.prefix_caching:
            raise ValueError("engine.prefix_cache_tokens is set but engine.prefix_caching is false")
        launch = [
            k
            for k in SERVER_LAUNCH_FLAGS
            if k != "prefix_caching" and getattr(self, k) != type(self).model_fields[k].default
        ]
        if launch and self.backend not in ("vllm", "sglang"):
            raise ValueError(
                f"engine.{launch[0]} applies to backends 'vllm' and 'sglang', not {self.backend!r}"
            )
        if launch and self.attach:
            raise ValueError(
                f"engine.{launch[0]} sets how sao launches a server; engine.attach uses a running one"
            )
        if self.backend in ("vllm", "sglang"):
            for key in SERVER_LAUNCH_FLAGS:
                given = server_flag_given(self.server_args, SERVER_LAUNCH_FLAGS[key][self.backend])
                explicit = key == "prefix_caching" or getattr(self, key) is not None
                if given and explicit:
                    raise ValueError(
                        f"engine.{key} and engine.server_args both set the server's {given}: set it in "
                        f"engine.{key} only"
                    )
        return self


# The server flags each launch key of `EngineConfig` sets, per backend (the config refuses a key given both
# ways; tests/engine/test_launch_config.py checks the command builders emit exactly these flags).
SERVER_LAUNCH_FLAGS: dict[str, dict[str, tuple[str, ...]]] = {
    "enforce_eager": {"vllm": ("--enforce-eager", "--no-enforce-eager"), "sglang": ("--disable-cuda-graph",)},
    "max_model_len": {"vllm": ("--max-model-len",), "sglang": ("--context-length",)},
    "gpu_memory_fraction": {"vllm": ("--gpu-memory-utilization",), "sglang": ("--mem-fraction-static",)},
    "prefix_caching": {
        "vllm": ("--enable-prefix-caching", "--no-enable-prefix-caching"),
        "sglang": ("--disable-radix-cache",),
    },
}
# Set from cluster.engine_gpus and model.rope_scaling (cross-section: `RunConfig`).
SERVER_TP_FLAGS = {"vllm": ("--tensor-parallel-size", "-tp"), "sglang": ("--tp-size", "--tp")}
SERVER_OVERRIDE_FLAGS = {"vllm": ("--hf-overrides",), "sglang": ("--json-model-override-args",)}


def server_flag_given(server_args: list[str] | tuple[str, ...], flags: tuple[str, ...]) -> str | None:
    """The first of ``flags`` that ``server_args`` sets (``--flag value`` or ``--flag=value``), else None."""
    for arg in server_args:
        name = arg.split("=", 1)[0]
        if name in flags:
            return name
    return None


class DataConfig(_Section):
    """Prompts and the environment they are played in."""

    source: Literal["env", "gateway", "both"] = Field(
        "env",
        description="Where episodes come from: 'env' the built-in producer playing data.env; 'gateway' "
        "external agents through the run's OpenAI-compatible server (the gateway section); 'both' at once.",
    )
    env: str = Field("calculator", description="Registered environment name.")
    env_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of the env constructor, e.g. {turns: episode}."
    )
    train_file: str | None = Field(
        None, description="Training prompts (JSONL); null = the env's built-in set."
    )
    eval_file: str | list[str] | None = Field(
        None,
        description="Held-out task files (JSONL) evaluated during training every logging.eval_every steps "
        "and at the end, played in data.env; null = no evaluation.",
    )
    id_field: str = Field("id", description="Task file column with the task id (missing: '<file>-<row>').")
    prompt_field: str = Field("prompt", description="Task file column with the prompt (text or messages).")
    answer_field: str = Field("answer", description="Task file column with the reference answer.")
    tests_field: str = Field("tests", description="Task file column with the hidden tests.")
    max_turns: int = Field(50, ge=1, description="Model turns per episode (paper: math 50, coding 300).")
    max_total_tokens: int = Field(
        16384, ge=1, description="Context budget of a trajectory: prompt + all turns."
    )
    env_timeout_s: float | None = Field(
        600.0,
        gt=0,
        description="Seconds each env call (reset, step, close) may take; past it the episode is dropped "
        "as env_timeout. null: wait forever.",
    )
    seed: int = Field(0, description="Prompt sampling seed.")


class GatewayConfig(_Section):
    """The run's OpenAI-compatible server for external agents (data.source gateway/both; docs/gateway.md)."""

    host: str = Field("127.0.0.1", description="Interface the server binds.")
    port: int = Field(
        8000, ge=0, le=65535, description="TCP port; 0 picks a free one (the URL is in RUN_DIR/gateway.json)."
    )
    admission: Literal["wait", "reject"] = Field(
        "wait",
        description="A new session over the staleness capacity: 'wait' holds its first request until a "
        "trained batch frees room (up to admission_timeout_s, then 429); 'reject' answers 429 at once.",
    )
    admission_timeout_s: float = Field(
        300.0, gt=0, description="admission=wait: longest wait of a new session's first request before 429."
    )
    max_sessions: int = Field(4096, ge=1, description="Open sessions at most; a new one beyond gets 429.")
    session_idle_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="Seconds without a request after which an unrewarded session is closed as abandoned "
        "(counted as dropped, never trained).",
    )
    max_body_bytes: int = Field(8 * 2**20, ge=1, description="Request body limit in bytes (413 beyond).")
    max_pending: int = Field(
        256, ge=1, description="Generation requests in flight at once; the next gets 503 with Retry-After."
    )
    retry_after_s: int = Field(1, ge=0, description="Retry-After seconds of 429 and 503 answers.")


class AlgoConfig(_Section):
    """The RL algorithm: advantage estimator, policy loss, critic schedule, sampling (docs/algorithms.md).

    Defaults are the `sao` preset. The algorithm library reads these field names.
    """

    preset: str = Field(DEFAULT_PRESET, description="Preset this config started from (see `sao presets`).")
    advantage: Literal["skip_observation_gae", "token_gae", "step_gae", "grpo", "running_mean", "spo"] = (
        Field("skip_observation_gae", description="Advantage estimator.")
    )
    step_value: Literal["average", "last_token"] = Field(
        "average",
        description="step_gae only: step value = mean of its token values, or its last token's value.",
    )
    policy_loss: Literal["dis", "ppo_clip"] = Field(
        "dis", description="'dis': band mask on the ratio to rollout log-probs; 'ppo_clip': clip vs pi_old."
    )
    eps_low: float = Field(
        0.3, gt=0, lt=1, description="Lower band edge 1 - eps_low (paper: math 0.3, coding 0.8; PPO 0.2)."
    )
    eps_high: float = Field(
        5.0, gt=0, description="Upper band edge 1 + eps_high (paper: math 5.0, coding 3.0; PPO 0.28)."
    )
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"] = Field(
        "token-mean",
        description="Loss aggregation; token-mean keeps band-masked tokens in the denominator (our reading).",
    )
    nll_coef: float = Field(0.0, ge=0, description="VAPO positive-example NLL loss weight.")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount (our reading: 1.0).")
    lam_critic: float = Field(1.0, ge=0, le=1, description="GAE lambda for critic targets (1 = MC returns).")
    lam_policy: float | Literal["adaptive"] = Field(
        "adaptive", description="GAE lambda for policy advantages; 'adaptive' = clamp(1 - 1/(alpha*l), 0, 1)."
    )
    adaptive_alpha: float = Field(1.5, gt=0, description="alpha of the length-adaptive lambda.")
    adaptive_length: Literal["action", "response"] = Field(
        "action",
        description="l of the adaptive lambda: action tokens of the trajectory (our reading) or the whole "
        "response incl. observations; step_gae counts steps.",
    )
    k_critic: int = Field(2, ge=1, description="Critic optimizer steps per actor step, targets fixed (K).")
    group_size: int = Field(1, ge=1, description="Rollouts per prompt (1 = single rollout).")
    normalize_std: bool = Field(True, description="grpo: divide the group-centred reward by the group std.")
    running_mean_window: int = Field(8, ge=1, description="running_mean: number of recent rewards averaged.")
    running_mean_scope: Literal["prompt", "global"] = Field(
        "prompt", description="running_mean: rewards of the same prompt, or of all prompts."
    )
    spo_d_half: float = Field(
        0.06, gt=0, description="spo: D_half of rho = clamp(2^(-D/D_half), rho_min, rho_max)."
    )
    spo_rho_min: float = Field(0.875, gt=0, le=1, description="spo: lower clamp of the tracker decay rho.")
    spo_rho_max: float = Field(0.96, gt=0, le=1, description="spo: upper clamp of the tracker decay rho.")
    spo_sampling_floor: float = Field(
        0.05, ge=0, description="spo: prioritised sampling weight sqrt(p(1-p)) + floor."
    )
    spo_prioritized_sampling: bool = Field(True, description="spo: sample prompts by the weight above.")
    value_pretrain: bool = Field(True, description="Whether this algorithm pretrains the critic before RL.")
    truncation: Literal["terminal", "bootstrap"] = Field(
        "terminal",
        description="A trajectory cut by the token or turn budget: 'terminal' scores it as the env did "
        "(next value 0 after its last action token; our reading), 'bootstrap' takes the critic's value at "
        "its last action token as the next value (GAE-family advantages).",
    )

    @property
    def uses_critic(self) -> bool:
        """True for the GAE-family advantages, which need a learned value model."""
        return self.advantage in CRITIC_ADVANTAGES

    @property
    def needs_old_logprobs(self) -> bool:
        """True when the loss needs pi_old log-probs (an extra forward before the update)."""
        return self.policy_loss == "ppo_clip"

    @field_validator("lam_policy")
    @classmethod
    def _lam_in_unit_interval(cls, value: float | str) -> float | str:
        if not isinstance(value, str) and not 0.0 <= value <= 1.0:
            raise ValueError("must be 'adaptive' or a number in [0, 1]")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> AlgoConfig:
        if self.advantage == "grpo" and self.group_size < 2:
            raise ValueError(
                f"algo.group_size must be >= 2 for algo.advantage='grpo' (got {self.group_size}): "
                "the baseline is the mean of the group"
            )
        if self.spo_rho_min > self.spo_rho_max:
            raise ValueError("algo.spo_rho_min must be <= algo.spo_rho_max")
        return self


class TrainerConfig(_Section):
    """The actor optimizer and the step budget."""

    lr: float = Field(1e-6, gt=0, description="Actor learning rate (paper: 1e-6 on a 30B MoE model).")
    batch_size: int = Field(128, ge=1, description="Trajectories per actor step.")
    micro_batch_tokens: int = Field(
        16384, ge=1, description="Packed tokens per forward/backward micro-batch."
    )
    grad_clip: float = Field(1.0, gt=0, description="Actor gradient-norm clip.")
    gradient_sync: Literal["step", "micro_batch"] = Field(
        "step",
        description="FSDP ranks: reduce-scatter gradients once per step ('step': a rank holds an unsharded "
        "float32 gradient, 4 bytes per parameter, between its micro-batches) or after every micro-batch "
        "('micro_batch': more communication, only sharded gradients held; for models whose full gradient "
        "does not fit beside the shards). One process: no difference.",
    )
    max_consecutive_skips: int = Field(
        10,
        ge=1,
        description="Actor steps in a row that may be skipped for a non-finite loss or gradient norm; one "
        "more stops training (TrainingDiverged).",
    )
    total_steps: int = Field(500, ge=1, description="Actor optimizer steps.")
    lr_schedule: Literal["constant", "cosine", "linear"] = Field("constant", description="Actor lr schedule.")
    warmup_steps: int = Field(0, ge=0, description="Linear actor lr warm-up steps.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    seed: int = Field(0, description="Training seed (torch, sampling).")
    threads: int | None = Field(
        None,
        ge=1,
        description="Local runtime: intra-op torch threads of the trainer (the thread its steps run in); "
        "null: half the cores this process may use, at least 1 (torch's own setting when OMP_NUM_THREADS "
        "is set). Logged as trainer/threads. runtime.backend=ray: cluster.trainer_cpus sets them.",
    )


class PushCheckConfig(_Section):
    """After every weight push, each engine replica and the trainer score one fixed probe sequence
    (teacher-forced log-probs, temperature 1) and are compared (docs/engine.md, push verification)."""

    action: Literal["error", "warn", "none"] = Field(
        "error",
        description="A replica whose mean |Δ log-prob| on the probe exceeds the threshold: 'error' stops the "
        "run with a checkpoint, naming the replica and the version; 'warn' logs it and trains on; 'none': no "
        "probe.",
    )
    threshold: float = Field(
        0.5,
        gt=0,
        description="Mean |log p_engine − log p_trainer| over the probe's tokens (nats) above which a push "
        "failed. Same weights give ~1e-6 in fp32 and ~1e-2–1e-1 for a bf16 engine against an fp32 trainer; "
        "wrong, partial or scrambled weights give >= 1.",
    )
    probe_tokens: int = Field(128, ge=2, le=8192, description="Length of the probe sequence in tokens.")
    probe: Literal["vocab", "prompt"] = Field(
        "vocab",
        description="'vocab': token ids drawn from the tokenizer's vocabulary (special tokens excluded) with "
        "trainer.seed; 'prompt': the first training task's rendered prompt, cut to probe_tokens.",
    )


class MismatchDriftConfig(_Section):
    """An alarm when the per-step lag-0 mismatch between the engine's log-probs and the trainer's grows over
    the run (docs/engine.md, mismatch metrics)."""

    action: Literal["warn", "error", "none"] = Field(
        "warn",
        description="When the alarm fires: 'warn' logs it once (again only after it cleared); 'error' stops "
        "the run with a checkpoint; 'none': no alarm (the metrics are logged either way).",
    )
    window: int = Field(
        20, ge=1, description="Steps (with lag-0 tokens) in the early-run and in the recent mean."
    )
    factor: float = Field(
        2.0, ge=1, description="The alarm fires when the recent mean exceeds factor x the early-run mean."
    )
    min_abs_diff: float = Field(
        0.01,
        ge=0,
        description="...and exceeds this mean |Δ log-prob| (nats): a mismatch below it moves token ratios by "
        "about 1 % on average, well inside the DIS band, whatever its growth.",
    )


class RuntimeConfig(_Section):
    """How producer and trainer are wired."""

    mode: Literal["async", "sync"] = Field(
        "async", description="'async': train on trajectories as they finish; 'sync': generate then train."
    )
    max_in_flight: int = Field(256, ge=1, description="Episodes being generated at once.")
    max_staleness: int = Field(
        1, ge=0, description="Max policy versions a new episode may start behind the trainer (admission)."
    )
    drop_older_than: int | None = Field(
        None, ge=0, description="Drop trajectories with tokens more than this many versions old; null = keep."
    )
    max_consecutive_drops: int | None = Field(
        1000,
        ge=1,
        description="Episodes in a row that yield no trajectory (env or engine failures) before the run "
        "stops with a checkpoint: a broken env or grader ends the run instead of spinning; null = never.",
    )
    backend: Literal["local", "ray"] = Field(
        "local",
        description="'local': one process; 'ray': engine replicas and FSDP2 trainer ranks as Ray actors "
        "(the cluster section), with the same run loop in the driver.",
    )
    weight_sync: Literal["auto", "inproc", "object_store", "broadcast", "disk", "vllm", "sglang"] = Field(
        "auto",
        description="How new weights reach the engines: 'inproc' (local runtime), 'object_store' (Ray's, "
        "small models), 'broadcast' (a process group of trainer rank 0 and the engine replicas, gloo/NCCL), "
        "'disk' (a safetensors directory the engines reload), 'vllm' / 'sglang' (trainer rank 0 into the "
        "servers' own NCCL weight-transfer group, bucketed; needs engine.backend to match and GPUs on both "
        "sides). 'auto': inproc for local; for ray broadcast with LocalEngine replicas, the servers' native "
        "transfer with vLLM / SGLang replicas when cluster.engine_gpus and cluster.trainer_gpus are > 0, "
        "else disk.",
    )
    weight_bucket_mb: int = Field(
        512,
        ge=1,
        description="Bucket size (MiB) of pushes over a process group ('broadcast', 'vllm', 'sglang'): the "
        "tensors travel packed in flat buffers of about this size, one broadcast each ('vllm': vLLM's packed "
        "chunks, this size plus at most one tensor; 'sglang': one update request per bucket). Costs one "
        "bucket of memory on the trainer's device and on each receiver's.",
    )
    weight_sync_timeout_s: float = Field(
        900.0,
        gt=0,
        description="Deadline of one weight push (and of its probe), whatever the path: a push still running "
        "then stops the run with a checkpoint, naming the path, the replicas that did not confirm and the "
        "version. The broadcast path falls back to the object store within it.",
    )
    push_check: PushCheckConfig = Field(default_factory=PushCheckConfig, description="Push verification.")
    mismatch_drift: MismatchDriftConfig = Field(
        default_factory=MismatchDriftConfig, description="The lag-0 mismatch drift alarm."
    )

    @model_validator(mode="after")
    def _sync_fits_backend(self) -> RuntimeConfig:
        if self.backend == "local" and self.weight_sync not in ("auto", "inproc"):
            raise ValueError(
                f"runtime.weight_sync={self.weight_sync!r} applies to runtime.backend='ray'; the local "
                "runtime hands the weights over in process ('inproc')"
            )
        if self.backend == "ray" and self.weight_sync == "inproc":
            raise ValueError("runtime.weight_sync='inproc' needs runtime.backend='local'")
        bucket_unused = self.backend == "local" or self.weight_sync in ("object_store", "disk")
        if bucket_unused and self.weight_bucket_mb != type(self).model_fields["weight_bucket_mb"].default:
            raise ValueError(
                "runtime.weight_bucket_mb applies to pushes over a process group (runtime.backend='ray', "
                f"runtime.weight_sync 'broadcast', 'vllm' or 'sglang'), not to {self.weight_sync!r} on "
                f"{self.backend!r}"
            )
        return self

    def resolved_weight_sync(self, engine_backend: str = "local", cluster: Any = None) -> str:
        """``weight_sync`` with 'auto' resolved (`weight_sync_path`); ``cluster``: the `ClusterConfig` whose
        GPUs decide between the servers' native transfer and disk (None: as if no GPUs)."""
        if cluster is None:
            return weight_sync_path(self.weight_sync, self.backend, engine_backend)
        gpus = {"engine_gpus": cluster.engine_gpus, "trainer_gpus": cluster.trainer_gpus}
        return weight_sync_path(self.weight_sync, self.backend, engine_backend, **gpus)


def weight_sync_path(
    setting: str, runtime_backend: str, engine_backend: str, *, engine_gpus: float = 0.0,
    trainer_gpus: float = 0.0,
) -> str:  # fmt: skip
    """``runtime.weight_sync`` with 'auto' resolved: inproc (local runtime); for ray, broadcast with
    LocalEngine replicas, with vLLM / SGLang server replicas their native NCCL transfer ('vllm' /
    'sglang') when both the replicas (``engine_gpus``) and the trainer ranks (``trainer_gpus``) have GPUs,
    else disk."""
    if setting != "auto":
        return setting
    if runtime_backend == "local":
        return "inproc"
    if engine_backend not in ("vllm", "sglang"):
        return "broadcast"
    return engine_backend if engine_gpus > 0 and trainer_gpus > 0 else "disk"


class ClusterConfig(_Section):
    """Where the distributed runtime (``runtime.backend=ray``) places its actors (docs/distributed.md)."""

    address: str | None = Field(
        None,
        description="Ray cluster to join ('auto', 'host:port' of `ray start --head`); null: start a "
        "private one on this machine, bound to 127.0.0.1, shut down at the end of the run.",
    )
    num_cpus: float | None = Field(
        None,
        gt=0,
        description="Local start only: logical CPUs of the started cluster (null: this machine's).",
    )
    num_gpus: int | None = Field(
        None, ge=0, description="Local start only: GPUs of the started cluster (null: those Ray detects)."
    )
    auth: Literal["disabled", "token"] = Field(
        "disabled",
        description="Local start only: Ray's token authentication; 'disabled' is set explicitly (the "
        "cluster listens on 127.0.0.1 only), 'token' leaves Ray's token auth on.",
    )
    temp_dir: str | None = Field(
        None, description="Local start only: Ray's session directory (null: a fresh one under /tmp)."
    )
    trainer_workers: int = Field(1, ge=1, description="Trainer ranks (one FSDP2 world).")
    trainer_cpus: float = Field(1.0, gt=0, description="CPUs per trainer rank (its torch threads).")
    trainer_gpus: float = Field(0.0, ge=0, description="GPUs per trainer rank (0: train on CPU, gloo).")
    engine_replicas: int = Field(1, ge=1, description="Rollout engine replicas.")
    engine_cpus: float = Field(1.0, gt=0, description="CPUs per engine replica (its torch threads).")
    engine_gpus: float = Field(0.0, ge=0, description="GPUs per engine replica.")
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="Ray placement-group strategy of the trainer and engine bundles."
    )
    start_timeout_s: float = Field(
        300.0, gt=0, description="Seconds to wait for the actors' resources and their start-up."
    )

    def requested(self) -> dict[str, float]:
        """Resources the actors ask for in total: ``{"CPU": …, "GPU": …}``."""
        return {
            "CPU": self.trainer_workers * self.trainer_cpus + self.engine_replicas * self.engine_cpus,
            "GPU": self.trainer_workers * self.trainer_gpus + self.engine_replicas * self.engine_gpus,
        }


def check_cluster_resources(cluster: ClusterConfig, available: Mapping[str, float]) -> None:
    """Raise `ConfigError` naming the key when the actors ask for more ``CPU``/``GPU`` than ``available``."""
    for kind, need in cluster.requested().items():
        have = float(available.get(kind, 0.0))
        if need > have + 1e-9:
            lower = kind.lower()
            raise ConfigError(
                f"cluster.trainer_{lower}s / cluster.engine_{lower}s: the run asks for {need:g} {kind} "
                f"(trainer_workers={cluster.trainer_workers} x {getattr(cluster, f'trainer_{lower}s'):g} + "
                f"engine_replicas={cluster.engine_replicas} x {getattr(cluster, f'engine_{lower}s'):g}) but "
                f"the cluster has {have:g}"
                + (
                    " (a cluster sao starts has cluster.num_cpus logical CPUs: raise it to share cores)"
                    if kind == "CPU"
                    else ""
                )
            )


class EvalConfig(_Section):
    """Evaluation during training on ``data.eval_file``: Pass@1 over ``k`` samples per task."""

    k: int = Field(4, ge=1, description="Samples per eval task (Pass@1 is their mean; pass@k is logged too).")
    temperature: float = Field(1.0, ge=0, description="Eval sampling temperature (paper: 1.0).")
    top_p: float = Field(1.0, gt=0, le=1, description="Eval nucleus sampling mass (paper: 1.0).")
    concurrency: int = Field(32, ge=1, description="Eval episodes generating at once, beside training.")
    limit: int | None = Field(None, ge=1, description="Evaluate only the first N tasks of each file.")
    seed: int = Field(0, description="Eval sampling seed (each sample's seed derives from it).")
    at_start: bool = Field(
        True, description="Also evaluate the initial weights (step 0) of a fresh run, beside the first steps."
    )


class LoggingConfig(_Section):
    """Where metrics and checkpoints go."""

    run_dir: str = Field(
        "runs/sao", description="Directory for metrics, checkpoints and the resolved config."
    )
    tensorboard: bool = Field(True, description="Write TensorBoard event files.")
    wandb: bool = Field(False, description="Log to Weights & Biases.")
    log_every: int = Field(1, ge=1, description="Log metrics every N actor steps.")
    checkpoint_every: int = Field(50, ge=1, description="Checkpoint every N actor steps.")
    eval_every: int | None = Field(
        None,
        ge=1,
        description="Evaluate on data.eval_file every N steps (and at the end); null = at the end.",
    )
    keep_checkpoints: int = Field(3, ge=1, description="Most recent checkpoints kept.")
    episodes: bool = Field(
        False,
        description="Append one line per trained trajectory (tokens and timings per turn, lag) to "
        "RUN_DIR/episodes.jsonl: the empirical workload of `sao plan --workload`.",
    )
    timeline_every_s: float | None = Field(
        None,
        gt=0,
        description="Every this many seconds, append episodes in flight, queue size and the engine's "
        "counters to RUN_DIR/timeline.jsonl (occupancy plots, `sao plan --calibrate`); null = off.",
    )
    inspect_every: int | None = Field(
        None,
        ge=1,
        description="Every N steps, keep inspect_samples of the step's trajectories with what the trainer "
        "computed per token (log-probs, DIS ratio and band, values, advantages, returns) in "
        "RUN_DIR/inspect/ for `sao inspect`; null = off.",
    )
    inspect_samples: int = Field(
        8, ge=1, description="Trajectories kept per inspected step (a seeded random choice from its batch)."
    )
    inspect_max_mb: float = Field(
        256.0,
        gt=0,
        description="Disk bound of RUN_DIR/inspect/ in MiB: past it, kept steps are deleted (never the first "
        "or the newest; each time the one leaving the smallest gap), so the kept steps stay spread over the "
        "run.",
    )


def value_pretrain_enabled(algo: AlgoConfig, critic: CriticConfig) -> bool:
    """Whether to pretrain the critic: critic.pretrain.enabled if set, else the preset's choice
    (``algo.value_pretrain``); never without a critic."""
    if not algo.uses_critic:
        return False
    enabled = critic.pretrain.enabled
    return algo.value_pretrain if enabled is None else enabled


class RunConfig(_Section):
    """A whole run: every section plus a name."""

    name: str = Field("sao", description="Run name.")
    model: ModelConfig = Field(..., description="Policy (and critic) backbone.")
    critic: CriticConfig = Field(default_factory=CriticConfig, description="Value model.")
    engine: EngineConfig = Field(default_factory=EngineConfig, description="Rollout generation.")
    data: DataConfig = Field(default_factory=DataConfig, description="Prompts and environment.")
    gateway: GatewayConfig = Field(
        default_factory=GatewayConfig, description="The server of external agents (data.source gateway/both)."
    )
    algo: AlgoConfig = Field(default_factory=AlgoConfig, description="RL algorithm.")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="Actor optimization.")
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig, description="Async/sync wiring.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Evaluation during training.")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Metrics and checkpoints.")
    cluster: ClusterConfig = Field(
        default_factory=ClusterConfig, description="Actor placement of the distributed runtime."
    )

    @model_validator(mode="before")
    @classmethod
    def _model_section_present(cls, data: Any) -> Any:
        # An absent model section gets ModelConfig's own message ("set exactly one of ..."), not "required".
        if isinstance(data, Mapping) and "model" not in data:
            return {**data, "model": {}}
        return data

    @model_validator(mode="after")
    def _batch_holds_whole_groups(self) -> RunConfig:
        if self.trainer.batch_size % self.algo.group_size:
            raise ValueError(
                f"trainer.batch_size ({self.trainer.batch_size}) must be a multiple of "
                f"algo.group_size ({self.algo.group_size})"
            )
        return self

    @model_validator(mode="after")
    def _gateway_fits_source(self) -> RunConfig:
        source = self.data.source
        if source == "env":
            changed = self.gateway.changed()
            if changed:
                raise ValueError(f"gateway.{changed[0]} applies to data.source 'gateway' or 'both', not env")
            return self
        if source == "gateway":  # no built-in producer: its knobs would be accepted and ignored
            if self.algo.advantage == "spo" and self.algo.spo_prioritized_sampling:
                raise ValueError(
                    "algo.spo_prioritized_sampling: with data.source='gateway' the agents pick the prompts, "
                    "sao cannot prioritise them; set it false"
                )
            for key in ("max_in_flight", "max_consecutive_drops"):
                if getattr(self.runtime, key) != type(self.runtime).model_fields[key].default:
                    raise ValueError(
                        f"runtime.{key} applies to the built-in producer (data.source 'env' or 'both'); "
                        "gateway sessions are bounded by gateway.max_sessions and the staleness capacity"
                    )
        return self

    def _server_sync_fits(self) -> None:
        """runtime.weight_sync / weight_bucket_mb against vLLM / SGLang server replicas on ray."""
        sync, server = self.runtime.weight_sync, self.engine.backend
        if sync not in ("auto", "disk", server):
            raise ValueError(
                f"runtime.weight_sync={sync!r} with engine.backend={server!r} on ray: server replicas reload "
                f"their weights from a directory ('disk') or take them over their native NCCL transfer "
                f"({server!r})"
            )
        if sync == server and not (self.cluster.engine_gpus > 0 and self.cluster.trainer_gpus > 0):
            raise ValueError(
                f"runtime.weight_sync={sync!r} (NCCL) needs GPUs on both ends: cluster.engine_gpus "
                f"({self.cluster.engine_gpus:g}) and cluster.trainer_gpus ({self.cluster.trainer_gpus:g}) > 0"
            )
        bucket_default = type(self.runtime).model_fields["weight_bucket_mb"].default
        resolved = self.runtime.resolved_weight_sync(server, self.cluster)
        if resolved == "disk" and self.runtime.weight_bucket_mb != bucket_default:
            raise ValueError(
                "runtime.weight_bucket_mb applies to pushes over a process group; here runtime.weight_sync "
                f"resolves to 'disk' (engine.backend={server!r} without GPUs on both ends)"
            )

    @model_validator(mode="after")
    def _cluster_fits_backend(self) -> RunConfig:
        if self.runtime.backend == "local":
            changed = self.cluster.changed()
            if changed:
                raise ValueError(
                    f"cluster.{changed[0]} applies to runtime.backend='ray'; the local runtime runs in one "
                    "process"
                )
            return self
        for key, cpus in (("engine.threads", "engine_cpus"), ("trainer.threads", "trainer_cpus")):
            section, name = key.split(".")
            if getattr(getattr(self, section), name) is not None:
                raise ValueError(
                    f"{key} applies to the local runtime; with runtime.backend='ray' cluster.{cpus} sets the "
                    "torch threads of each actor"
                )
        if self.engine.backend == "process":
            raise ValueError(
                "engine.backend='process' is for the local runtime; with runtime.backend='ray' each engine "
                "replica is already a process of its own (use 'local', 'vllm' or 'sglang')"
            )
        if self.engine.backend in ("vllm", "sglang"):
            if self.engine.attach:
                raise ValueError(
                    "engine.attach: with runtime.backend='ray' every engine replica launches its own server"
                )
            self._server_sync_fits()
        elif self.runtime.weight_sync in ("vllm", "sglang"):
            raise ValueError(
                f"runtime.weight_sync={self.runtime.weight_sync!r} is the native transfer of "
                f"{self.runtime.weight_sync} servers; engine.backend is {self.engine.backend!r}"
            )
        if self.cluster.address is None:
            cpus = self.cluster.num_cpus if self.cluster.num_cpus is not None else float(os.cpu_count() or 1)
            available = {"CPU": cpus}
            if self.cluster.num_gpus is not None:
                available["GPU"] = float(self.cluster.num_gpus)
            else:
                available["GPU"] = float("inf")  # checked against what Ray detects, before any actor starts
            check_cluster_resources(self.cluster, available)
        else:
            local_only = [
                k for k in self.cluster.changed() if k in ("num_cpus", "num_gpus", "auth", "temp_dir")
            ]
            if local_only:
                raise ValueError(
                    f"cluster.{local_only[0]} applies to a cluster sao starts itself; with cluster.address "
                    "the running cluster's own settings count"
                )
        return self

    @model_validator(mode="after")
    def _server_launch_fits_run(self) -> RunConfig:
        """The engine's launch keys against the sections they meet: the episode budget, the replica's GPUs,
        the model's rope scaling (each refusal names both keys)."""
        engine, budget = self.engine, self.data.max_total_tokens
        if engine.max_model_len is not None and engine.max_model_len < budget:
            raise ValueError(
                f"engine.max_model_len={engine.max_model_len} is below data.max_total_tokens={budget}: the "
                "server would cut episodes short; raise engine.max_model_len or lower data.max_total_tokens"
            )
        if engine.backend not in ("vllm", "sglang"):
            return self
        if self.model.rope_scaling is not None:
            if engine.attach:
                raise ValueError(
                    "model.rope_scaling with engine.attach: sao cannot give a running server the trainer's "
                    "rope scaling; let sao launch the server (drop engine.attach)"
                )
            given = server_flag_given(engine.server_args, SERVER_OVERRIDE_FLAGS[engine.backend])
            if given:
                raise ValueError(
                    f"model.rope_scaling and engine.server_args ({given}) both override the server's model "
                    "config: set the rope scaling in model.rope_scaling only"
                )
        gpus = self.cluster.engine_gpus
        if self.runtime.backend == "ray" and gpus > 1:
            if gpus != int(gpus):
                raise ValueError(
                    f"cluster.engine_gpus={gpus:g}: a vLLM / SGLang replica on more than one GPU needs a "
                    "whole number of them (its tensor-parallel size)"
                )
            given = server_flag_given(engine.server_args, SERVER_TP_FLAGS[engine.backend])
            if given:
                raise ValueError(
                    f"cluster.engine_gpus={int(gpus)} and engine.server_args ({given}) both set the "
                    "server's tensor-parallel size: set it with cluster.engine_gpus only"
                )
        return self

    @property
    def value_pretrain_enabled(self) -> bool:
        """Whether to pretrain the critic (`value_pretrain_enabled` of the algo and critic sections)."""
        return value_pretrain_enabled(self.algo, self.critic)

    def to_yaml_dict(self) -> dict[str, Any]:
        """Plain data (str/int/float/bool/None/list/dict) in field order, ready for yaml.safe_dump."""
        return self.model_dump(mode="json")
