"""JudgedEnv: an env's episodes graded by an LLM judge — combine modes, where the episode ends, what the
judge is shown, failures as JudgeError (the agent loop's judge_error drop), the gateway's score path, and
the judge SFT data of examples/make_judge_chats.py."""

from __future__ import annotations

import asyncio
import json
import runpy
import sys
from pathlib import Path

import httpx
import pytest

from sao.envs.base import JudgeError, StepResult, Task, TrainingProgress, notify_training_progress
from sao.envs.calculator import CalculatorEnv
from sao.envs.judge_client import JudgeClient, JudgeSettings, parse_score, render_messages
from sao.envs.judged import COMBINES, JudgedEnv, episode_fields, transcript
from sao.envs.style_shift import StyleShiftEnv
from sao.rollout.env_calls import EpisodeError, step_env

from .scripted import play_scripted

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "make_judge_chats.py"


class CountingEnv:
    """Ends when the reply is ``done`` (reward 0.5); other turns earn 0.2 and get an observation."""

    name = "counting"

    def __init__(self, max_turns: int = 3) -> None:
        self.tools = [{"type": "function", "function": {"name": "noop"}}]
        self.max_turns = max_turns
        self.turn = 0
        self.closed = 0
        self.progress: TrainingProgress | None = None

    def set_training_progress(self, progress: TrainingProgress) -> None:
        self.progress = progress

    async def reset(self, task: Task):
        self.turn = 0
        return [{"role": "system", "content": "count"}, {"role": "user", "content": str(task.prompt)}]

    async def step(self, text: str) -> StepResult:
        self.turn += 1
        done = text == "done"
        info = {"turn": self.turn, "target": "tidy"}
        return StepResult(
            [] if done else [{"role": "user", "content": f"obs{self.turn}"}], 0.5 if done else 0.2, done, info
        )

    async def close(self) -> None:
        self.closed += 1


TASK = Task(id="t1", prompt="count to two", answer="two")


def _judge(answer: str = "Score: 8", status: int = 200, **kw):
    """A judge client whose server answers ``answer``; the requests it saw are returned too."""
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        if status != 200:
            return httpx.Response(status, text="down")
        return httpx.Response(200, json={"choices": [{"message": {"content": answer}}]})

    prompt = kw.pop(
        "prompt", "P={prompt}|A={answer}|W={reward}|T={info[target]}|R={response}\n{conversation}"
    )
    settings = JudgeSettings(base_url="http://judge.test", model="grader", prompt=prompt, **kw)
    return JudgeClient(settings, httpx.MockTransport(handler)), seen


def _play(env, turns: list[str], task: Task = TASK) -> list[StepResult]:
    return play_scripted(env, task, turns)[1]


@pytest.mark.parametrize(
    ("combine", "reward"), [("product", 0.4), ("sum", 1.3), ("mean", 0.65), ("judge", 0.8)]
)
def test_the_last_step_reward_combines_env_and_judge_and_earlier_steps_pass_through(combine, reward):
    client, seen = _judge("Looks right. Score: 8")
    env = JudgedEnv(CountingEnv(), client, combine)
    first, last = _play(env, ["one", "done"])
    assert (first.reward, first.done, first.info) == (0.2, False, {"turn": 1, "target": "tidy"})
    assert last.reward == pytest.approx(reward) and last.done
    assert last.info == {
        "turn": 2,
        "target": "tidy",
        "judge_score": 0.8,
        "env_reward": 0.5,
        "judge_latency_s": last.info["judge_latency_s"],
        "judge_cached": False,
    }
    assert last.info["judge_latency_s"] > 0 and len(seen) == 1
    assert COMBINES[combine](0.5, 0.8) == pytest.approx(reward)


def test_the_judge_sees_the_whole_recorded_episode_in_the_template():
    client, seen = _judge()
    _play(JudgedEnv(CountingEnv(), client), ["one", "done"])
    (request,) = seen
    assert request["messages"][-1]["content"] == (
        "P=count to two|A=two|W=0.5|T=tidy|R=done\n"
        "system: count\nuser: count to two\nassistant: one\nuser: obs1\nassistant: done"
    )


def test_an_episode_that_reaches_max_turns_is_graded_at_that_step():
    client, seen = _judge("Score: 5")
    env = JudgedEnv(CountingEnv(max_turns=3), client, "sum", max_turns=2)  # the run's bound is smaller
    assert env.max_turns == 2
    results = _play(env, ["a", "b", "c"])[:2]
    assert [r.reward for r in results] == [0.2, pytest.approx(0.7)] and not results[1].done
    assert results[1].info["judge_score"] == 0.5 and len(seen) == 1
    # the final observation is not part of what the judge saw: the agent loop stops there
    assert seen[0]["messages"][-1]["content"].endswith("assistant: a\nuser: obs1\nassistant: b")
    # without a run bound, the env's own
    env = JudgedEnv(CountingEnv(max_turns=3), client, max_turns=None)
    assert env.max_turns == 3 and [("judge_score" in r.info) for r in _play(env, ["a", "b", "c"])] == [
        False,
        False,
        True,
    ]
    assert JudgedEnv(CountingEnv(max_turns=3), client, max_turns=10).max_turns == 3


