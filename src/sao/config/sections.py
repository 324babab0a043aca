"""The plain sections: data, gateway, trainer, evaluation, logging."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from .section import Section

__all__ = ["DataConfig", "EvalConfig", "GatewayConfig", "LoggingConfig", "TrainerConfig"]


class DataConfig(Section):
    """Prompts and the environment they are played in."""

    source: Literal["env", "gateway", "both"] = Field(
        "env",
        description="Where episodes come from: 'env' the built-in producer playing data.env; 'gateway' "
        "external agents through the run's OpenAI-compatible server (the gateway section); 'both' at once.",
    )
    env: str = Field(
        "calculator",
        description="The environment: a registered name (built-in, or a library adapter: reasoning_gym, "
        "textarena, verifiers) or a user's file.py:Class / package.module:Class.",
    )
    env_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of the env constructor, e.g. {turns: episode}."
    )
    train_file: str | None = Field(
        None, description="Training prompts (JSONL); null = the env's built-in set."
    )
    num_tasks: int = Field(
        4096,
        ge=1,
        description="data.train_file null: how many tasks the env's own generator makes, the pool training "
        "visits epoch by epoch. With data.stream: the pool of value pretraining and the weight probes (a "
        "seed of its own, never drawn by the stream).",
    )
    stream: bool = Field(
        False,
        description="Play a freshly generated task in every episode, so no prompt is seen twice: task i of "
        "the run comes from the env's generator seeded by data.seed and i (in chunks of 256); a resumed run "
        "goes on from the next i. Needs data.train_file null and data.source env.",
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


class GatewayConfig(Section):
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
    tool_call_format: str = Field(
        "hermes",
        description="How the model writes tool calls, parsed into the API's structured tool calls: 'hermes' "
        "(Qwen2.5/Qwen3/Hermes <tool_call>{json}</tool_call>), 'qwen3_coder' (Qwen3-Coder's XML "
        "<function=...><parameter=...>), or another registered format (sao.envs.tool_formats). Must match "
        "the model's chat template.",
    )
    reasoning_parser: Literal["think", "none"] = Field(
        "think",
        description="How the model's reasoning is split from its answer: 'think' (a <think>...</think> "
        "block, Qwen3/DeepSeek-R1 style) returned as reasoning_content / thinking blocks / reasoning items; "
        "'none': the whole text is the content. Recorded tokens are what was generated either way.",
    )

    @field_validator("tool_call_format")
    @classmethod
    def _known_format(cls, value: str) -> str:
        from sao.envs.tool_formats import get_tool_format

        get_tool_format(value)  # ValueError listing the known formats
        return value


class TrainerConfig(Section):
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


class EvalConfig(Section):
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
    engine: Literal["auto", "frozen", "shared"] = Field(
        "auto",
        description="Where evaluations sample. frozen: an engine of their own, loaded with the evaluated "
        "step's weights and never pushed to while it evaluates (every evaluation on one policy version; "
        "costs one more engine); shared: the run's engine, beside training (an intermediate evaluation "
        "spans the versions pushed while it runs). auto: frozen with runtime.backend local and "
        "engine.backend local or process, else shared.",
    )

    def resolved_engine(self, runtime_backend: str, engine_backend: str) -> str:
        """``engine`` with 'auto' resolved: 'frozen' where an evaluation engine of its own can be started
        (`frozen_eval_supported`), else 'shared'."""
        if self.engine != "auto":
            return self.engine
        return "frozen" if frozen_eval_supported(runtime_backend, engine_backend) else "shared"


def frozen_eval_supported(runtime_backend: str, engine_backend: str) -> bool:
    """Whether the run can start an evaluation engine of its own: the local runtime with an in-process or
    child-process engine (a second vLLM / SGLang server, or a replica outside the Ray pool, is not
    started)."""
    return runtime_backend == "local" and engine_backend in ("local", "process")


class LoggingConfig(Section):
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
