"""`math_tir` played by scripted policies (fixed assistant turns), and the answer verifier behind it."""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path

import pytest

from sao.envs import Task, make_env
from sao.envs.base import StepResult
from sao.envs.math_tir import NUDGE, MathTIREnv
from sao.envs.verify import normalize_answer, verify_answer

from .scripted import ScriptedEngine, play_scripted

DATA = Path(__file__).resolve().parents[2] / "data"
TASK = Task(id="apples", prompt="Tom has 3 bags of 14 apples. How many apples?", answer="42")


def play(env: MathTIREnv, task: Task, turns: list[str]) -> tuple[list[dict], list[StepResult]]:
    """Reset, then feed ``turns`` until the env says done; the initial messages and every step result."""
    return play_scripted(env, task, turns)


def test_reset_sends_system_prompt_and_problem() -> None:
    initial, _ = play(MathTIREnv(), TASK, [])
    assert [m["role"] for m in initial] == ["system", "user"]
    assert "\\boxed" in initial[0]["content"] and initial[1]["content"] == TASK.prompt


def test_correct_boxed_answer_scores_one() -> None:
    _, results = play(MathTIREnv(), TASK, ["3 * 14 = 42, so \\boxed{42}."])
    assert len(results) == 1 and results[0].done and results[0].reward == 1.0
    assert results[0].info["answer"] == "42" and results[0].info["correct"] is True


def test_wrong_boxed_answer_scores_zero() -> None:
    _, results = play(MathTIREnv(), TASK, ["\\boxed{41}"])
    assert results[0].done and results[0].reward == 0.0 and results[0].info["correct"] is False


def test_python_block_runs_and_its_output_is_observed() -> None:
    code_turn = "Let me compute.\n```python\nprint(3 * 14)\n```"
    _, results = play(MathTIREnv(), TASK, [code_turn, "\\boxed{42}"])
    first = results[0]
    assert not first.done and first.reward == 0.0
    assert [m["role"] for m in first.observation] == ["tool"]
    assert "42" in first.observation[0]["content"]
    assert first.info["code_blocks"] == 1 and first.info["code_errors"] == 0
    assert results[1].done and results[1].reward == 1.0


def test_blocks_of_one_turn_all_run_in_order() -> None:
    turn = "```python\nprint('first-out')\n```\nand\n```python\nprint('second-out')\n```"
    _, results = play(MathTIREnv(), TASK, [turn])
    content = results[0].observation[0]["content"]
    assert content.index("first-out") < content.index("second-out")
    assert results[0].info["code_blocks"] == 2


def test_crashing_code_is_an_error_observation_and_the_episode_continues() -> None:
    crash = "```python\nraise ValueError('boom-7')\n```"
    _, results = play(MathTIREnv(), TASK, [crash, "\\boxed{42}"])
    assert not results[0].done
    assert "boom-7" in results[0].observation[0]["content"]
    assert results[0].info["code_errors"] == 1
    assert results[1].done and results[1].reward == 1.0


def test_infinite_loop_times_out_and_the_episode_continues() -> None:
    loop = "```python\nprint('started', flush=True)\nwhile True:\n    pass\n```"
    env = MathTIREnv(code_timeout_s=1.0)
    _, results = play(env, TASK, [loop, "\\boxed{42}"])
    assert not results[0].done
    assert "time" in results[0].observation[0]["content"].lower()
    assert results[0].info["code_errors"] == 1
    assert results[1].reward == 1.0


def test_turn_without_code_or_answer_gets_a_nudge() -> None:
    _, results = play(MathTIREnv(), TASK, ["Hmm, let me think about apples."])
    assert not results[0].done
    assert results[0].observation == [{"role": "user", "content": NUDGE}]


def test_max_turns_without_answer_ends_with_zero() -> None:
    _, results = play(MathTIREnv(max_turns=2), TASK, ["thinking", "still thinking", "\\boxed{42}"])
    assert len(results) == 2
    assert results[1].done and results[1].reward == 0.0 and results[1].info["max_turns"] is True


def test_equivalent_answer_forms_are_accepted() -> None:
    half = Task(id="half", prompt="Half of one?", answer="0.5")
    _, results = play(MathTIREnv(), half, ["\\boxed{\\frac{1}{2}}"])
    assert results[0].reward == 1.0


def test_registered_under_math_tir() -> None:
    env = make_env("math_tir", max_turns=7)
    assert isinstance(env, MathTIREnv) and env.max_turns == 7


@pytest.mark.parametrize(
    ("prediction", "reference"),
    [("\\frac{1}{2}", "0.5"), ("0.5", "1/2"), ("1,000", "1000"), ("\\text{12}", "12"), ("1+x", "x+1")],
)
def test_verify_accepts_equivalent_forms(prediction: str, reference: str) -> None:
    assert verify_answer(prediction, reference)


@pytest.mark.parametrize(
    ("prediction", "reference"), [("41", "42"), ("\\frac{1}{3}", "0.5"), ("", "1"), (None, "1"), ("1", None)]
)
def test_verify_rejects_different_or_missing_answers(prediction: object, reference: object) -> None:
    assert not verify_answer(prediction, reference)


@pytest.mark.parametrize("weird", ["}{", "\\frac{", "\\boxed{", "a" * 5000, "\x00\x01", "1/0", "((((", 3.5])
def test_verify_never_raises_on_weird_input(weird: object) -> None:
    assert verify_answer(weird, "1") in (True, False)


def test_verify_falls_back_to_normalized_match_without_math_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "math_verify", None)  # import fails as if not installed
    assert verify_answer("\\dfrac{1}{2}", "0.5")
    assert verify_answer("1,000", "1000")
    assert verify_answer("\\text{Tuesday}", "tuesday")
    assert not verify_answer("x+1", "y+1")


def test_verify_works_outside_the_main_thread() -> None:
    out: list[bool] = []
    worker = threading.Thread(target=lambda: out.append(verify_answer("\\frac{1}{2}", "0.5")))
    worker.start()
    worker.join()
    assert out == [True]


def test_normalize_answer_strips_formatting_only() -> None:
    assert normalize_answer(" \\$1,234. ") == "1234"
    assert normalize_answer("\\left(1, 2\\right)") == "(1,2)"
    assert normalize_answer("90^\\circ") == "90"


def test_sample_file_answers_verify_against_themselves() -> None:
    from sao.envs.tasks import load_tasks

    tasks = load_tasks(DATA / "math_tir_sample.jsonl")
    assert len(tasks) == 10 and len({t.id for t in tasks}) == 10
    assert all(verify_answer(t.answer, t.answer) for t in tasks)


def test_episode_through_the_agent_loop_records_tool_output_and_outcome(tiny_tokenizer) -> None:
    from sao.rollout.agent_loop import AgentLoopConfig, run_episode

    engine = ScriptedEngine(tiny_tokenizer, ["```python\nprint(6 * 7 + 1000)\n```", "So \\boxed{42}."])
    traj = asyncio.run(run_episode(engine, tiny_tokenizer, MathTIREnv(), TASK, AgentLoopConfig()))
    assert traj.rewards == [0.0, 1.0] and traj.finish_reason == "stop" and traj.num_turns == 2
    observed = tiny_tokenizer.decode(
        [t for t, a in zip(traj.token_ids, traj.action_mask, strict=True) if not a], skip_special_tokens=False
    )
    assert "<tool_response>\n1042" in observed
