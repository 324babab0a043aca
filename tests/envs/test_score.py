"""Scoring finished conversations an env did not play (`score_conversation`, the envs' ``score``).

Every expected reward is worked out by hand from the env's rule; the calculator's ``score`` is also checked
against what playing the same turns through ``reset``/``step`` rewards.
"""

from __future__ import annotations

import asyncio
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sao.envs.base import EnvError, Message, Task, has_scorer, initial_messages, score_conversation
from sao.envs.calculator import CalculatorEnv, answer_text, evaluate, optimal_policy, tool_call_text
from sao.envs.guess_number import GuessNumberEnv, guess_text
from sao.envs.guess_number import optimal_policy as guess_policy

from .scripted import play_scripted

TASK = Task(id="t", prompt="What is 37 * 12?", answer=444, metadata={"a": 37, "op": "*", "b": 12})
USER = {"role": "user", "content": "What is 37 * 12?"}
CALL = tool_call_text("37*12")


def score(env, messages: list[Message], task: Task = TASK) -> float:
    return asyncio.run(score_conversation(env, task, messages))


def assistant(content: str | None, **extra) -> Message:
    return {"role": "assistant", "content": content, **extra}


def tool(content: str, **extra) -> Message:
    return {"role": "tool", "content": content, **extra}


def structured_call(expr: str, call_id: str = "call_1") -> Message:
    """An OpenAI-format assistant turn calling calc (structured ``tool_calls``, no content)."""
    function = {"name": "calc", "arguments": json.dumps({"expr": expr})}
    return assistant(None, tool_calls=[{"id": call_id, "type": "function", "function": function}])


# --- calculator -----------------------------------------------------------------------------------------


def test_calculator_correct_answer_read_off_the_tool_scores_one():
    messages = [USER, assistant(CALL), tool("444"), assistant("answer: 444")]
    assert score(CalculatorEnv(), messages) == 1.0


def test_calculator_structured_tool_calls_in_openai_format_score_one():
    messages = [
        {"role": "system", "content": "You are a calculator agent."},
        USER,
        structured_call("37*12"),
        tool("444", tool_call_id="call_1"),
        assistant("37*12=444"),  # the last integer is the answer
    ]
    assert score(CalculatorEnv(), messages) == 1.0


def test_calculator_correct_answer_without_a_tool_message_scores_zero():
    assert score(CalculatorEnv(), [USER, assistant("answer: 444")]) == 0.0
    # the value in an assistant turn or a user turn is not a tool result
    messages = [USER, assistant("it is 444"), {"role": "user", "content": "444"}, assistant("answer: 444")]
    assert score(CalculatorEnv(), messages) == 0.0


def test_calculator_wrong_answer_scores_zero():
    assert score(CalculatorEnv(), [USER, assistant(CALL), tool("444"), assistant("answer: 443")]) == 0.0
    assert score(CalculatorEnv(), [USER, assistant(CALL), tool("444"), assistant("no idea")]) == 0.0


def test_calculator_tool_result_must_be_exactly_the_answer():
    other = [USER, structured_call("37*11"), tool("407"), assistant("answer: 444")]
    assert score(CalculatorEnv(), other) == 0.0
    mentioned = [USER, structured_call("37*12"), tool("the result is 444"), assistant("answer: 444")]
    assert score(CalculatorEnv(), mentioned) == 0.0
    wrapped = [USER, structured_call("37*12"), tool("<tool_response>\n444\n</tool_response>")]
    assert score(CalculatorEnv(), [*wrapped, assistant("answer: 444")]) == 1.0
    parts = [{"type": "text", "text": "444"}]  # OpenAI content parts
    assert score(CalculatorEnv(), [USER, structured_call("37*12"), tool(parts), assistant("444")]) == 1.0


def test_calculator_final_turn_that_is_a_tool_call_scores_zero():
    earlier = [USER, structured_call("37*12"), tool("444")]
    assert score(CalculatorEnv(), [*earlier, structured_call("37*12", "call_2")]) == 0.0
    assert score(CalculatorEnv(), [*earlier, assistant("444 " + CALL)]) == 0.0  # text tool call
    with_content = assistant("answer: 444", tool_calls=structured_call("1+1")["tool_calls"])
    assert score(CalculatorEnv(), [*earlier, with_content]) == 0.0


