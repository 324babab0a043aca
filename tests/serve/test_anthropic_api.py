"""The Anthropic Messages API conversion: request bodies → `ChatRequest`, chat.completion → message."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from sao.serve.anthropic_api import (
    AnthropicRequestError,
    MessagesRequest,
    to_chat_request,
    to_messages_response,
)
from sao.serve.openai_api import normalize_messages

WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CLOCK = {"name": "now", "input_schema": {"type": "object", "properties": {}}}


def _convert(body: dict) -> list[dict]:
    """The converted messages as the gateway sees them (``model_dump(exclude_none=True)``)."""
    return [m.model_dump(exclude_none=True) for m in to_chat_request(MessagesRequest(**body)).messages]


def _chat(content, tool_calls=None, finish="stop", **extra) -> dict:
    """A chat.completion as the gateway builds it."""
    message = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-0123abcd",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "tiny",
        "session_id": "s-1",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish,
                "logprobs": {
                    "content": [
                        {"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []},
                        {"token": "b", "logprob": -1.25, "bytes": [98], "top_logprobs": []},
                    ]
                },
                "token_ids": [11, 12],
                "versions": [3, 3],
            }
        ],
        "prompt_token_ids": [1, 2, 3],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        **extra,
    }


def _call(call_id: str, name: str, args: dict) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def test_multi_turn_tool_conversation():
    body = {
        "model": "tiny",
        "max_tokens": 64,
        "system": [{"type": "text", "text": "You are terse."}, {"type": "text", "text": "Use tools."}],
        "tools": [WEATHER, CLOCK],
        "messages": [
            {"role": "user", "content": "Weather in Paris and the time?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "now", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C, sunny"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": [{"type": "text", "text": "12:00"}, {"type": "text", "text": "UTC"}],
                    },
                    {"type": "text", "text": "Also,", "cache_control": {"type": "ephemeral"}},
                    {"type": "text", "text": "be brief."},
                ],
            },
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_3", "name": "now", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_3", "content": "boom", "is_error": True}
                ],
            },
            {"role": "assistant", "content": "Sunny, 18C, noon."},
            {"role": "user", "content": [{"type": "text", "text": "Thanks"}]},
        ],
    }
    assert _convert(body) == [
        {"role": "system", "content": "You are terse.\nUse tools."},
        {"role": "user", "content": "Weather in Paris and the time?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [_call("toolu_1", "get_weather", {"city": "Paris"}), _call("toolu_2", "now", {})],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18C, sunny"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "12:00\nUTC"},
        {"role": "user", "content": "Also,\nbe brief."},
        {"role": "assistant", "tool_calls": [_call("toolu_3", "now", {})]},  # content None, dropped
        {"role": "tool", "tool_call_id": "toolu_3", "content": "error: boom"},
        {"role": "assistant", "content": "Sunny, 18C, noon."},
        {"role": "user", "content": "Thanks"},
    ]
    req = to_chat_request(MessagesRequest(**body))
    assert req.messages[6].content is None
    assert normalize_messages(req.messages) == _convert(body)  # the gateway's checks accept it
    assert req.tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather for a city.",
                "parameters": WEATHER["input_schema"],
            },
        },
        {"type": "function", "function": {"name": "now", "parameters": CLOCK["input_schema"]}},
    ]


def test_block_order_is_kept():
    content = [
        {"type": "text", "text": "before"},
        {"type": "tool_result", "tool_use_id": "t1"},
        {"type": "text", "text": "after"},
    ]
    assert _convert({"max_tokens": 8, "messages": [{"role": "user", "content": content}]}) == [
        {"role": "user", "content": "before"},
        {"role": "tool", "tool_call_id": "t1", "content": ""},
        {"role": "user", "content": "after"},
    ]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("boom", "error: boom"),
        ("Error: already marked", "Error: already marked"),
        ("errors: 3", "error: errors: 3"),
        (None, "error"),
        ([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "error: a\nb"),
    ],
)
def test_is_error_prefix(content, expected):
    block = {"type": "tool_result", "tool_use_id": "t1", "is_error": True}
    if content is not None:
        block["content"] = content
    (tool,) = _convert({"max_tokens": 8, "messages": [{"role": "user", "content": [block]}]})
    assert tool == {"role": "tool", "tool_call_id": "t1", "content": expected}


def test_only_set_fields_are_passed():
    plain = to_chat_request(MessagesRequest(max_tokens=32, messages=[{"role": "user", "content": "hi"}]))
    assert plain.model_fields_set == {"messages", "max_tokens"}
    assert plain.temperature == 1.0 and plain.top_p == 1.0 and plain.top_k == -1 and plain.stop is None
    assert plain.tools is None and plain.session_id is None and not plain.stream

    full = MessagesRequest(
        model="tiny",
        max_tokens=32,
        messages=[{"role": "user", "content": "hi"}],
        temperature=0.7,
        top_p=0.9,
        top_k=20,
        stop_sequences=["\n\n"],
        stream=True,
        session_id="s-1",
        group_id="g-1",
        task_id="task-9",
        tools=[CLOCK],
        tool_choice={"type": "auto"},
        metadata={"user_id": "u"},
    )
    req = to_chat_request(full)
    assert req.model_fields_set == {
        "messages", "max_tokens", "model", "temperature", "top_p", "top_k", "stop", "stream",
        "session_id", "group_id", "task_id", "tools",
    }  # fmt: skip
    assert (req.model, req.max_tokens, req.temperature, req.top_p, req.top_k) == ("tiny", 32, 0.7, 0.9, 20)
    assert req.stop == ["\n\n"] and req.stream is True and req.session_id == "s-1"
    assert (req.group_id, req.task_id) == ("g-1", "task-9")


def test_explicit_null_is_not_passed():
    req = to_chat_request(
        MessagesRequest(max_tokens=4, messages=[{"role": "user", "content": "hi"}], temperature=None)
    )
    assert "temperature" not in req.model_fields_set and req.temperature == 1.0


@pytest.mark.parametrize(
    "fields",
    [
        {"max_tokens": 0},
        {"messages": []},
        {"temperature": 1.5},
        {"temperature": -0.1},
        {"top_p": 0},
        {"top_k": 0},
    ],
)
def test_body_validation(fields):
    body = {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], **fields}
    with pytest.raises(ValidationError):
        MessagesRequest(**body)


def test_max_tokens_is_required():
    with pytest.raises(ValidationError):
        MessagesRequest(messages=[{"role": "user", "content": "hi"}])


def _user(*blocks):
    return {"role": "user", "content": list(blocks)}


def _assistant(*blocks):
    return {"role": "assistant", "content": list(blocks)}


HI = {"role": "user", "content": "hi"}
OK = {"role": "assistant", "content": "ok"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"messages": [HI, OK, _user({"type": "image", "source": {}})]},
         "messages.2.content.0: unknown content block type 'image'"),
        ({"messages": [HI, _assistant({"type": "text", "text": "x"}, {"type": "document"})]},
         "messages.1.content.1: unknown content block type 'document'"),
        ({"messages": [{"role": "system", "content": "sys"}]}, "messages.0.role: 'system' is not"),
        ({"messages": [HI, {"role": "tool", "content": "x"}]},
         "messages.1.role: must be 'user' or 'assistant'"),
        ({"messages": [{"content": "x"}]}, "messages.0.role: must be"),
        ({"messages": [{"role": "user"}]}, "messages.0.content: expected a string or a list"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages.0.content: expected a string or a list"),
        ({"messages": [{"role": "user", "content": []}]}, "messages.0.content: must not be an empty list"),
        ({"messages": [_user("text")]}, "messages.0.content.0: expected a content block"),
        ({"messages": [_user({"text": "no type"})]}, "messages.0.content.0: expected a content block"),
        ({"messages": [_user({"type": "text"})]}, "messages.0.content.0: a text block needs a string 'text'"),
        ({"messages": [HI, _assistant({"type": "tool_use", "name": "now", "input": {}})]},
         "messages.1.content.0: needs a non-empty string 'id'"),
        ({"messages": [HI, _assistant({"type": "tool_use", "id": "t", "input": {}})]},
         "messages.1.content.0: needs a non-empty string 'name'"),
        ({"messages": [HI, _assistant({"type": "tool_use", "id": "t", "name": "now", "input": [1]})]},
         "messages.1.content.0.input: a tool_use input must be an object"),
        ({"messages": [HI, OK, _user({"type": "tool_result", "content": "x"})]},
         "messages.2.content.0: needs a non-empty string 'tool_use_id'"),
        ({"messages": [HI, OK, _user({"type": "tool_result", "tool_use_id": "t", "content": 5})]},
         "messages.2.content.0.content: expected a string or a list of text blocks"),
        ({"messages": [_user({"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]})]},
         "messages.0.content.0.content.0: expected a text block, got 'image'"),
        ({"messages": [_user({"type": "tool_use", "id": "t", "name": "now", "input": {}})]},
         "messages.0.content.0: a tool_use block belongs in an assistant message"),
        ({"messages": [HI, _assistant({"type": "tool_result", "tool_use_id": "t"})]},
         "messages.1.content.0: a tool_result block belongs in a user message"),
        ({"messages": [_user({"type": "thinking", "thinking": "hmm", "signature": "s"})]},
         "messages.0.content.0: a thinking block belongs in an assistant message"),
        ({"messages": [HI, _assistant({"type": "thinking", "signature": "s"})]},
         "messages.1.content.0: a thinking block needs a string 'thinking'"),
        ({"messages": [HI, _assistant({"type": "redacted_thinking", "data": "x"})]},
         "messages.1.content.0: redacted_thinking blocks are not supported"),
        ({"messages": [HI], "system": [{"type": "image"}]}, "system.0: expected a text block, got 'image'"),
        ({"messages": [HI], "tools": [{"name": "x"}]}, "tools.0.input_schema: must be an object"),
        ({"messages": [HI], "tools": [CLOCK, {"input_schema": {}}]},
         "tools.1: needs a non-empty string 'name'"),
        ({"messages": [HI], "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
         "tools.0: server tools ('web_search_20250305') are not supported"),
    ],
)  # fmt: skip
def test_malformed_requests_name_the_path(body, message):
    req = MessagesRequest(max_tokens=8, **body)
    with pytest.raises(AnthropicRequestError) as info:
        to_chat_request(req)
    assert str(info.value).startswith(message)
    assert isinstance(info.value, ValueError)


def test_text_response():
    out = to_messages_response(_chat("Hello there."))
    assert out == {
        "id": "msg_0123abcd",
        "type": "message",
        "role": "assistant",
        "model": "tiny",
        "content": [{"type": "text", "text": "Hello there."}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 2},
        "session_id": "s-1",
        "prompt_token_ids": [1, 2, 3],
        "token_ids": [11, 12],
        "versions": [3, 3],
        "logprobs": [-0.5, -1.25],
    }


def test_tool_use_response_keeps_ids_and_extras():
    calls = [_call("call_abc", "get_weather", {"city": "Paris"}), _call("call_def", "now", {})]
    out = to_messages_response(_chat("Let me check.", calls, finish="tool_calls", session_closed=True))
    assert out["content"] == [
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "call_abc", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "call_def", "name": "now", "input": {}},
    ]
    assert out["stop_reason"] == "tool_use"
    assert out["session_closed"] is True
    assert not {"object", "created", "choices"} & out.keys()

    only_calls = to_messages_response(_chat(None, calls[:1], finish="tool_calls"))
    assert [b["type"] for b in only_calls["content"]] == ["tool_use"]


def test_length_and_empty_responses():
    out = to_messages_response(_chat("cut off mid", finish="length"))
    assert out["stop_reason"] == "max_tokens"
    assert out["content"] == [{"type": "text", "text": "cut off mid"}]
    empty = to_messages_response(_chat("", session_id=None))
    assert empty["content"] == [] and empty["stop_reason"] == "end_turn" and empty["session_id"] is None


def test_non_object_arguments_are_wrapped():
    call = {"id": "call_x", "type": "function", "function": {"name": "now", "arguments": '"soon"'}}
    broken = {"id": "call_y", "type": "function", "function": {"name": "now", "arguments": "{not json"}}
    out = to_messages_response(_chat(None, [call, broken], finish="tool_calls"))
    assert [b["input"] for b in out["content"]] == [{"arguments": "soon"}, {"arguments": "{not json"}]


def test_round_trip_echoes_the_same_tool_calls():
    calls = [
        _call("call_abc", "get_weather", {"city": "Paris", "units": ["C", "F"]}),
        _call("call_d", "now", {}),
    ]
    chat = _chat("Checking.", calls, finish="tool_calls")
    reply = to_messages_response(chat)
    follow_up = {
        "max_tokens": 16,
        "tools": [WEATHER, CLOCK],
        "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": reply["role"], "content": reply["content"]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": b["id"], "content": "ok"}
                    for b in reply["content"]
                    if b["type"] == "tool_use"
                ],
            },
        ],
    }
    messages = normalize_messages(to_chat_request(MessagesRequest(**follow_up)).messages)
    assistant = messages[1]
    assert assistant["content"] == chat["choices"][0]["message"]["content"]
    assert assistant["tool_calls"] == chat["choices"][0]["message"]["tool_calls"]
    assert [m["tool_call_id"] for m in messages[2:]] == ["call_abc", "call_d"]
