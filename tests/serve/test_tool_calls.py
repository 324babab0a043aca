"""The gateway's tool calls come from the envs' parser (`sao.envs.tools.parse_tool_calls`): the same calls,
in OpenAI form, with only the blocks that became calls taken out of the content."""

from __future__ import annotations

import json

import pytest

from sao.envs.tools import parse_tool_calls
from sao.serve.openai_api import ChatRequest, normalize_messages, split_tool_calls

CALL = '<tool_call>{"name": "calc", "arguments": {"expr": "1+1"}}</tool_call>'
TEXTS = [
    "Sure. " + CALL,
    '<tool_call>\n{"name": "calc", "arguments": "{\\"expr\\": \\"2\\"}"}\n</tool_call>',
    "<tool_call>{bad</tool_call> then " + CALL,
    '<tool_call>{"name": "calc", "arguments": [1]}</tool_call>' + CALL,
    CALL + ' <tool_call>{"name": "now"}</tool_call> <tool_call>{"name": 3}</tool_call>',
    "no call here",
    CALL.removesuffix("</tool_call>"),
]


def _parsed(calls):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls or []]


@pytest.mark.parametrize("text", TEXTS)
def test_the_gateway_sends_exactly_the_calls_the_envs_parse(text):
    _, calls = split_tool_calls(text)
    assert _parsed(calls) == [(c.name, c.arguments) for c in parse_tool_calls(text).calls]
    for call in calls or []:
        assert call["type"] == "function" and call["id"].startswith("call_")


def test_arguments_given_as_a_json_string_are_sent_as_that_object_once_encoded():
    _, [call] = split_tool_calls(TEXTS[1])
    assert json.loads(call["function"]["arguments"]) == {"expr": "2"}


def test_a_malformed_block_makes_no_call_stays_in_the_content_and_hides_no_later_call():
    content, calls = split_tool_calls(TEXTS[2])
    assert content == "<tool_call>{bad</tool_call> then"
    assert _parsed(calls) == [("calc", {"expr": "1+1"})]


def test_arguments_that_are_not_an_object_make_no_call():
    content, calls = split_tool_calls(TEXTS[3])
    assert content == '<tool_call>{"name": "calc", "arguments": [1]}</tool_call>'
    assert _parsed(calls) == [("calc", {"expr": "1+1"})]


def test_content_is_none_when_only_calls_were_written():
    content, calls = split_tool_calls(CALL + "\n" + CALL)
    assert content is None and len(calls) == 2 and calls[0]["id"] != calls[1]["id"]


@pytest.mark.parametrize(
    "text", ["no call here", CALL.removesuffix("</tool_call>"), "<tool_call>{x}</tool_call>"]
)
def test_text_without_a_well_formed_call_comes_back_unchanged(text):
    assert split_tool_calls(text) == (text, None)


@pytest.mark.parametrize("text", TEXTS)
def test_every_sent_call_passes_the_gateways_own_check_when_echoed(text):
    content, calls = split_tool_calls(text)
    if calls is None:
        return
    echo = {"role": "assistant", "content": content, "tool_calls": calls}
    req = ChatRequest(messages=[{"role": "user", "content": "hi"}, echo])
    assert normalize_messages(req.messages)[1]["tool_calls"] == calls
