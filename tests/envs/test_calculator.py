"""The calculator env, end to end with scripted assistant turns (the env is under test, not a model)."""

from __future__ import annotations

import asyncio
import json
import runpy
import sys
from pathlib import Path

import pytest

from sao.envs import make_env
from sao.envs.base import Task
from sao.envs.calculator import (
    OPTIMAL_SCORE,
    TOOL_SCHEMA,
    CalcError,
    CalculatorEnv,
    answer_text,
    evaluate,
    make_tasks,
    optimal_policy,
    tool_call_text,
)
from sao.envs.sft_data import calculator_conversations, play_episode
from sao.models.chat import render_chat

from .scripted import play_scripted

TASK = Task(id="t", prompt="What is 37 * 12?", answer=444, metadata={"a": 37, "op": "*", "b": 12})
CALL = '<tool_call>{"name": "calc", "arguments": {"expr": "37*12"}}</tool_call>'


def play(turns: list[str], task: Task = TASK, env: CalculatorEnv | None = None):
    """Reset, then step each scripted turn until done; the initial messages and every StepResult."""
    return play_scripted(env or CalculatorEnv(), task, turns)


def test_canonical_formats_are_the_documented_strings():
    assert tool_call_text("37*12") == CALL
    assert answer_text(444) == "answer: 444"


def test_tool_call_then_answer_earns_reward_1():
    first, (call, answer) = play([CALL, "answer: 444"])
    assert first == [{"role": "user", "content": "What is 37 * 12?"}]
    assert call.observation == [{"role": "tool", "content": "444"}]
    assert (call.reward, call.done) == (0.0, False)
    assert (answer.reward, answer.done, answer.observation) == (1.0, True, [])
    assert answer.info["used_tool"] and answer.info["correct"]


@pytest.mark.parametrize(
    "call",
    [
        '<tool_call>\n{"name": "calc", "arguments": {"expr": "37 * 12"}}\n</tool_call>',
        '<tool_call>{"name":"calc","arguments":{"expr":"37*12"}}</tool_call>',
        'Let me compute. <tool_call> { "name" : "calc", "arguments" : { "expr" : "(37)*12" } } </tool_call>',
    ],
)
def test_whitespace_and_json_variants_of_the_call_are_accepted(call):
    _, (obs, answer) = play([call, "37*12=444"])
    assert obs.observation == [{"role": "tool", "content": "444"}]
    assert answer.reward == 1.0  # the last integer of the answer turn is the answer


def test_right_answer_without_the_tool_scores_zero():
    _, [answer] = play(["answer: 444"])
    assert (answer.reward, answer.done) == (0.0, True)
    assert answer.info["correct"] and not answer.info["used_tool"]


def test_wrong_answer_after_the_tool_scores_zero():
    _, results = play([CALL, "answer: 445"])
    assert results[-1].done and results[-1].reward == 0.0 and not results[-1].info["correct"]


def test_a_tool_result_for_another_expression_does_not_count_as_using_the_tool():
    other = tool_call_text("37*13")
    _, results = play([other, "answer: 444"])
    assert results[-1].reward == 0.0 and not results[-1].info["used_tool"]


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ("<tool_call>{calc 37*12}</tool_call>", "not valid JSON"),
        ('<tool_call>{"name": "calc", "arguments": {"expr": "37*12"}}', "not closed"),
        ('<tool_call>{"name": "python", "arguments": {"expr": "37*12"}}</tool_call>', "unknown tool"),
        (
            '<tool_call>{"name": "calc", "arguments": {"expr": "__import__(\'os\')"}}</tool_call>',
            "unexpected",
        ),
        ('<tool_call>{"name": "calc", "arguments": {"x": "1"}}</tool_call>', "expr must be a string"),
        ('<tool_call>{"name": "calc", "arguments": {"expr": "37*"}}</tool_call>', "ends early"),
    ],
)
def test_a_malformed_call_gets_a_tool_error_and_the_episode_continues(bad, reason):
    _, (err, _call, answer) = play([bad, CALL, "answer: 444"])
    [msg] = err.observation
    assert msg["role"] == "tool" and msg["content"].startswith("error:") and reason in msg["content"]
    assert (err.reward, err.done) == (0.0, False) and reason in err.info["error"]
    assert (answer.reward, answer.done) == (1.0, True)  # the retry turn still wins


