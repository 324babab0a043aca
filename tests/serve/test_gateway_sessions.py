"""Gateway sessions as a training run records them: echoed tool calls, malformed input, the rules (token
budget, turn limit, fixed sampling), verifier rewards, a weight update mid-session, the Anthropic
Messages API. In-process (ASGI transport, one event loop) with a real LocalEngine on the tiny model."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
import torch

from sao.engine import LocalEngine
from sao.envs import make_env
from sao.envs.calculator import TOOL_SCHEMA, make_tasks, tool_call_text
from sao.models.forward import token_logprobs
from sao.models.loading import load_policy
from sao.runtime.gateway_run import make_verifier
from sao.serve.gateway import create_app
from sao.serve.hooks import SessionRules, VerifierError
from sao.serve.openai_api import split_tool_calls
from sao.serve.sessions import ChatSession
from sao.types import Batch

TOOLS = [TOOL_SCHEMA]


class Hooks:
    """Records what the gateway tells its owner (admits everything)."""

    def __init__(self) -> None:
        self.sessions: list[tuple[str, list[Any]]] = []  # closed: (session id, trajectories)
        self.lost: list[str] = []  # abandoned
        self.given_back: list[str] = []  # discarded

    async def admit(self, session_id, group_id):
        return None

    async def closed(self, session_id, group_id, trajectories):
        self.sessions.append((session_id, trajectories))

    def abandoned(self, session_id, group_id):
        self.lost.append(session_id)

    def discarded(self, session_id, group_id):
        self.given_back.append(session_id)


def _serve(engine, tokenizer, **kw):
    app = create_app(engine, tokenizer, default_max_tokens=8, **kw)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw", timeout=60)
    return app, client


async def _chat(client, sid, messages, **body):
    r = await client.post(
        "/v1/chat/completions", json={"messages": messages, "session_id": sid, "max_tokens": 6, **body}
    )
    return r


def test_an_echoed_tool_call_renders_as_generated_and_extends_the_branch(tiny_tokenizer):
    tok = tiny_tokenizer
    session = ChatSession(tok, "s")
    messages = [{"role": "user", "content": "What is 2 * 3?"}]
    session.commit(session.plan(messages, TOOLS))
    generated = tool_call_text("2*3") + "<|im_end|>"
    ids = tok(generated, add_special_tokens=False)["input_ids"]
    text = session.record_generation(ids, [-0.5] * len(ids), [0] * len(ids), "stop")
    content, calls = split_tool_calls(text[: -len("<|im_end|>")])
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"expr": "2*3"}
    reply = {"role": "assistant", "content": content, "tool_calls": calls}
    session.note_reply(reply)
    # As the openai SDK sends it back: structured calls, other JSON spacing than generated, extra None keys
    echoed = {
        **reply,
        "tool_calls": [{**calls[0], "function": {"name": "calc", "arguments": '{"expr":"2*3"}'}}],
    }
    follow = [*messages, echoed, {"role": "tool", "tool_call_id": calls[0]["id"], "content": "6"}]
    plan = session.plan(follow, TOOLS)
    assert plan.branch == 0 and not plan.prefix_mismatch
    assert (
        plan.delta
        == "\n<|im_start|>user\n<tool_response>\n6\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    full = tok.apply_chat_template(follow, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert not full.startswith(session.text)  # a re-rendering would not extend what was generated
    other_call = {**calls[0], "function": {"name": "calc", "arguments": '{"expr": "2*4"}'}}
    edited = [*messages, {**echoed, "tool_calls": [other_call]}]
    assert session.plan([*edited, follow[-1]], TOOLS).prefix_mismatch  # a changed call is a branch
    assert session.plan(follow, None).prefix_mismatch  # so are other tools
    assert session.plan([{"role": "user", "content": "What is 2 * 4?"}, *follow[1:]], TOOLS).prefix_mismatch
    assert session.plan(follow[:1], TOOLS).prefix_mismatch  # a resent older request
    # Without note_reply, the reply is the generated text: an echo of the text continues the branch.
    raw = ChatSession(tok, "raw")
    raw.commit(raw.plan(messages, TOOLS))
    raw.record_generation(ids, [-0.5] * len(ids), [0] * len(ids), "stop")
    as_text = [*messages, {"role": "assistant", "content": text[: -len("<|im_end|>")]}, follow[-1]]
    assert raw.plan(as_text, TOOLS).delta == plan.delta and raw.plan(follow, TOOLS).prefix_mismatch


def test_malformed_tool_calls_get_400_naming_the_field_and_leave_other_sessions_intact(
    tiny_moe_dir, tiny_tokenizer
):
    async def main():
        engine = LocalEngine(tiny_moe_dir, device="cpu", dtype="float32", max_running=4)
        hooks = Hooks()
        _, client = _serve(engine, tiny_tokenizer, hooks=hooks)
        user = {"role": "user", "content": "What is 1 + 1?"}
        first = await _chat(client, "good", [user], tools=TOOLS, seed=1)
        assert first.status_code == 200
        reply = first.json()["choices"][0]["message"]
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": "calc", "arguments": '{"expr": "1+1"}'},
        }
        bad = {
            "messages.1.tool_calls.0.function.arguments: not valid JSON": [
                user,
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{**call, "function": {"name": "calc", "arguments": "{expr: 1"}}],
                },
            ],
            "messages.1.tool_calls.0.function.arguments: must be a JSON object": [
                user,
                {
                    "role": "assistant",
                    "tool_calls": [{**call, "function": {"name": "calc", "arguments": "[1]"}}],
                },
            ],
            "messages.1.tool_calls: must be a list": [user, {"role": "assistant", "tool_calls": {"id": 1}}],
            "messages.1.tool_calls.0: must be": [user, {"role": "assistant", "tool_calls": [{"id": "x"}]}],
            "messages.2.tool_call_id: 'call_9' answers no tool call": [
                user,
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_9", "content": "2"},
            ],
            "messages.0.content.0: only text parts": [{"role": "user", "content": [{"type": "image_url"}]}],
            "messages.1.role: must be one of": [user, {"role": "robot", "content": "hi"}],
        }
        for sid in ("good", "fresh"):
            for reason, messages in bad.items():
                r = await _chat(client, sid, messages, tools=TOOLS)
                assert r.status_code == 400 and reason in r.json()["error"]["message"], (sid, reason, r.text)
        # Refused before the session is looked up: "fresh" never opened, "good" is as it was.
        assert hooks.given_back == [] and (await client.get("/v1/sessions")).json()["open"] == ["good"]
        follow = [user, reply, {"role": "user", "content": "and 2+2?"}]
        second = await _chat(client, "good", follow, tools=TOOLS, seed=2)
        assert second.status_code == 200
        r = await client.post("/v1/sessions/good/reward", json={"reward": 1.0})
        assert r.status_code == 200, r.text
        [(_, [traj])] = hooks.sessions
        assert traj.num_turns == 2 and not traj.metadata["prefix_mismatch"]
        generated = first.json()["choices"][0]["token_ids"] + second.json()["choices"][0]["token_ids"]
        assert [t for t, m in zip(traj.token_ids, traj.action_mask, strict=True) if m] == generated
        await engine.close()

    asyncio.run(main())


def test_rewards_for_unknown_closed_or_invalid_sessions_get_clear_errors(tiny_moe_dir, tiny_tokenizer):
    async def main():
        engine = LocalEngine(tiny_moe_dir, device="cpu", dtype="float32", max_running=4)
        hooks = Hooks()
        _, client = _serve(engine, tiny_tokenizer, hooks=hooks)
        assert (await _chat(client, "a", [{"role": "user", "content": "hi"}])).status_code == 200
        assert (await _chat(client, "b", [{"role": "user", "content": "hey"}])).status_code == 200
        cases = [
            ("nobody", {"reward": 1.0}, 404, "unknown or already closed session 'nobody'"),
            ("a", {"reward": 1.0, "rewards": [1.0]}, 400, "at most one of"),
            ("a", {"reward": float("nan")}, 400, "reward"),
            ("a", {"rewards": [float("inf")]}, 400, "rewards.0"),
            ("a", {}, 400, "this gateway has no verifier"),
            ("a", {"rewards": [1.0, 0.0, 1.0]}, 400, "cannot close session 'a'"),
            ("a", {"reward": 1.0, "extra": 1}, 400, "extra"),
        ]
        for sid, body, status, reason in cases:
            r = await client.post(f"/v1/sessions/{sid}/reward", content=json.dumps(body, allow_nan=True),
                                  headers={"content-type": "application/json"})  # fmt: skip
            assert r.status_code == status and reason in r.text, (body, r.text)
        assert hooks.sessions == []  # nothing was closed by a bad reward
        for sid in ("a", "b"):
            assert (await client.post(f"/v1/sessions/{sid}/reward", json={"reward": 0.5})).status_code == 200
        r = await client.post("/v1/sessions/a/reward", json={"reward": 1.0})
        assert r.status_code == 404 and "already closed" in r.text
        assert [sid for sid, _ in hooks.sessions] == ["a", "b"]
        await engine.close()

    asyncio.run(main())


def test_the_token_budget_closes_a_session_as_truncated_and_later_requests_get_409(
    tiny_moe_dir, tiny_tokenizer
):
    async def main():
        engine = LocalEngine(tiny_moe_dir, device="cpu", dtype="float32", max_running=4)
        hooks = Hooks()
        user = [{"role": "user", "content": "What is 12 + 30?"}]
        text = tiny_tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
        prompt = len(tiny_tokenizer(text, add_special_tokens=False)["input_ids"])
        rules = SessionRules(max_session_tokens=prompt + 5, max_turns=5)
        _, client = _serve(engine, tiny_tokenizer, hooks=hooks, rules=rules)
        r = await _chat(client, "cut", user, max_tokens=50, stop=None)
        body = r.json()
        assert r.status_code == 200 and body["session_closed"] == "truncated"
        assert len(body["choices"][0]["token_ids"]) == 5 and body["choices"][0]["finish_reason"] == "length"
        [(sid, [traj])] = hooks.sessions
        assert sid == "cut" and traj.rewards == [0.0] and traj.finish_reason == "length"
        assert traj.metadata["truncated"] and traj.num_tokens == prompt + 5
        again = await _chat(client, "cut", user)
        assert again.status_code == 409 and "closed: truncated by the token budget" in again.text
        late = await client.post("/v1/sessions/cut/reward", json={"reward": 1.0})
        assert late.status_code == 409 and "already closed: truncated" in late.text
        # A session whose next prompt no longer fits is closed (and emitted) before its request is refused.
        rules = SessionRules(max_session_tokens=prompt + 12)
        _, client = _serve(engine, tiny_tokenizer, hooks=hooks, rules=rules)
        first = await _chat(client, "long", user, max_tokens=2)
        assert first.status_code == 200 and "session_closed" not in first.json()
        more = [*user, first.json()["choices"][0]["message"], {"role": "user", "content": "x" * 40}]
        r = await _chat(client, "long", more)
        assert r.status_code == 400 and "closed as truncated" in r.text
        assert hooks.sessions[-1][0] == "long" and hooks.sessions[-1][1][0].rewards == [0.0]
        # A first request that does not fit records nothing.
        r = await _chat(client, "huge", [{"role": "user", "content": "y" * 200}])
        assert r.status_code == 400 and "token budget" in r.text and hooks.given_back == ["huge"]
        await engine.close()

    asyncio.run(main())


def test_turn_limit_and_fixed_sampling_of_recorded_sessions(tiny_moe_dir, tiny_tokenizer):
    async def main():
        engine = LocalEngine(tiny_moe_dir, device="cpu", dtype="float32", max_running=4)
        hooks = Hooks()
        rules = SessionRules(max_turns=1, temperature=1.0, top_p=1.0, max_tokens_per_turn=3)
        _, client = _serve(engine, tiny_tokenizer, hooks=hooks, rules=rules)
        user = [{"role": "user", "content": "hello"}]
        r = await _chat(client, "s", user, temperature=0.5)
        assert r.status_code == 400 and "temperature=0.5" in r.text and "engine.temperature" in r.text
        r = await _chat(client, "s", user, max_tokens=50)
        assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) <= 3  # engine.max_new_tokens
        again = [*user, r.json()["choices"][0]["message"], {"role": "user", "content": "more"}]
        r2 = await _chat(client, "s", again)
        assert r2.status_code == 409 and "the limit (data.max_turns)" in r2.text
        assert (await client.post("/v1/sessions/s/reward", json={"reward": 1.0})).status_code == 200
        unnamed = await client.post("/v1/chat/completions", json={"messages": user, "temperature": 0.5})
        assert unnamed.status_code == 200  # not recorded, so not bound by the run's sampling
        await engine.close()

    asyncio.run(main())


def test_the_verifier_scores_a_conversation_with_the_envs_rule():
    make = lambda: make_env("calculator")  # noqa: E731
    tasks = make_tasks(3, seed=4)
    verify = make_verifier(make, tasks, timeout_s=5)
    task = tasks[0]
    a, op, b = task.metadata["a"], task.metadata["op"], task.metadata["b"]
    args = json.dumps({"expr": f"{a}{op}{b}"})
    call = {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": args}}
    conversation = [
        {"role": "user", "content": task.prompt},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": str(task.answer)},
        {"role": "assistant", "content": f"answer: {task.answer}"},
    ]
    assert asyncio.run(verify(task.id, conversation)) == 1.0
    wrong = [*conversation[:-1], {"role": "assistant", "content": f"answer: {task.answer + 1}"}]
    assert asyncio.run(verify(task.id, wrong)) == 0.0
    no_tool = [conversation[0], conversation[-1]]
    assert asyncio.run(verify(task.id, no_tool)) == 0.0  # the answer must be read off the tool
    with pytest.raises(VerifierError, match="unknown task id 'nope'"):
        asyncio.run(verify("nope", conversation))
    with pytest.raises(VerifierError, match="no score"):
        asyncio.run(make_verifier(lambda: make_env("long_tail"), tasks, 5)(task.id, conversation))


def test_a_reward_may_come_from_the_runs_verifier(tiny_moe_dir, tiny_tokenizer):
    async def main():
        engine = LocalEngine(tiny_moe_dir, device="cpu", dtype="float32", max_running=4)
        hooks = Hooks()
        tasks = make_tasks(2, seed=0)
        verifier = make_verifier(lambda: make_env("calculator"), tasks, 5)
        _, client = _serve(engine, tiny_tokenizer, hooks=hooks, verifier=verifier)
        user = [{"role": "user", "content": tasks[0].prompt}]
        assert (await _chat(client, "v", user, task_id=tasks[0].id)).status_code == 200
        assert (await _chat(client, "w", user)).status_code == 200
        r = await client.post("/v1/sessions/w/reward", json={})
        assert r.status_code == 400 and "task_id" in r.text  # w named no task
        r = await client.post("/v1/sessions/w/reward", json={"task_id": "calculator-9-9"})
        assert r.status_code == 400 and "unknown task id" in r.text
        r = await client.post("/v1/sessions/v/reward", json={})  # v named its task at its first request
        assert r.status_code == 200 and r.json()["trajectories"][0]["rewards"] == [0.0]  # no tool, no answer
        r = await client.post("/v1/sessions/w/reward", json={"task_id": tasks[1].id})
        assert r.status_code == 200
        assert [t[1][0].prompt_id for t in hooks.sessions] == [tasks[0].id, tasks[1].id]
        # A reward given by the agent may name the task too: it becomes the trajectory's prompt id.
        assert (await _chat(client, "x", user)).status_code == 200
        r = await client.post("/v1/sessions/x/reward", json={"reward": 1.0, "task_id": tasks[0].id})
        assert r.status_code == 200
        [traj] = hooks.sessions[-1][1]
        assert traj.prompt_id == traj.metadata["task_id"] == tasks[0].id and traj.rewards == [1.0]
        await engine.close()

    asyncio.run(main())


def test_a_weight_update_mid_session_switches_versions_and_the_session_goes_on(tiny_moe_dir, tiny_tokenizer):
    async def main():
        # No KV kept across turns: the second turn re-encodes the history with the new weights, so its
        # log-probs are the new weights' teacher-forced ones (a kept prefix is tested in test_prefix_cache).
        engine = LocalEngine(
            tiny_moe_dir, device="cpu", dtype="float32", max_running=4, prefix_cache_tokens=0
        )
        hooks = Hooks()
        _, client = _serve(engine, tiny_tokenizer, hooks=hooks)
        user = [{"role": "user", "content": "What is 5 + 5?"}]
        first = (await _chat(client, "u", user, seed=3)).json()
        model = load_policy(tiny_moe_dir, dtype="float32", device="cpu")
        torch.manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        await engine.update_weights(model.state_dict(), version=1)
        follow = [*user, first["choices"][0]["message"], {"role": "user", "content": "again"}]
        second = (await _chat(client, "u", follow, seed=4)).json()
        assert set(first["choices"][0]["versions"]) == {0} and set(second["choices"][0]["versions"]) == {1}
        assert (await client.post("/v1/sessions/u/reward", json={"reward": 1.0})).status_code == 200
        [(_, [traj])] = hooks.sessions
        action = [v for v, m in zip(traj.versions, traj.action_mask, strict=True) if m]
        n1, n2 = len(first["choices"][0]["token_ids"]), len(second["choices"][0]["token_ids"])
        assert action == [0] * n1 + [1] * n2
        # The second turn's recorded log-probs are the new weights' (teacher-forced), token for token.
        batch = Batch.from_trajectories([traj])
        with torch.no_grad():
            teacher, _ = token_logprobs(model, batch)
        mask = batch.action_mask
        torch.testing.assert_close(teacher[mask][n1:], batch.rollout_logprobs[mask][n1:], atol=1e-4, rtol=0)
        await engine.close()

    asyncio.run(main())


def test_the_anthropic_messages_api_records_into_the_same_sessions(tiny_moe_dir, tiny_tokenizer):
    async def main():
        engine = LocalEngine(tiny_moe_dir, device="cpu", dtype="float32", max_running=4)
        hooks = Hooks()
        _, client = _serve(engine, tiny_tokenizer, hooks=hooks)
        tools = [{"name": "calc", "input_schema": TOOL_SCHEMA["function"]["parameters"]}]
        body = {"max_tokens": 6, "system": "be brief", "tools": tools,
                "messages": [{"role": "user", "content": "What is 3 * 3?"}]}  # fmt: skip
        r = await client.post("/v1/messages", json=body, headers={"X-Session-Id": "anth"})
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["type"] == "message" and out["role"] == "assistant" and out["session_id"] == "anth"
        assert out["stop_reason"] in ("end_turn", "max_tokens") and out["usage"]["output_tokens"] >= 1
        body["messages"] += [
            {"role": "assistant", "content": out["content"]},
            {"role": "user", "content": [{"type": "text", "text": "and 4 * 4?"}]},
        ]
        r2 = await client.post("/v1/messages", json=body, headers={"X-Session-Id": "anth"})
        assert r2.status_code == 200, r2.text
        image = [{"role": "user", "content": [{"type": "image"}]}]
        bad = await client.post(
            "/v1/messages", json={**body, "messages": image}, headers={"X-Session-Id": "o"}
        )
        assert bad.status_code == 400 and "unknown content block type 'image'" in bad.text
        assert (await client.post("/v1/sessions/anth/reward", json={"reward": 1.0})).status_code == 200
        [(_, [traj])] = hooks.sessions
        assert traj.num_turns == 2 and not traj.metadata["prefix_mismatch"]
        assert [t for t, m in zip(traj.token_ids, traj.action_mask, strict=True) if m] == (
            out["token_ids"] + r2.json()["token_ids"]
        )
        await engine.close()

    asyncio.run(main())


def test_the_anthropic_sdk_sends_its_replies_back_and_the_session_does_not_branch(
    tiny_moe_dir, tiny_tokenizer, serve_app
):
    anthropic = pytest.importorskip("anthropic")
    engine = LocalEngine(tiny_moe_dir, device="cpu", dtype="float32", max_running=4)
    hooks = Hooks()
    url = serve_app(create_app(engine, tiny_tokenizer, default_max_tokens=8, hooks=hooks))
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    tools = [{"name": "calc", "input_schema": TOOL_SCHEMA["function"]["parameters"]}]
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    sid = {"X-Session-Id": "sdk"}
    first = client.messages.create(model="m", max_tokens=6, messages=messages, tools=tools, extra_headers=sid)
    messages += [{"role": "assistant", "content": first.content}, {"role": "user", "content": "and 3?"}]
    second = client.messages.create(
        model="m", max_tokens=6, messages=messages, tools=tools, extra_headers=sid
    )
    assert first.stop_reason in ("end_turn", "max_tokens") and second.usage.output_tokens >= 1
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
    with pytest.raises(anthropic.BadRequestError, match="unknown content block type 'image'"):
        client.messages.create(model="m", max_tokens=6, messages=[{"role": "user", "content": [image]}])
    assert httpx.post(f"{url}/v1/sessions/sdk/reward", json={"reward": 1.0}).status_code == 200
    [(_, [traj])] = hooks.sessions
    assert traj.num_turns == 2 and not traj.metadata["prefix_mismatch"]
