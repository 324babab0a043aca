"""Load: 100 concurrent multi-turn sessions through the real openai SDK, a real uvicorn server and a real
LocalEngine, with fewer in-flight slots than sessions (so some requests are refused with 503 and retried by
the SDK after Retry-After): every session is recorded exactly once, token-exact, with its reward."""

from __future__ import annotations

import asyncio
import json
import time

from sao.engine import LocalEngine
from sao.serve.gateway import create_app

from .recording import check_token_exact, play_session

SESSIONS = 100
MAX_TOKENS = 6


def test_100_concurrent_sessions_are_recorded_exactly_once_and_token_exact(
    tiny_moe_dir, tiny_tokenizer, serve_app, tmp_path
):
    import httpx
    from openai import AsyncOpenAI

    engine = LocalEngine(tiny_moe_dir, device="cpu", dtype="float32", max_running=32)
    received = []
    out = tmp_path / "trajectories.jsonl"
    app = create_app(
        engine,
        tiny_tokenizer,
        default_max_tokens=MAX_TOKENS,
        on_trajectory=received.append,
        output_path=out,
        max_pending=48,  # below the 100 sessions: the SDK's retries on 503 + Retry-After are exercised
        reasoning_parser=None,  # check_token_exact re-renders each reply's content as the generated text
    )
    url = serve_app(app)
    turns_of = {f"load-{i}": 2 + i % 2 for i in range(SESSIONS)}  # 2 or 3 turns
    reward_of = {sid: i / SESSIONS for i, sid in enumerate(turns_of)}

    async def run() -> dict:
        client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=30, timeout=120)
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:

            async def one(i: int, sid: str) -> list:
                played = await play_session(client, sid, turns_of[sid], max_tokens=MAX_TOKENS, seed=i)
                r = await http.post(f"/v1/sessions/{sid}/reward", json={"reward": reward_of[sid]})
                assert r.status_code == 200, r.text
                return played

            played = await asyncio.gather(*(one(i, sid) for i, sid in enumerate(turns_of)))
            stats = (await http.get("/v1/stats")).json()
        await client.close()
        return {"played": dict(zip(turns_of, played, strict=True)), "stats": stats}

    started = time.perf_counter()
    result = asyncio.run(run())
    seconds = time.perf_counter() - started
    asyncio.run(engine.close())

    by_session = {}
    for traj in received:
        assert traj.prompt_id not in by_session, f"{traj.prompt_id} emitted twice"
        by_session[traj.prompt_id] = traj
    assert set(by_session) == set(turns_of)
    for sid, played in result["played"].items():
        traj = by_session[sid]
        traj.validate()
        check_token_exact(traj, played, tiny_tokenizer, reward_of[sid])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["prompt_id"] for r in rows) == sorted(turns_of)
    assert {r["traj_id"] for r in rows} == {t.traj_id for t in received}
    stats = result["stats"]
    assert stats["sessions"]["open"] == 0 and stats["sessions"]["closed"] == SESSIONS
    assert stats["sessions"]["abandoned"] == 0 and stats["requests"]["in_flight"] == 0
    requests = sum(turns_of.values())
    print(
        f"{SESSIONS} sessions, {requests} requests in {seconds:.1f} s "
        f"({stats['requests']['rejected_overloaded']} refused with 503 and retried)"
    )
