"""`sao plan`: JSON output with a calibration, the no-constants note, --calibrate, --workload, --gpus."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sao.cli import app
from sao.plan import EngineCosts, StageCosts, TrainerCosts

from .test_calibrate import metrics_lines, synthetic_timeline, write_jsonl
from .test_workload import RECORD

QUICKSTART = str(Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml")
FAST = ["--steps", "4", "--warmup", "1"]
runner = CliRunner()


@pytest.fixture
def calibration(tmp_path: Path) -> str:
    path = tmp_path / "calib.json"
    StageCosts(EngineCosts(0.01, 1e-4, 1e-8, 1e-5), TrainerCosts(2.0, 1e-4), 0.3, "test").write(path)
    return str(path)


def invoke(*args: str) -> dict:
    result = runner.invoke(app, ["plan", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_plan_json_with_a_calibration_reports_both_modes(calibration: str) -> None:
    out = invoke(QUICKSTART, "--calibration", calibration, "--json", *FAST)
    model = out["throughput"]
    sync, asynchronous = model["results"]["sync"], model["results"]["async"]
    assert sync["trajectories_per_hour"] > 0 and asynchronous["trajectories_per_hour"] > 0
    assert model["async_over_sync"] == pytest.approx(
        asynchronous["trajectories_per_s"] / sync["trajectories_per_s"]
    )
    assert model["policy"]["batch_size"] == 16 and model["policy"]["max_running"] == 16  # from the config
    assert "budget bound" in model["workload"]["description"]  # no workload given: said so
    assert sync["lag"]["max"] == 0 and asynchronous["admission"]["max"] <= 1
    assert len(asynchronous["in_flight_series"]) > 1


def test_config_overrides_and_layout_flags_apply(calibration: str) -> None:
    out = invoke(
        QUICKSTART,
        "trainer.batch_size=8",
        "--calibration",
        calibration,
        "--engines",
        "3",
        "--mode",
        "async",
        "--json",
        *FAST,
    )
    model = out["throughput"]
    assert model["policy"]["batch_size"] == 8 and set(model["results"]) == {"async"}
    assert model["results"]["async"]["engine_replicas"] == 3


def test_without_stage_constants_it_says_what_it_needs() -> None:
    out = invoke(QUICKSTART, "--json")
    assert out["throughput"] is None and "--calibration FILE" in out["note"]
    result = runner.invoke(app, ["plan", QUICKSTART])
    assert result.exit_code == 0 and "--calibration FILE" in result.stdout


def test_explicit_constants_and_parametric_workload(tmp_path: Path) -> None:
    out = invoke(
        QUICKSTART,
        "--engine-t0",
        "0.01",
        "--trainer-a",
        "1.0",
        "--push-s",
        "0.2",
        "--turns",
        "2",
        "--gen-tokens",
        "lognormal:median=30,sigma=0.5",
        "--json",
        *FAST,
    )
    model = out["throughput"]
    assert model["costs"]["engine"]["t0_s"] == 0.01 and model["costs"]["push_s"] == 0.2
    assert model["workload"]["description"].startswith("parametric") and model["workload"]["turns_max"] == 2


def test_half_given_constants_are_an_error() -> None:
    result = runner.invoke(app, ["plan", QUICKSTART, "--engine-t0", "0.01"])
    assert result.exit_code == 2 and "trainer" in result.stderr


def test_workload_from_a_run_directory(tmp_path: Path, calibration: str) -> None:
    (tmp_path / "episodes.jsonl").write_text(json.dumps(RECORD) + "\n")
    out = invoke(QUICKSTART, "--calibration", calibration, "--workload", str(tmp_path), "--json", *FAST)
    assert "episodes.jsonl" in out["throughput"]["workload"]["description"]
    assert out["throughput"]["workload"]["total_tokens_mean"] == 235


def test_gpus_sweeps_the_split(calibration: str) -> None:
    out = invoke(
        QUICKSTART,
        "--calibration",
        calibration,
        "--gpus",
        "6",
        "--colocated",
        "--mode",
        "sync",
        "--json",
        *FAST,
    )
    split = out["throughput"]["best_split"]
    assert [c["engine_replicas"] for c in split["candidates"]] == [1, 2, 3, 4, 5]
    assert split["best"]["trajectories_per_s"] == max(c["trajectories_per_s"] for c in split["candidates"])
    assert split["colocated_sync"]["colocated"] and split["colocated_sync"]["engine_replicas"] == 6
    assert out["throughput"]["results"]["sync"]["colocated"]


def test_calibrate_writes_the_file_plan_reads(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    synthetic_timeline(run / "timeline.jsonl")
    write_jsonl(run / "metrics.jsonl", metrics_lines(3.0, 2e-4, [1e4, 3e4, 2e4]))
    out = tmp_path / "calib.json"
    result = runner.invoke(app, ["plan", "--calibrate", str(run), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "R²" in result.stdout and out.is_file()
    assert invoke(QUICKSTART, "--calibration", str(out), "--json", *FAST)["throughput"]["results"]


def test_calibrate_a_directory_without_a_timeline_exits_2_naming_the_file(tmp_path: Path) -> None:
    result = runner.invoke(app, ["plan", "--calibrate", str(tmp_path)])
    assert result.exit_code == 2 and "timeline.jsonl" in result.stderr and "Traceback" not in result.output


def test_tables_print_without_json(calibration: str) -> None:
    result = runner.invoke(app, ["plan", QUICKSTART, "--calibration", calibration, *FAST])
    assert result.exit_code == 0, result.output
    for text in ("throughput model", "trajectories/hour", "admission staleness max", "async / sync"):
        assert text in result.stdout


def test_a_named_profile_prints_its_source() -> None:
    out = invoke(QUICKSTART, "--profile", "verl-qwen2.5-math-7b-h20", "--mode", "async", "--json", *FAST)
    assert "verl" in out["throughput"]["costs"]["source"]
    result = runner.invoke(app, ["plan", QUICKSTART, "--profile", "nope"])
    assert result.exit_code == 2 and "unknown profile" in result.stderr


def test_resource_plan_is_printed_first_when_the_model_is_known(calibration: str) -> None:
    args = [QUICKSTART, "model.path=Qwen/Qwen3-30B-A3B", "--calibration", calibration, *FAST]
    result = runner.invoke(app, ["plan", *args])
    assert result.exit_code == 0, result.output
    assert result.stdout.index("Resource plan") < result.stdout.index("throughput model")
    assert invoke(*args, "--json")["resource_plan"] is not None
