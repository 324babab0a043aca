"""The OpenAI-compatible gateway, end to end with the openai client and a real LocalEngine."""

from __future__ import annotations

import time

import pytest
import torch

from conftest import free_port
from sao.engine import LocalEngine
from sao.models.forward import token_logprobs
from sao.models.loading import load_policy
from sao.serve.gateway import create_app
from sao.serve.sessions import ChatSession
from sao.types import Batch


@pytest.fixture(scope="module")
def gateway(tiny_moe_dir, tiny_tokenizer, tmp_path_factory, serve_app):
    engine = LocalEngine(tiny_moe_dir, device="cpu", dtype="float32", max_running=8)
    received = []
    out = tmp_path_factory.mktemp("gw") / "trajectories.jsonl"
    app = create_app(
        engine, tiny_tokenizer, default_max_tokens=16, on_trajectory=received.append, output_path=out
    )
    url = serve_app(app)
    return {"url": url, "received": received, "out": out, "app": app}


@pytest.fixture
def client(gateway):
    from openai import OpenAI

    return OpenAI(base_url=gateway["url"] + "/v1", api_key="unused", max_retries=0)


def test_two_turn_session_is_recorded_token_exactly(gateway, client, tiny_moe_dir, tiny_tokenizer):
    import httpx

    sid = "session-two-turns"
    messages = [{"role": "user", "content": "What is 2+3?"}]
    first = client.chat.completions.create(
        model="sao", messages=messages, max_tokens=8, seed=1, extra_headers={"X-Session-Id": sid}
    )
    reply = first.choices[0].message.content
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "And 4+4?"}]
    second = client.chat.completions.create(
        model="sao", messages=messages, max_tokens=8, seed=2, extra_headers={"X-Session-Id": sid}
    )
    r = httpx.post(f"{gateway['url']}/v1/sessions/{sid}/reward", json={"reward": 1.0})
    assert r.status_code == 200, r.text
    [traj] = [t for t in gateway["received"] if t.prompt_id == sid]
    traj.validate()
    assert traj.num_turns == 2 and traj.rewards == [1.0]
    assert traj.metadata["prefix_mismatch"] is False

    first_ids = first.choices[0].model_extra["token_ids"]
    second_ids = second.choices[0].model_extra["token_ids"]
    prompt1 = first.model_extra["prompt_token_ids"]
    prompt2 = second.model_extra["prompt_token_ids"]
    # Turn 2's prompt extends turn 1's prompt + its generated tokens exactly (no re-rendering).
    assert prompt2[: len(prompt1) + len(first_ids)] == prompt1 + first_ids
    assert traj.token_ids == prompt2 + second_ids
    generated = [t for t, m in zip(traj.token_ids, traj.action_mask, strict=True) if m]
    assert generated == first_ids + second_ids
    # The recorded log-probs are the engine's, and they match the trainer's teacher-forced ones.
    recorded = [lp for lp, m in zip(traj.rollout_logprobs, traj.action_mask, strict=True) if m]
    api_lps = [c.logprob for c in first.choices[0].logprobs.content + second.choices[0].logprobs.content]
    assert recorded == pytest.approx(api_lps)
    policy = load_policy(tiny_moe_dir, dtype="float32", device="cpu")
    batch = Batch.from_trajectories([traj])
    with torch.no_grad():
        trainer_lp, _ = token_logprobs(policy, batch)
    torch.testing.assert_close(
        trainer_lp[batch.action_mask], batch.rollout_logprobs[batch.action_mask], atol=1e-4, rtol=0
    )
    assert gateway["out"].read_text().count(traj.traj_id) == 1


def test_recorded_sessions_open_in_the_trajectory_inspector(gateway, client, tiny_moe_dir):
    import httpx

    from sao.inspector import load_source, render_html

    sid = "session-inspected"
    client.chat.completions.create(model="sao", messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
                                   seed=3, extra_headers={"X-Session-Id": sid})  # fmt: skip
    assert httpx.post(f"{gateway['url']}/v1/sessions/{sid}/reward", json={"reward": 0.5}).status_code == 200
    doc = load_source(gateway["out"], tokenizer=tiny_moe_dir)
    (rec,) = [r for r in doc["trajectories"] if r["session_id"] == sid]
    (traj,) = [t for t in gateway["received"] if t.prompt_id == sid]
    assert rec["tokens"]["id"] == traj.token_ids and rec["reward"] == 0.5
    assert rec["tokens"]["role"].count("a") == traj.num_action_tokens
    assert sid in render_html(doc)


def test_edited_history_is_recorded_as_a_flagged_branch(gateway, client):
    import httpx

    sid = "session-branch"
    messages = [{"role": "user", "content": "hi"}]
    client.chat.completions.create(
        model="sao", messages=messages, max_tokens=4, extra_body={"session_id": sid}
    )
    edited = [*messages, {"role": "assistant", "content": "something else"}, {"role": "user", "content": "?"}]
    client.chat.completions.create(model="sao", messages=edited, max_tokens=4, extra_body={"session_id": sid})
    r = httpx.post(f"{gateway['url']}/v1/sessions/{sid}/reward", json={"reward": 0.0})
    flags = [t["prefix_mismatch"] for t in r.json()["trajectories"]]
    assert flags == [False, True]


