"""The OpenAI Responses API (/v1/responses) on the session recorder: input items convert to the chat
conversation the other APIs record (tool calls and their outputs, reasoning, instructions), the session's
memo converts only new items, ``previous_response_id`` continues a response, malformed input gets 400
naming the path, the real openai SDK parses responses and their streams, and a Responses session records
the same tokens as a Chat Completions session of the same conversation."""

from __future__ import annotations

import json

import httpx
import pytest

from sao.engine import LocalEngine
from sao.envs.calculator import TOOL_SCHEMA, tool_call_text
from sao.serve.responses_api import (
    ResponsesMemo,
    ResponsesRequest,
    ResponsesRequestError,
    responses_to_chat,
)

from .recording import recording_gateway
from .test_streaming import REASONED_CALL, ScriptedEngine

FN = TOOL_SCHEMA["function"]
FLAT_TOOL = {
    "type": "function",
    "name": FN["name"],
    "description": FN.get("description"),
    "parameters": FN["parameters"],
}
SYSTEM = "Be brief."


def _chat(req: ResponsesRequest, memo=None):
    chat, _ = responses_to_chat(req, memo)
    return [m.model_dump(exclude_none=True) for m in chat.messages]


def _part(kind, text):
    return {"type": kind, "text": text}


def test_input_items_become_the_chat_conversation():
    args = '{"expr": "2+3"}'
    parts = [_part("input_text", "2+3 "), _part("text", "and 1+1?")]
    items = [
        {"role": "developer", "content": "dev note"},
        {"type": "message", "role": "user", "content": parts},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [_part("reasoning_text", "add")]},
        {"type": "message", "role": "assistant", "content": [_part("output_text", "Computing.")]},
        {"type": "function_call", "call_id": "c1", "name": "calc", "arguments": args},
        {"type": "function_call", "call_id": "c2", "name": "calc", "arguments": '{"expr": "1+1"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "5"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "2"}]},
        {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "done"}]},
        {"role": "assistant", "content": "5 and 2."},
        {"role": "user", "content": "thanks"},
    ]  # fmt: skip
    req = ResponsesRequest(input=items, instructions=SYSTEM, tools=[FLAT_TOOL], max_output_tokens=9, seed=3)
    chat, conversation = responses_to_chat(req, None)
    call = lambda i, e: {"id": i, "type": "function", "function": {"name": "calc", "arguments": e}}  # noqa: E731
    assert [m.model_dump(exclude_none=True) for m in chat.messages] == [
        {"role": "system", "content": SYSTEM},
        {"role": "system", "content": "dev note"},
        {"role": "user", "content": "2+3 and 1+1?"},
        {"role": "assistant", "content": "Computing.", "reasoning_content": "add",
         "tool_calls": [call("c1", args), call("c2", '{"expr": "1+1"}')]},
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        {"role": "tool", "tool_call_id": "c2", "content": "2"},
        {"role": "assistant", "content": "5 and 2.", "reasoning_content": "done"},
        {"role": "user", "content": "thanks"},
    ]  # fmt: skip
    assert conversation == chat.messages[1:]  # what previous_response_id continues: no instructions
    assert chat.tools == [TOOL_SCHEMA]
    assert chat.max_tokens == 9 and chat.seed == 3
    assert chat.model_fields_set == {"messages", "max_tokens", "tools", "seed"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"input": [{"type": "item_reference", "id": "x"}]},
         "input.0: unsupported item type 'item_reference'"),
        ({"input": [{"role": "tool", "content": "x"}]},
         "input.0.role: must be user, assistant, system or developer"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
         "input.0.content.0: only text parts are supported, not 'input_image'"),
        ({"input": ["hi"]}, "input.0: expected an input item"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "calc", "arguments": "{oops"}]},
         "input.0.arguments: must be a JSON object as text"),
        ({"input": [{"type": "function_call", "name": "calc", "arguments": "{}"}]},
         "input.0: needs a non-empty string 'call_id'"),
        ({"input": [{"type": "function_call_output", "output": "5"}]},
         "input.0: needs a non-empty string 'call_id'"),
        ({"input": "hi", "tools": [{"type": "web_search"}]},
         "tools.0: only function tools are supported, not 'web_search'"),
        ({"input": "hi", "text": {"format": {"type": "json_schema"}}},
         "text.format: only plain text is supported"),
        ({"input": "hi", "previous_response_id": "resp_x"}, "previous_response_id: 'resp_x' is not one of"),
    ],
)  # fmt: skip
def test_malformed_requests_name_the_path(body, message):
    with pytest.raises(ResponsesRequestError) as info:
        responses_to_chat(ResponsesRequest(**body), None)
    assert str(info.value).startswith(message)


