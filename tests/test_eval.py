"""`sao.eval`: the pass@k estimator, aggregation, task-file loading, and a seeded run on the tiny model."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sao.eval import EvalSettings, load_task_file, pass_at_k, run_eval, sample_seed, summarize

DATA = Path(__file__).resolve().parents[1] / "data"
AIME = str(DATA / "aime_style_sample.jsonl")
TIR = str(DATA / "math_tir_sample.jsonl")


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 0, 1, 0.0),
        (4, 4, 1, 1.0),
        (4, 1, 1, 0.25),
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (5, 2, 3, 0.9),  # 1 - C(3,3)/C(5,3) = 1 - 1/10
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
        (16, 1, 16, 1.0),
        (3, 1, 3, 1.0),
    ],
)
def test_pass_at_k_matches_hand_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_equals_the_binomial_formula() -> None:
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)])
def test_pass_at_k_rejects_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def _task(file: str, task_id: str, rewards: list[float], k: int) -> dict:
    samples = [{"reward": r, "success": r > 0.5, "error": None, "turns": 1} for r in rewards]
    c = sum(s["success"] for s in samples)
    return {
        "file": file,
        "id": task_id,
        "n": k,
        "correct": c,
        "pass@1": c / k,
        f"pass@{k}": float(c > 0),
        "samples": samples,
    }


def test_summarize_averages_per_problem_per_file_and_overall() -> None:
    tasks = [_task("a", "1", [1, 0], 2), _task("a", "2", [0, 0], 2), _task("b", "3", [1, 1], 2)]
    report = summarize(tasks, 2)
    assert report["files"]["a"]["pass@1"] == pytest.approx(0.25)
    assert report["files"]["a"]["pass@2"] == pytest.approx(0.5)
    assert report["files"]["b"]["pass@1"] == pytest.approx(1.0)
    assert report["overall"]["pass@1"] == pytest.approx((0.5 + 0 + 1) / 3)
    assert report["overall"]["tasks"] == 3 and report["overall"]["samples"] == 6


def test_task_files_pick_prompt_field_and_env() -> None:
    aime = load_task_file(AIME)
    assert len(aime.tasks) == 5 and aime.envs == ["math_tir"] * 5
    assert aime.tasks[0].prompt.startswith("Find") and aime.tasks[0].answer == "40"
    code = load_task_file(DATA / "code_tests" / "tasks.jsonl", limit=2)
    assert code.envs == ["code_tests", "code_tests"]
    assert load_task_file(AIME, env="calculator").envs == ["calculator"] * 5


def test_sample_seeds_differ_per_sample_and_depend_on_the_run_seed() -> None:
    seeds = {sample_seed(0, AIME, "x", j) for j in range(8)}
    assert len(seeds) == 8
    assert sample_seed(0, AIME, "x", 0) != sample_seed(1, AIME, "x", 0)
    assert sample_seed(0, "/elsewhere/aime_style_sample.jsonl", "x", 0) == sample_seed(0, AIME, "x", 0)


def _results(report: dict) -> list[dict]:
    """The per-task results without timings."""
    return [
        {**t, "samples": [{k: v for k, v in s.items() if k != "duration_s"} for s in t["samples"]]}
        for t in report["tasks"]
    ]


SETTINGS = EvalSettings(k=2, seed=3, max_turns=2, max_tokens_per_turn=12, max_total_tokens=1024, limit=2)


def test_eval_on_tiny_model_is_reproducible_with_the_same_seed(tiny_moe_dir: Path) -> None:
    first = run_eval(tiny_moe_dir, [AIME, TIR], SETTINGS, device="cpu")
    one_at_a_time = dataclasses.replace(SETTINGS, concurrency=1)
    second = run_eval(tiny_moe_dir, [AIME, TIR], one_at_a_time, device="cpu")
    assert _results(first) == _results(second)
    assert first["overall"] == second["overall"] and first["files"] == second["files"]
    assert first["overall"]["tasks"] == 4 and first["overall"]["samples"] == 8
    assert set(first["files"]) == {AIME, TIR}
    samples = [s for t in first["tasks"] for s in t["samples"]]
    assert all(s["error"] is None and s["tokens"] > 0 for s in samples)
    assert len({s["seed"] for s in samples}) == 8
    assert len({s["token_digest"] for s in samples}) == 8  # the seeds really reach the sampler
    assert first["settings"]["k"] == 2 and first["settings"]["model"] == str(tiny_moe_dir)
    other = run_eval(tiny_moe_dir, [AIME], dataclasses.replace(SETTINGS, seed=4), device="cpu")
    first_digest = first["tasks"][0]["samples"][0]["token_digest"]
    assert other["tasks"][0]["samples"][0]["token_digest"] != first_digest


def test_eval_command_prints_table_and_writes_json(tiny_moe_dir: Path, tmp_path: Path) -> None:
    from sao.cli import app

    out = tmp_path / "results.json"
    args = ["eval", "--model", str(tiny_moe_dir), "--tasks", AIME, "--k", "2", "--seed", "3", "--limit", "2"]
    args += ["--max-turns", "2", "--max-tokens-per-turn", "12", "--max-total-tokens", "1024"]
    args += ["--device", "cpu", "--out", str(out), "--transcripts"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "pass@1" in result.output and "overall" in result.output
    report = json.loads(out.read_text())
    assert report["settings"]["temperature"] == 1.0 and report["settings"]["top_p"] == 1.0
    assert [t["id"] for t in report["tasks"]] == ["aime-style-1", "aime-style-2"]
    assert all(len(t["samples"]) == 2 for t in report["tasks"])
    first = load_task_file(AIME).tasks[0]
    transcript = report["tasks"][0]["samples"][0]["transcript"]  # the decoded episode: prompt, then turns
    assert first.prompt in transcript and "<|im_start|>assistant" in transcript


def test_eval_command_rejects_missing_task_file(tmp_path: Path) -> None:
    from sao.cli import app

    result = CliRunner().invoke(
        app, ["eval", "--model", str(tmp_path), "--tasks", str(tmp_path / "nope.jsonl")]
    )
    assert result.exit_code == 2 and "nope.jsonl" in result.output


def test_max_turns_caps_the_env_and_works_for_envs_without_a_turn_argument(
    tiny_moe_dir: Path, tmp_path: Path
) -> None:
    from sao.envs import make_env_tasks, save_tasks_jsonl

    tasks = tmp_path / "style.jsonl"
    save_tasks_jsonl(tasks, make_env_tasks("style_shift", 2, seed=1))
    one_turn = EvalSettings(k=1, max_turns=1, max_tokens_per_turn=8, max_total_tokens=256, env="style_shift",
                            env_kwargs={"schedule": [[0, "cute"]]})  # fmt: skip
    report = run_eval(tiny_moe_dir, [tasks], one_turn, device="cpu")  # style_shift takes no max_turns
    assert [s["error"] for t in report["tasks"] for s in t["samples"]] == [None, None]
    calc = tmp_path / "calc.jsonl"
    save_tasks_jsonl(calc, make_env_tasks("calculator", 2, seed=1))
    capped = dataclasses.replace(one_turn, env="calculator", env_kwargs={})  # calculator's own budget is 3
    report = run_eval(tiny_moe_dir, [calc], capped, device="cpu")
    assert [s["turns"] for t in report["tasks"] for s in t["samples"]] == [1, 1]
