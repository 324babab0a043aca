"""Capacity planning for sao runs (`sao plan`): a discrete-event model of producer, engines and trainer.

Plain Python arithmetic: no tensors, no transformers (a tiny model's config, in `architecture`, is the one
exception). Modules, one job each: `workload` (episodes to simulate) and `dists` (their distributions),
`costs` (stage constants), `layout` (GPUs and producer/trainer policy), `replica` (one engine as a
processor-sharing server), `sim` (the event loop), `result` (what it reports), `split` (the best
engine/trainer split of a pool), `calibrate` and `lsq` (stage constants fitted from a run directory),
`from_config` (inputs from a run config), `peers` (verl's published 128-GPU table, rebuilt), `report` (rich
tables). The static resource plan is separate: `architecture` (shapes and parameter counts), `memory` (the
trainer's GPU memory), `resources` (the plan `sao plan` prints), `resource_table` (its rows and rich
table), `paper_doc` (its tables in docs/paper_configs.md). See docs/planner.md.
"""

from __future__ import annotations

from .calibrate import CalibrationError, calibrate, fit_engine, fit_trainer
from .costs import CostsError, EngineCosts, StageCosts, TrainerCosts
from .dists import Distribution, Fixed, LogNormal, PowerLaw, parse_dist
from .from_config import ConfigInputs, budget_workload, config_inputs
from .layout import Layout, Policy
from .result import DistStats, PlanResult
from .sim import simulate
from .split import SplitReport, best_split, split_candidates
from .workload import (
    EmpiricalWorkload,
    Episode,
    ParametricWorkload,
    Turn,
    Workload,
    WorkloadError,
    WorkloadSummary,
    load_episodes,
    summarize,
)

__all__ = [
    "CalibrationError",
    "ConfigInputs",
    "CostsError",
    "DistStats",
    "Distribution",
    "EmpiricalWorkload",
    "EngineCosts",
    "Episode",
    "Fixed",
    "Layout",
    "LogNormal",
    "ParametricWorkload",
    "PlanResult",
    "Policy",
    "PowerLaw",
    "SplitReport",
    "StageCosts",
    "TrainerCosts",
    "Turn",
    "Workload",
    "WorkloadError",
    "WorkloadSummary",
    "best_split",
    "budget_workload",
    "calibrate",
    "config_inputs",
    "fit_engine",
    "fit_trainer",
    "load_episodes",
    "parse_dist",
    "simulate",
    "split_candidates",
    "summarize",
]
