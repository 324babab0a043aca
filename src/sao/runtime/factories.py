"""The factory table: for each component of a run, the config keys it reads and the plain, typed arguments
it receives (``<component>_args(...)``: cheap and pure, so the consumption test can compare them).

Every leaf of `RunConfig` is read by exactly the factories that list it (or refused at load,
`REFUSED_AT_LOAD`), and no factory hands a component a whole section: ``tests/runtime/test_build.py``
checks both, leaf by leaf. `sao.runtime.build` makes the components from these arguments; docs/assembly.md is
the guide for adding one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sao.config import RunConfig

from .factory_args import (
    actor_args,
    agent_loop_args,
    checkpoint_args,
    cluster_args,
    critic_args,
    engine_args,
    env_args,
    eval_args,
    gateway_args,
    inspect_args,
    loop_args,
    run_log_args,
    sampler_args,
    sink_args,
    staleness_args,
    task_args,
    thread_args,
    tokenizer_args,
    trainer_args,
    value_pretrain_args,
    weight_check_args,
)

__all__ = ["FACTORIES", "READ_AT_LOAD", "REFUSED_AT_LOAD", "Factory"]


@dataclass(frozen=True)
class Factory:
    """``args(*sections)`` with ``sections`` the dotted config paths it is handed; ``reads``: exactly the leaf
    keys whose values reach the component (``algo.advantage`` / ``algo.loss``: the typed estimator and loss,
    components themselves, whose own fields they read)."""

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

_CLUSTER = tuple(f"cluster.{k}" for k in ("address", "num_cpus", "num_gpus", "auth", "temp_dir",
    "trainer_workers", "trainer_cpus", "trainer_gpus", "engine_replicas", "engine_cpus", "engine_gpus",
    "placement_strategy", "start_timeout_s"))  # fmt: skip
_GATEWAY = tuple(f"gateway.{k}" for k in ("host", "port", "admission", "admission_timeout_s", "max_sessions",
    "session_idle_timeout_s", "max_body_bytes", "max_pending", "retry_after_s", "tool_call_format",
    "reasoning_parser"))  # fmt: skip
_JUDGE = tuple(f"judge.{k}" for k in ("url", "model", "api_key_env", "system_prompt", "prompt", "score_min",
    "score_max", "combine", "temperature", "max_tokens", "timeout_s", "retries", "concurrency",
    "cache_size"))  # fmt: skip

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
    "env": Factory(env_args, ("data", "judge"),
                   ("data.env", "data.env_kwargs", *_JUDGE, "data.max_turns"),
                   "one fresh env per episode (its own max_turns capped by data.max_turns), wrapped by "
                   "the LLM judge when judge.url is set (sao.runtime.build.build_env_factory)"),
    "tasks": Factory(task_args, ("data",),
                     ("data.env", "data.env_kwargs", "data.train_file", "data.id_field", "data.prompt_field",
                      "data.answer_field", "data.tests_field", "data.seed", "data.num_tasks", "data.stream"),
                     "the training tasks (a task file, the env's own task source, or a stream of fresh "
                     "ones: sao.runtime.build.build_tasks)"),
    "sampler": Factory(sampler_args, ("algo", "data"),
                       ("algo.group_size", "algo.advantage", "data.seed"),
                       "the prompt order (sao.runtime.sampler.PromptSampler)"),
    "staleness": Factory(staleness_args, ("runtime", "trainer"),
                         ("runtime.mode", "runtime.max_in_flight", "runtime.max_staleness",
                          "runtime.drop_older_than", "runtime.max_consecutive_drops", "trainer.batch_size"),
                         "capacity, in-flight bound and drop rule (StalenessManager, Producer)"),
    "trainer": Factory(trainer_args, ("algo", "critic", "trainer", "engine"),
                       ("algo.advantage", "algo.loss", "algo.k_critic", "critic.freeze", "critic.lr",
                        "critic.lr_warmup_steps", "critic.warmup_steps", "critic.value_clip",
                        "critic.recompute_values", "critic.grad_clip", "trainer.lr",
                        "trainer.micro_batch_tokens", "trainer.grad_clip", "trainer.gradient_sync",
                        "trainer.max_consecutive_skips",
                        "trainer.total_steps",
                        "trainer.lr_schedule", "trainer.warmup_steps", "trainer.weight_decay",
                        "engine.temperature", "trainer.seed"),
                       "the RL step: critic ×K, actor (sao.train.step.Trainer)"),
    "value_pretrain": Factory(value_pretrain_args, ("algo", "critic", "trainer", "runtime"),
                              ("algo.advantage", "algo.value_pretrain", "critic.pretrain.enabled",
                               "critic.pretrain.corpus_size", "critic.pretrain.max_steps",
                               "critic.pretrain.ev_patience", "critic.pretrain.ev_min_delta",
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
                          "algo.preset", "algo.advantage", "algo.loss", "algo.k_critic", "algo.group_size"),
                         "kept trajectories with the trainer's per-token numbers (sao.runtime.inspection)"),
    "evaluator": Factory(eval_args, ("data", "eval", "logging", "engine", "runtime"),
                         ("data.eval_file", "eval.k", "eval.temperature", "eval.top_p", "eval.concurrency",
                          "eval.limit", "eval.seed", "eval.at_start", "eval.engine", "runtime.backend",
                          "engine.backend", "logging.eval_every", "data.env",
                          "data.env_kwargs",
                          "data.max_turns", "data.max_total_tokens", "data.env_timeout_s",
                          "engine.max_new_tokens"),
                         "evaluation during training (sao.runtime.evaluation.TrainingEvaluator)"),
    "weight_checks": Factory(weight_check_args, ("runtime", "trainer"),
                             ("runtime.push_check.action", "runtime.push_check.threshold",
                              "runtime.push_check.probe_tokens", "runtime.push_check.probe",
                              "runtime.mismatch_drift.action", "runtime.mismatch_drift.window",
                              "runtime.mismatch_drift.factor", "runtime.mismatch_drift.min_abs_diff",
                              "runtime.weight_sync_timeout_s", "trainer.seed"),
                             "push verification, drift alarm, push deadline (sao.runtime.weight_checks)"),
    "cluster": Factory(cluster_args, ("cluster", "runtime"),
                       (*_CLUSTER, "runtime.weight_sync", "runtime.weight_bucket_mb"),
                       "the Ray runtime: cluster, engine replicas, trainer ranks, weight sync "
                       "(sao.runtime.ray_backend.RayParts)"),
    "gateway": Factory(gateway_args, ("data", "gateway", "engine", "algo", "name"),
                       ("data.source", *_GATEWAY, "data.max_total_tokens", "data.max_turns",
                        "data.env_timeout_s", "engine.temperature", "engine.top_p", "engine.top_k",
                        "engine.max_new_tokens", "algo.group_size", "name"),
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
