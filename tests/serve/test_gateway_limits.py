"""The gateway's limits, each against a real uvicorn server and a real LocalEngine: open sessions (429),
idle sessions (abandoned, never emitted), body size (413, also chunked), requests in flight (503), the
context (max_tokens capped, a full prompt refused), and bad requests amid good concurrent sessions."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
import time

import httpx
import pytest

from sao.engine import LocalEngine
from sao.serve.gateway import create_app
from sao.serve.limits import GatewayLimits
from sao.serve.registry import SessionRegistry
from sao.serve.sessions import ChatSession

from .recording import check_token_exact, play_session

USER = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def engine(tiny_moe_dir):
    engine = LocalEngine(tiny_moe_dir, device="cpu", dtype="float32", max_running=8)
    yield engine
    asyncio.run(engine.close())


def chat(url: str, sid: str | None, messages=USER, timeout: float = 60, **body) -> httpx.Response:
    headers = {"X-Session-Id": sid} if sid else {}
    payload = {"messages": messages, "max_tokens": 2, **body}
    return httpx.post(f"{url}/v1/chat/completions", json=payload, headers=headers, timeout=timeout)


def error(r: httpx.Response) -> str:
    return r.json()["error"]["message"]


def test_a_new_session_beyond_max_sessions_gets_429_and_open_sessions_go_on(
    engine, tiny_tokenizer, serve_app
):
    app = create_app(engine, tiny_tokenizer, max_sessions=2, retry_after_s=3)
    url = serve_app(app)
    assert chat(url, "a").status_code == 200 and chat(url, "b").status_code == 200
    refused = chat(url, "c")
    assert refused.status_code == 429 and refused.headers["retry-after"] == "3"
    assert "max_sessions" in error(refused) and refused.json()["error"]["type"] == "too_many_sessions"
    assert httpx.get(f"{url}/v1/sessions").json()["open"] == ["a", "b"]  # "c" left no trace
    second = [*USER, {"role": "assistant", "content": "x"}, {"role": "user", "content": "again"}]
    assert chat(url, "a", second).status_code == 200  # an open session is never refused
    assert httpx.post(f"{url}/v1/sessions/a/reward", json={"reward": 1.0}).status_code == 200
    assert chat(url, "c").status_code == 200  # the slot "a" freed
    assert httpx.get(f"{url}/v1/stats").json()["sessions"]["rejected"] == 1


def test_idle_sessions_are_abandoned_by_the_sweeper_and_never_emitted(
    engine, tiny_tokenizer, serve_app, tmp_path
):
    received, out = [], tmp_path / "trajectories.jsonl"
    app = create_app(
        engine, tiny_tokenizer, session_idle_timeout_s=1.0, on_trajectory=received.append, output_path=out
    )
    url = serve_app(app)
    assert chat(url, "idle").status_code == 200
    messages = list(USER)
    for k in range(6):  # "active" lives 2.4x the timeout, but is never idle that long
        r = chat(url, "active", messages)
        assert r.status_code == 200, r.text
        messages += [
            {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
            {"role": "user", "content": f"turn {k}"},
        ]
        time.sleep(0.4)
    listing = httpx.get(f"{url}/v1/sessions").json()
    assert listing["open"] == ["active"] and listing["abandoned"] == 1
    late = httpx.post(f"{url}/v1/sessions/idle/reward", json={"reward": 1.0})
    assert late.status_code == 404 and "abandoned" in error(late)
    assert httpx.post(f"{url}/v1/sessions/active/reward", json={"reward": 0.5}).status_code == 200
    [traj] = received
    assert traj.prompt_id == "active" and traj.num_turns == 6

    # Then no request at all: the lifespan's sweeper alone must free a session that goes quiet.
    assert chat(url, "quiet").status_code == 200
    deadline = time.time() + 10
    while "quiet" in app.state.registry and time.time() < deadline:
        time.sleep(0.05)
    assert "quiet" not in app.state.registry and app.state.registry.abandoned == 2
    assert received == [traj]  # abandoned sessions are emitted nowhere
    [row] = out.read_text().splitlines()
    assert '"prompt_id": "active"' in row


def test_registry_sweeps_idle_sessions_but_never_busy_ones(tiny_tokenizer):
    now = [0.0]
    registry = SessionRegistry(
        lambda sid: ChatSession(tiny_tokenizer, sid), max_sessions=2, idle_timeout_s=10, retry_after_s=1,
        clock=lambda: now[0],
    )  # fmt: skip
    busy, idle = registry.open("busy"), registry.open("idle")
    for entry in (busy, idle):
        entry.session.prompt_for(USER)  # something recorded: kept on release
    registry.release(idle)
    now[0] = 11.0
    assert registry.sweep() == ["idle"]  # "busy" is as old, but has a request in flight
    assert "busy" in registry and registry.abandoned == 1
    registry.release(busy)
    now[0] = 20.0
    assert registry.sweep() == []  # idle for 9 s only: idle time counts from the end of the request
    failed = registry.open("failed")  # nothing recorded (the request failed): dropped on release
    registry.release(failed)
    assert "failed" not in registry and registry.abandoned == 1


def test_bodies_over_max_body_bytes_get_413_before_parsing_also_when_chunked(
    engine, tiny_tokenizer, serve_app
):
    app = create_app(engine, tiny_tokenizer, max_body_bytes=2048)
    url = serve_app(app)
    big = [{"role": "user", "content": "x" * 3000}]
    declared = chat(url, "big", big)
    assert declared.status_code == 413 and "2048 bytes" in error(declared)

    def chunks():  # no Content-Length: the transfer is chunked
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(8):
            yield b"y" * 512
        yield b'"}]}'

    chunked = httpx.post(
        f"{url}/v1/chat/completions", content=chunks(), headers={"X-Session-Id": "chunked"}, timeout=60
    )
    assert "content-length" not in chunked.request.headers
    assert chunked.status_code == 413 and "2048 bytes" in error(chunked)
    not_json = httpx.post(f"{url}/v1/chat/completions", content=b"{" * 4096, timeout=60)
    assert not_json.status_code == 413  # refused before parsing: a parse error would be 400
    assert httpx.get(f"{url}/v1/sessions").json()["open"] == []
    assert chat(url, "small").status_code == 200
    assert httpx.get(f"{url}/v1/stats").json()["requests"]["rejected_too_large"] == 3


class HeldEngine:
    """The real engine behind a turnstile: each ``generate`` waits until ``release`` is set (by the test
    thread), so the test controls how many requests are in flight."""

    def __init__(self, inner: LocalEngine) -> None:
        self.inner = inner
        self.release = threading.Event()
        self.context_limit = inner.context_limit

    async def generate(self, prompt, params):
        await asyncio.to_thread(self.release.wait, 60)
        return await self.inner.generate(prompt, params)


def test_requests_beyond_max_pending_get_503_with_retry_after(engine, tiny_tokenizer, serve_app):
    held = HeldEngine(engine)
    app = create_app(held, tiny_tokenizer, max_pending=2, retry_after_s=2)
    url = serve_app(app)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = [pool.submit(chat, url, f"held-{i}") for i in range(2)]
        try:
            deadline = time.time() + 30
            while httpx.get(f"{url}/v1/stats").json()["requests"]["in_flight"] < 2:
                assert time.time() < deadline, "the two requests never got in flight"
                time.sleep(0.02)
            refused = chat(url, "third", timeout=5)  # without the gate it would wait for the turnstile
            prompt = {"prompt": "1+", "max_tokens": 2}
            completion = httpx.post(f"{url}/v1/completions", json=prompt, timeout=5)
        finally:
            held.release.set()
        assert [f.result().status_code for f in first] == [200, 200]
    assert refused.status_code == 503 and refused.headers["retry-after"] == "2"
    assert "max_pending" in error(refused) and refused.json()["error"]["type"] == "overloaded"
    assert completion.status_code == 503
    assert "third" not in httpx.get(f"{url}/v1/sessions").json()["open"]  # refused: nothing recorded
    assert chat(url, "third").status_code == 200
    stats = httpx.get(f"{url}/v1/stats").json()["requests"]
    assert stats["rejected_overloaded"] == 2 and stats["in_flight"] == 0


def test_max_tokens_is_capped_by_the_context_and_a_full_prompt_gets_400(engine, tiny_tokenizer, serve_app):
    url = serve_app(create_app(engine, tiny_tokenizer, max_context_tokens=64))
    prompt = list(range(40, 80))  # 40 tokens: 24 left of the 64
    r = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 100, "seed": 1}, timeout=60)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]  # completions have no stop token: only the cap ends it
    assert len(choice["token_ids"]) == 24 and choice["finish_reason"] == "length"
    full = httpx.post(f"{url}/v1/completions", json={"prompt": list(range(64))}, timeout=60)
    assert full.status_code == 400 and "fills the context of 64 tokens" in error(full)
    assert full.json()["error"]["type"] == "context_length_exceeded"
    long_chat = chat(url, "long", [{"role": "user", "content": "z" * 80}])
    assert long_chat.status_code == 400 and "fills the context" in error(long_chat)
    assert httpx.get(f"{url}/v1/sessions").json()["open"] == []


def test_the_context_limit_defaults_to_the_engines(engine, tiny_tokenizer, serve_app):
    url = serve_app(create_app(engine, tiny_tokenizer))
    assert httpx.get(f"{url}/v1/stats").json()["limits"]["max_context_tokens"] == engine.context_limit
    assert httpx.get(f"{url}/v1/models").json()["data"][0]["max_model_len"] == engine.context_limit


def test_invalid_limits_are_refused(engine, tiny_tokenizer):
    for bad in (
        {"max_sessions": 0},
        {"max_pending": -1},
        {"session_idle_timeout_s": 0},
        {"max_body_bytes": 0},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            create_app(engine, tiny_tokenizer, **bad)
    assert GatewayLimits().max_pending >= 1


def test_bad_requests_amid_good_concurrent_sessions_affect_none_of_them(engine, tiny_tokenizer, serve_app):
    from openai import AsyncOpenAI

    received = []
    app = create_app(
        engine, tiny_tokenizer, on_trajectory=received.append, max_body_bytes=4096, max_context_tokens=160,
        reasoning_parser=None,  # check_token_exact re-renders each reply's content as the generated text
    )  # fmt: skip
    url = serve_app(app)
    sids = [f"good-{i}" for i in range(12)]

    async def run() -> dict[str, list]:
        client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:

            async def bad_requests(sid: str, history: list) -> None:
                """Between two good turns, bad requests that name the same session."""
                header = {"X-Session-Id": sid}
                too_long = [*history, {"role": "user", "content": "w" * 200}]
                bad = [
                    ({"json": {"messages": too_long}}, 400),  # renders, then is over the context
                    ({"json": {"messages": [*history, {"role": "x", "content": "?"}]}}, 400),  # template
                    ({"content": b"{not json"}, 400),
                    ({"json": {"messages": history, "temperature": -1}}, 400),
                    ({"json": {"messages": history, "n": 2}}, 400),
                    ({"json": {"messages": history, "stream": True, "temperature": -1}}, 400),
                    ({"content": b'{"messages": "' + b"v" * 5000 + b'"}'}, 413),
                ]
                for kwargs, status in bad:
                    r = await http.post("/v1/chat/completions", headers=header, **kwargs)
                    assert r.status_code == status and r.json()["error"]["message"], r.text
                both = await http.post(f"/v1/sessions/{sid}/reward", json={"reward": 1, "rewards": [1]})
                assert both.status_code == 400

            async def one(i: int, sid: str) -> list:
                between = functools.partial(bad_requests, sid)
                played = await play_session(client, sid, 2, max_tokens=6, seed=i, between=between)
                r = await http.post(f"/v1/sessions/{sid}/reward", json={"reward": float(i)})
                assert r.status_code == 200, r.text
                return played

            played = await asyncio.gather(*(one(i, sid) for i, sid in enumerate(sids)))
        await client.close()
        return dict(zip(sids, played, strict=True))

    played = asyncio.run(run())
    assert sorted(t.prompt_id for t in received) == sorted(sids)  # exactly one trajectory each
    for traj in received:
        check_token_exact(traj, played[traj.prompt_id], tiny_tokenizer, float(sids.index(traj.prompt_id)))
    assert httpx.get(f"{url}/v1/sessions").json()["open"] == []


def test_a_dead_engine_under_supervision_gets_503_with_retry_after(tiny_tokenizer, serve_app):
    """The gateway in front of a `SupervisedEngine` whose server is gone (an attached URL nobody listens on;
    its restart fails too): 503 with ``Retry-After``, not a 500, and nothing recorded."""
    from sao.engine.server_process import free_port
    from sao.engine.vllm import VLLMEngine
    from sao.runtime.engine_guard import SupervisedEngine

    async def start():
        raise OSError("no server to attach to")

    async def weights():
        return {}, 0

    dead = VLLMEngine(f"http://127.0.0.1:{free_port()}", "m", 512)
    app = create_app(SupervisedEngine(dead, start, weights, max_restarts=1), tiny_tokenizer, retry_after_s=5)
    url = serve_app(app)
    for _ in range(2):  # the crash itself, then the supervisor that gave up
        r = chat(url, "s")
        assert r.status_code == 503 and r.headers["retry-after"] == "5" and "engine" in error(r)
    assert httpx.get(f"{url}/v1/sessions").json()["open"] == []
