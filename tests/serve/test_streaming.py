"""Streaming (SSE) on /v1/chat/completions and /v1/messages: the real openai and anthropic SDKs parse the
streams of a real uvicorn server, a streamed session records exactly the tokens of the same session not
streamed (same seeds, a real LocalEngine), refusals are HTTP errors before any event, and n > 1 is served
to unrecorded requests only. Tool calls and reasoning in streams come from a scripted engine (the gateway
is under test, not the model)."""

from __future__ import annotations

import json

import httpx
import pytest

from sao.engine import LocalEngine
from sao.engine.types import Generation
from sao.envs.calculator import TOOL_SCHEMA, tool_call_text
from sao.serve.streaming import chat_events, text_pieces

from .recording import recording_gateway

TURNS = 3


class ScriptedEngine:
    """Generations are fixed texts, in turn (cycling), tokenised, plus the end-of-turn token: what a model
    that reasons and calls tools returns."""

    version = 0

    def __init__(self, tokenizer, texts: list[str]) -> None:
        self.tokenizer, self.texts, self.calls = tokenizer, list(texts), 0
        self.eot = tokenizer.convert_tokens_to_ids("<|im_end|>")

    async def generate(self, prompt_ids, params) -> Generation:
        text = self.texts[self.calls % len(self.texts)]
        self.calls += 1
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.eot][: params.max_new_tokens]
        lps = [-0.25 - 0.01 * i for i in range(len(ids))]
        return Generation(ids, lps, [0] * len(ids), "stop" if ids[-1] == self.eot else "length")

    async def close(self) -> None:
        return None


REASONED_CALL = "<think>\nadd them up first\n</think>\n\nLet me compute. " + tool_call_text("2+3")


@pytest.fixture(scope="module")
def real(tiny_moe_dir, tiny_tokenizer, serve_app):
    engine = LocalEngine(tiny_moe_dir, device="cpu", dtype="float32", max_running=8)
    return recording_gateway(engine, tiny_tokenizer, serve_app, 8)


@pytest.fixture(scope="module")
def scripted(tiny_tokenizer, serve_app):
    return recording_gateway(ScriptedEngine(tiny_tokenizer, [REASONED_CALL]), tiny_tokenizer, serve_app, 256)


def _openai(url):
    from openai import OpenAI

    return OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def _anthropic(url):
    from anthropic import Anthropic

    return Anthropic(base_url=url, api_key="unused", max_retries=0)


def _trajectory(gateway, sid, reward=1.0):
    r = httpx.post(f"{gateway['url']}/v1/sessions/{sid}/reward", json={"reward": reward})
    assert r.status_code == 200, r.text
    [traj] = [t for t in gateway["received"] if t.metadata["session_id"] == sid]
    traj.validate()
    return traj


def _same_tokens(a, b):
    assert a.token_ids == b.token_ids
    assert a.action_mask == b.action_mask
    assert a.rollout_logprobs == b.rollout_logprobs
    assert a.turn_ids == b.turn_ids and a.num_turns == b.num_turns == TURNS
    assert not a.metadata["prefix_mismatch"] and not b.metadata["prefix_mismatch"]


@pytest.mark.parametrize("text", ["", " ", "one", "  two words  ", "a\n\nb\tc ", "héllo wörld ✓", '{"a": 1}'])
def test_stream_pieces_join_back_to_the_text(text):
    pieces = text_pieces(text)
    assert "".join(pieces) == text
    assert all(pieces)
    if len(text.split()) > 1:
        assert len(pieces) > 1