def test_calculator_huge_integers_score_zero_without_raising():
    huge = "9" * 5000  # longer than int() converts by default
    assert score(CalculatorEnv(), [USER, assistant(CALL), tool(huge), assistant("answer: " + huge)]) == 0.0


def test_calculator_score_leaves_the_episode_in_progress_alone():
    env = CalculatorEnv()

    async def go() -> float:
        await env.reset(TASK)
        await env.step(CALL)
        assert await score_conversation(env, TASK, [USER, assistant("answer: 444")]) == 0.0
        return (await env.step("answer: 444")).reward

    assert asyncio.run(go()) == 1.0


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 99), st.sampled_from("+-*"), st.integers(0, 99))
def test_calculator_optimal_policy_conversation_scores_one_and_off_by_one_zero(a, op, b):
    meta = {"a": a, "op": op, "b": b}
    task = Task(id="p", prompt=f"What is {a} {op} {b}?", answer=evaluate(f"{a}{op}{b}"), metadata=meta)
    messages = initial_messages(task)
    call = optimal_policy(task, messages)
    messages += [assistant(call), tool(str(evaluate(f"{a}{op}{b}")))]
    final = optimal_policy(task, messages)
    assert final == answer_text(task.answer)
    env = CalculatorEnv()
    assert score(env, [*messages, assistant(final)], task) == 1.0
    for off in (task.answer - 1, task.answer + 1):
        assert score(env, [*messages, assistant(answer_text(off))], task) == 0.0


def played_conversation(env, task: Task, turns: list[str]) -> tuple[list[Message], float, bool]:
    """Play ``turns`` through reset/step; the conversation (initial messages, each turn, the env's
    observations), the last step's reward and whether the episode ended on the last turn."""
    initial, results = play_scripted(env, task, turns)
    messages = list(initial)
    for text, result in zip(turns, results, strict=False):  # play stops at done
        messages += [assistant(text), *result.observation]
    return messages, results[-1].reward, len(results) == len(turns) and results[-1].done


@pytest.mark.parametrize(
    ("turns", "expected"),
    [
        ([CALL, "answer: 444"], 1.0),
        ([CALL, "37*12=444"], 1.0),
        (["answer: 444"], 0.0),  # right, but not read off the tool
        ([CALL, "answer: 440"], 0.0),
        ([tool_call_text("37*11"), "answer: 407"], 0.0),  # the tool's value, but the wrong answer
        ([tool_call_text("37*11"), CALL, "answer: 444"], 1.0),
        ([tool_call_text("37/12"), "answer: 444"], 0.0),  # the tool answered error:
        ([CALL, CALL, CALL], 0.0),  # the last turn is a tool call (and the budget runs out)
    ],
)
def test_calculator_score_agrees_with_playing_the_turns(turns, expected):
    messages, reward, ended = played_conversation(CalculatorEnv(), TASK, turns)
    assert ended and reward == expected
    assert score(CalculatorEnv(), messages) == expected


# --- math_tir -------------------------------------------------------------------------------------------


@pytest.fixture
def math_env():
    from sao.envs.math_tir import MathTIREnv

    try:
        return MathTIREnv()
    except EnvError as err:  # no sandbox on this machine
        pytest.skip(str(err))


MATH = Task(id="apples", prompt="Tom has 3 bags of 14 apples. How many apples?", answer="42")
MATH_USER = {"role": "user", "content": MATH.prompt}


def test_math_tir_boxed_correct_and_incorrect(math_env):
    code = assistant(None, tool_calls=[{"id": "c", "type": "function", "function": {"name": "python"}}])
    ran = [MATH_USER, code, tool("42", tool_call_id="c")]
    assert score(math_env, [*ran, assistant("So the answer is \\boxed{42}.")], MATH) == 1.0
    assert score(math_env, [MATH_USER, assistant("\\boxed{42.0}")], MATH) == 1.0  # verify_answer: numeric
    assert score(math_env, [*ran, assistant("\\boxed{41}")], MATH) == 0.0
    assert score(math_env, [*ran, assistant("The answer is 42.")], MATH) == 0.0  # not boxed
    assert score(math_env, [*ran, code], MATH) == 0.0  # the final turn is a tool call


