"""The planner's inputs read from a run config: layout, producer/trainer policy and workload budgets.

Read keys: ``trainer.batch_size``, ``algo.group_size``, ``algo.k_critic`` (when ``algo.uses_critic``),
``runtime.mode``, ``runtime.max_staleness``, ``runtime.max_in_flight``, ``engine.max_concurrent`` (sequences
per replica), ``cluster.engine_replicas`` / ``trainer_workers`` / ``engine_gpus`` / ``trainer_gpus`` (a
GPU count of 0, a CPU run, counts as 1 device), ``data.max_turns``, ``data.max_total_tokens``,
``engine.max_new_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass

from sao.config import RunConfig

from .dists import Fixed
from .layout import Layout, Policy
from .workload import ParametricWorkload

__all__ = ["ConfigInputs", "budget_workload", "config_inputs"]


@dataclass(frozen=True)
class ConfigInputs:
    layout: Layout
    policy: Policy
    critic_steps: int  # K of the preset (0 without a critic)
    max_turns: int
    max_new_tokens: int
    max_total_tokens: int


def config_inputs(cfg: RunConfig) -> ConfigInputs:
    cluster = cfg.cluster
    layout = Layout(
        cluster.engine_replicas,
        cluster.trainer_workers,
        cluster.engine_gpus or 1.0,
        cluster.trainer_gpus or 1.0,
    )
    policy = Policy(
        mode=cfg.runtime.mode,
        batch_size=cfg.trainer.batch_size,
        group_size=cfg.algo.group_size,
        max_staleness=cfg.runtime.max_staleness,
        max_in_flight=cfg.runtime.max_in_flight,
        max_running=cfg.engine.max_concurrent,
        prefix_cache=cfg.engine.prefix_caching,
    )
    critic_steps = cfg.algo.k_critic if cfg.algo.uses_critic else 0
    return ConfigInputs(
        layout, policy, critic_steps, cfg.data.max_turns, cfg.engine.max_new_tokens, cfg.data.max_total_tokens
    )


def budget_workload(inputs: ConfigInputs, prompt_tokens: int = 256) -> ParametricWorkload:
    """The budget bound: every episode uses all its turns and every turn all its new tokens, within the
    context budget (an upper bound on work per episode, for when no workload is known)."""
    return ParametricWorkload(
        turns=Fixed(inputs.max_turns),
        gen_tokens=Fixed(inputs.max_new_tokens),
        prompt_tokens=Fixed(prompt_tokens),
        max_turns=inputs.max_turns,
        max_new_tokens=inputs.max_new_tokens,
        max_total_tokens=inputs.max_total_tokens,
        label="budget bound (no workload given: every episode uses data.max_turns turns of "
        "engine.max_new_tokens tokens)",
    )
