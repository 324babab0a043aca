"""The argument halves of the factories (`sao.runtime.factories`): each turns the config sections it is handed
into the plain, typed arguments its component receives (`sao.runtime.args`), reading exactly the keys the
table lists. Cheap and pure, so the consumption test can compare them.
"""

from __future__ import annotations

from pathlib import Path

from sao.config import (
    AlgoConfig,
    ClusterConfig,
    CriticConfig,
    DataConfig,
    EngineConfig,
    EvalConfig,
    GatewayConfig,
    JudgeConfig,
    LoggingConfig,
    ModelConfig,
    RuntimeConfig,
    TrainerConfig,
)
from sao.config.schema import value_pretrain_enabled
from sao.eval import EvalSettings
from sao.rollout.agent_loop import AgentLoopConfig
from sao.train.settings import ActorOptim, CriticOptim

from .args import (
    CheckpointArgs,
    ClusterArgs,
    ClusterSettings,
    ComputeArgs,
    CriticArgs,
    DriftSettings,
    EngineArgs,
    EnvArgs,
    EvalArgs,
    GatewayArgs,
    GatewaySettings,
    InspectArgs,
    JudgeArgs,
    LoopArgs,
    ModelArgs,
    ModelSource,
    PushCheckSettings,
    RunLogArgs,
    SamplerArgs,
    ServerArgs,
    SinkArgs,
    SinkSettings,
    StalenessArgs,
    TaskArgs,
    ThreadArgs,
    TokenizerArgs,
    TrainerArgs,
    ValuePretrainArgs,
    WeightCheckArgs,
)

__all__ = [
    "actor_args",
    "agent_loop_args",
    "checkpoint_args",
    "cluster_args",
    "compute_args",
    "critic_args",
    "engine_args",
    "env_args",
    "eval_args",
    "gateway_args",
    "inspect_args",
    "loop_args",
    "run_log_args",
    "sampler_args",
    "sink_args",
    "staleness_args",
    "task_args",
    "thread_args",
    "tokenizer_args",
    "trainer_args",
    "value_pretrain_args",
    "weight_check_args",
]


def actor_args(model: ModelConfig, trainer: TrainerConfig) -> ModelArgs:
    source = ModelSource(
        model.path, model.tiny_arch, model.tiny_size, model.tiny_tokenizer, model.rope_scaling
    )
    return ModelArgs(source, compute_args(model), trainer.seed)


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
    pc, md = runtime.push_check, runtime.mismatch_drift
    return WeightCheckArgs(
        PushCheckSettings(pc.action, pc.threshold, pc.probe_tokens, pc.probe),
        DriftSettings(md.action, md.window, md.factor, md.min_abs_diff),
        runtime.weight_sync_timeout_s, trainer.seed,
    )  # fmt: skip


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


def env_args(data: DataConfig, judge: JudgeConfig) -> EnvArgs:
    if judge.url is None:
        return EnvArgs(data.env, dict(data.env_kwargs), max_turns=data.max_turns)
    judged = JudgeArgs(judge.settings(), judge.combine, data.max_turns)
    return EnvArgs(data.env, dict(data.env_kwargs), judged, data.max_turns)


def task_args(data: DataConfig) -> TaskArgs:
    fields = (data.id_field, data.prompt_field, data.answer_field, data.tests_field)
    return TaskArgs(
        data.env, data.train_file, fields, data.seed, data.num_tasks, dict(data.env_kwargs), data.stream
    )


def sampler_args(algo: AlgoConfig, data: DataConfig) -> SamplerArgs:
    return SamplerArgs(algo.group_size, data.seed, algo.advantage.build().prioritizes_prompts)


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
    actor = ActorOptim(trainer.lr, trainer.weight_decay, trainer.grad_clip, trainer.lr_schedule,
                       trainer.warmup_steps, trainer.total_steps)  # fmt: skip
    freeze = critic.freeze if isinstance(critic.freeze, str) else tuple(critic.freeze)
    critic_optim = CriticOptim(
        algo.k_critic, freeze, critic.lr, trainer.weight_decay, critic.lr_warmup_steps, critic.warmup_steps,
        critic.value_clip, critic.recompute_values, critic.grad_clip,
    )  # fmt: skip
    return TrainerArgs(algo.advantage, algo.loss, actor, critic_optim, trainer.micro_batch_tokens,
                       trainer.max_consecutive_skips, trainer.gradient_sync, engine.temperature,
                       trainer.seed)  # fmt: skip


