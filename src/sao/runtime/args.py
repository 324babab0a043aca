"""What each component of a run receives: plain, typed, comparable arguments (`sao.runtime.build` makes
them from the config sections; the consumption test compares them when a key changes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sao.config.runtime import requested_resources
from sao.envs.judge_client import JudgeSettings
from sao.eval import EvalSettings
from sao.serve.hooks import SessionRules
from sao.train.settings import TrainerArgs

__all__ = [
    "CheckpointArgs",
    "ClusterArgs",
    "ClusterSettings",
    "ComputeArgs",
    "CriticArgs",
    "DriftSettings",
    "EngineArgs",
    "EnvArgs",
    "EvalArgs",
    "GatewayArgs",
    "GatewaySettings",
    "InspectArgs",
    "LoopArgs",
    "ModelArgs",
    "ModelSource",
    "PushCheckSettings",
    "RunLogArgs",
    "SamplerArgs",
    "ServerArgs",
    "SinkArgs",
    "SinkSettings",
    "StalenessArgs",
    "TaskArgs",
    "ThreadArgs",
    "TokenizerArgs",
    "TrainerArgs",
    "ValuePretrainArgs",
    "WeightCheckArgs",
]


@dataclass(frozen=True)
class ModelSource:
    """Where the policy checkpoint comes from (`sao.models.loading.model_from_config`): a directory, or a tiny
    model built on first use; with ``rope_scaling`` merged into a derived checkpoint."""

    path: str | None
    tiny_arch: str | None
    tiny_size: str
    tiny_tokenizer: str
    rope_scaling: dict[str, Any] | None


@dataclass(frozen=True)
class ModelArgs:
    """The policy: its checkpoint, how the trainer holds and computes it, the seed a tiny model is built
    with."""

    model: ModelSource
    compute: ComputeArgs
    seed: int


@dataclass(frozen=True)
class ComputeArgs:
    """How the trainer holds and computes a model (actor and critic alike; `sao.models.precision`)."""

    dtype: str  # compute dtype of forward and backward (model.dtype)
    master_dtype: str  # weights, gradients, their reduction, AdamW state
    device: str
    attn_implementation: str
    gradient_checkpointing: bool | None  # None: on with CUDA


@dataclass(frozen=True)
class CriticArgs:
    """Whether the run has a critic, how a new value head starts, how the trainer holds it."""

    enabled: bool
    head_init: str
    compute: ComputeArgs


@dataclass(frozen=True)
class TokenizerArgs:
    """The chat template every rendering uses (an override, or None: the checkpoint's) and the
    ``enable_thinking`` value passed to it (None: none)."""

    chat_template: str | None
    enable_thinking: bool | None


@dataclass(frozen=True)
class ServerArgs:
    """How a vLLM / SGLang server is launched and checked at start: the engine's launch keys with what they
    derive from (`sao.runtime.engines.server_settings` resolves them; docs/servers.md, launch keys)."""

    episode_budget: int = 16384  # data.max_total_tokens: a server with a smaller context limit is refused
    max_model_len: int | None = None  # engine.max_model_len (None: the budget, unless server_args set it)
    enforce_eager: bool | None = None  # engine.enforce_eager (None: on when the server has no GPU)
    gpu_memory_fraction: float | None = None  # engine.gpu_memory_fraction (None: the server's default)
    prefix_caching: bool = True  # engine.prefix_caching
    replica_gpus: float | None = None  # cluster.engine_gpus under runtime.backend=ray; None: local runtime
    rope_scaling: dict[str, Any] | None = None  # model.rope_scaling


@dataclass(frozen=True)
class ThreadArgs:
    """The local runtime's torch threads as configured (`sao.runtime.threads.plan_threads` decides)."""

    backend: str  # engine.backend
    engine: int | None  # engine.threads
    trainer: int | None  # trainer.threads


@dataclass(frozen=True)
class EngineArgs:
    backend: str
    device: str
    dtype: str
    max_concurrent: int
    seed: int
    threads: int | None = None
    python: str | None = None
    attach: str | None = None
    server_args: tuple[str, ...] = ()
    max_restarts: int = 3
    server: ServerArgs = field(default_factory=ServerArgs)
    # LocalEngine's kept KV for later turns (engine.prefix_cache_tokens; 0 with engine.prefix_caching off;
    # None: the engine's KV budget)
    prefix_cache_tokens: int | None = None


@dataclass(frozen=True)
class JudgeArgs:
    """The LLM judge's reward (``judge.*``): its client settings, how its score meets the env's reward, and
    the agent loop's turn bound (the judge grades the episode at the turn that ends it)."""

    settings: JudgeSettings
    combine: str
    max_turns: int


@dataclass(frozen=True)
class EnvArgs:
    """``data.env`` with its kwargs, the judge (None: none), and ``max_turns``, the agent loop's turn bound
    (``data.max_turns``): an env with a larger ``max_turns`` of its own is capped to it, so an env that
    grades on its last turn (swe, code_tests) grades on the loop's last turn instead of being cut ungraded."""

    name: str
    kwargs: dict[str, Any]
    judge: JudgeArgs | None = None
    max_turns: int | None = None


@dataclass(frozen=True)
class TaskArgs:
    """Training tasks: a file (with its column names), else the env's own task source (``count`` tasks, or
    a fresh stream of them when ``stream``)."""

    env: str
    train_file: str | None
    fields: tuple[str, str, str, str]  # id, prompt, answer, tests
    seed: int
    count: int = 4096  # tasks asked of an env's own source
    env_kwargs: dict[str, Any] = field(default_factory=dict)  # the generator takes those it declares
    stream: bool = False


@dataclass(frozen=True)
class SamplerArgs:
    group_size: int
    seed: int
    prioritized: bool  # prompt priorities from the advantage estimator's state, when it has them


@dataclass(frozen=True)
class StalenessArgs:
    """Capacity and drop rules; sync mode is capacity and in-flight bound of exactly one batch."""

    batch_size: int
    max_staleness: int
    drop_older_than: int | None
    max_in_flight: int
    max_consecutive_drops: int | None = None  # failed episodes in a row before the run stops


@dataclass(frozen=True)
class ValuePretrainArgs:
    """Value pretraining before RL: on, and with which options (`sao.train.value_pretrain`)."""

    enabled: bool
    options: Any  # ValuePretrainOptions (imported lazily: it pulls in torch)
    concurrency: int
    rollout_seed: int


@dataclass(frozen=True)
class CheckpointArgs:
    run_dir: Path
    keep_last: int
    every: int


@dataclass(frozen=True)
class RunLogArgs:
    """The optional throughput logs (`sao.runtime.run_logs`): episodes.jsonl, timeline.jsonl."""

    run_dir: Path
    episodes: bool
    timeline_every_s: float | None


@dataclass(frozen=True)
class InspectArgs:
    """The trajectory inspector's sampling (`sao.runtime.inspection`): every ``every`` steps (None: off),
    ``samples`` trajectories of the batch, the files bounded by ``max_bytes``; ``meta`` names the run and
    its algorithm settings in every file."""

    run_dir: Path
    every: int | None
    samples: int
    max_bytes: int
    seed: int
    meta: dict[str, Any]


@dataclass(frozen=True)
class SinkSettings:
    """Which metric sinks besides JSONL, and how often records are kept (`sao.sinks.make_sinks`)."""

    tensorboard: bool
    wandb: bool
    log_every: int


@dataclass(frozen=True)
class SinkArgs:
    run_dir: Path
    logging: SinkSettings
    run_name: str


@dataclass(frozen=True)
class EvalArgs:
    """Evaluation during training: task files, how to sample, how often (None: only at the end)."""

    files: tuple[str, ...]
    env: EnvArgs
    settings: EvalSettings
    every: int | None
    at_start: bool = False
    engine: str = "frozen"  # eval.engine resolved: frozen | shared (`sao.runtime.eval_engine`)


@dataclass(frozen=True)
class LoopArgs:
    """The run loop itself: how many steps, of how many trajectories, the run seed."""

    total_steps: int
    batch_size: int
    seed: int
    backend: str


@dataclass(frozen=True)
class ClusterSettings:
    """Where the Ray runtime places its actors (``cluster.*``; `sao.runtime.ray_cluster.RayCluster`)."""

    address: str | None
    num_cpus: float | None
    num_gpus: int | None
    auth: str
    temp_dir: str | None
    trainer_workers: int
    trainer_cpus: float
    trainer_gpus: float
    engine_replicas: int
    engine_cpus: float
    engine_gpus: float
    placement_strategy: str
    start_timeout_s: float

    def requested(self) -> dict[str, float]:
        """Resources the actors ask for in total: ``{"CPU": …, "GPU": …}``."""
        return requested_resources(self)


@dataclass(frozen=True)
class ClusterArgs:
    """The distributed runtime's placement (the whole cluster section) and its weight-sync path."""

    cluster: ClusterSettings
    weight_sync: str  # runtime.weight_sync ('auto' is resolved with the engine backend and GPUs: RayParts)
    weight_bucket_mb: int = 512  # runtime.weight_bucket_mb: bucket size of pushes over a process group


@dataclass(frozen=True)
class GatewaySettings:
    """The server external agents use and its admission (``gateway.*``; `sao.runtime.gateway_run`)."""

    host: str
    port: int
    admission: str  # wait | reject
    admission_timeout_s: float
    max_sessions: int
    session_idle_timeout_s: float
    max_body_bytes: int
    max_pending: int
    retry_after_s: int
    tool_call_format: str = "hermes"  # a `sao.envs.tool_formats` name
    reasoning_parser: str = "think"  # think | none


@dataclass(frozen=True)
class GatewayArgs:
    """Where episodes come from (``data.source``) and, for gateway sessions, the server, its admission
    and the rules every recorded session follows (`sao.runtime.gateway_run`)."""

    source: str  # env | gateway | both
    gateway: GatewaySettings
    group_size: int
    rules: SessionRules
    verifier_timeout_s: float | None
    model_name: str = "sao"  # the run's name: the model name agents see in the API


@dataclass(frozen=True)
class PushCheckSettings:
    """``runtime.push_check``: what a failed push does, threshold, probe (`sao.runtime.push_check`)."""

    action: str  # error | warn | none
    threshold: float
    probe_tokens: int
    probe: str  # vocab | prompt


@dataclass(frozen=True)
class DriftSettings:
    """``runtime.mismatch_drift``: the lag-0 mismatch drift alarm (`sao.runtime.weight_checks`)."""

    action: str  # warn | error | none
    window: int
    factor: float
    min_abs_diff: float


@dataclass(frozen=True)
class WeightCheckArgs:
    """Push verification, the lag-0 mismatch drift alarm and the weight-sync deadline
    (`sao.runtime.weight_checks`); ``seed`` draws the vocabulary probe."""

    push_check: PushCheckSettings
    mismatch_drift: DriftSettings
    timeout_s: float
    seed: int