def test_a_second_episode_on_the_same_wrapper_is_recorded_afresh_and_cached_when_identical():
    client, seen = _judge()
    env = JudgedEnv(CountingEnv(), client)
    one = _play(env, ["done"])[-1]
    two = _play(env, ["done"])[-1]
    assert (one.info["judge_cached"], two.info["judge_cached"], len(seen)) == (False, True, 1)
    assert two.reward == one.reward == pytest.approx(0.4)


@pytest.mark.parametrize(("answer", "status"), [("Score: 8", 500), ("I cannot tell", 200)])
def test_a_failed_judge_raises_judge_error_which_the_agent_loop_drops_as_judge_error(answer, status):
    client, _ = _judge(answer, status, retries=0)
    env = JudgedEnv(CountingEnv(), client)
    with pytest.raises(JudgeError):
        _play(env, ["done"])

    async def through_the_agent_loop():
        await env.reset(TASK)
        return await step_env(env, "done", timeout_s=10)

    with pytest.raises(EpisodeError) as err:
        asyncio.run(through_the_agent_loop())
    assert err.value.reason == "judge_error"


def test_the_wrapper_forwards_name_tools_progress_and_close():
    client, _ = _judge()
    inner = CountingEnv()
    env = JudgedEnv(inner, client)
    assert env.name == "counting" and env.tools == inner.tools
    notify_training_progress(env, TrainingProgress(step=3, trained_trajectories=96))
    assert inner.progress == TrainingProgress(step=3, trained_trajectories=96)
    _play(env, ["done"])
    assert inner.closed == 1


def test_invalid_combine_and_turn_bounds_are_refused():
    client, _ = _judge()
    with pytest.raises(ValueError, match="unknown judge combine 'max'"):
        JudgedEnv(CountingEnv(), client, "max")
    with pytest.raises(ValueError, match="max_turns"):
        JudgedEnv(CountingEnv(), client, max_turns=0)


def test_style_shift_under_the_judge_sees_the_preferred_style_from_its_info():
    client, seen = _judge("Score: 10", prompt="Style {info[style]}? {response}", score_max=10)
    env = JudgedEnv(StyleShiftEnv(shift_every=10), client, "product")
    notify_training_progress(env, TrainingProgress(step=0, trained_trajectories=25))  # classical
    task = Task(id="s", prompt="Write one sentence about cat.", metadata={"topic": "cat"})
    (result,) = _play(env, ["Thy cat doth sleep."], task)
    assert seen[0]["messages"][-1]["content"] == "Style classical? Thy cat doth sleep."
    assert result.reward == 1.0 and result.info["style"] == "classical"


def test_score_combines_the_envs_own_score_with_the_judge_or_uses_the_judge_alone():
    client, seen = _judge("Score: 6", prompt="{answer}|{reward}|{response}\n{conversation}")
    task = Task(id="c", prompt="What is 2 * 3?", answer=6)
    messages = [
        {"role": "user", "content": "What is 2 * 3?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "2*3"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "1", "content": "6"},
        {"role": "assistant", "content": "answer: 6"},
    ]
    assert asyncio.run(JudgedEnv(CalculatorEnv(), client, "product").score(task, messages)) == pytest.approx(
        0.6
    )
    assert seen[-1]["messages"][-1]["content"] == (
        '6|1.0|answer: 6\nuser: What is 2 * 3?\nassistant: [tool call] calc({"expr": "2*3"})\ntool: 6\n'
        "assistant: answer: 6"
    )
    wrong = [*messages[:-1], {"role": "assistant", "content": "answer: 7"}]
    assert asyncio.run(JudgedEnv(CalculatorEnv(), client, "sum").score(task, wrong)) == pytest.approx(0.6)
    # an env without score(): the judge alone, whatever the combine; reward renders empty
    assert asyncio.run(JudgedEnv(CountingEnv(), client, "product").score(task, messages)) == pytest.approx(
        0.6
    )
    assert seen[-1]["messages"][-1]["content"].startswith("6||answer: 6")


def test_score_raises_judge_error_when_the_judge_fails():
    client, _ = _judge(status=503, retries=0, prompt="{response}")
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    with pytest.raises(JudgeError):
        asyncio.run(JudgedEnv(CalculatorEnv(), client).score(Task(id="c", prompt="q", answer=1), messages))


def test_episode_fields_take_the_first_user_and_last_assistant_message():
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "first"}]},
        {"role": "assistant", "content": "mid"},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": "last"},
    ]
    fields = episode_fields(messages, answer=3, reward=1.0, info={"k": 1})
    assert (fields.prompt, fields.response, fields.answer, fields.reward, dict(fields.info)) == (
        "first",
        "last",
        3,
        1.0,
        {"k": 1},
    )
    assert (
        fields.conversation
        == transcript(messages)
        == "system: sys\nuser: first\nassistant: mid\nuser: second\nassistant: last"
    )


