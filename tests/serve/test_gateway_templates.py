"""The gateway records sessions token-in/token-out with a real BPE tokenizer and templates that rewrite
history (Qwen3-like with thinking, Hermes-like), through the OpenAI and the Anthropic protocols.

A tiny BPE model steered to write ``<think>`` blocks (the ``steer_bpe`` fixture)
serves a three-turn session whose later requests echo the replies as the client got them: the session
never branches, every request's prompt is the recorded tokens plus the template's suffix for the new
messages, the trained action tokens are the replies' tokens, the DIS ratio is 1, and an earlier reply's
reasoning stays as generated where the template would strip it."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import torch

from sao.engine import LocalEngine
from sao.envs.calculator import TOOL_SCHEMA
from sao.models.forward import token_logprobs
from sao.models.loading import load_tokenizer
from sao.serve.gateway import create_app
from sao.types import Batch

from .test_gateway_sessions import Hooks


@pytest.fixture(scope="module")
def bpe_dir(tiny_bpe_dir):
    return tiny_bpe_dir


async def _openai_turn(client, messages, sid):
    r = await client.post(
        "/v1/chat/completions",
        json={"messages": messages, "session_id": sid, "max_tokens": 12, "tools": [TOOL_SCHEMA], "seed": 1},
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["message"], choice["token_ids"], r.json()["prompt_token_ids"]


async def _anthropic_turn(client, messages, sid):
    tools = [{"name": "calc", "input_schema": TOOL_SCHEMA["function"]["parameters"]}]
    body = {"messages": messages, "max_tokens": 12, "tools": tools, "system": "Be brief."}
    r = await client.post("/v1/messages", json=body, headers={"X-Session-Id": sid})
    assert r.status_code == 200, r.text
    out = r.json()
    return {"role": "assistant", "content": out["content"]}, out["token_ids"], out["prompt_token_ids"]


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
@pytest.mark.parametrize("template", ["qwen3", "hermes"])
def test_a_session_with_a_rewriting_template_records_the_engines_tokens_without_branching(
    bpe_dir, steer_bpe, template, protocol
):
    tok = load_tokenizer(bpe_dir, chat_template=template)
    model = steer_bpe(bpe_dir, tok)

    async def main():
        engine = LocalEngine(model, tok, max_running=4)
        hooks = Hooks()
        app = create_app(engine, tok, default_max_tokens=12, hooks=hooks)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw", timeout=60)
        turn = _openai_turn if protocol == "openai" else _anthropic_turn
        messages = [{"role": "user", "content": "What is 2 + 3?"}]
        if protocol == "openai":
            messages.insert(0, {"role": "system", "content": "Be brief."})
        replies, prompts = [], []
        for follow in ("Use the tool.", "Now answer."):
            reply, ids, prompt = await turn(client, messages, "s")
            replies.append(ids)
            prompts.append(prompt)
            messages = [*messages, reply, {"role": "user", "content": follow}]
        reply, ids, prompt = await turn(client, messages, "s")
        replies.append(ids)
        prompts.append(prompt)
        assert (await client.post("/v1/sessions/s/reward", json={"reward": 1.0})).status_code == 200
        await engine.close()
        return hooks.sessions, replies, prompts

    sessions, replies, prompts = asyncio.run(main())
    [(_, [traj])] = sessions
    traj.validate()
    assert traj.num_turns == 3 and not traj.metadata["prefix_mismatch"]
    actions = [t for t, m in zip(traj.token_ids, traj.action_mask, strict=True) if m]
    assert actions == [t for ids in replies for t in ids]
    for prompt, ids in zip(prompts, replies, strict=True):  # generated from the recorded tokens + suffix
        assert traj.token_ids[: len(prompt) + len(ids)] == prompt + ids
    batch = Batch.from_trajectories([traj])
    with torch.no_grad():
        logprobs, _ = token_logprobs(model, batch)
    mask = batch.action_mask
    torch.testing.assert_close(logprobs[mask], batch.rollout_logprobs[mask], atol=2e-4, rtol=0)
    first = tok.decode(replies[0])
    assert first in tok.decode(traj.token_ids)  # the first reply as generated, reasoning included
    assert "<think>" in tok.decode([t for ids in replies for t in ids])  # the steering wrote reasoning
