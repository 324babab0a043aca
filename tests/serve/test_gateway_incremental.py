"""A gateway session costs O(new messages) per request: it renders and tokenizes only what a request adds
(counted on the real tokenizer, through real HTTP requests to the app and a real LocalEngine), converts and
checks only the messages the session's last request did not have (`MessageMemo`, `ConversionMemo`: the
same result as converting everything), and still records exactly the token-in/token-out stream; a request
that edits its history still opens a new branch."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from fastapi import HTTPException

from sao.engine import LocalEngine
from sao.envs.calculator import TOOL_SCHEMA, tool_call_text
from sao.models.chat_delta import observation_delta, render
from sao.models.loading import load_tokenizer
from sao.serve.anthropic_api import ConversionMemo, MessagesRequest, to_chat_request
from sao.serve.gateway import create_app
from sao.serve.openai_api import ChatRequest, MessageMemo, normalize_messages, split_tool_calls
from sao.serve.sessions import ChatSession

TURNS = 30
EOT = "<|im_end|>"
# A tool observation of about 50 tokens, the same length every turn (so each turn's delta is too).
FILLER = " ".join(["the sum of this step is then the first answer"] * 4)


def observation(turn: int) -> str:
    return f"result {turn:03d}: {FILLER}"


class CountingTokenizer:
    """The real tokenizer, recording what it is asked to render (messages per chat-template call) and to
    tokenize (characters per call); everything else is the tokenizer's own."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.rendered: list[int] = []
        self.tokenized: list[int] = []

    def apply_chat_template(self, conversation, *args, **kwargs):
        self.rendered.append(len(conversation))
        return self._inner.apply_chat_template(conversation, *args, **kwargs)

    def __call__(self, text, *args, **kwargs):
        self.tokenized.append(len(text))
        return self._inner(text, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _openai_turn(messages, reply, turn):
    return [*messages, reply, {"role": "tool", "content": observation(turn)}]


async def _openai_session(client, sid: str, turns: int, tok: CountingTokenizer):
    """``turns`` requests of one session, each adding the echoed reply and a tool observation; per request:
    (messages rendered, characters tokenized, prompt ids, generated ids, messages sent)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a calculator agent."},
        {"role": "user", "content": "What is 2 * 3, step by step?"},
    ]
    out = []
    for turn in range(turns):
        rendered, tokenized = len(tok.rendered), len(tok.tokenized)
        body = {"messages": messages, "tools": [TOOL_SCHEMA], "max_tokens": 4, "seed": turn}
        r = await client.post("/v1/chat/completions", json=body, headers={"X-Session-Id": sid})
        assert r.status_code == 200, r.text
        data = r.json()
        choice = data["choices"][0]
        out.append(
            (tok.rendered[rendered:], tok.tokenized[tokenized:], data["prompt_token_ids"],
             choice["token_ids"], messages)
        )  # fmt: skip
        messages = _openai_turn(messages, choice["message"], turn)
    return out


@pytest.fixture(scope="module")
def bpe(tiny_bpe_dir):
    return load_tokenizer(tiny_bpe_dir)


def _serve(tiny_bpe_dir, tok, received):
    engine = LocalEngine(tiny_bpe_dir, device="cpu", dtype="float32", max_running=2)
    app = create_app(engine, tok, default_max_tokens=4, on_trajectory=received.append)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw", timeout=60)
    return engine, client


def test_each_request_renders_and_tokenizes_only_its_new_messages_and_records_the_exact_stream(
    tiny_bpe_dir, bpe
):
    tok, received = CountingTokenizer(bpe), []

    async def main():
        engine, client = _serve(tiny_bpe_dir, tok, received)
        turns = await _openai_session(client, "long", TURNS, tok)
        r = await client.post("/v1/sessions/long/reward", json={"reward": 1.0})
        assert r.status_code == 200, r.text
        await engine.close()
        return turns

    turns = asyncio.run(main())
    # The first request renders its conversation; every later one renders one stand-in conversation
    # (2 messages) plus its one new message, and tokenizes that delta only: the same work at turn 30
    # as at turn 2, although the history grew from 4 to 62 messages.
    assert turns[0][0] == [2]
    rendered = [r for r, *_ in turns[1:]]
    assert rendered == [[3]] * (TURNS - 1)
    tokenized = [t for _, t, *_ in turns[1:]]
    assert all(len(t) == 1 for t in tokenized)
    sizes = [t[0] for t in tokenized]
    assert max(sizes) - min(sizes) <= len(EOT)  # a reply cut by max_tokens adds its end-of-turn token

    # The token stream is the render-free one: the first rendering, then per turn the generated tokens
    # and the template's suffix for the new messages (computed here straight from chat_delta).
    tools = [TOOL_SCHEMA]

    def encode(text: str) -> list[int]:
        return bpe(text, add_special_tokens=False)["input_ids"]

    expected = encode(render(bpe, turns[0][4], tools, add_generation_prompt=True))
    for turn, (_, _, prompt_ids, gen_ids, _) in enumerate(turns):
        assert prompt_ids == expected, f"turn {turn}"
        ended = bool(gen_ids) and gen_ids[-1] == bpe.convert_tokens_to_ids(EOT)
        new = [{"role": "tool", "content": observation(turn)}]
        delta = observation_delta(bpe, new, tools, EOT, ended)
        expected = [*expected, *gen_ids, *encode(delta)]
    [traj] = received
    assert traj.token_ids == turns[-1][2] + turns[-1][3]
    assert traj.num_turns == TURNS and traj.metadata["prefix_mismatch"] is False


def test_the_anthropic_api_renders_only_new_messages_too(tiny_bpe_dir, bpe):
    tok, received = CountingTokenizer(bpe), []

    async def main():
        engine, client = _serve(tiny_bpe_dir, tok, received)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Count with me."}]
        per_request = []
        for turn in range(12):
            rendered = len(tok.rendered)
            body = {"messages": messages, "system": "Be brief.", "max_tokens": 4, "session_id": "a"}
            r = await client.post("/v1/messages", json=body)
            assert r.status_code == 200, r.text
            per_request.append(tok.rendered[rendered:])
            text = "".join(b["text"] for b in r.json()["content"] if b["type"] == "text")
            reply = {"role": "assistant", "content": r.json()["content"] or text}
            said = {"role": "user", "content": [{"type": "text", "text": observation(turn)}]}
            messages = [*messages, reply, said]
        assert (await client.post("/v1/sessions/a/reward", json={"reward": 0.5})).status_code == 200
        await engine.close()
        return per_request

    per_request = asyncio.run(main())
    assert per_request[0] == [2] and per_request[1:] == [[3]] * 11
    [traj] = received
    assert traj.num_turns == 12 and traj.metadata["prefix_mismatch"] is False


def test_an_edited_history_still_opens_a_new_branch_which_then_extends_incrementally(tiny_bpe_dir, bpe):
    tok, received = CountingTokenizer(bpe), []

    async def main():
        engine, client = _serve(tiny_bpe_dir, tok, received)
        turns = await _openai_session(client, "edit", 6, tok)
        last = turns[-1][4]
        edited = [*last[:3], {"role": "tool", "content": "result 000: something else"}, *last[4:]]
        rendered = len(tok.rendered)
        body = {"messages": edited, "tools": [TOOL_SCHEMA], "max_tokens": 4, "seed": 9}
        r = await client.post("/v1/chat/completions", json=body, headers={"X-Session-Id": "edit"})
        assert r.status_code == 200, r.text
        branch_prompt = r.json()["prompt_token_ids"]
        assert tok.rendered[rendered:] == [len(edited)]  # the new branch: rendered in full, once
        follow = _openai_turn(edited, r.json()["choices"][0]["message"], 99)
        rendered = len(tok.rendered)
        body = {**body, "messages": follow}
        r = await client.post("/v1/chat/completions", json=body, headers={"X-Session-Id": "edit"})
        assert r.status_code == 200, r.text
        assert tok.rendered[rendered:] == [3]  # extending the new branch renders its new message only
        assert r.json()["prompt_token_ids"][: len(branch_prompt)] == branch_prompt
        assert (await client.post("/v1/sessions/edit/reward", json={"reward": 1.0})).status_code == 200
        await engine.close()
        return branch_prompt, edited

    branch_prompt, edited = asyncio.run(main())
    full = render(bpe, edited, [TOOL_SCHEMA], add_generation_prompt=True)
    assert branch_prompt == bpe(full, add_special_tokens=False)["input_ids"]
    first, second = received
    assert (first.num_turns, first.metadata["prefix_mismatch"]) == (6, False)
    assert (second.num_turns, second.metadata["prefix_mismatch"]) == (2, True)


def test_a_reply_echoed_in_another_form_is_parsed_once_then_matched_by_equality(bpe):
    session = ChatSession(bpe, "s")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2 * 3?"}]
    for turn in range(4):
        session.commit(session.plan(messages, [TOOL_SCHEMA]))
        ids = bpe(tool_call_text(f"{turn}*3") + EOT, add_special_tokens=False)["input_ids"]
        text = session.record_generation(ids, [-0.5] * len(ids), [0] * len(ids), "stop")
        content, calls = split_tool_calls(text.removesuffix(EOT))
        session.note_reply({"role": "assistant", "content": content, "tool_calls": calls})
        # The client's echo: another call id and compact JSON, so it is not equal to the reply it got.
        args = json.dumps(json.loads(calls[0]["function"]["arguments"]), separators=(",", ":"))
        call = {"id": f"other-{turn}", "function": {"name": "calc", "arguments": args}}
        echo = {"role": "assistant", "tool_calls": [call]}
        messages = [*messages, echo, {"role": "tool", "content": str(turn * 3)}]
    session.commit(plan := session.plan(messages, [TOOL_SCHEMA]))
    assert not plan.prefix_mismatch and len(session.branches) == 1
    branch = session.branches[0]
    echoes = [m for m in branch.messages if not m.sent]
    # Each reply remembers the echo's form, so the next request compares it with one ``==``.
    assert [r.message for r in echoes] == [m for m in messages if m["role"] == "assistant"]
    # Memory of the form never widens what matches: another call is still a new branch.
    other_call = {"function": {"name": "calc", "arguments": "{}"}}
    changed = [messages[0], {**messages[1], "tool_calls": [other_call]}, *messages[2:]]
    assert session.plan(changed, [TOOL_SCHEMA]).prefix_mismatch


def _models(messages: list[dict[str, Any]]):
    return ChatRequest(messages=messages).messages


def _normalized_or_error(messages, memo=None):
    try:
        return normalize_messages(_models(messages), memo)
    except HTTPException as err:
        return err.detail


CALL = {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "1+1"}'}}


def test_normalizing_with_the_session_memo_gives_what_normalizing_everything_gives():
    user = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    called = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    answered = {"role": "tool", "tool_call_id": "c1", "content": "2"}
    requests = [
        [user],
        [user, called, answered],
        [user, called, answered, {"role": "user", "content": "more"}],
        # an edited earlier message: the call c1 is gone, so the tool message now answers nothing
        [user, {"role": "assistant", "content": "no call"}, answered],
        [user, {"role": "assistant", "content": "no call"}, {"role": "user", "content": "x"}],
        [user, {"role": "assistant", "content": "no call"}, {"role": "user", "content": "x"}, answered],
        [user, called, answered, {"role": "tool", "tool_call_id": "c9", "content": "?"}],  # invalid tail
        [user, called, answered, {"role": "bad", "content": "x"}],
        [user, called, answered, {"role": "assistant", "content": "done"}],
        [user],  # an older request again
        [user, called, {"role": "tool", "tool_call_id": "c1", "content": "3"}],
    ]
    memo = MessageMemo()
    for messages in requests:
        assert _normalized_or_error(messages, memo) == _normalized_or_error(messages), messages
    assert "answers no tool call" in _normalized_or_error(requests[3], memo)
    assert "answers no tool call" in _normalized_or_error(requests[5], memo)


def test_the_memo_converts_only_messages_it_has_not_seen():
    memo = MessageMemo()
    first = _models([{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": [CALL]}])
    out1 = normalize_messages(first, memo)
    answer = {"role": "tool", "tool_call_id": "c1", "content": "2"}
    out2 = normalize_messages(_models([*(m.model_dump() for m in first), answer]), memo)
    # The repeated messages are the very dicts converted before (not converted again); the new one is new.
    assert out2[0] is out1[0] and out2[1] is out1[1] and out2[2] == answer


def test_the_anthropic_memo_reuses_converted_messages_and_converts_like_a_fresh_request():
    def body(n: int) -> dict[str, Any]:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather?"}]
        for i in range(n):
            use = {"type": "tool_use", "id": f"t{i}", "name": "now", "input": {"i": i}}
            result = {"type": "tool_result", "tool_use_id": f"t{i}", "content": f"r{i}"}
            messages += [{"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]
        return {"max_tokens": 8, "system": "Be brief.", "messages": messages}

    memo = ConversionMemo()
    before = to_chat_request(MessagesRequest(**body(2)), memo)
    after = to_chat_request(MessagesRequest(**body(3)), memo)
    fresh = to_chat_request(MessagesRequest(**body(3)))
    assert [m.model_dump() for m in after.messages] == [m.model_dump() for m in fresh.messages]
    assert all(a is b for a, b in zip(after.messages[1:5], before.messages[1:5], strict=True))
    edited = body(3)
    edited["messages"][1]["content"][0]["input"] = {"i": 7}
    redone = to_chat_request(MessagesRequest(**edited), memo)
    assert json.loads(redone.messages[2].model_extra["tool_calls"][0]["function"]["arguments"]) == {"i": 7}