# --- the judge SFT data ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def example():
    return runpy.run_path(str(EXAMPLE))


def test_judge_chats_are_the_clients_exact_requests_with_the_labels_answer(example):
    convs = example["judge_conversations"](400, seed=1)
    assert convs == example["judge_conversations"](400, seed=1)
    settings = example["judge_settings"]()
    labels = []
    for messages in convs:
        request, answer = messages[:-1], messages[-1]
        assert answer["role"] == "assistant" and answer["content"] in ("Score: 0", "Score: 1")
        (user,) = request  # no system prompt
        prompt, rest = user["content"].removeprefix("Question: ").split("\nReference: ", 1)
        reference, rest = rest.split("\nResponse: ", 1)
        response = rest.rsplit("\nIs the response's final answer", 1)[0]
        fields = episode_fields(
            [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}],
            answer=int(reference),
        )
        assert render_messages(settings, fields) == request  # byte for byte what JudgeClient sends
        label = parse_score(answer["content"], settings.score_min, settings.score_max)
        assert label == example["judge_label"](response, int(reference))
        labels.append(label)
    assert 0.35 <= sum(labels) / len(labels) <= 0.65  # balanced
    kinds = {m[0]["content"].split("\nResponse: ")[1][:9] for m in convs}
    assert any(k.startswith("<tool_cal") for k in kinds) and any(k.startswith("<answer>") for k in kinds)


@pytest.mark.parametrize(
    ("response", "label"),
    [
        ("answer: 444", 1),
        ("37*12=444", 1),
        ("444? No: answer: 445", 0),
        ('<tool_call>{"name": "calc", "arguments": {"expr": "400+44"}}</tool_call> 444', 0),
        ("I am not sure.", 0),
        ("<answer>-444</answer>", 0),
    ],
)
def test_judge_label_reads_the_last_integer_of_a_non_tool_call_response(example, response, label):
    assert example["judge_label"](response, 444) == label


def test_make_judge_chats_cli_writes_jsonl_and_prints_the_run_settings(
    example, tmp_path, monkeypatch, capsys
):
    from sao.train.sft import load_chat_jsonl

    out = tmp_path / "judge.jsonl"
    monkeypatch.setattr(
        sys, "argv", [str(EXAMPLE), "--n", "30", "--seed", "2", "--families", "arithmetic", "--out", str(out)]
    )
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    printed = capsys.readouterr().out
    assert f"wrote 30 conversations to {out}" in printed and "score_max: 1" in printed
    rows = [m for m, _ in load_chat_jsonl(out)]
    assert rows == example["judge_conversations"](30, 2, ("arithmetic",))
    assert all("Calculate" in r[0]["content"] for r in rows)
    with pytest.raises(ValueError, match="unknown or no families"):
        example["judge_conversations"](3, 0, ("chess",))


@pytest.mark.parametrize(
    ("response", "label"),
    [
        ("12 + 7 = 19\n<answer>19</answer>", 1),
        ("leech: 2 * 0 = 0\n0 + 12 = 12\n<answer>12</answer>", 1),
        ("<answer>19</answer>", 0),
        ("Working it out step by step.\n<answer>19</answer>", 0),
        ("answer = 19", 0),
        ('<tool_call>{"name": "calc", "arguments": {"expr": "12+7"}}</tool_call> 12+7=19', 0),
    ],
)
def test_the_style_judge_labels_responses_that_show_a_worked_step(example, response, label):
    assert example["work_label"](response) == label


def test_style_judge_chats_ask_the_work_question_with_its_labels(example):
    convs = example["judge_conversations"](200, 3, ("arithmetic",), "work")
    settings = example["judge_settings"](criterion="work")
    for messages in convs:
        (user,), answer = messages[:-1], messages[-1]
        assert "Does the response show its working" in user["content"] and "Reference" not in user["content"]
        response = user["content"].split("\nResponse: ", 1)[1].rsplit("\nDoes the response", 1)[0]
        fields = episode_fields(
            [{"role": "user", "content": user["content"].split("\n")[0].removeprefix("Question: ")},
             {"role": "assistant", "content": response}]
        )  # fmt: skip
        assert render_messages(settings, fields) == [user]
        assert answer["content"] == f"Score: {example['work_label'](response)}"
    assert 0.1 < sum(m[-1]["content"] == "Score: 1" for m in convs) / len(convs) < 0.9
