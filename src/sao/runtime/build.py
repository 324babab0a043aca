"""How a run is assembled: one factory per component, each given only the config sections it reads.

Every factory comes in two halves: ``<component>_args(...)`` turns the sections into the plain, typed
arguments the component receives (cheap, pure: the consumption test compares them), and ``build_<name>``
or the component's own constructor makes the object from them. `FACTORIES` names, for each factory, the
sections it is handed and the config keys it reads; every leaf of `RunConfig` is read by at least one
factory or refused at load (`REFUSED_AT_LOAD`), which ``tests/runtime/test_build.py`` checks leaf by leaf.
docs/assembly.md is the guide for adding a component.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sao.config import (
    AlgoConfig,
    ClusterConfig,
    ConfigError,
    CriticConfig,
    DataConfig,
    EngineConfig,
    EvalConfig,
    GatewayConfig,
    LoggingConfig,
    ModelConfig,
    RunConfig,
    RuntimeConfig,
    TrainerConfig,
)
from sao.config.schema import value_pretrain_enabled
from sao.envs.base import Env, EnvError, Task, make_env
from sao.eval import EvalSettings
from sao.rollout.agent_loop import AgentLoopConfig

from .args import (
    CheckpointArgs,
    ClusterArgs,
    ComputeArgs,
    CriticArgs,
    EngineArgs,
    EnvArgs,
    EvalArgs,
    GatewayArgs,
    InspectArgs,
    LoopArgs,
    ModelArgs,
    RunLogArgs,
    SamplerArgs,
    ServerArgs,
    SinkArgs,
    StalenessArgs,
    TaskArgs,
    ThreadArgs,
    TokenizerArgs,
    TrainerArgs,
    ValuePretrainArgs,
    WeightCheckArgs,
)

__all__ = [
    "FACTORIES",
    "REFUSED_AT_LOAD",
    "Factory",
    "build_env_factory",
    "build_tasks",
    "build_tokenizer",
    "build_trainer",
]


# ---- the factories' argument halves ------------------------------------------------------------------


def actor_args(model: ModelConfig, trainer: TrainerConfig) -> ModelArgs:
    return ModelArgs(model, trainer.seed)


def compute_args(model: ModelConfig) -> ComputeArgs:
    return ComputeArgs(
        model.dtype, model.master_dtype, model.device, model.attn_implementation, model.gradient_checkpointing
    )


def critic_args(algo: AlgoConfig, critic: CriticConfig, model: ModelConfig) -> CriticArgs:
    return CriticArgs(algo.uses_critic, critic.head_init, compute_args(model))


def tokenizer_args(model: ModelConfig) -> TokenizerArgs:
    return TokenizerArgs(model.chat_template, model.enable_thinking)


def thread_args(engine: EngineConfig, trainer: TrainerConfig) -> ThreadArgs:
    return ThreadArgs(engine.backend, engine.threads, trainer.threads)


def engine_args(
    engine: EngineConfig, model: ModelConfig, trainer: TrainerConfig, data: DataConfig,
    cluster: ClusterConfig, runtime: RuntimeConfig,
) -> EngineArgs:  # fmt: skip
    server = ServerArgs(
        data.max_total_tokens, engine.max_model_len, engine.enforce_eager, engine.gpu_memory_fraction,
        engine.prefix_caching, cluster.engine_gpus if runtime.backend == "ray" else None, model.rope_scaling,
    )  # fmt: skip
    return EngineArgs(
        engine.backend, model.device, engine.dtype, engine.max_concurrent, trainer.seed,
        engine.threads, engine.python, engine.attach, tuple(engine.server_args), engine.max_restarts, server,
        engine.prefix_cache_tokens if engine.prefix_caching else 0,
    )  # fmt: skip


def weight_check_args(runtime: RuntimeConfig, trainer: TrainerConfig) -> WeightCheckArgs:
    """Push verification, the mismatch drift alarm and the push deadline (`sao.runtime.weight_checks`)."""
    return WeightCheckArgs(
        runtime.push_check, runtime.mismatch_drift, runtime.weight_sync_timeout_s, trainer.seed
    )


def agent_loop_args(data: DataConfig, engine: EngineConfig) -> AgentLoopConfig:
    return AgentLoopConfig(
        max_turns=data.max_turns,
        max_total_tokens=data.max_total_tokens,
        max_tokens_per_turn=engine.max_new_tokens,
        temperature=engine.temperature,
        top_p=engine.top_p,
        top_k=engine.top_k,
        env_timeout_s=data.env_timeout_s,
    )


def env_args(data: DataConfig) -> EnvArgs:
    return EnvArgs(data.env, dict(data.env_kwargs))


def task_args(data: DataConfig) -> TaskArgs:
    fields = (data.id_field, data.prompt_field, data.answer_field, data.tests_field)
    return TaskArgs(data.env, data.train_file, fields, data.seed)


def sampler_args(algo: AlgoConfig, data: DataConfig) -> SamplerArgs:
    return SamplerArgs(algo.group_size, data.seed, algo.spo_prioritized_sampling)


def staleness_args(runtime: RuntimeConfig, trainer: TrainerConfig) -> StalenessArgs:
    drops = runtime.max_consecutive_drops
    if runtime.mode == "sync":
        return StalenessArgs(trainer.batch_size, 0, runtime.drop_older_than, trainer.batch_size, drops)
    return StalenessArgs(
        trainer.batch_size, runtime.max_staleness, runtime.drop_older_than, runtime.max_in_flight, drops
    )


def trainer_args(
    algo: AlgoConfig, critic: CriticConfig, trainer: TrainerConfig, engine: EngineConfig
) -> TrainerArgs:
    return TrainerArgs(algo, critic, trainer, engine.temperature)


def value_pretrain_args(
    algo: AlgoConfig, critic: CriticConfig, trainer: TrainerConfig, runtime: RuntimeConfig
) -> ValuePretrainArgs:
    from sao.train.value_pretrain import ValuePretrainOptions

    pre = critic.pretrain
    enabled = value_pretrain_enabled(algo, critic)
    options = ValuePretrainOptions(
        corpus_size=pre.corpus_size, max_steps=pre.max_steps, ev_patience=pre.ev_patience,
        ev_min_delta=pre.ev_min_delta, lr=critic.lr, batch_size=min(32, pre.corpus_size),
        micro_batch_tokens=trainer.micro_batch_tokens, gamma=algo.gamma, freeze="none",
        grad_clip=critic.grad_clip, seed=trainer.seed,
    )  # fmt: skip
    return ValuePretrainArgs(enabled, options, runtime.max_in_flight, trainer.seed + 10_000_000)


def checkpoint_args(logging: LoggingConfig) -> CheckpointArgs:
    return CheckpointArgs(Path(logging.run_dir), logging.keep_checkpoints, logging.checkpoint_every)


def sink_args(logging: LoggingConfig, name: str) -> SinkArgs:
    return SinkArgs(Path(logging.run_dir), logging, name)


def run_log_args(logging: LoggingConfig) -> RunLogArgs:
    return RunLogArgs(Path(logging.run_dir), logging.episodes, logging.timeline_every_s)


# The algorithm settings every inspection file records (the viewer shows them; a reader can recompute).
INSPECT_META_KEYS = ("preset", "advantage", "policy_loss", "eps_low", "eps_high", "gamma", "lam_policy",
                     "lam_critic", "adaptive_alpha", "k_critic", "step_value", "group_size")  # fmt: skip


def inspect_args(logging: LoggingConfig, algo: AlgoConfig, trainer: TrainerConfig, name: str) -> InspectArgs:
    meta = {"name": name, **{key: getattr(algo, key) for key in INSPECT_META_KEYS}}
    max_bytes = int(logging.inspect_max_mb * 2**20)
    return InspectArgs(Path(logging.run_dir), logging.inspect_every, logging.inspect_samples, max_bytes,
                       trainer.seed, meta)  # fmt: skip


def eval_args(data: DataConfig, eval: EvalConfig, logging: LoggingConfig, engine: EngineConfig) -> EvalArgs:
    files = data.eval_file or ()
    files = (files,) if isinstance(files, str) else tuple(files)
    settings = EvalSettings(
        k=eval.k, seed=eval.seed, temperature=eval.temperature, top_p=eval.top_p, max_turns=data.max_turns,
        max_tokens_per_turn=engine.max_new_tokens, max_total_tokens=data.max_total_tokens,
        concurrency=eval.concurrency, env=data.env, limit=eval.limit, env_timeout_s=data.env_timeout_s,
    )  # fmt: skip
    return EvalArgs(files, env_args(data), settings, logging.eval_every, eval.at_start)


def cluster_args(cluster: ClusterConfig, runtime: RuntimeConfig) -> ClusterArgs:
    return ClusterArgs(cluster, runtime.weight_sync, runtime.weight_bucket_mb)


def gateway_args(
    data: DataConfig, gateway: GatewayConfig, engine: EngineConfig, algo: AlgoConfig
) -> GatewayArgs:
    from sao.serve.hooks import SessionRules

    rules = SessionRules(
        max_session_tokens=data.max_total_tokens, max_turns=data.max_turns, temperature=engine.temperature,
        top_p=engine.top_p, top_k=engine.top_k, max_tokens_per_turn=engine.max_new_tokens,
    )  # fmt: skip
    return GatewayArgs(data.source, gateway, algo.group_size, rules, data.env_timeout_s)


def loop_args(trainer: TrainerConfig, runtime: RuntimeConfig) -> LoopArgs:
    return LoopArgs(trainer.total_steps, trainer.batch_size, trainer.seed, runtime.backend)


# ---- the table ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Factory:
    """``args(*sections)`` with ``sections`` the dotted config paths it is handed; ``reads``: the leaf keys
    (``section.*`` = every leaf below) whose values reach the component."""

    args: Callable[..., Any]
    sections: tuple[str, ...]
    reads: tuple[str, ...]
    builds: str

    def __call__(self, cfg: RunConfig) -> Any:
        return self.args(*(_section(cfg, path) for path in self.sections))


def _section(cfg: RunConfig, path: str) -> Any:
    value: Any = cfg
    for part in path.split("."):
        value = getattr(value, part)
    return value


_MODEL_SOURCE = ("model.path", "model.tiny_arch", "model.tiny_size", "model.tiny_tokenizer", "model.device",
                 "model.rope_scaling")  # fmt: skip
_COMPUTE = ("model.dtype", "model.master_dtype", "model.attn_implementation", "model.gradient_checkpointing",
            "model.device")  # fmt: skip

FACTORIES: dict[str, Factory] = {
    "actor": Factory(actor_args, ("model", "trainer"), (*_MODEL_SOURCE, *_COMPUTE, "trainer.seed"),
                     "the policy checkpoint and the trainer's actor: master weights, compute dtype, "
                     "attention kernel, checkpointing (sao.models.loading, sao.models.precision)"),
    "critic": Factory(critic_args, ("algo", "critic", "model"),
                      ("algo.advantage", "critic.head_init", *_COMPUTE),
                      "the critic: policy backbone + value head (sao.models.critic.load_critic)"),
    "tokenizer": Factory(tokenizer_args, ("model",), ("model.chat_template", "model.enable_thinking"),
                         "the run's tokenizer and chat template, used by every rendering "
                         "(sao.runtime.build.build_tokenizer)"),
    "threads": Factory(thread_args, ("engine", "trainer"),
                       ("engine.backend", "engine.threads", "trainer.threads"),
                       "intra-op torch threads of the local runtime's engine and trainer "
                       "(sao.runtime.threads.plan_threads)"),
    "engine": Factory(engine_args, ("engine", "model", "trainer", "data", "cluster", "runtime"),
                      ("engine.backend", "engine.max_concurrent", "engine.threads", "engine.python",
                       "engine.attach", "engine.server_args", "engine.max_restarts", "engine.dtype",
                       "engine.enforce_eager", "engine.max_model_len", "engine.gpu_memory_fraction",
                       "engine.prefix_caching", "engine.prefix_cache_tokens", "data.max_total_tokens",
                       "cluster.engine_gpus",
                       "runtime.backend", "model.rope_scaling", "model.device", "trainer.seed"),
                      "the rollout engine and how its server is launched (sao.runtime.engines.start_engine)"),
    "agent_loop": Factory(agent_loop_args, ("data", "engine"),
                          ("data.max_turns", "data.max_total_tokens", "data.env_timeout_s",
                           "engine.max_new_tokens", "engine.temperature", "engine.top_p", "engine.top_k"),
                          "turn and token limits, sampling (sao.rollout.agent_loop.AgentLoopConfig)"),
    "env": Factory(env_args, ("data",), ("data.env", "data.env_kwargs"), "one fresh env per episode"),
    "tasks": Factory(task_args, ("data",),
                     ("data.env", "data.train_file", "data.id_field", "data.prompt_field",
                      "data.answer_field", "data.tests_field", "data.seed"),
                     "the training tasks (a task file, or the env's own task source)"),
    "sampler": Factory(sampler_args, ("algo", "data"),
                       ("algo.group_size", "algo.spo_prioritized_sampling", "data.seed"),
                       "the prompt order (sao.runtime.sampler.PromptSampler)"),
    "staleness": Factory(staleness_args, ("runtime", "trainer"),
                         ("runtime.mode", "runtime.max_in_flight", "runtime.max_staleness",
                          "runtime.drop_older_than", "runtime.max_consecutive_drops", "trainer.batch_size"),
                         "capacity, in-flight bound and drop rule (StalenessManager, Producer)"),
    "trainer": Factory(trainer_args, ("algo", "critic", "trainer", "engine"),
                       ("algo.*", "critic.freeze", "critic.lr", "critic.lr_warmup_steps",
                        "critic.warmup_steps", "critic.value_clip", "critic.recompute_values",
                        "critic.grad_clip", "trainer.lr",
                        "trainer.micro_batch_tokens", "trainer.grad_clip", "trainer.gradient_sync",
                        "trainer.max_consecutive_skips",
                        "trainer.total_steps",
                        "trainer.lr_schedule", "trainer.warmup_steps", "trainer.weight_decay",
                        "engine.temperature"),
                       "the RL step: critic ×K, actor (sao.train.step.Trainer)"),
    "value_pretrain": Factory(value_pretrain_args, ("algo", "critic", "trainer", "runtime"),
                              ("algo.advantage", "algo.value_pretrain", "algo.gamma", "critic.pretrain.*",
                               "critic.lr", "critic.grad_clip", "trainer.micro_batch_tokens", "trainer.seed",
                               "runtime.max_in_flight"),
                              "value pretraining on initial-policy rollouts (sao.train.value_pretrain)"),
    "checkpoints": Factory(checkpoint_args, ("logging",),
                           ("logging.run_dir", "logging.keep_checkpoints", "logging.checkpoint_every"),
                           "checkpoints and resume (sao.train.checkpoint.CheckpointManager)"),
    "sinks": Factory(sink_args, ("logging", "name"),
                     ("logging.run_dir", "logging.tensorboard", "logging.wandb", "logging.log_every", "name"),
                     "metric sinks: JSONL, TensorBoard, W&B (sao.sinks.make_sinks)"),
    "run_logs": Factory(run_log_args, ("logging",),
                        ("logging.run_dir", "logging.episodes", "logging.timeline_every_s"),
                        "episodes.jsonl and timeline.jsonl for throughput analysis (sao.runtime.run_logs)"),
    "inspector": Factory(inspect_args, ("logging", "algo", "trainer", "name"),
                         ("logging.run_dir", "logging.inspect_every", "logging.inspect_samples",
                          "logging.inspect_max_mb", "trainer.seed", "name",
                          *(f"algo.{key}" for key in INSPECT_META_KEYS)),
                         "kept trajectories with the trainer's per-token numbers (sao.runtime.inspection)"),
    "evaluator": Factory(eval_args, ("data", "eval", "logging", "engine"),
                         ("data.eval_file", "eval.*", "logging.eval_every", "data.env", "data.env_kwargs",
                          "data.max_turns", "data.max_total_tokens", "data.env_timeout_s",
                          "engine.max_new_tokens"),
                         "evaluation during training (sao.runtime.evaluation.TrainingEvaluator)"),
    "weight_checks": Factory(weight_check_args, ("runtime", "trainer"),
                             ("runtime.push_check.*", "runtime.mismatch_drift.*",
                              "runtime.weight_sync_timeout_s", "trainer.seed"),
                             "push verification, drift alarm, push deadline (sao.runtime.weight_checks)"),
    "cluster": Factory(cluster_args, ("cluster", "runtime"),
                       ("cluster.*", "runtime.weight_sync", "runtime.weight_bucket_mb"),
                       "the Ray runtime: cluster, engine replicas, trainer ranks, weight sync "
                       "(sao.runtime.ray_backend.RayParts)"),
    "gateway": Factory(gateway_args, ("data", "gateway", "engine", "algo"),
                       ("data.source", "gateway.*", "data.max_total_tokens", "data.max_turns",
                        "data.env_timeout_s", "engine.temperature", "engine.top_p", "engine.top_k",
                        "engine.max_new_tokens", "algo.group_size"),
                       "episodes from external agents: the run's OpenAI-compatible server, admission, "
                       "session rules, verifier (sao.runtime.gateway_run)"),
    "loop": Factory(loop_args, ("trainer", "runtime"),
                    ("trainer.total_steps", "trainer.batch_size", "trainer.seed", "runtime.backend"),
                    "the run loop: steps, batch size, run seed (sao.runtime.runner.Run)"),
}  # fmt: skip

# Keys whose effect is at load time, not in a component: `algo.preset` picks the preset that fills the
# other algo/critic keys (sao.config.loading). Values refused at load name the key and why.
READ_AT_LOAD: dict[str, str] = {"algo.preset": "selects the preset applied before the YAML and overrides"}
REFUSED_AT_LOAD: dict[str, dict[Any, str]] = {
    "model.dtype": {"float16": "fp16 training needs loss scaling, which sao does not do (use bfloat16)"},
}


# ---- builders -----------------------------------------------------------------------------------------


def build_trainer(cfg: RunConfig, actor: Any, critic: Any) -> Any:
    """The `Trainer` for ``cfg``, handed only its sections (algo, critic, trainer, the temperature)."""
    from sao.train.step import Trainer

    args: TrainerArgs = FACTORIES["trainer"](cfg)
    return Trainer(actor, critic, args.algo, args.critic, args.optim, temperature=args.temperature,
                   gradient_sync=args.optim.gradient_sync)  # fmt: skip


def build_tokenizer(args: TokenizerArgs, checkpoint: Path) -> Any:
    """The run's tokenizer: ``checkpoint``'s, with ``model.chat_template`` replacing its template and
    ``model.enable_thinking`` bound in it (so every rendering — episodes, gateway sessions, evaluation, a
    checkpoint's saved tokenizer — sees the same value). Raises `ConfigError` naming the key."""
    from sao.models.loading import load_tokenizer
    from sao.models.templates import bind_template_variables, load_chat_template

    tokenizer = load_tokenizer(checkpoint)
    if args.chat_template is not None:
        try:
            tokenizer.chat_template = load_chat_template(args.chat_template)
        except (OSError, ValueError) as err:
            raise ConfigError(f"model.chat_template: {err}") from None
    if not tokenizer.chat_template:
        raise ConfigError(
            f"model.chat_template: the tokenizer of {str(checkpoint)!r} has no chat template; name one "
            "(a .jinja file, or 'qwen3', 'hermes', 'sao')"
        )
    if args.enable_thinking is not None:
        tokenizer.chat_template = bind_template_variables(
            tokenizer.chat_template, enable_thinking=args.enable_thinking
        )
    return tokenizer


def build_env_factory(args: EnvArgs) -> Callable[[], Env]:
    """A builder of fresh envs (one per episode); builds one now so a bad name or kwargs fail at startup."""
    build = functools.partial(make_env, args.name, **args.kwargs)
    try:
        build()
    except EnvError as err:
        raise ConfigError(f"data.env / data.env_kwargs: {err}") from None
    return build


def build_tasks(args: TaskArgs) -> list[Task]:
    """The training tasks: ``data.train_file`` read with its column names, else the env's task source."""
    if args.train_file:
        from sao.envs.tasks import load_tasks

        id_field, prompt_field, answer_field, tests_field = args.fields
        return load_tasks(args.train_file, id_field=id_field, prompt_field=prompt_field,
                          answer_field=answer_field, tests_field=tests_field)  # fmt: skip
    from sao.envs.base import make_env_tasks

    try:
        return make_env_tasks(args.env, args.count, seed=args.seed)
    except EnvError as err:
        raise ConfigError(f"data.train_file: not set, and {err}") from None


def assemble(cfg: RunConfig) -> dict[str, Any]:
    """Every factory's arguments for one run config, by factory name (what `Run` builds from)."""
    return {name: factory(cfg) for name, factory in FACTORIES.items()}
