"""Aggregation and the report, on run dirs with known metrics: the numbers in the CSVs are the ones the
runs logged, reduced as the spec says; every run is listed; pairs are tested by permutation."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import yaml

from sao.sweep.aggregate import align, load_run
from sao.sweep.finals import Column, final_table, run_value
from sao.sweep.report import write_report
from sao.sweep.spec import Final, ReportSpec


def _run(root, arm, seed, rewards, *, batch=4, seconds=2.0, evals=None, status="done", extra=None):
    """A run dir as `sao train` leaves it: config.yaml, metrics.jsonl (one record per step, eval records
    beside), sweep.json."""
    d = root / f"{arm}-{seed}"
    d.mkdir(parents=True)
    cfg = {"name": arm, "trainer": {"seed": seed, "batch_size": batch, "total_steps": len(rewards)}}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    lines = []
    for i, r in enumerate(rewards, start=1):
        rec = {"step": i, "time": 1e9 + i, "reward/mean": r, "trainer/step": float(i),
               "runtime/elapsed_s": seconds * i, **(extra(i) if extra else {})}  # fmt: skip
        lines.append(json.dumps(rec))
        if evals and i in evals:
            lines.append(json.dumps({"step": i, "time": 1e9 + i, "eval/pass@1": evals[i]}))
    lines.append('{"step": 99, "reward/mean": ')  # a live run's half-written line is skipped
    (d / "metrics.jsonl").write_text("\n".join(lines))
    outcome = {"status": status, "returncode": 0, "wall_s": seconds * len(rewards) + 5, "attempts": 1,
               "arm": arm, "seed": seed, "command": ["sao", "train"]}  # fmt: skip
    (d / "sweep.json").write_text(json.dumps(outcome))
    return load_run(d, arm=arm, seed=seed)


def test_a_run_reads_back_what_it_logged(tmp_path):
    run = _run(tmp_path, "a", 3, [0.1, 0.2, 0.3], evals={3: 0.5})
    steps, values = run.series["reward/mean"]
    assert steps.tolist() == [1, 2, 3] and values.tolist() == [0.1, 0.2, 0.3]
    assert run.series["eval/pass@1"][1].tolist() == [0.5]
    assert (run.status, run.steps_done, run.total_steps, run.wall_s) == ("done", 3, 3, 11.0)
    assert run.x("trajectories", steps).tolist() == [4, 8, 12]
    assert run.x("wall", steps).tolist() == [2.0, 4.0, 6.0]
    assert load_run(tmp_path / "a-3").arm == "a" and load_run(tmp_path / "a-3").seed == 3
    with pytest.raises(FileNotFoundError, match=r"no config\.yaml"):
        load_run(tmp_path)


def test_curves_align_runs_of_different_lengths(tmp_path):
    a = _run(tmp_path, "a", 0, [1.0, 2.0, 3.0])
    b = _run(tmp_path, "a", 1, [3.0, 4.0], seconds=4.0)
    by_step = align([a, b], "reward/mean", "step")
    assert by_step.x.tolist() == [1, 2, 3]
    assert np.array_equal(by_step.values, [[1, 2, 3], [3, 4, np.nan]], equal_nan=True)
    smoothed = align([a, b], "reward/mean", "step", smooth=2)
    assert smoothed.values[0].tolist() == [1.0, 1.5, 2.5]  # trailing: no look-ahead
    wall = align([a, b], "reward/mean", "wall", grid_points=5)  # grid 0, 2, 4, 6, 8 s
    assert wall.x.tolist() == [0, 2, 4, 6, 8]
    assert np.array_equal(wall.values, [[np.nan, 1, 2, 3, np.nan], [np.nan, np.nan, 3, 3, 4]], equal_nan=True)
    assert align([a, b], "no/such", "step") is None


def test_finals_reduce_each_run_as_the_spec_says(tmp_path):
    run = _run(tmp_path, "a", 0, [0.0, 1.0, 0.0, 1.0, 1.0], evals={2: 0.25, 5: 0.75})
    value = lambda **kw: run_value(run, Column(Final(**kw)))  # noqa: E731
    assert value(metric="eval/pass@1") == (0.75, False)
    assert value(metric="reward/mean", how="tail", frac=0.4) == (1.0, False)
    assert value(metric="reward/mean", how="head", frac=0.4) == (0.5, False)
    assert value(metric="reward/mean", how="mean") == (0.6, False)
    assert value(metric="reward/mean", how="roughness") == (0.75, False)
    assert (
        value(metric="reward/mean", how="max")[0] == 1.0 and value(metric="reward/mean", how="min")[0] == 0.0
    )
    assert value(metric="reward/mean", how="drop", frac=0.2, smooth=2) == (0.0, False)  # ends at its best
    assert math.isnan(value(metric="missing")[0])
    falling = _run(tmp_path, "b", 0, [0.2, 0.9, 0.9, 0.3, 0.1])
    drop = run_value(falling, Column(Final(metric="reward/mean", how="drop", frac=0.4, smooth=2)))
    assert drop == (pytest.approx(0.9 - 0.2), False)  # best smoothed 0.9, last 40 %: (0.3 + 0.1) / 2


def test_recovery_counts_steps_after_each_shift_and_censors_a_run_that_never_recovers(tmp_path):
    # Shifts after 16 and 32 trained trajectories = steps 4 and 8 (batch 4); level 1.0 before each.
    curve = [1, 1, 1, 1, 0, 0.5, 1, 1, 0, 0, 0, 0]
    run = _run(tmp_path, "a", 0, curve)
    final = Final(metric="reward/mean", how="recovery", shifts=[16, 32], pre_window=2, smooth=1)
    assert run_value(run, Column(final, 0)) == (3.0, False)  # step 7 is back to >= 0.9
    assert run_value(run, Column(final, 1)) == (4.0, True)  # never: censored at the 4 steps it had left


def test_recovery_is_nan_for_a_run_that_never_passed_the_shift_and_censored_at_the_next_one(tmp_path):
    final = Final(metric="reward/mean", how="recovery", shifts=[16, 32], pre_window=2, smooth=1)
    short = _run(tmp_path, "short", 0, [1, 1, 1])  # stopped at step 3: never reached the shift at step 4
    assert math.isnan(run_value(short, Column(final, 0))[0])
    # Back only after the second shift (step 10): censored for the first at the 4 steps up to it.
    late = _run(tmp_path, "late", 0, [1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1])
    assert run_value(late, Column(final, 0)) == (4.0, True)


def test_pairwise_differences_and_intervals(tmp_path):
    good = [_run(tmp_path, "good", s, [0.5, 1.0 + 0.01 * s]) for s in range(5)]
    bad = [_run(tmp_path, "bad", s, [0.5, 0.2 + 0.01 * s]) for s in range(5)]
    table = final_table({"good": good, "bad": bad}, [Final(metric="reward/mean")])
    cell = table.cells[("good", "reward/mean")]
    assert cell.values == pytest.approx([1.0, 1.01, 1.02, 1.03, 1.04]) and cell.seeds == (0, 1, 2, 3, 4)
    assert cell.interval.low <= cell.interval.mean <= cell.interval.high
    assert cell.interval.mean == pytest.approx(1.02)
    (diff,) = table.differences["reward/mean"]
    assert (diff.a, diff.b) == ("good", "bad") and diff.mean == pytest.approx(0.8)
    assert diff.low > 0 and diff.p_value == pytest.approx(2 / 252)  # exact: the most extreme split
    assert "permutation" in diff.test


def test_the_report_lists_every_run_and_writes_its_files(tmp_path):
    runs = {
        "sao": [_run(tmp_path / "r", "sao", s, [0.2, 0.6, 0.9], evals={3: 0.8}) for s in range(3)],
        "grpo": [_run(tmp_path / "r", "grpo", s, [0.2, 0.3, 0.4], evals={3: 0.4}, status="stopped")
                 for s in range(3)],
    }  # fmt: skip
    settings = ReportSpec(
        curves=["reward/mean", "eval/pass@1"], finals=[Final(metric="eval/pass@1")], smooth=1
    )
    paths = write_report(
        runs, settings, tmp_path / "out", title="t", description="d", not_started=["x seed 9"]
    )
    names = sorted(p.name for p in paths)
    assert names == sorted(["curves_step.png", "curves_trajectories.png", "curves_wall.png", "curves.csv",
                            "finals.csv", "differences.csv", "runs.csv", "report.md"])  # fmt: skip
    assert all(p.stat().st_size > 0 for p in paths)
    finals = list(csv.DictReader((tmp_path / "out" / "finals.csv").open()))
    assert [(r["arm"], float(r["mean"])) for r in finals] == [
        ("sao", pytest.approx(0.8)),
        ("grpo", pytest.approx(0.4)),
    ]
    rows = csv.DictReader((tmp_path / "out" / "curves.csv").open())
    curves = [r for r in rows if (r["arm"], r["axis"], r["metric"]) == ("sao", "trajectories", "reward/mean")]
    assert [(float(r["x"]), int(r["n"])) for r in curves] == [(4, 3), (8, 3), (12, 3)]
    assert [float(r["mean"]) for r in curves] == pytest.approx([0.2, 0.6, 0.9])
    runs_csv = list(csv.DictReader((tmp_path / "out" / "runs.csv").open()))
    assert len(runs_csv) == 6 and {r["status"] for r in runs_csv} == {"done", "stopped"}
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| sao | 0.800 |" in md and "| eval/pass@1 | sao − grpo |" in md
    assert "3 done, 3 stopped" in md and "Not started yet (not in the numbers): x seed 9." in md
    assert "![curves_step](curves_step.png)" in md


def test_unfinished_runs_are_listed_not_averaged_and_unknown_metrics_are_named(tmp_path):
    done = [_run(tmp_path, "a", s, [0.5, 0.7]) for s in range(2)]
    crashed = _run(tmp_path, "a", 2, [0.0], status="failed")
    settings = ReportSpec(curves=[], finals=[Final(metric="reward/mean"), Final(metric="reward/maen")])
    write_report({"a": done}, settings, tmp_path / "out", title="t", excluded=[crashed])
    md = (tmp_path / "out" / "report.md").read_text()
    assert "listed under Runs: a seed 2 (failed)" in md and "| a | 2 | failed | 1/1 |" in md
    assert "No run logged reward/maen" in md
    finals = list(csv.DictReader((tmp_path / "out" / "finals.csv").open()))
    assert finals[0]["n"] == "2" and float(finals[0]["mean"]) == pytest.approx(0.7)
    assert len(list(csv.DictReader((tmp_path / "out" / "runs.csv").open()))) == 3
    assert not list((tmp_path / "out").glob("*.png"))  # no curves asked for
