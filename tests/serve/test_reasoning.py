"""Reasoning carried: the ``think`` parser splits a turn's ``<think>`` block off its content, the gateway
returns it as ``reasoning_content`` / Anthropic ``thinking`` blocks / Responses ``reasoning`` items, and a
harness that sends it back, or drops it (as Qwen3's template does), stays on one branch whose recorded
tokens are what was generated — with the Qwen3-like template that strips earlier reasoning, through all
three APIs."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from sao.engine import LocalEngine
from sao.envs.calculator import TOOL_SCHEMA, tool_call_text
from sao.models.loading import load_tokenizer
from sao.serve.anthropic_api import MessagesRequest, to_chat_request, to_messages_response
from sao.serve.gateway import create_app
from sao.serve.reasoning import REASONING_PARSERS, get_reasoning_parser, no_reasoning, split_think
from sao.serve.replies import ReplyBuilder

from .test_gateway_sessions import Hooks
from .test_streaming import ScriptedEngine


@pytest.mark.parametrize(
    ("text", "reasoning", "content"),
    [
        ("<think>\nadd 2 and 3\n</think>\n\nIt is 5.", "add 2 and 3", "It is 5."),
        ("  <think>r</think>c", "r", "c"),
        ("add 2 and 3\n</think>\n\nIt is 5.", "add 2 and 3", "It is 5."),  # the prompt opened the block
        ("<think>\nstill thinking when cut", "still thinking when cut", ""),
        ("<think>\n\n</think>\n\nIt is 5.", None, "It is 5."),  # an empty block is no reasoning
        ("It is 5.", None, "It is 5."),
        ("", None, ""),
    ],
)
def test_the_think_parser_splits_reasoning_from_content(text, reasoning, content):
    assert split_think(text) == (reasoning, content)
    assert no_reasoning(text) == (None, text)


def test_parsers_are_chosen_by_name_and_an_unknown_name_is_refused(tiny_tokenizer):
    assert get_reasoning_parser("think") is split_think
    assert get_reasoning_parser(None) is get_reasoning_parser("none") is no_reasoning
    with pytest.raises(ValueError, match="unknown reasoning_parser 'r1': use one of 'think', 'none'"):
        get_reasoning_parser("r1")
    assert set(REASONING_PARSERS) == {"think", "none"}
    engine = ScriptedEngine(tiny_tokenizer, ["x"])
    with pytest.raises(ValueError, match="reasoning_parser"):
        create_app(engine, tiny_tokenizer, reasoning_parser="deepseek")
    with pytest.raises(ValueError, match="unknown tool-call format 'nope'"):
        create_app(engine, tiny_tokenizer, tool_call_format="nope")


def test_a_tool_call_inside_the_reasoning_is_thought_not_a_call(tiny_tokenizer):
    reply = ReplyBuilder(tiny_tokenizer, reasoning_parser="think", tool_call_format="hermes")
    call = tool_call_text("1+1")
    thought = reply(f"<think>maybe {call}</think>\n\nNo tool needed.<|im_end|>", [TOOL_SCHEMA])
    assert thought == {
        "role": "assistant",
        "content": "No tool needed.",
        "reasoning_content": f"maybe {call}",
    }
    made = reply(f"<think>use it</think>\n\n{call}<|im_end|>", [TOOL_SCHEMA])
    assert made["content"] is None and made["reasoning_content"] == "use it" and len(made["tool_calls"]) == 1
    plain = ReplyBuilder(tiny_tokenizer, reasoning_parser=None, tool_call_format="hermes")
    assert plain("<think>r</think>c<|im_end|>", None) == {"role": "assistant", "content": "<think>r</think>c"}


def test_anthropic_thinking_blocks_carry_the_reasoning_both_ways():
    chat = {"id": "chatcmpl-1", "model": "m", "usage": {}, "choices": [{"finish_reason": "stop", "message": {
        "role": "assistant", "content": "5", "reasoning_content": "add"}}]}  # fmt: skip
    out = to_messages_response(chat)
    [thinking, text] = out["content"]
    assert thinking["type"] == "thinking" and thinking["thinking"] == "add" and thinking["signature"]
    assert text == {"type": "text", "text": "5"}
    history = [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": out["content"]}]
    req = MessagesRequest(max_tokens=4, messages=history)
    echoed = to_chat_request(req).messages[1].model_dump(exclude_none=True)
    assert echoed == {"role": "assistant", "content": "5", "reasoning_content": "add"}


# ---- a session whose harness sends the reasoning back, or drops it -------------------------------------

THOUGHT = "<think>\nadd them up first\n</think>\n\nLet me compute. " + tool_call_text("2+3")
ANSWER = "<think>\nthe tool said 5\n</think>\n\nanswer: 5"
ANTHROPIC_TOOLS = [{"name": "calc", "input_schema": TOOL_SCHEMA["function"]["parameters"]}]
FLAT_TOOLS = [{"type": "function", "name": "calc", "parameters": TOOL_SCHEMA["function"]["parameters"]}]


async def _openai(client, sid, history, keep):
    body = {"messages": history, "max_tokens": 64, "tools": [TOOL_SCHEMA], "seed": len(history)}
    r = await client.post("/v1/chat/completions", json=body, headers={"X-Session-Id": sid})
    assert r.status_code == 200, r.text
    out, reply = r.json(), r.json()["choices"][0]["message"]
    reasoning = reply.get("reasoning_content")
    if not keep:
        reply = {k: v for k, v in reply.items() if k != "reasoning_content"}
    results = [
        {"role": "tool", "tool_call_id": c["id"], "content": "5"} for c in reply.get("tool_calls") or []
    ]
    return [reply, *results, {"role": "user", "content": "Go on."}], reasoning, out["choices"][0]["token_ids"]


async def _anthropic(client, sid, history, keep):
    body = {"messages": history, "max_tokens": 64, "tools": ANTHROPIC_TOOLS, "seed": len(history)}
    r = await client.post("/v1/messages", json=body, headers={"X-Session-Id": sid})
    assert r.status_code == 200, r.text
    out = r.json()
    thinking = [b["thinking"] for b in out["content"] if b["type"] == "thinking"]
    blocks = [b for b in out["content"] if keep or b["type"] != "thinking"]
    results = [
        {"type": "tool_result", "tool_use_id": b["id"], "content": "5"}
        for b in blocks
        if b["type"] == "tool_use"
    ]
    user = {"role": "user", "content": [*results, {"type": "text", "text": "Go on."}]}
    return [{"role": "assistant", "content": blocks}, user], (thinking or [None])[0], out["token_ids"]


async def _responses(client, sid, history, keep):
    body = {"input": history, "max_output_tokens": 64, "tools": FLAT_TOOLS, "seed": len(history)}
    r = await client.post("/v1/responses", json=body, headers={"X-Session-Id": sid})
    assert r.status_code == 200, r.text
    out = r.json()
    reasoning = [i["content"][0]["text"] for i in out["output"] if i["type"] == "reasoning"]
    items = [i for i in out["output"] if keep or i["type"] != "reasoning"]
    results = [{"type": "function_call_output", "call_id": i["call_id"], "output": "5"} for i in items
               if i["type"] == "function_call"]  # fmt: skip
    return (
        [*items, *results, {"role": "user", "content": "Go on."}],
        (reasoning or [None])[0],
        out["token_ids"],
    )


HARNESSES = {"openai": _openai, "anthropic": _anthropic, "responses": _responses}


def _play(make_engine, tok, protocol, keep, turns=3):
    """``turns`` requests of one session through ``protocol`` on ``make_engine()``; returns (closed
    sessions, generated ids, the reasoning each reply came with)."""

    async def main():
        engine, hooks = make_engine(), Hooks()
        app = create_app(engine, tok, default_max_tokens=64, hooks=hooks)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw", timeout=60)
        history = [{"role": "user", "content": "What is 2 + 3?"}]
        generated, reasoning = [], []
        for _ in range(turns):
            new, thought, ids = await HARNESSES[protocol](client, "s", history, keep)
            generated.append(ids)
            reasoning.append(thought)
            history = [*history, *new]
        assert (await client.post("/v1/sessions/s/reward", json={"reward": 1.0})).status_code == 200
        await engine.close()
        return hooks.sessions, generated, reasoning

    return asyncio.run(main())


@pytest.fixture(scope="module")
def qwen3_tok(tiny_bpe_dir):
    return load_tokenizer(tiny_bpe_dir, chat_template="qwen3")


def _one_branch_of_the_generated_tokens(sessions, generated, tok):
    [(_, [traj])] = sessions
    traj.validate()
    assert not traj.metadata["prefix_mismatch"] and traj.num_turns == len(generated)
    actions = [t for t, m in zip(traj.token_ids, traj.action_mask, strict=True) if m]
    assert actions == [t for ids in generated for t in ids]
    return tok.decode(traj.token_ids)


@pytest.mark.parametrize("keep", [True, False], ids=["sent-back", "dropped"])
@pytest.mark.parametrize("protocol", list(HARNESSES))
def test_a_harness_that_sends_reasoning_back_or_drops_it_stays_on_one_branch(qwen3_tok, protocol, keep):
    make = lambda: ScriptedEngine(qwen3_tok, [THOUGHT, ANSWER])  # noqa: E731
    sessions, generated, reasoning = _play(make, qwen3_tok, protocol, keep)
    assert reasoning == ["add them up first", "the tool said 5", "add them up first"]
    text = _one_branch_of_the_generated_tokens(sessions, generated, qwen3_tok)
    # Every turn's reasoning is recorded as generated, although the template strips earlier turns' reasoning.
    assert text.count("<think>\nadd them up first\n</think>") == 2 and "the tool said 5" in text


@pytest.mark.parametrize("keep", [True, False], ids=["sent-back", "dropped"])
def test_a_real_model_that_thinks_stays_on_one_branch_whatever_the_harness_does_with_it(
    tiny_bpe_dir, qwen3_tok, steer_bpe, keep
):
    model = steer_bpe(tiny_bpe_dir, qwen3_tok)
    make = lambda: LocalEngine(model, qwen3_tok, max_running=4)  # noqa: E731
    sessions, generated, reasoning = _play(make, qwen3_tok, "openai", keep)
    assert any(reasoning)  # the steered model writes <think> blocks: the parser found some reasoning
    _one_branch_of_the_generated_tokens(sessions, generated, qwen3_tok)