def test_a_streamed_chat_session_records_the_same_tokens_as_the_same_session_not_streamed(real):
    client = _openai(real["url"])
    replies = {}
    for sid, stream in (("chat-plain", False), ("chat-streamed", True)):
        messages, got = [{"role": "user", "content": "What is 2 + 3?"}], []
        for k in range(TURNS):
            kw = {"model": "sao", "messages": messages, "max_tokens": 6, "seed": 7 + k}
            kw["extra_headers"] = {"X-Session-Id": sid}
            if stream:
                chunks = list(client.chat.completions.create(**kw, stream=True))
                content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                final = chunks[-1]
                assert final.choices[0].finish_reason is not None and final.model_extra["session_id"] == sid
                token_ids = final.choices[0].model_extra["token_ids"]
                logprobs = [e.logprob for e in final.choices[0].logprobs.content]
                assert len(chunks) > 2  # role, content pieces, finish
            else:
                out = client.chat.completions.create(**kw)
                content = out.choices[0].message.content
                token_ids = out.choices[0].model_extra["token_ids"]
                logprobs = [e.logprob for e in out.choices[0].logprobs.content]
            got.append((content, token_ids, logprobs))
            messages = [
                *messages,
                {"role": "assistant", "content": content},
                {"role": "user", "content": "?"},
            ]
        replies[sid] = got
    assert replies["chat-plain"] == replies["chat-streamed"]
    plain, streamed = _trajectory(real, "chat-plain"), _trajectory(real, "chat-streamed")
    _same_tokens(plain, streamed)
    actions = [t for t, m in zip(streamed.token_ids, streamed.action_mask, strict=True) if m]
    assert actions == [t for _, ids, _ in replies["chat-streamed"] for t in ids]


def test_a_streamed_anthropic_session_records_the_same_tokens_as_the_same_session_not_streamed(real):
    client = _anthropic(real["url"])
    replies = {}
    for sid, stream in (("msg-plain", False), ("msg-streamed", True)):
        messages, got = [{"role": "user", "content": "What is 2 + 3?"}], []
        for k in range(TURNS):
            kw = {"model": "sao", "messages": messages, "max_tokens": 6, "system": "Be brief."}
            kw.update(extra_headers={"X-Session-Id": sid}, extra_body={"seed": 11 + k})
            if stream:
                with client.messages.stream(**kw) as events:
                    kinds = [event.type for event in events]
                    out = events.get_final_message()
                assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
                assert "content_block_delta" in kinds
            else:
                out = client.messages.create(**kw)
            assert out.model_extra["session_id"] == sid
            content = [block.to_dict() for block in out.content]
            got.append((content, out.stop_reason, out.usage.output_tokens, out.model_extra["token_ids"]))
            messages = [
                *messages,
                {"role": "assistant", "content": content},
                {"role": "user", "content": "?"},
            ]
        replies[sid] = got
    assert replies["msg-plain"] == replies["msg-streamed"]
    _same_tokens(_trajectory(real, "msg-plain"), _trajectory(real, "msg-streamed"))


def test_a_streamed_request_that_is_refused_gets_an_http_error_before_any_event(real):
    url = real["url"]
    history = [{"role": "user", "content": "hi"}]
    bad = [
        ("/v1/chat/completions", {"messages": history, "temperature": -1}),
        ("/v1/chat/completions", {"messages": [{"role": "bogus", "content": "x"}]}),
        ("/v1/chat/completions", {"messages": history, "n": 2}),
        ("/v1/messages", {"messages": [{"role": "tool", "content": "x"}], "max_tokens": 4}),
    ]
    for path, body in bad:
        r = httpx.post(url + path, json={**body, "stream": True}, headers={"X-Session-Id": "refused"})
        assert r.status_code == 400, r.text
        assert r.headers["content-type"].startswith("application/json") and r.json()["error"]["message"]
    assert "refused" not in httpx.get(url + "/v1/sessions").json()["open"]


def test_n_choices_are_served_to_unrecorded_requests_and_refused_to_sessions(real):
    import openai

    client = _openai(real["url"])
    messages = [{"role": "user", "content": "Pick a number."}]
    out = client.chat.completions.create(model="sao", messages=messages, max_tokens=5, n=3, seed=5)
    assert [c.index for c in out.choices] == [0, 1, 2]
    ids = [c.model_extra["token_ids"] for c in out.choices]
    assert len({tuple(i) for i in ids}) == 3  # seeds 5, 6, 7: three different generations
    assert out.usage.completion_tokens == sum(len(i) for i in ids)
    chunks = list(client.chat.completions.create(model="sao", messages=messages, max_tokens=5, n=3, seed=5,
                                                 stream=True))  # fmt: skip
    streamed = {
        c.choices[0].index: c.choices[0].model_extra["token_ids"]
        for c in chunks
        if c.choices[0].finish_reason
    }
    assert [streamed[i] for i in range(3)] == ids  # the same seeds give the same choices, streamed
    with pytest.raises(openai.BadRequestError, match="recorded session records one reply per request"):
        client.chat.completions.create(model="sao", messages=messages, n=2, extra_body={"session_id": "n2"})
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="sao", messages=messages, n=17)


