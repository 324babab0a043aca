"""The `verifiers` adapter (`sao.envs.verifiers_env`) on environments written against the library's public
0.4 API (``verifiers.v1``), in `tests/envs/vf_envs/` and loaded by module name as installed hub packages
are: a single-turn taskset (`sao_vf_sum`), a multi-turn game whose env answers each guess
(`sao_vf_guess`), and a taskset with python tool functions (`sao_vf_calc`). A run config points at one
the same way (with the package installed, or its folder on ``PYTHONPATH``)::

    data:
      env: verifiers
      env_kwargs: {env_id: sao_vf_guess, env_args: {num_tasks: 4}, max_turns: 6}
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verifiers.v1")

from sao.envs.base import EnvError, Task, score_conversation
from sao.envs.factory import make_env, make_env_tasks
from sao.envs.tasks import load_tasks, save_tasks_jsonl
from sao.envs.verifiers_env import VerifiersEnv

from .scripted import ScriptedEngine, play_scripted

VF_ENVS = Path(__file__).parent / "vf_envs"


@pytest.fixture(autouse=True)
def _vf_envs_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(VF_ENVS))


def tasks(env_id: str, n: int = 1, seed: int = 0, **env_args) -> list[Task]:
    return VerifiersEnv.make_tasks(n, seed, env_id=env_id, env_args=env_args)


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


# --- single turn -------------------------------------------------------------------------------


def test_single_turn_prompt_is_the_system_prompt_few_shot_and_question_as_the_library_sends_them() -> None:
    [task] = tasks("sao_vf_sum", seed=3)
    initial, _ = play_scripted(VerifiersEnv("sao_vf_sum"), task, [task.answer])
    assert initial == task.prompt
    assert [m["role"] for m in initial] == ["system", "user", "assistant", "user"]
    assert initial[0]["content"] == "Answer with the number only." and initial[2]["content"] == "2"


@pytest.mark.parametrize(("reply", "reward"), [("{answer}", 1.0), ("{answer}0", 0.0)], ids=["right", "wrong"])
def test_single_turn_exact_answer_is_rewarded_by_the_tasks_reward_function(reply: str, reward: float) -> None:
    [task] = tasks("sao_vf_sum", seed=1)
    _, [result] = play_scripted(VerifiersEnv("sao_vf_sum"), task, [reply.format(answer=task.answer)])
    assert result.done and result.observation == [] and result.reward == reward
    assert result.info["rewards"] == {"exact_answer": reward} and result.info["reward_weights"] == {
        "exact_answer": 1.0
    }
    assert result.info["metrics"] == {"reply_chars": float(len(reply.format(answer=task.answer)))}
    assert result.info["stop_condition"] == "agent_completed" and result.info["turns"] == 1


def test_reasoning_is_split_off_before_the_reward_reads_the_reply() -> None:
    [task] = tasks("sao_vf_sum")
    _, [result] = play_scripted(
        VerifiersEnv("sao_vf_sum"), task, [f"<think>\nadd them\n</think>\n\n{task.answer}"]
    )
    assert result.reward == 1.0


def test_a_non_finite_reward_raises_instead_of_scoring() -> None:
    [task] = tasks("sao_vf_sum", task={"nan_reward": True})
    env = VerifiersEnv("sao_vf_sum", env_args={"task": {"nan_reward": True}})
    with pytest.raises(RuntimeError, match=r"exact_answer.*not finite"):
        play_scripted(env, task, [task.answer])


def test_a_hook_that_uses_the_runtime_raises_as_sao_runs_no_sandbox() -> None:
    [task] = tasks("sao_vf_sum", task={"use_runtime": True})
    env = VerifiersEnv("sao_vf_sum", env_args={"task": {"use_runtime": True}})
    with pytest.raises(Exception, match=r"uses its runtime \(runtime\.run\)"):  # vf wraps it (TaskError)
        play_scripted(env, task, [task.answer])


# --- multi turn: the env's run() answers each turn -----------------------------------------------


def test_multi_turn_env_answers_each_guess_and_records_its_reward() -> None:
    [task] = tasks("sao_vf_guess")
    secret = task.metadata["data"]["secret"]
    guesses = [str(secret - 1), "twenty", str(secret + 1), str(secret)]
    env = VerifiersEnv("sao_vf_guess")
    _, results = play_scripted(env, task, guesses)
    assert [r.observation for r in results[:3]] == [
        [{"role": "user", "content": "Higher."}],
        [{"role": "user", "content": "Reply with one number."}],
        [{"role": "user", "content": "Lower."}],
    ]
    assert [r.done for r in results] == [False, False, False, True] and results[-1].reward == 1.0
    assert results[-1].info["rewards"] == {"solved": 1.0} and results[-1].info["metrics"] == {"guesses": 4.0}


def test_multi_turn_env_stops_at_its_own_turn_limit_and_still_scores() -> None:
    [task] = tasks("sao_vf_guess")
    wrong = str(task.metadata["data"]["secret"] % 20 + 1)
    env = VerifiersEnv("sao_vf_guess")
    assert env.max_turns == 6  # the env's player AgentConfig(max_turns=6)
    _, results = play_scripted(env, task, [wrong] * 10)
    assert len(results) == 6 and results[-1].done and results[-1].reward == 0.0
    assert results[-1].info["stop_condition"] == "max_turns" and results[-1].info["rewards"] == {
        "solved": 0.0
    }

    short = VerifiersEnv("sao_vf_guess", max_turns=2)
    _, results = play_scripted(short, task, [wrong] * 10)
    assert short.max_turns == 2 and len(results) == 2 and results[-1].done


def test_an_exception_in_the_envs_response_raises_from_step() -> None:
    [task] = tasks("sao_vf_guess", crash_after=1)
    wrong = str(task.metadata["data"]["secret"] % 20 + 1)
    env = VerifiersEnv("sao_vf_guess", env_args={"crash_after": 1})
    results: list = []

    async def go() -> None:
        await env.reset(task)
        try:
            results.append(await env.step(wrong))
            await env.step(wrong)
        finally:
            await env.close()

    with pytest.raises(RuntimeError, match="the game engine crashed"):
        asyncio.run(go())
    assert results[0].observation and not results[0].done  # the first guess was answered


def test_closing_a_cut_episode_cancels_the_envs_control_flow() -> None:
    [task] = tasks("sao_vf_guess")
    env = VerifiersEnv("sao_vf_guess")

    async def go() -> bool:
        await env.reset(task)
        await env.step("1")
        await env.close()
        return env._play.cancelled()

    assert asyncio.run(go())


# --- tools -------------------------------------------------------------------------------------


def test_tool_env_exposes_its_toolsets_as_function_schemas() -> None:
    env = VerifiersEnv("sao_vf_calc")
    by_name = {t["function"]["name"]: t for t in env.tools}
    assert sorted(by_name) == ["calc_digits", "calc_divide", "calc_multiply"]
    multiply = by_name["calc_multiply"]
    assert multiply["type"] == "function" and multiply["function"]["description"] == "Multiply two integers."
    assert multiply["function"]["parameters"]["required"] == ["a", "b"]
    assert VerifiersEnv("sao_vf_sum").tools is None

    async def build_in_a_running_loop() -> VerifiersEnv:  # as the runtime builds envs: tools listed anyway
        return VerifiersEnv("sao_vf_calc", env_args={"num_tasks": 2})

    assert asyncio.run(build_in_a_running_loop()).tools == env.tools


def test_tool_calls_are_run_and_their_results_observed_then_the_answer_rewarded() -> None:
    [task] = tasks("sao_vf_calc")  # 12 * 34
    turns = [call("calc_digits"), call("calc_multiply", a=12, b=34), "408"]
    _, results = play_scripted(VerifiersEnv("sao_vf_calc"), task, turns)
    assert results[0].observation[0]["content"] == "The answer has 3 digits."  # its setup_task saw the row
    assert results[1].observation == [
        {"role": "tool", "content": "408", "tool_call_id": "call_1_0", "name": "calc_multiply"}
    ]
    assert [r.done for r in results] == [False, False, True] and results[-1].reward == 1.0
    assert results[-1].info["metrics"] == {
        "tool_calls": 2.0
    }  # the calls are structured on the trace's replies


def test_answering_without_the_tools_is_scored_and_a_wrong_answer_gets_zero() -> None:
    [task] = tasks("sao_vf_calc")
    _, [result] = play_scripted(VerifiersEnv("sao_vf_calc"), task, ["400"])
    assert result.done and result.reward == 0.0 and result.info["metrics"] == {"tool_calls": 0.0}


def test_malformed_unknown_and_failing_tool_calls_answer_with_errors_and_the_episode_goes_on() -> None:
    [task] = tasks("sao_vf_calc")
    turns = [
        "<tool_call>{not json</tool_call>",
        call("calc_power", a=2, b=3) + call("calc_divide", a=1, b=0),
        "<tool_call>" + json.dumps({"name": "calc_multiply", "arguments": {"a": 12}}) + "</tool_call>",
        "408",
    ]
    _, results = play_scripted(VerifiersEnv("sao_vf_calc"), task, turns)
    [malformed], [unknown, failing], [invalid] = (r.observation for r in results[:3])
    assert malformed["role"] == "tool" and malformed["content"].startswith(
        "error: tool call is not valid JSON"
    )
    assert unknown["content"] == "error: unknown tool 'calc_power'"
    assert failing["content"] == "Error executing tool divide: division by zero"
    assert "Error executing tool multiply" in invalid["content"] and "b" in invalid["content"]
    assert results[-1].done and results[-1].reward == 1.0


def test_a_response_stop_hook_ends_the_rollout_and_it_is_scored() -> None:
    [task] = tasks("sao_vf_calc")
    _, results = play_scripted(VerifiersEnv("sao_vf_calc"), task, ["I give up", "408"])
    assert len(results) == 1 and results[0].done and results[0].reward == 0.0
    assert results[0].info["stop_condition"] == "gave_up"


# --- tasks, loading, registry, scoring ---------------------------------------------------------


def test_make_tasks_is_deterministic_in_the_seed_and_cycles_with_unique_ids() -> None:
    first, again, other = (
        tasks("sao_vf_sum", 5, seed=7),
        tasks("sao_vf_sum", 5, seed=7),
        tasks("sao_vf_sum", 5, seed=8),
    )
    assert first == again and [t.id for t in first] != [t.id for t in other]
    assert sorted(t.metadata["row"] for t in first) == [0, 1, 2, 3, 4]
    many = tasks("sao_vf_sum", 12, seed=7, num_tasks=5)
    assert len(many) == 12 and len({t.id for t in many}) == 12 and many[:5] == first
    assert sorted(t.metadata["row"] for t in many[5:10]) == [0, 1, 2, 3, 4]
    assert first[0].answer == first[0].metadata["data"]["answer"]


def test_tasks_survive_the_task_file_round_trip_and_play_the_same(tmp_path: Path) -> None:
    made = tasks("sao_vf_guess", 3, seed=2) + tasks("sao_vf_sum", 2)
    path = tmp_path / "tasks.jsonl"
    save_tasks_jsonl(path, made)
    loaded = load_tasks(path)
    assert loaded == made
    secret = str(loaded[0].metadata["data"]["secret"])
    _, results = play_scripted(VerifiersEnv("sao_vf_guess"), loaded[0], [secret])
    assert results[-1].reward == 1.0


def test_registered_as_verifiers_with_its_task_generator_reading_the_env_kwargs() -> None:
    env_kwargs = {"env_id": "sao_vf_guess", "env_args": {"num_tasks": 2}, "max_turns": 3}
    env = make_env("verifiers", **env_kwargs)
    assert isinstance(env, VerifiersEnv) and env.max_turns == 3 and env.name == "verifiers:sao_vf_guess"
    made = make_env_tasks("verifiers", 4, 0, **env_kwargs)
    assert len(made) == 4 and {t.metadata["row"] for t in made} == {0, 1}


def test_unknown_environments_and_config_keys_are_refused_with_an_env_error() -> None:
    with pytest.raises(EnvError, match="no_such_vf_package"):
        make_env("verifiers", env_id="no_such_vf_package")
    with pytest.raises(EnvError, match="num_taskz"):
        VerifiersEnv("sao_vf_sum", env_args={"num_taskz": 3})
    with pytest.raises(EnvError, match="max_turns"):
        VerifiersEnv("sao_vf_sum", max_turns=0)
    with pytest.raises(EnvError, match="env_id"):
        VerifiersEnv.make_tasks(1, 0)


def test_without_the_library_the_module_imports_and_building_says_how_to_install() -> None:
    code = (
        "import sys; sys.modules['verifiers'] = None; sys.modules['verifiers.v1'] = None\n"
        "from sao.envs.base import EnvError\n"
        "from sao.envs.verifiers_env import VerifiersEnv\n"
        "try:\n    VerifiersEnv('sao_vf_sum')\nexcept EnvError as err:\n    print(err)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert "pip install 'sao[verifiers]'" in out.stdout


def test_score_verifies_a_conversation_with_the_tasks_reward_functions() -> None:
    [task] = tasks("sao_vf_sum")
    env = VerifiersEnv("sao_vf_sum")
    right = [*task.prompt, {"role": "assistant", "content": task.answer}]
    wrong = [*task.prompt, {"role": "assistant", "content": "-1"}]
    assert asyncio.run(score_conversation(env, task, right)) == 1.0
    assert asyncio.run(score_conversation(env, task, wrong)) == 0.0
    [guess] = tasks("sao_vf_guess")
    with pytest.raises(EnvError, match="run"):
        asyncio.run(score_conversation(VerifiersEnv("sao_vf_guess"), guess, right))


def test_an_episode_through_the_agent_loop_shows_the_tools_and_rewards_the_answer(tiny_tokenizer) -> None:
    from sao.rollout.agent_loop import AgentLoopConfig, run_episode

    [task] = tasks("sao_vf_calc")
    engine = ScriptedEngine(tiny_tokenizer, [call("calc_multiply", a=12, b=34), "408"])
    env = VerifiersEnv("sao_vf_calc")
    traj = asyncio.run(
        run_episode(engine, tiny_tokenizer, env, task, AgentLoopConfig(max_tokens_per_turn=256))
    )
    assert traj.rewards == [0.0, 1.0] and traj.finish_reason == "stop"
    text = tiny_tokenizer.decode(traj.token_ids, skip_special_tokens=False)
    assert (
        '"name": "calc_multiply"' in text.split("<|im_start|>user")[0]
    )  # the schemas are in the system turn
    assert "<tool_response>\n408" in text


def test_a_multi_turn_game_through_the_agent_loop_gets_the_envs_answers_as_user_turns(tiny_tokenizer) -> None:
    from sao.rollout.agent_loop import AgentLoopConfig, run_episode

    [task] = tasks("sao_vf_guess", seed=1)
    secret = task.metadata["data"]["secret"]
    engine = ScriptedEngine(tiny_tokenizer, [str(secret % 20 + 1), str(secret)])
    traj = asyncio.run(
        run_episode(engine, tiny_tokenizer, VerifiersEnv("sao_vf_guess"), task, AgentLoopConfig())
    )
    assert traj.rewards == [0.0, 1.0] and traj.finish_reason == "stop"
    text = tiny_tokenizer.decode(traj.token_ids, skip_special_tokens=False)
    assert "<|im_start|>user\nLower.<|im_end|>" in text or "<|im_start|>user\nHigher.<|im_end|>" in text