def test_malformed_requests_get_4xx_and_the_server_stays_up(gateway, client):
    import httpx
    import openai

    url = gateway["url"]
    assert httpx.post(f"{url}/v1/chat/completions", json={"messages": []}).status_code == 400
    assert httpx.post(f"{url}/v1/chat/completions", content=b"{not json").status_code in (400, 422)
    bad_temp = {"messages": [{"role": "user", "content": "x"}], "temperature": -1}
    assert httpx.post(f"{url}/v1/chat/completions", json=bad_temp).status_code == 400
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="sao", messages=[{"role": "user", "content": "x"}], n=17)
    assert httpx.post(f"{url}/v1/sessions/nope/reward", json={"reward": 1}).status_code == 404
    assert httpx.post(f"{url}/v1/completions", json={"prompt": [10**9]}).status_code == 400
    ok = client.chat.completions.create(
        model="sao", messages=[{"role": "user", "content": "x"}], max_tokens=2
    )
    assert ok.choices[0].message.role == "assistant"


def test_completions_endpoint_returns_token_ids_and_logprobs(client):
    out = client.completions.create(model="sao", prompt="12+3=", max_tokens=5, seed=3)
    choice = out.choices[0]
    assert len(choice.model_extra["token_ids"]) == len(choice.logprobs.token_logprobs) <= 5
    assert all(lp <= 0 for lp in choice.logprobs.token_logprobs)


def test_a_session_extends_its_branch_with_the_suffix_of_the_new_messages(tiny_tokenizer):
    session = ChatSession(tiny_tokenizer, "s")
    ids1 = session.prompt_for([{"role": "user", "content": "a"}])
    gen = tiny_tokenizer("ok", add_special_tokens=False)["input_ids"] + [tiny_tokenizer.eos_token_id]
    session.record_generation(gen, [-0.5] * len(gen), [3] * len(gen), "stop")
    msgs = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "b"},
    ]
    ids2 = session.prompt_for(msgs)
    assert ids2[: len(ids1) + len(gen)] == ids1 + gen
    full = tiny_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert ids2 == tiny_tokenizer(full, add_special_tokens=False)["input_ids"]
    [traj] = session.trajectories([1.0])
    assert traj.versions.count(3) == len(gen)


def test_sao_serve_command_serves_records_sessions_and_applies_its_limits(tiny_moe_dir, tmp_path):
    import subprocess
    import sys

    import httpx

    port = free_port()
    out = tmp_path / "sessions.jsonl"
    cmd = [sys.executable, "-m", "sao.cli", "serve", "--model", str(tiny_moe_dir), "--port", str(port)]
    limits = ["--max-sessions", "1", "--session-idle-timeout", "300", "--max-body-bytes", "4000"]
    limits += ["--max-pending", "5", "--retry-after", "7", "--max-context-tokens", "512"]
    proc = subprocess.Popen(
        [*cmd, "--out", str(out), "--device", "cpu", *limits], stderr=subprocess.PIPE, text=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            try:
                if httpx.get(f"{url}/v1/models").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stderr.read()
            assert time.time() < deadline, "sao serve did not come up"
            time.sleep(0.3)
        stats = httpx.get(f"{url}/v1/stats").json()
        assert stats["sessions"]["max_sessions"] == 1 and stats["sessions"]["idle_timeout_s"] == 300
        assert stats["requests"]["max_pending"] == 5
        assert stats["limits"]["max_body_bytes"] == 4000 and stats["limits"]["max_context_tokens"] == 512
        body = {"messages": [{"role": "user", "content": "1+1"}], "max_tokens": 4, "session_id": "cli"}
        assert httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).status_code == 200
        second = httpx.post(f"{url}/v1/chat/completions", json={**body, "session_id": "other"}, timeout=60)
        assert second.status_code == 429 and second.headers["retry-after"] == "7"  # --max-sessions 1
        big = {**body, "messages": [{"role": "user", "content": "x" * 4000}]}
        assert httpx.post(f"{url}/v1/chat/completions", json=big, timeout=60).status_code == 413
        assert httpx.post(f"{url}/v1/sessions/cli/reward", json={"reward": 1.0}).status_code == 200
        assert '"prompt_id": "cli"' in out.read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_requests_without_a_session_are_not_recorded(gateway, client):
    import httpx

    before = httpx.get(f"{gateway['url']}/v1/sessions").json()["open"]
    out = client.chat.completions.create(
        model="sao", messages=[{"role": "user", "content": "x"}], max_tokens=2
    )
    assert out.model_extra["session_id"] is None
    assert httpx.get(f"{gateway['url']}/v1/sessions").json()["open"] == before