def test_usage_is_streamed_last_when_asked_for(real):
    client = _openai(real["url"])
    kw = {"model": "sao", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    chunks = list(client.chat.completions.create(**kw, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1
    assert all(c.usage is None for c in chunks[:-1])
    plain = list(client.chat.completions.create(**kw))
    assert all(c.choices for c in plain)


def test_streamed_tool_calls_and_reasoning_parse_in_the_openai_sdk_as_the_plain_reply(scripted):
    client = _openai(scripted["url"])
    kw = {"model": "sao", "messages": [{"role": "user", "content": "2+3?"}], "tools": [TOOL_SCHEMA]}
    plain = client.chat.completions.create(**kw).choices[0].message
    with client.chat.completions.stream(**kw) as stream:  # the SDK's accumulating stream helper
        for _ in stream:
            pass
        final = stream.get_final_completion()
    chunks = list(client.chat.completions.create(**kw, stream=True))
    message = final.choices[0].message
    assert message.content == plain.content == "Let me compute."
    assert plain.model_extra["reasoning_content"] == "add them up first"
    reasoning = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks)
    assert reasoning == "add them up first"
    [call], [plain_call] = message.tool_calls, plain.tool_calls
    assert call.function.name == plain_call.function.name == "calc"
    assert json.loads(call.function.arguments) == json.loads(plain_call.function.arguments) == {"expr": "2+3"}
    assert call.id.startswith("call_") and final.choices[0].finish_reason == "tool_calls"
    arg_chunks = [c for c in chunks if c.choices[0].delta.tool_calls]
    assert arg_chunks[0].choices[0].delta.tool_calls[0].function.name == "calc" and len(arg_chunks) > 2


def test_streamed_thinking_and_tool_use_parse_in_the_anthropic_sdk_as_the_plain_reply(scripted):
    client = _anthropic(scripted["url"])
    tools = [{"name": "calc", "input_schema": TOOL_SCHEMA["function"]["parameters"]}]
    kw = {
        "model": "sao",
        "max_tokens": 256,
        "messages": [{"role": "user", "content": "2+3?"}],
        "tools": tools,
    }
    plain = client.messages.create(**kw)
    with client.messages.stream(**kw) as stream:
        deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert {"thinking_delta", "signature_delta", "text_delta", "input_json_delta"} <= set(deltas)
    strip = [{k: v for k, v in b.to_dict().items() if k != "id"} for b in final.content]
    assert strip == [{k: v for k, v in b.to_dict().items() if k != "id"} for b in plain.content]
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
    assert final.content[0].thinking == "add them up first" and final.content[0].signature
    assert final.content[2].input == {"expr": "2+3"} and final.stop_reason == "tool_use"
    assert final.model_extra["token_ids"] == plain.model_extra["token_ids"]


def test_chat_chunks_end_with_done_and_put_saos_fields_on_the_last_choice_chunk():
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    message = {"role": "assistant", "content": "a b", "tool_calls": [call]}
    choice = {"index": 0, "message": message, "finish_reason": "tool_calls", "logprobs": {"content": []},
              "token_ids": [1, 2], "versions": [3, 3]}  # fmt: skip
    out = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m", "session_id": "s",
           "choices": [choice], "prompt_token_ids": [9], "usage": {},
           "session_closed": "truncated"}  # fmt: skip
    events = list(chat_events(out))
    assert events[-1] == "data: [DONE]\n\n" and all(e.startswith("data: ") for e in events)
    chunks = [json.loads(e[len("data: ") :]) for e in events[:-1]]
    assert all(c["session_id"] == "s" and c["object"] == "chat.completion.chunk" for c in chunks)
    last = chunks[-1]
    assert last["prompt_token_ids"] == [9] and last["session_closed"] == "truncated"
    assert last["choices"][0]["token_ids"] == [1, 2] and last["choices"][0]["versions"] == [3, 3]
    assert not any("prompt_token_ids" in c for c in chunks[:-1])
    calls = [
        c["choices"][0]["delta"]["tool_calls"][0] for c in chunks if "tool_calls" in c["choices"][0]["delta"]
    ]
    assert calls[0] == {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "f", "arguments": ""},
    }
    assert "".join(c["function"]["arguments"] for c in calls) == '{"x": 1}'