def test_an_answer_turn_without_a_number_gets_an_error_observation():
    _, (err, _call, answer) = play(["I do not know.", CALL, "answer: 444"])
    assert err.observation == [{"role": "user", "content": "error: reply answer: <number>"}]
    assert not err.done and answer.reward == 1.0


def test_the_episode_ends_after_max_turns_with_reward_0():
    env = CalculatorEnv()
    assert env.max_turns == 3
    _, results = play([CALL, CALL, CALL, "answer: 444"], env=env)
    assert len(results) == 3
    assert results[-1].done and results[-1].reward == 0.0 and results[-1].info["truncated"]
    assert results[-1].observation == []


def test_step_outside_an_episode_reports_instead_of_raising():
    env = CalculatorEnv()
    result = asyncio.run(env.step("answer: 1"))
    assert result.done and result.reward == 0.0 and "error" in result.info
    play([CALL, "answer: 444"], env=env)
    again = asyncio.run(env.step("answer: 444"))
    assert again.done and again.reward == 0.0


@pytest.mark.parametrize(
    ("expr", "value"),
    [("37*12", 444), ("99-100", -1), (" 2 + 3 * 4 ", 14), ("(2+3)*4", 20), ("-5*-5", 25), ("0", 0)],
)
def test_evaluate_follows_the_tiny_grammar(expr, value):
    assert evaluate(expr) == value


@pytest.mark.parametrize(
    "expr", ["", "2**3", "2/3", "1e3", "abs(2)", "2 3", "(1+2", "1" * 13, "1+" * 40 + "1", None, 7]
)
def test_evaluate_rejects_everything_else(expr):
    with pytest.raises(CalcError):
        evaluate(expr)


def test_make_tasks_is_deterministic_and_extends():
    tasks = make_tasks(200, seed=3)
    assert tasks == make_tasks(200, seed=3)
    assert make_tasks(50, seed=3) == tasks[:50]
    assert [t.id for t in tasks[:2]] == ["calculator-3-0", "calculator-3-1"]
    assert [t.prompt for t in make_tasks(50, seed=4)] != [t.prompt for t in tasks[:50]]
    for t in tasks:
        a, op, b = t.metadata["a"], t.metadata["op"], t.metadata["b"]
        assert 0 <= a <= 99 and 0 <= b <= 99 and op in "+-*"
        assert t.prompt == f"What is {a} {op} {b}?" and t.answer == evaluate(f"{a}{op}{b}")
    assert {t.metadata["op"] for t in tasks} == set("+-*")


def test_the_optimal_policy_reaches_the_optimal_score():
    env = make_env("calculator")
    assert isinstance(env, CalculatorEnv)
    tasks = make_tasks(300, seed=1)

    async def run():
        return [(await play_episode(env, t, lambda m, t=t: optimal_policy(t, m)))[1] for t in tasks]

    rewards = asyncio.run(run())
    assert sum(rewards) / len(rewards) == OPTIMAL_SCORE == 1.0