def test_math_tir_score_agrees_with_step(math_env):
    for turn, expected in [("3*14 = \\boxed{42}", 1.0), ("\\boxed{43}", 0.0)]:
        messages, reward, ended = played_conversation(math_env, MATH, [turn])
        assert ended and reward == expected
        assert score(math_env, messages, MATH) == expected


# --- guess_number ---------------------------------------------------------------------------------------

GUESS = Task(id="g", prompt="Guess my number from 1 to 16.", answer=11, metadata={"max_number": 16})
GUESS_USER = {"role": "user", "content": GUESS.prompt}


def test_guess_number_scores_the_final_guess_within_the_budget():
    env = GuessNumberEnv()  # budget 5 for N = 16
    hints = [GUESS_USER, assistant(guess_text(8)), {"role": "user", "content": "higher"}]
    assert score(env, [*hints, assistant(guess_text(11))], GUESS) == 1.0
    assert score(env, [*hints, assistant(guess_text(12))], GUESS) == 0.0
    assert score(env, [*hints, assistant("eleven")], GUESS) == 0.0
    too_long = [GUESS_USER] + [assistant(guess_text(1)), {"role": "user", "content": "higher"}] * 5
    assert score(env, [*too_long, assistant(guess_text(11))], GUESS) == 0.0  # turn 6 > 5
    shaped = GuessNumberEnv(shaping=0.25)
    assert score(shaped, [*hints, assistant(guess_text(11))], GUESS) == 0.75  # turn 2: 1 - 0.25


def test_guess_number_score_agrees_with_binary_search_play():
    env = GuessNumberEnv(shaping=0.1)
    for secret in (1, 11, 16):
        task = Task(id="g", prompt=GUESS.prompt, answer=secret, metadata={"max_number": 16})

        async def go(task=task) -> tuple[list[Message], float]:
            messages = await env.reset(task)
            while True:
                turn = guess_policy(messages)
                result = await env.step(turn)
                messages += [assistant(turn), *result.observation]
                if result.done:
                    return messages, result.reward

        messages, reward = asyncio.run(go())
        assert reward > 0.0 and score(GuessNumberEnv(shaping=0.1), messages, task) == pytest.approx(reward)


# --- score_conversation ---------------------------------------------------------------------------------


class NoScore:
    name = "no_score"


class FixedScore:
    def __init__(self, value) -> None:
        self.value = value
        self.seen: list = []

    def score(self, task: Task, messages: list[Message]):
        self.seen.append((task, messages))
        return self.value


class AsyncScore:
    async def score(self, task: Task, messages: list[Message]) -> float:
        await asyncio.sleep(0)
        return 0.5


def test_has_scorer():
    assert has_scorer(CalculatorEnv()) and has_scorer(GuessNumberEnv()) and has_scorer(AsyncScore())
    assert not has_scorer(NoScore())
    not_callable = NoScore()
    not_callable.score = 1.0  # an attribute named score is not a scorer
    assert not has_scorer(not_callable)


def test_env_without_score_is_an_env_error():
    with pytest.raises(EnvError, match=r"'no_score' has no score\(\).*explicit reward"):
        score(NoScore(), [USER, assistant("answer: 444")])


@pytest.mark.parametrize(
    "messages",
    [[], [USER], [USER, assistant("answer: 444"), tool("444")], [USER, "answer: 444"]],
    ids=["empty", "user-last", "tool-last", "not-a-dict"],
)
def test_last_message_must_be_an_assistant_message(messages):
    env = FixedScore(1.0)
    with pytest.raises(EnvError):
        score(env, messages)
    assert env.seen == []  # the env's score is not called on bad input


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "1.0", None, True, False, [1.0]])
def test_a_score_that_is_not_a_finite_real_number_is_an_env_error(bad):
    with pytest.raises(EnvError, match="FixedScore"):
        score(FixedScore(bad), [USER, assistant("x")])


def test_scores_are_floats_and_the_conversation_is_passed_through():
    env = FixedScore(1)
    messages = [USER, assistant("x")]
    result = score(env, messages)
    assert result == 1.0 and type(result) is float
    assert env.seen == [(TASK, messages)]


def test_an_async_score_is_awaited():
    assert score(AsyncScore(), [USER, assistant("x")]) == 0.5
