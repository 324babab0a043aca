"""Calibration: the fits recover known constants from runtime-format files and name what they cannot use."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from sao.plan import (
    CalibrationError,
    EngineCosts,
    Fixed,
    Layout,
    LogNormal,
    ParametricWorkload,
    Policy,
    StageCosts,
    TrainerCosts,
    calibrate,
    fit_engine,
    fit_trainer,
    simulate,
)

TRUE = EngineCosts(t0_s=0.015, t1_s=4e-4, c_s=3e-8, p_s=6e-5)


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def synthetic_timeline(
    path: Path, n: int = 30, batch: float | None = None, prefill: bool = True, seed: int = 0
) -> Path:
    """Samples whose intervals obey Δbusy = t0·Δsteps + t1·Δtokens + c·Δcontext + p·Δprefill exactly."""
    rng = random.Random(seed)
    totals = dict.fromkeys(
        ("busy_s", "decode_steps", "tokens_generated", "context_tokens", "prefill_tokens"), 0.0
    )
    records = []
    for i in range(n):
        records.append(
            {
                "t": float(i),
                "version": i // 5,
                "in_flight": 8,
                "queued": 0,
                "trained": 4 * (i // 5),
                "engine": {"running": 4.0, "waiting": 0.0, **totals},
            }
        )
        steps = rng.uniform(20, 80)
        running = batch if batch is not None else rng.uniform(1, 32)
        d = {
            "decode_steps": steps,
            "tokens_generated": steps * running,
            "context_tokens": steps * running * rng.uniform(200, 3000),
            "prefill_tokens": rng.uniform(0, 4000) if prefill else 0.0,
        }
        d["busy_s"] = (
            TRUE.t0_s * d["decode_steps"]
            + TRUE.t1_s * d["tokens_generated"]
            + TRUE.c_s * d["context_tokens"]
            + TRUE.p_s * d["prefill_tokens"]
        )
        for key, value in d.items():
            totals[key] += value
    return write_jsonl(path, records)


def test_engine_fit_recovers_the_constants(tmp_path: Path) -> None:
    costs, report = fit_engine(synthetic_timeline(tmp_path / "timeline.jsonl"))
    for name in ("t0_s", "t1_s", "c_s", "p_s"):
        assert getattr(costs, name) == pytest.approx(getattr(TRUE, name), rel=1e-6), name
    assert report["r2"] == pytest.approx(1.0) and report["rmse_s"] < 1e-9
    assert report["dropped"] == [] and report["intervals"] == 29


def test_a_constant_batch_makes_t1_unidentifiable_and_folds_it_into_t0(tmp_path: Path) -> None:
    costs, report = fit_engine(synthetic_timeline(tmp_path / "timeline.jsonl", batch=16.0))
    assert costs.t1_s == 0.0
    assert costs.t0_s == pytest.approx(TRUE.t0_s + 16 * TRUE.t1_s, rel=1e-6)
    assert [d.split()[0] for d in report["dropped"]] == ["t1_s"]


def test_prefill_never_counted_drops_p(tmp_path: Path) -> None:
    costs, report = fit_engine(synthetic_timeline(tmp_path / "timeline.jsonl", prefill=False))
    assert costs.p_s == 0.0 and costs.c_s == pytest.approx(TRUE.c_s, rel=1e-6)
    assert any(d.startswith("p_s") for d in report["dropped"])


def test_restart_and_idle_intervals_are_skipped(tmp_path: Path) -> None:
    path = synthetic_timeline(tmp_path / "timeline.jsonl", n=20)
    lines = path.read_text().splitlines()
    idle = json.loads(lines[-1])
    idle["t"] += 1.0
    reset = {**idle, "t": idle["t"] + 1.0, "engine": dict.fromkeys(idle["engine"], 0.0)}
    path.write_text("\n".join([*lines, json.dumps(idle), json.dumps(reset)]) + "\n")
    costs, report = fit_engine(path)
    assert report["intervals"] == 19 and costs.t0_s == pytest.approx(TRUE.t0_s, rel=1e-6)


def test_too_few_intervals_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = synthetic_timeline(tmp_path / "timeline.jsonl", n=4)
    with pytest.raises(CalibrationError, match=r"timeline\.jsonl: 3 usable intervals.*at least 6"):
        fit_engine(path)


def test_a_missing_timeline_names_the_setting_that_writes_it(tmp_path: Path) -> None:
    with pytest.raises(CalibrationError, match=r"timeline\.jsonl: no such file.*logging\.timeline_every_s"):
        fit_engine(tmp_path / "timeline.jsonl")


def test_a_malformed_sample_names_file_and_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "timeline.jsonl", [{"t": 0.0, "engine": {"busy_s": "x"}}])
    with pytest.raises(CalibrationError, match=r"timeline\.jsonl:1: engine\.busy_s"):
        fit_engine(path)


def metrics_lines(a: float, b: float, tokens: list[float], push: float = 0.7) -> list[dict]:
    lines: list[dict] = [{"step": 0, "time": 0.0, "critic/pretrain_loss": 1.0}]  # not a trainer step
    for i, n in enumerate(tokens, start=1):
        lines.append(
            {
                "step": i,
                "time": float(i),
                "batch/tokens": n,
                "batch/trajectories": 8.0,
                "runtime/train_s": a + b * n,
                "runtime/weight_push_s": push + 0.01 * (i % 3),
            }
        )
    return lines


def test_trainer_fit_recovers_a_b_and_the_median_push(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "metrics.jsonl", metrics_lines(3.0, 2e-4, [1e4, 3e4, 2e4, 5e4, 4e4]))
    trainer, push_s, report = fit_trainer(path, workers=4)
    assert (trainer.a_s, trainer.b_s) == (pytest.approx(3.0), pytest.approx(2e-4))
    assert trainer.workers == 4 and report["steps"] == 5 and report["r2"] == pytest.approx(1.0)
    assert push_s == pytest.approx(0.71)


def test_constant_batch_tokens_fit_a_proportional_trainer(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "metrics.jsonl", metrics_lines(0.0, 1e-4, [2e4] * 4))
    trainer, _, report = fit_trainer(path)
    assert trainer.a_s == 0.0 and trainer.b_s == pytest.approx(1e-4)
    assert report["dropped"] and report["dropped"][0].startswith("a_s")


def test_too_few_trainer_steps_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "metrics.jsonl", metrics_lines(1.0, 1e-4, [1e4, 2e4]))
    with pytest.raises(CalibrationError, match=r"metrics\.jsonl: 2 trainer steps"):
        fit_trainer(path)


def test_calibrate_a_run_directory_and_read_the_file_back(tmp_path: Path) -> None:
    synthetic_timeline(tmp_path / "timeline.jsonl")
    write_jsonl(tmp_path / "metrics.jsonl", metrics_lines(3.0, 2e-4, [1e4, 3e4, 2e4]))
    (tmp_path / "config.yaml").write_text("runtime:\n  backend: ray\ncluster:\n  trainer_workers: 2\n")
    costs = calibrate(tmp_path)
    costs.write(tmp_path / "calib.json")
    again = StageCosts.read(tmp_path / "calib.json")
    assert again.engine == costs.engine and again.trainer == costs.trainer and again.trainer.workers == 2
    assert again.push_s == pytest.approx(costs.push_s) and again.fit["engine"]["r2"] == pytest.approx(1.0)


def test_the_simulator_timeline_calibrates_back_to_its_constants(tmp_path: Path) -> None:
    # The DES writes the runtime's timeline format; fitting it recovers the constants it ran with.
    workload = ParametricWorkload(
        turns=LogNormal(3, 0.8, 1, 10),
        gen_tokens=LogNormal(200, 0.8, 1, 1000),
        obs_tokens=Fixed(50),
        prompt_tokens=LogNormal(100, 0.5),
        env_s=LogNormal(1.0, 1.0, hi=20),
    )
    costs = StageCosts(TRUE, TrainerCosts(5.0, 1e-5), push_s=1.0)
    policy = Policy("async", batch_size=16, group_size=4, max_in_flight=32, max_running=8)
    result = simulate(workload, costs, Layout(2, 1), policy, steps=8, timeline_every_s=3.0)
    fitted, report = fit_engine(write_jsonl(tmp_path / "timeline.jsonl", result.timeline))
    assert report["r2"] == pytest.approx(1.0) and report["dropped"] == []
    for name in ("t0_s", "t1_s", "c_s", "p_s"):
        assert getattr(fitted, name) == pytest.approx(getattr(TRUE, name), rel=1e-4), name