def test_sft_conversations_render_replay_and_are_imperfect_as_documented(tiny_tokenizer):
    convs = calculator_conversations(400, seed=0)
    assert convs == calculator_conversations(400, seed=0)
    tasks = make_tasks(400, seed=0)
    rewards = []
    for task, messages in zip(tasks, convs, strict=True):
        render_chat(tiny_tokenizer, messages)
        # Replaying the assistant turns through the env reproduces the conversation exactly.
        turns = [m["content"] for m in messages if m["role"] == "assistant"]
        first, results = play(turns, task=task)
        replayed = list(first)
        for text, result in zip(turns, results, strict=True):
            replayed += [{"role": "assistant", "content": text}, *result.observation]
        assert replayed == messages
        rewards.append(results[-1].reward)
    no_tool = sum(not any(m["role"] == "tool" for m in c) for c in convs) / len(convs)
    assert 0.14 <= no_tool <= 0.26  # direct_frac = 0.2
    assert sum(rewards) / len(rewards) == pytest.approx(1 - no_tool)  # every tool episode wins
    direct_answers = [c[-1]["content"] for c, r in zip(convs, rewards, strict=True) if len(c) == 2]
    wrong = [
        c
        for c, t in zip(convs, tasks, strict=True)
        if len(c) == 2 and c[-1]["content"] != answer_text(t.answer)
    ]
    assert 0 < len(wrong) < len(direct_answers)  # some direct answers are wrong, some right


def test_make_tool_chats_example_writes_env_format_jsonl(tmp_path, monkeypatch):
    from sao.train.sft import load_chat_jsonl

    out = tmp_path / "chats.jsonl"
    script = Path(__file__).resolve().parents[2] / "examples" / "make_tool_chats.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--n", "20", "--out", str(out), "--seed", "5"])
    runpy.run_path(str(script), run_name="__main__")
    convs = load_chat_jsonl(out)
    assert [messages for messages, _ in convs] == calculator_conversations(20, seed=5)
    assert all(tools is None for _, tools in convs)
    assert json.loads(out.read_text().splitlines()[0]).keys() == {"messages"}

    with_tools = tmp_path / "chats_tools.jsonl"
    monkeypatch.setattr(sys, "argv", [str(script), "--n", "3", "--out", str(with_tools), "--tools"])
    runpy.run_path(str(script), run_name="__main__")
    assert all(tools == [TOOL_SCHEMA] for _, tools in load_chat_jsonl(with_tools))


def test_with_its_tool_schema_an_episode_has_the_tokens_of_the_same_gateway_session(tiny_tokenizer):
    """The env's prompt shows TOOL_SCHEMA as an OpenAI agent's tools=[...] does, so the agent loop's tokens
    equal a gateway session in which the client sends the structured tool call back."""
    from sao.engine.types import Generation
    from sao.rollout.agent_loop import AgentLoopConfig, run_episode
    from sao.serve.openai_api import split_tool_calls
    from sao.serve.sessions import ChatSession

    tok = tiny_tokenizer
    task = make_tasks(1, seed=9)[0]
    turns = [optimal_policy(task, []), answer_text(task.answer)]
    eot = "<|im_end|>"

    class Scripted:
        version = 0

        def __init__(self):
            self.texts = list(turns)

        async def generate(self, prompt_ids, params):
            ids = tok(self.texts.pop(0) + eot, add_special_tokens=False)["input_ids"]
            return Generation(ids, [-0.5] * len(ids), [0] * len(ids), "stop")

    env = CalculatorEnv(tool_schema=True)
    assert env.tools == [TOOL_SCHEMA]
    traj = asyncio.run(run_episode(Scripted(), tok, env, task, AgentLoopConfig(max_total_tokens=2000)))
    assert traj.rewards[-1] == 1.0 and "# Tools\n<tools>" in tok.decode(traj.token_ids)

    session = ChatSession(tok, "s")
    messages = [{"role": "user", "content": task.prompt}]
    for k, text in enumerate(turns):
        session.commit(plan := session.plan(messages, [TOOL_SCHEMA]))
        assert not plan.prefix_mismatch
        ids = tok(text + eot, add_special_tokens=False)["input_ids"]
        session.record_generation(ids, [-0.5] * len(ids), [0] * len(ids), "stop")
        content, calls = split_tool_calls(text)
        reply = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
        session.note_reply(reply)
        messages.append(reply)
        if k == 0:
            messages.append({"role": "tool", "tool_call_id": calls[0]["id"], "content": str(task.answer)})
    [gateway] = session.trajectories([1.0])
    assert gateway.token_ids == traj.token_ids and gateway.action_mask == traj.action_mask