def test_the_memo_converts_only_new_items_like_a_fresh_conversion():
    memo = ResponsesMemo()
    items = [{"role": "user", "content": "hi"}]
    grow = [
        [{"type": "function_call", "call_id": "c1", "name": "calc", "arguments": "{}"}],
        [{"type": "function_call", "call_id": "c2", "name": "calc", "arguments": "{}"}],  # joins the last run
        [{"type": "function_call_output", "call_id": "c1", "output": "1"},
         {"type": "function_call_output", "call_id": "c2", "output": "2"}],
        [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}],
    ]  # fmt: skip
    for extra in [[], *grow]:
        previous = memo.messages
        items = [*items, *extra]
        req = ResponsesRequest(input=items, instructions=SYSTEM)
        chat, _ = responses_to_chat(req, memo)
        assert [m.model_dump(exclude_none=True) for m in chat.messages] == _chat(req)
    assert [m.role for m in chat.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "user",
    ]
    assert len(chat.messages[2].tool_calls) == 2
    # The last request converted only from its last unchanged item (the second call output) on: the user
    # message, the assistant run and the first output are the previous request's objects.
    assert [a is b for a, b in zip(memo.messages, previous, strict=False)] == [True, True, True, False]
    edited = ResponsesRequest(input=[{"role": "user", "content": "other"}], instructions=SYSTEM)
    assert _chat(edited, memo) == _chat(edited)


@pytest.fixture(scope="module")
def real(tiny_moe_dir, tiny_tokenizer, serve_app):
    engine = LocalEngine(tiny_moe_dir, device="cpu", dtype="float32", max_running=8)
    return recording_gateway(engine, tiny_tokenizer, serve_app, 8)


@pytest.fixture(scope="module")
def scripted(tiny_tokenizer, serve_app):
    engine = ScriptedEngine(tiny_tokenizer, [REASONED_CALL, "<think>\nso 5\n</think>\n\nanswer: 5"])
    return recording_gateway(engine, tiny_tokenizer, serve_app, 256)


def _client(url):
    from openai import OpenAI

    return OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def _trajectory(gateway, sid):
    r = httpx.post(f"{gateway['url']}/v1/sessions/{sid}/reward", json={"reward": 1.0})
    assert r.status_code == 200, r.text
    [traj] = [t for t in gateway["received"] if t.metadata["session_id"] == sid]
    traj.validate()
    return traj


def _play_chat(client, sid, first, follow_ups, seed, max_tokens):
    """A Chat Completions harness: the history with each reply as returned, then the next message(s)."""
    messages = [{"role": "system", "content": SYSTEM}, *first]
    for k, follow in enumerate([*follow_ups, None]):
        out = client.chat.completions.create(
            model="sao", messages=messages, tools=[TOOL_SCHEMA], max_tokens=max_tokens, seed=seed + k,
            extra_headers={"X-Session-Id": sid},
        )  # fmt: skip
        reply = out.choices[0].message.to_dict(exclude_none=True)
        if follow is None:
            return
        messages = [*messages, reply, *follow(reply.get("tool_calls") or [])]


def _chat_follow(items):
    """A follow-up as chat messages: ``items`` as Responses items (user texts and call outputs)."""

    def make(calls):
        out = []
        for item in items(calls):
            if item.get("type") == "function_call_output":
                out.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
            else:
                out.append(item)
        return out

    return make


def _play_responses(client, sid, first, follow_ups, seed, max_tokens, chained):
    """A Responses harness: the whole input each time (``chained`` False) or only the new items after
    ``previous_response_id``."""
    items, previous = list(first), None
    for k, follow in enumerate([*follow_ups, None]):
        out = client.responses.create(
            model="sao", input=items, instructions=SYSTEM, tools=[FLAT_TOOL], max_output_tokens=max_tokens,
            previous_response_id=previous, extra_body={"seed": seed + k}, extra_headers={"X-Session-Id": sid},
        )  # fmt: skip
        assert out.object == "response" and out.model_extra["session_id"] == sid
        if follow is None:
            return
        calls = [i.to_dict() for i in out.output if i.type == "function_call"]
        new = follow([{"id": c["call_id"], "function": c} for c in calls])
        items = new if chained else [*items, *(i.to_dict() for i in out.output), *new]
        previous = out.id if chained else None


def _same_tokens(a, b, turns):
    assert a.token_ids == b.token_ids and a.action_mask == b.action_mask
    assert a.rollout_logprobs == b.rollout_logprobs and a.num_turns == b.num_turns == turns
    assert not a.metadata["prefix_mismatch"] and not b.metadata["prefix_mismatch"]


