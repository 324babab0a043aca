"""Typed run configuration: `RunConfig` holding one pydantic model per section, and the rules that span
sections.

The sections live in their own modules (`model`, `engine`, `sections`, `algo`, `runtime`); they are
re-exported here. `sao.config.loading` builds and validates a `RunConfig`. Fields marked "our reading" are
choices we make where the paper is silent (docs/algorithms.md); each is an option so it can be ablated.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

from pydantic import Field, model_validator

from .algo import DEFAULT_PRESET, AlgoConfig
from .engine import (
    SERVER_LAUNCH_FLAGS,
    SERVER_OVERRIDE_FLAGS,
    SERVER_TP_FLAGS,
    EngineConfig,
    server_flag_given,
)
from .judge import JudgeConfig
from .model import CriticConfig, ModelConfig, ValuePretrainConfig
from .runtime import (
    ClusterConfig,
    MismatchDriftConfig,
    PushCheckConfig,
    RuntimeConfig,
    check_cluster_resources,
    weight_sync_path,
)
from .section import ConfigError, Section
from .sections import DataConfig, EvalConfig, GatewayConfig, LoggingConfig, TrainerConfig
from .unions import union_paths

__all__ = [
    "DEFAULT_PRESET",
    "SERVER_LAUNCH_FLAGS",
    "SERVER_OVERRIDE_FLAGS",
    "SERVER_TP_FLAGS",
    "AlgoConfig",
    "ClusterConfig",
    "ConfigError",
    "CriticConfig",
    "DataConfig",
    "EngineConfig",
    "EvalConfig",
    "GatewayConfig",
    "JudgeConfig",
    "LoggingConfig",
    "MismatchDriftConfig",
    "ModelConfig",
    "PushCheckConfig",
    "RunConfig",
    "RuntimeConfig",
    "TrainerConfig",
    "ValuePretrainConfig",
    "check_cluster_resources",
    "server_flag_given",
    "value_pretrain_enabled",
    "weight_sync_path",
]


def value_pretrain_enabled(algo: AlgoConfig, critic: CriticConfig) -> bool:
    """Whether to pretrain the critic: critic.pretrain.enabled if set, else the preset's choice
    (``algo.value_pretrain``); never without a critic."""
    if not algo.uses_critic:
        return False
    enabled = critic.pretrain.enabled
    return algo.value_pretrain if enabled is None else enabled


class RunConfig(Section):
    """A whole run: every section plus a name."""

    name: str = Field("sao", description="Run name.")
    model: ModelConfig = Field(..., description="Policy (and critic) backbone.")
    critic: CriticConfig = Field(default_factory=CriticConfig, description="Value model.")
    engine: EngineConfig = Field(default_factory=EngineConfig, description="Rollout generation.")
    data: DataConfig = Field(default_factory=DataConfig, description="Prompts and environment.")
    gateway: GatewayConfig = Field(
        default_factory=GatewayConfig, description="The server of external agents (data.source gateway/both)."
    )
    judge: JudgeConfig = Field(
        default_factory=JudgeConfig, description="An LLM judge's reward on every episode (off without url)."
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
    def _eval_engine_fits(self) -> RunConfig:
        from .sections import frozen_eval_supported

        if self.eval.engine == "frozen" and not frozen_eval_supported(
            self.runtime.backend, self.engine.backend
        ):
            raise ValueError(
                "eval.engine='frozen' starts an evaluation engine of its own, which the local runtime does "
                "with engine.backend 'local' or 'process' only (here "
                f"runtime.backend={self.runtime.backend!r}, engine.backend={self.engine.backend!r}); set "
                "eval.engine: shared"
            )
        return self

    @model_validator(mode="after")
    def _tasks_fit_source(self) -> RunConfig:
        from sao.envs.extras import missing_library

        data = self.data
        missing = missing_library(data.env)
        if missing is not None:
            raise ValueError(f"data.env: {missing}")
        if data.train_file is not None:
            for key in ("stream", "num_tasks"):
                if getattr(data, key) != type(data).model_fields[key].default:
                    raise ValueError(f"data.{key} applies to tasks the env generates (data.train_file null)")
        judge, timeout = self.judge, data.env_timeout_s
        if judge.url is not None and timeout is not None and timeout <= judge.worst_case_s():
            raise ValueError(
                f"data.env_timeout_s ({timeout:g} s) must exceed the judge's worst case, "
                f"(judge.retries + 1) x judge.timeout_s + backoffs = {judge.worst_case_s():g} s: the judge "
                "grades inside the env's last step, and a slow judge would drop episodes as env_timeout"
            )
        if data.stream and data.source != "env":
            raise ValueError(
                "data.stream needs data.source 'env': gateway agents name their tasks from a fixed set"
            )
        if data.stream and self.algo.advantage.build().prioritizes_prompts:
            raise ValueError(
                "data.stream: prioritized sampling (algo.advantage.prioritized_sampling) picks from a fixed "
                "pool; a stream never revisits a prompt. Set one of them false"
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
            if self.algo.advantage.build().prioritizes_prompts:
                raise ValueError(
                    "algo.advantage.prioritized_sampling: with data.source='gateway' the agents pick the "
                    "prompts, sao cannot prioritise them; set it false"
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
        data = self.model_dump(mode="json")
        for *path, key in union_paths(type(self)):  # the type first: it says whose the other keys are
            parent = functools.reduce(lambda d, k: d[k], path, data)
            parent[key] = {"type": parent[key].pop("type"), **parent[key]}
        return data