def value_pretrain_args(
    algo: AlgoConfig, critic: CriticConfig, trainer: TrainerConfig, runtime: RuntimeConfig
) -> ValuePretrainArgs:
    from sao.train.value_pretrain import ValuePretrainOptions

    pre = critic.pretrain
    enabled = value_pretrain_enabled(algo, critic)
    options = ValuePretrainOptions(
        corpus_size=pre.corpus_size, max_steps=pre.max_steps, ev_patience=pre.ev_patience,
        ev_min_delta=pre.ev_min_delta, lr=critic.lr, batch_size=min(32, pre.corpus_size),
        micro_batch_tokens=trainer.micro_batch_tokens, gamma=getattr(algo.advantage, "gamma", 1.0),
        freeze="none",
        grad_clip=critic.grad_clip, seed=trainer.seed,
    )  # fmt: skip
    return ValuePretrainArgs(enabled, options, runtime.max_in_flight, trainer.seed + 10_000_000)


def checkpoint_args(logging: LoggingConfig) -> CheckpointArgs:
    return CheckpointArgs(Path(logging.run_dir), logging.keep_checkpoints, logging.checkpoint_every)


def sink_args(logging: LoggingConfig, name: str) -> SinkArgs:
    settings = SinkSettings(logging.tensorboard, logging.wandb, logging.log_every)
    return SinkArgs(Path(logging.run_dir), settings, name)


def run_log_args(logging: LoggingConfig) -> RunLogArgs:
    return RunLogArgs(Path(logging.run_dir), logging.episodes, logging.timeline_every_s)


def inspect_args(logging: LoggingConfig, algo: AlgoConfig, trainer: TrainerConfig, name: str) -> InspectArgs:
    """``meta``: the algorithm settings every inspection file records (the viewer shows them; a reader can
    recompute): the preset, the estimator's and the loss's types (``advantage``, ``policy_loss``) and
    fields (a loss field named like an estimator's gets ``loss_``), K and the group size."""
    advantage, loss = algo.advantage.model_dump(mode="json"), algo.loss.model_dump(mode="json")
    meta = {"name": name, "preset": algo.preset, "advantage": advantage.pop("type"),
            "policy_loss": loss.pop("type"), **advantage,
            **{(f"loss_{k}" if k in advantage else k): v for k, v in loss.items()},
            "k_critic": algo.k_critic, "group_size": algo.group_size}  # fmt: skip
    max_bytes = int(logging.inspect_max_mb * 2**20)
    return InspectArgs(Path(logging.run_dir), logging.inspect_every, logging.inspect_samples, max_bytes,
                       trainer.seed, meta)  # fmt: skip


def eval_args(
    data: DataConfig, eval: EvalConfig, logging: LoggingConfig, engine: EngineConfig, runtime: RuntimeConfig
) -> EvalArgs:
    files = data.eval_file or ()
    files = (files,) if isinstance(files, str) else tuple(files)
    settings = EvalSettings(
        k=eval.k, seed=eval.seed, temperature=eval.temperature, top_p=eval.top_p, max_turns=data.max_turns,
        max_tokens_per_turn=engine.max_new_tokens, max_total_tokens=data.max_total_tokens,
        concurrency=eval.concurrency, env=data.env, env_kwargs=dict(data.env_kwargs), limit=eval.limit,
        env_timeout_s=data.env_timeout_s,
    )  # fmt: skip
    env = EnvArgs(data.env, dict(data.env_kwargs), max_turns=data.max_turns)
    where = eval.resolved_engine(runtime.backend, engine.backend)
    return EvalArgs(files, env, settings, logging.eval_every, eval.at_start, where)


def cluster_args(cluster: ClusterConfig, runtime: RuntimeConfig) -> ClusterArgs:
    c = cluster
    settings = ClusterSettings(
        c.address, c.num_cpus, c.num_gpus, c.auth, c.temp_dir, c.trainer_workers, c.trainer_cpus,
        c.trainer_gpus, c.engine_replicas, c.engine_cpus, c.engine_gpus, c.placement_strategy,
        c.start_timeout_s,
    )  # fmt: skip
    return ClusterArgs(settings, runtime.weight_sync, runtime.weight_bucket_mb)


def gateway_args(
    data: DataConfig, gateway: GatewayConfig, engine: EngineConfig, algo: AlgoConfig, name: str
) -> GatewayArgs:
    from sao.serve.hooks import SessionRules

    rules = SessionRules(
        max_session_tokens=data.max_total_tokens, max_turns=data.max_turns, temperature=engine.temperature,
        top_p=engine.top_p, top_k=engine.top_k, max_tokens_per_turn=engine.max_new_tokens,
    )  # fmt: skip
    g = gateway
    settings = GatewaySettings(
        g.host, g.port, g.admission, g.admission_timeout_s, g.max_sessions, g.session_idle_timeout_s,
        g.max_body_bytes, g.max_pending, g.retry_after_s, g.tool_call_format, g.reasoning_parser,
    )  # fmt: skip
    return GatewayArgs(data.source, settings, algo.group_size, rules, data.env_timeout_s, name)


def loop_args(trainer: TrainerConfig, runtime: RuntimeConfig) -> LoopArgs:
    return LoopArgs(trainer.total_steps, trainer.batch_size, trainer.seed, runtime.backend)