CALL_ARGS = json.dumps({"expr": "2+3"})
# The first request already holds a tool call the client made (a few-shot turn) and its result.
FIRST = [
    {"role": "user", "content": "What is 2 + 3?"},
    {"type": "function_call", "call_id": "call_0", "name": "calc", "arguments": CALL_ARGS},
    {"type": "function_call_output", "call_id": "call_0", "output": "5"},
    {"role": "user", "content": "And then?"},
]
FIRST_CHAT = [
    FIRST[0],
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "calc", "arguments": CALL_ARGS}}]},
    {"role": "tool", "tool_call_id": "call_0", "content": "5"},
    FIRST[3],
]  # fmt: skip


def test_a_responses_session_records_the_tokens_of_the_same_chat_session(real):
    client = _client(real["url"])
    follow = [
        lambda calls: [{"role": "user", "content": "Go on."}],
        lambda calls: [{"role": "user", "content": "?"}],
    ]
    _play_chat(client, "chat", FIRST_CHAT, [_chat_follow(f) for f in follow], seed=21, max_tokens=6)
    _play_responses(client, "resp", FIRST, follow, seed=21, max_tokens=6, chained=False)
    _play_responses(client, "resp-chained", FIRST, follow, seed=21, max_tokens=6, chained=True)
    chat = _trajectory(real, "chat")
    _same_tokens(chat, _trajectory(real, "resp"), 3)
    _same_tokens(chat, _trajectory(real, "resp-chained"), 3)


def test_a_responses_session_with_model_tool_calls_and_reasoning_records_the_tokens_of_the_chat_session(
    scripted, tiny_tokenizer
):
    client = _client(scripted["url"])

    def answer(calls):
        return [{"type": "function_call_output", "call_id": c["id"], "output": "5"} for c in calls] + [
            {"role": "user", "content": "So?"}
        ]

    for sid, play in (
        ("chat", lambda sid: _play_chat(client, sid, FIRST_CHAT[:1], [_chat_follow(answer)], 1, 256)),
        ("resp", lambda sid: _play_responses(client, sid, FIRST[:1], [answer], 1, 256, chained=False)),
        ("resp-chained", lambda sid: _play_responses(client, sid, FIRST[:1], [answer], 1, 256, chained=True)),
    ):
        scripted["engine"].calls = 0  # each session: the tool call, then the answer
        play(sid)
    chat = _trajectory(scripted, "chat")
    _same_tokens(chat, _trajectory(scripted, "resp"), 2)
    _same_tokens(chat, _trajectory(scripted, "resp-chained"), 2)
    text = tiny_tokenizer.decode(chat.token_ids)
    assert text.count(tool_call_text("2+3")) == 1 and "<tool_response>" in text and "So?" in text


def test_the_openai_sdk_parses_responses_and_their_streams(scripted):
    client = _client(scripted["url"])
    scripted["engine"].calls = 0
    kw = {"model": "sao", "input": "2+3?", "tools": [FLAT_TOOL]}
    plain = client.responses.create(**kw)
    assert [i.type for i in plain.output] == ["reasoning", "message", "function_call"]
    assert plain.output[0].content[0].text == "add them up first"
    assert plain.output_text == "Let me compute."
    assert json.loads(plain.output[2].arguments) == {"expr": "2+3"} and plain.output[2].call_id.startswith(
        "call_"
    )
    assert plain.status == "completed" and plain.usage.output_tokens == len(plain.model_extra["token_ids"])
    scripted["engine"].calls = 0
    with client.responses.stream(**kw) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    needed = ["reasoning_text.delta", "output_text.delta", "content_part.done", "output_item.done",
              "function_call_arguments.delta", "function_call_arguments.done"]  # fmt: skip
    assert {f"response.{kind}" for kind in needed} <= set(kinds)
    assert final.output_text == plain.output_text
    assert [i.type for i in final.output] == ["reasoning", "message", "function_call"]
    assert final.output[2].arguments == plain.output[2].arguments
    assert final.model_extra["token_ids"] == plain.model_extra["token_ids"]


def test_previous_response_id_must_be_a_response_of_the_open_session(real):
    import openai

    client = _client(real["url"])
    first = client.responses.create(
        model="sao", input="hi", max_output_tokens=4, extra_body={"session_id": "p"}
    )
    assert first.status == "incomplete" and first.incomplete_details.reason == "max_output_tokens"
    nxt = client.responses.create(model="sao", input="more", previous_response_id=first.id,
                                  max_output_tokens=4, extra_body={"session_id": "p"})  # fmt: skip
    assert (
        nxt.model_extra["prompt_token_ids"][: len(first.model_extra["prompt_token_ids"])]
        == first.model_extra["prompt_token_ids"]
    )
    for body in ({"session_id": "other"}, {}):
        with pytest.raises(openai.BadRequestError, match="previous_response_id"):
            client.responses.create(model="sao", input="x", previous_response_id=first.id, extra_body=body)
    assert not _trajectory(real, "p").metadata["prefix_mismatch"]
