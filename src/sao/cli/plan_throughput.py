"""The throughput section of `sao plan`: simulate the modes asked for (and the best split of a GPU pool),
then report the result as JSON or as rich tables.

Owns: running `sao.plan.simulate` / `best_split` for the command and rendering their results. Does not own:
the stage constants, workload and layout (`sao.cli.plan` builds them from the flags), the model itself
(`sao.plan`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import typer

from sao.cli.common import _fail, _stdout
from sao.plan import Layout, PlanResult, Policy, StageCosts, Workload, best_split, simulate, summarize

__all__ = ["Scenario", "Simulation", "report_throughput"]


@dataclasses.dataclass(frozen=True)
class Scenario:
    """What is simulated: the workload, the layout of engines and trainers, the producer/trainer policy."""

    workload: Workload
    layout: Layout
    policy: Policy


@dataclasses.dataclass(frozen=True)
class Simulation:
    """How: the modes (sync, async or both), sync on the colocated pool, the GPU pool whose split is
    searched (None: no search), steps simulated and left out, the sampling seed, the split's stride."""

    mode: str
    colocated: bool
    gpus: int | None
    steps: int
    warmup: int
    seed: int
    stride: int


def report_throughput(
    report: dict[str, Any], costs: StageCosts, scenario: Scenario, simulation: Simulation, as_json: bool
) -> None:
    """Simulate, add the ``throughput`` section to ``report``, then print the report as JSON or the section as
    tables (layout, workload, costs, results, split); exits 2 when the simulation refuses its inputs."""
    try:
        results, split = _simulate_all(costs, scenario, simulation)
    except ValueError as err:
        raise _fail(f"error: {err}") from None
    summary = summarize(scenario.workload, seed=simulation.seed)
    ratio = (
        results["async"].trajectories_per_s / results["sync"].trajectories_per_s
        if {"sync", "async"} <= results.keys()
        else None
    )
    report["throughput"] = {
        "layout": dataclasses.asdict(scenario.layout),
        "policy": dataclasses.asdict(scenario.policy),
        "workload": {"description": scenario.workload.describe(), **dataclasses.asdict(summary)},
        "costs": costs.to_json(),
        "results": {name: r.to_dict() for name, r in results.items()},
        "async_over_sync": ratio,
        "best_split": None if split is None else _split_json(split),
    }
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    _print_throughput(costs, scenario, summary, results, ratio, split)


def _split_json(split: Any) -> dict[str, Any]:
    """The best engine/trainer split of the GPU pool, its colocated-sync baseline and every candidate."""
    return {
        "gpus": split.gpus,
        "best": split.best.to_dict(series=False),
        "colocated_sync": split.colocated_sync.to_dict(series=False),
        "speedup": split.speedup,
        "candidates": [r.to_dict(series=False) for r in split.candidates],
    }


def _print_throughput(
    costs: StageCosts,
    scenario: Scenario,
    summary: Any,
    results: dict[str, PlanResult],
    ratio: float | None,
    split: Any,
) -> None:
    """The rich tables, then async / sync and the best split's speedup."""
    from sao.plan.report import costs_table, layout_table, results_table, split_table, workload_table

    console = _stdout()
    for table in (
        layout_table(scenario.layout, scenario.policy),
        workload_table(scenario.workload.describe(), summary),
        costs_table(costs),
        results_table(results),
    ):
        console.print(table)
    if ratio is not None:
        console.print(f"async / sync: {ratio:.2f}x trained trajectories per hour", highlight=False)
    if split is not None:
        console.print(split_table(split))
        console.print(f"best split over colocated sync: {split.speedup:.2f}x", highlight=False)


def _simulate_all(
    costs: StageCosts, scenario: Scenario, simulation: Simulation
) -> tuple[dict[str, PlanResult], Any]:
    """The modes asked for (sync on the colocated pool with ``colocated``), and with ``gpus`` the best
    split of that pool."""
    workload, layout, policy = scenario.workload, scenario.layout, scenario.policy
    mode, gpus = simulation.mode, simulation.gpus
    run = {"steps": simulation.steps, "warmup_steps": simulation.warmup, "seed": simulation.seed}
    results: dict[str, PlanResult] = {}
    if mode in ("sync", "both"):
        sync_layout = (
            Layout.colocated_pool(gpus or int(layout.gpus), layout.gpus_per_engine, layout.gpus_per_trainer)
            if simulation.colocated
            else layout
        )
        results["sync"] = simulate(workload, costs, sync_layout, policy.with_mode("sync"), **run)
    if mode in ("async", "both"):
        results["async"] = simulate(workload, costs, layout, policy.with_mode("async"), **run)
    split = None
    if gpus is not None:
        split = best_split(
            workload,
            costs,
            policy,
            gpus,
            gpus_per_engine=layout.gpus_per_engine,
            gpus_per_trainer=layout.gpus_per_trainer,
            stride=simulation.stride,
            **run,
        )
    return results, split
