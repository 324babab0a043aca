"""Rich tables of a plan (what `sao plan` prints): layout, workload, stage constants, results, split."""

from __future__ import annotations

from collections.abc import Mapping

from rich.table import Table

from .costs import StageCosts
from .layout import Layout, Policy
from .result import PlanResult
from .split import SplitReport
from .workload import WorkloadSummary

__all__ = ["costs_table", "layout_table", "results_table", "split_table", "workload_table"]


def _kv(title: str, rows: list[tuple[str, str]]) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("", style="bold", no_wrap=True)
    table.add_column("")
    for key, value in rows:
        table.add_row(key, value)
    return table


def layout_table(layout: Layout, policy: Policy) -> Table:
    return _kv(
        "layout",
        [
            ("engine replicas", f"{layout.engine_replicas} × {layout.gpus_per_engine:g} GPU"),
            ("trainer workers", f"{layout.trainer_workers} × {layout.gpus_per_trainer:g} GPU"),
            ("GPUs", f"{layout.gpus:g}" + (" (colocated)" if layout.colocated else "")),
            ("batch / group", f"{policy.batch_size} / {policy.group_size}"),
            (
                "max_staleness / capacity (async)",
                f"{policy.max_staleness} / {policy.with_mode('async').capacity}",
            ),
            ("max_in_flight", str(policy.max_in_flight)),
            ("max_running per replica", str(policy.max_running)),
        ],
    )


def workload_table(description: str, s: WorkloadSummary) -> Table:
    return _kv(
        "workload",
        [
            ("source", description),
            ("turns mean / max", f"{s.turns_mean:.2f} / {s.turns_max}"),
            ("generated tokens per episode mean / p99", f"{s.gen_tokens_mean:.0f} / {s.gen_tokens_p99:.0f}"),
            ("tokens per trajectory mean", f"{s.total_tokens_mean:.0f}"),
            ("env seconds per episode mean", f"{s.env_s_mean:.2f}"),
        ],
    )


def costs_table(costs: StageCosts) -> Table:
    e, t = costs.engine, costs.trainer
    rows = [
        ("source", costs.source),
        (
            "engine t0 / t1 / c / p",
            f"{e.t0_s:.4g} s/step, {e.t1_s:.4g} s/seq, {e.c_s:.4g} s/ctx token, {e.p_s:.4g} s/prefill token",
        ),
        (
            "trainer a / b",
            f"{t.a_s:.4g} s + {t.b_s:.4g} s/token at {t.workers} worker(s), eff {t.scaling_eff:g}",
        ),
        ("critic", f"K={t.critic_steps} × factor {t.critic_step_factor:g}"),
        ("push_s", f"{costs.push_s:.4g}"),
    ]
    for part in ("engine", "trainer"):
        fit = costs.fit.get(part)
        if isinstance(fit, Mapping):
            extra = "; ".join(fit.get("dropped", []) + [f"clamped {c}" for c in fit.get("clamped", [])])
            rows.append(
                (
                    f"{part} fit",
                    f"R² {fit.get('r2', float('nan')):.4f}, rmse {fit.get('rmse_s', 0):.3g} s"
                    + (f"; {extra}" if extra else ""),
                )
            )
    return _kv("stage constants", rows)


def results_table(results: Mapping[str, PlanResult]) -> Table:
    table = Table(title="throughput model", title_justify="left")
    table.add_column("", style="bold", no_wrap=True)
    for name in results:
        table.add_column(name, justify="right")
    rows = [
        ("layout", lambda r: f"{r.engine_replicas}E/{r.trainer_workers}T" + (" colo" if r.colocated else "")),
        ("trajectories/hour", lambda r: f"{r.trajectories_per_hour:,.0f}"),
        ("step s (mean)", lambda r: f"{r.step_s_mean:.2f}"),
        ("engine utilisation", lambda r: f"{r.engine_utilisation:.1%}"),
        ("trainer utilisation", lambda r: f"{r.trainer_utilisation:.1%}"),
        ("engine occupancy (seqs/replica)", lambda r: f"{r.engine_occupancy:.1f}"),
        ("in flight (mean)", lambda r: f"{r.in_flight_mean:.1f}"),
        ("token lag mean / p99 / max", lambda r: f"{r.lag.mean:.2f} / {r.lag.p99:g} / {r.lag.max:g}"),
        ("trajectory age max", lambda r: f"{r.age.max:g}"),
        ("admission staleness max", lambda r: f"{r.admission.max:g}"),
    ]
    for label, cell in rows:
        table.add_row(label, *(cell(r) for r in results.values()))
    return table


def split_table(report: SplitReport, top: int = 8) -> Table:
    table = Table(title=f"best split of {report.gpus} GPUs (async) vs colocated sync", title_justify="left")
    for column in ("engines", "trainers", "trajectories/hour", "engine util", "trainer util", "lag max"):
        table.add_column(column, justify="right")
    ranked = sorted(report.candidates, key=lambda r: -r.trajectories_per_s)[:top]
    for r in [*ranked, report.colocated_sync]:
        mark = " (best)" if r is report.best else (" colocated sync" if r is report.colocated_sync else "")
        table.add_row(
            f"{r.engine_replicas}{mark}",
            str(r.trainer_workers),
            f"{r.trajectories_per_hour:,.0f}",
            f"{r.engine_utilisation:.1%}",
            f"{r.trainer_utilisation:.1%}",
            f"{r.lag.max:g}",
        )
    return table
