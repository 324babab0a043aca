"""`RunParts`: every component's arguments for one run, one typed field per factory of
`sao.runtime.factories.FACTORIES` (same names), made by `sao.runtime.build.assemble`.

`Run` reads ``parts.loop.total_steps``, ``parts.engine`` and so on, and hands each component its own field:
no component sees the config, and a field read that does not exist is an `AttributeError` at once rather
than a ``KeyError`` deep in a run.
"""

from __future__ import annotations

from dataclasses import dataclass

from sao.rollout.agent_loop import AgentLoopConfig

from .args import (
    CheckpointArgs,
    ClusterArgs,
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
    SinkArgs,
    StalenessArgs,
    TaskArgs,
    ThreadArgs,
    TokenizerArgs,
    TrainerArgs,
    ValuePretrainArgs,
    WeightCheckArgs,
)

__all__ = ["RunParts"]


@dataclass(frozen=True)
class RunParts:
    """One field per factory, holding what that factory's ``args`` half returned for the run's config."""

    actor: ModelArgs
    critic: CriticArgs
    tokenizer: TokenizerArgs
    threads: ThreadArgs
    engine: EngineArgs
    agent_loop: AgentLoopConfig
    env: EnvArgs
    tasks: TaskArgs
    sampler: SamplerArgs
    staleness: StalenessArgs
    trainer: TrainerArgs
    value_pretrain: ValuePretrainArgs
    checkpoints: CheckpointArgs
    sinks: SinkArgs
    run_logs: RunLogArgs
    inspector: InspectArgs
    evaluator: EvalArgs
    weight_checks: WeightCheckArgs
    cluster: ClusterArgs
    gateway: GatewayArgs
    loop: LoopArgs
