"""`code_tests` played by scripted policies: file tools, commands, hidden tests, malformed calls."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from sao.envs import Task, make_env
from sao.envs.base import StepResult
from sao.envs.code_tests import CODE_TOOLS, NUDGE, CodeTestsEnv

from .scripted import ScriptedEngine, play_scripted

DATA = Path(__file__).resolve().parents[2] / "data" / "code_tests" / "tasks.jsonl"
HIDDEN = "hidden_test_add.py"
HIDDEN_TEST = """import unittest
from calc import add


class T(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)
        self.assertEqual(add(-1, 1), 0)
"""
TASK = Task(
    id="add",
    prompt="Implement add(a, b) in calc.py.",
    tests={HIDDEN: HIDDEN_TEST},
    metadata={
        "files": {"calc.py": "def add(a, b):\n    raise NotImplementedError  # TODO\n"},
        "test_command": "python -m unittest -q hidden_test_add",
    },
)
GOOD = "def add(a, b):\n    return a + b\n"
BAD = "def add(a, b):\n    return a - b\n"


def call(name: str, **arguments: str) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def play(turns: list[str], task: Task = TASK, **env_kwargs: object) -> tuple[list[dict], list[StepResult]]:
    """Reset, then feed ``turns`` until the env says done; the initial messages and every step result."""
    env = CodeTestsEnv(command_timeout_s=20.0, test_timeout_s=30.0, **env_kwargs)  # type: ignore[arg-type]
    return play_scripted(env, task, turns)


def contents(result: StepResult) -> list[str]:
    return [m["content"] for m in result.observation]


def test_reset_lists_files_and_exposes_tool_schemas() -> None:
    env = CodeTestsEnv()
    initial, _ = play([])
    assert [m["role"] for m in initial] == ["system", "user"]
    assert "calc.py" in initial[1]["content"] and HIDDEN not in initial[1]["content"]
    names = [tool["function"]["name"] for tool in env.tools]
    assert names == ["read_file", "write_file", "run", "submit"] and env.tools is CODE_TOOLS


def test_read_write_and_run_tools_act_on_the_repository() -> None:
    write_then_cat = call("write_file", path="notes/todo.txt", content="remember-me") + call(
        "run", command="cat notes/todo.txt"
    )
    turns = [
        call("read_file", path="calc.py"),
        write_then_cat,
        call("run", command="python -c \"print('ran-' + 'ok')\""),
    ]
    _, results = play(turns)
    assert "NotImplementedError  # TODO" in contents(results[0])[0]
    assert [m["role"] for m in results[1].observation] == ["tool", "tool"]
    assert "notes/todo.txt" in contents(results[1])[0]
    assert "remember-me" in contents(results[1])[1]
    assert "ran-ok" in contents(results[2])[0]
    assert not any(r.done for r in results)


def test_submitting_a_correct_solution_scores_one() -> None:
    _, results = play([call("write_file", path="calc.py", content=GOOD), call("submit")])
    assert results[-1].done and results[-1].reward == 1.0
    assert results[-1].info["submitted"] is True and results[-1].info["tests_passed"] is True


def test_submitting_a_wrong_solution_scores_zero() -> None:
    _, results = play([call("write_file", path="calc.py", content=BAD), call("submit")])
    assert results[-1].done and results[-1].reward == 0.0 and results[-1].info["tests_passed"] is False


def test_submit_ends_the_turn_and_later_calls_are_ignored() -> None:
    turn = (
        call("write_file", path="calc.py", content=GOOD)
        + call("submit")
        + call("write_file", path="calc.py", content=BAD)
    )
    _, results = play([turn])
    assert results[0].done and results[0].reward == 1.0


def test_malformed_tool_calls_get_error_observations_and_the_episode_continues() -> None:
    turns = [
        "<tool_call>{not json}</tool_call>",
        call("delete_everything"),
        call("read_file"),
        '<tool_call>{"name": "write_file", "arguments": {"path": "x.py", "content": 3}}</tool_call>',
        call("read_file", path="does_not_exist.py"),
        "<tool_call>" + json.dumps({"name": "run", "arguments": {"command": "true"}}),
    ]
    _, results = play(turns)
    assert len(results) == len(turns) and not any(r.done for r in results)
    for result in results:
        assert result.observation and all(m["role"] == "tool" for m in result.observation)
        assert any(c.startswith("error:") for c in contents(result)), contents(result)
    assert "unknown tool" in contents(results[1])[0]
    assert '"path"' in contents(results[2])[0]


def test_turn_without_tool_call_gets_a_nudge() -> None:
    _, results = play(["I will now think very hard."])
    assert results[0].observation == [{"role": "user", "content": NUDGE}] and not results[0].done


def test_hidden_tests_are_not_in_the_sandbox_before_submit() -> None:
    turns = [call("read_file", path=HIDDEN), call("run", command=f"ls -a; cat {HIDDEN}")]
    _, results = play(turns)
    assert contents(results[0])[0].startswith("error:")
    listing = contents(results[1])[0]
    assert "calc.py" in listing and "assertEqual" not in listing


def test_hidden_tests_overwrite_a_same_named_file_of_the_model() -> None:
    fake = "import unittest\n"  # an empty test module would pass with a wrong solution
    turns = [
        call("write_file", path=HIDDEN, content=fake) + call("write_file", path="calc.py", content=BAD),
        call("submit"),
    ]
    _, results = play(turns)
    assert results[-1].reward == 0.0


def test_max_turns_without_submit_still_runs_the_hidden_tests() -> None:
    _, results = play([call("write_file", path="calc.py", content=GOOD)], max_turns=1)
    assert results[0].done and results[0].reward == 1.0
    assert results[0].info["submitted"] is False and results[0].info["max_turns"] is True


def test_registered_under_code_tests() -> None:
    env = make_env("code_tests", max_turns=9)
    assert isinstance(env, CodeTestsEnv) and env.max_turns == 9


def _shipped_tasks() -> list[Task]:
    from sao.envs.tasks import load_tasks

    return load_tasks(DATA)


@pytest.mark.parametrize("with_solution", [True, False], ids=["solution", "starting-files"])
def test_shipped_tasks_pass_with_their_solution_and_fail_without(with_solution: bool) -> None:
    tasks = _shipped_tasks()
    assert len(tasks) >= 4 and all(t.metadata["env"] == "code_tests" for t in tasks)
    for task in tasks:
        writes = "".join(
            call("write_file", path=path, content=content)
            for path, content in task.metadata["solution"].items()
            if with_solution
        )
        _, results = play([writes + call("submit")], task=task)
        assert results[-1].reward == (1.0 if with_solution else 0.0), (task.id, results[-1].info)


def test_episode_through_the_agent_loop_shows_tools_and_grades_the_submission(tiny_tokenizer) -> None:
    from sao.rollout.agent_loop import AgentLoopConfig, run_episode

    turns = [call("write_file", path="calc.py", content=GOOD), call("run", command="ls"), call("submit")]
    engine = ScriptedEngine(tiny_tokenizer, turns)
    cfg = AgentLoopConfig(max_tokens_per_turn=512)
    traj = asyncio.run(run_episode(engine, tiny_tokenizer, CodeTestsEnv(), TASK, cfg))
    assert traj.rewards == [0.0, 0.0, 1.0] and traj.finish_reason == "stop"
    text = tiny_tokenizer.decode(traj.token_ids, skip_special_tokens=False)
    assert '"name": "read_file"' in text.split("<|im_start|>user")[0]  # the schemas are in the system turn
    assert "<tool_response>\nwrote" in text and "calc.py" in text.split("<tool_response>")[2]


def test_a_step_past_the_env_timeout_is_dropped_and_close_kills_the_sandbox_and_removes_it() -> None:
    """The agent loop's env timeout (`sao.rollout.env_calls`) on a real code env: a command that outlives the
    episode's step budget ends the episode as ``env_timeout``, and ``close`` (which the loop always awaits)
    kills what the command started and removes the scratch dir at once, not when the command's own
    (longer) sandbox timeout would have."""
    import time

    from sao.envs.sandbox_proc import find_processes
    from sao.rollout.env_calls import EpisodeError, close_env, reset_env, step_env

    async def main():
        env = CodeTestsEnv(command_timeout_s=60.0)
        await reset_env(env, TASK, 30)
        box = env._sandbox
        t0 = time.monotonic()
        with pytest.raises(EpisodeError) as err:
            await step_env(env, call("run", command="sleep 300 & sleep 300"), timeout_s=1.0)
        assert err.value.reason == "env_timeout"
        assert find_processes(uid=box._uid, marker=box._marker)  # the command is still running
        assert await close_env(env, 30) is None
        return box, time.monotonic() - t0

    box, took = asyncio.run(main())
    assert took < 20 and box.closed and not box.root.exists()
    assert find_processes(uid=box._uid, marker=box._marker) == []
