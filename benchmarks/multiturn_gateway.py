"""Benchmark: the gateway's request overhead at turn 1, 10, 25 and 50 of long agent sessions.

Request overhead = a chat request's wall time as the agent sees it (``httpx`` call and JSON decode of the
reply) minus the engine's ``generate`` time for it (timed by a thin wrapper around the engine): the HTTP
layer, parsing, sao's session logic (matching the history against the recorded one, rendering and
tokenizing the new messages, recording) and the response. The server-side part (the ASGI app's time minus
``generate``) is reported too, as it excludes the client's JSON encoding of the history and decoding of
the reply. The target (issue 27) is overhead at turn 50 <= 1.5x turn 1: what a request costs must not
grow with the history beyond the unavoidable parsing of the JSON the client sends.

Workload: the tiny Qwen3-MoE with the BPE tokenizer and the shipped ``qwen3`` chat template (fp32, CPU, a
real `LocalEngine`), served by `sao.serve.gateway.create_app` under uvicorn on 127.0.0.1 (a thread of this
process) and called over real HTTP. A session: a system prompt and a user task with the calculator tool,
then per turn the client echoes the reply as it got it and adds a ~50-token tool observation; 4 generated
tokens per turn (``max_tokens``). Each repetition runs ``sessions`` (3) sessions of ``max(turns)`` turns in
lockstep (turn t of every session, then turn t + 1), so a slow spell hits every turn of the measurement,
not one; a repetition's overhead at turn t is the median over its sessions. Reported per turn: overhead
(median and range over repetitions), the ratio to turn 1 (of medians, and the range of per-repetition
ratios), the prompt length and the messages the client sends, and the load average.

    python benchmarks/multiturn_gateway.py               # turns 1, 10, 25, 50; 5 repetitions (~1 min)
    python benchmarks/multiturn_gateway.py --reps 3 --sessions 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx
import torch
import uvicorn

from harness import LoadWatch, Spread, ratio
from sao.engine.local import LocalEngine
from sao.envs.calculator import TOOL_SCHEMA
from sao.models.loading import load_tokenizer
from sao.models.tiny import tiny_checkpoint
from sao.serve.gateway import create_app

__all__ = ["measure", "report"]

GENERATED_TOKENS = 4
# ~50 BPE tokens, the same every turn but for the turn number.
OBSERVATION = "result {turn:03d}: " + " ".join(["the sum of this step is then the first answer"] * 4)


class TimedEngine:
    """An engine whose ``generate`` calls are timed (``generate_s``, seconds, in call order); everything
    else is the engine's own."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.generate_s: list[float] = []

    async def generate(self, prompt_token_ids: Sequence[int], params: Any) -> Any:
        started = time.perf_counter()
        try:
            return await self.engine.generate(prompt_token_ids, params)
        finally:
            self.generate_s.append(time.perf_counter() - started)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


class TimedApp:
    """An ASGI app whose HTTP requests are timed (``request_s``: seconds from the call into the app to the
    hand-over of the response's last body chunk, in call order; recorded before the client can have it)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.request_s: list[float] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()

        async def timed_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                self.request_s.append(time.perf_counter() - started)
            await send(message)

        await self.app(scope, receive, timed_send)


def _serve(app: Any) -> tuple[uvicorn.Server, threading.Thread, str]:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the gateway did not start within 30 s")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, thread, f"http://127.0.0.1:{port}"


class _Session:
    """One agent session: its conversation, extended by each reply and a tool observation."""

    def __init__(self, sid: str) -> None:
        self.sid = sid
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a calculator agent. Use the tool for every step."},
            {"role": "user", "content": "What is 17 * 23 + 5? Work it out step by step."},
        ]

    def request(self, client: httpx.Client, turn: int) -> tuple[float, int]:
        """Send turn ``turn`` (from 0): ``(wall seconds, the reply's JSON decoding included; prompt
        tokens)``."""
        body = {
            "messages": self.messages,
            "tools": [TOOL_SCHEMA],
            "max_tokens": GENERATED_TOKENS,
            "seed": turn,
        }
        started = time.perf_counter()
        r = client.post("/v1/chat/completions", json=body, headers={"X-Session-Id": self.sid})
        out = r.json()
        wall = time.perf_counter() - started
        if r.status_code != 200:
            raise RuntimeError(f"session {self.sid} turn {turn}: HTTP {r.status_code}: {r.text[:300]}")
        reply = out["choices"][0]["message"]
        tool = {"role": "tool", "content": OBSERVATION.format(turn=turn)}
        self.messages = [*self.messages, reply, tool]
        return wall, out["usage"]["prompt_tokens"]


def _round(
    client: httpx.Client, app: TimedApp, engine: TimedEngine, tag: str, sessions: int, turns: int
) -> list[list[tuple[float, float, float, int, int]]]:
    """``sessions`` sessions of ``turns`` turns in lockstep, then rewarded; per turn, per session:
    (client overhead s, server overhead s, engine s, prompt tokens, messages sent)."""
    live = [_Session(f"{tag}-{i}") for i in range(sessions)]
    out = []
    for turn in range(turns):
        row = []
        for session in live:
            sent = len(session.messages)
            before_app, before_engine = len(app.request_s), len(engine.generate_s)
            wall, prompt = session.request(client, turn)
            [engine_s] = engine.generate_s[before_engine:]
            [server_s] = app.request_s[before_app:]
            row.append((wall - engine_s, server_s - engine_s, engine_s, prompt, sent))
        out.append(row)
    for session in live:
        r = client.post(f"/v1/sessions/{session.sid}/reward", json={"reward": 1.0})
        if r.status_code != 200:
            raise RuntimeError(f"reward of {session.sid}: HTTP {r.status_code}: {r.text[:300]}")
    return out


def measure(turns: Sequence[int] = (1, 10, 25, 50), reps: int = 5, *, sessions: int = 3) -> dict[str, Any]:
    """Request overhead of gateway sessions at each of ``turns`` (1-based), ``reps`` repetitions of
    ``sessions`` lockstep sessions (see the module docstring). Returns a dict: ``turns``; per turn (keys
    as in ``turns``) ``client_ms``/``server_ms``/``engine_ms`` (`Spread` over repetitions of the
    per-repetition median over sessions), ``client_ratio``/``server_ratio`` (overhead at turn t / turn 1:
    ``(ratio of medians, Spread of per-repetition ratios)``), ``prompt_tokens`` and ``messages`` (of the
    request at that turn); ``observation_tokens``; ``load`` (the load-average line)."""
    turns = sorted(set(turns))
    if not turns or turns[0] < 1:
        raise ValueError(f"turns must be >= 1, got {turns}")
    if reps < 1 or sessions < 1:
        raise ValueError(f"reps and sessions must be >= 1, got {reps} and {sessions}")
    torch.set_num_threads(1)  # the engine's thread beside the server's and the client's: 2 cores
    watch = LoadWatch()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = tiny_checkpoint(Path(tmp), "qwen3_moe", "test", seed=0, tokenizer="bpe")
        tokenizer = load_tokenizer(model_dir)
        engine = TimedEngine(LocalEngine(model_dir, device="cpu", dtype="float32", max_running=sessions))
        app = TimedApp(create_app(engine, tokenizer, default_max_tokens=GENERATED_TOKENS))
        server, thread, url = _serve(app)
        try:
            with httpx.Client(base_url=url, timeout=120) as client:
                _round(client, app, engine, "warmup", 1, min(turns[-1], 5))
                rounds = [
                    _round(client, app, engine, f"rep{rep}", sessions, turns[-1]) for rep in range(reps)
                ]
            stats = engine.engine.stats()
        finally:
            server.should_exit = True
            thread.join(timeout=30)
            asyncio.run(engine.engine.close())
    observation = OBSERVATION.format(turn=0)
    result: dict[str, Any] = {
        "turns": turns,
        "reps": reps,
        "sessions": sessions,
        "observation_tokens": len(tokenizer(observation, add_special_tokens=False)["input_ids"]),
        "load": watch.report(),
        "engine": {
            k: stats[k] for k in ("finished", "prefix_hits", "prefix_reused_tokens", "prefill_tokens")
        },
    }

    def per_rep(turn: int, field: int) -> list[float]:  # per repetition: the median over its sessions
        return [statistics.median(row[field] for row in r[turn - 1]) for r in rounds]

    for key, field in (("client_ms", 0), ("server_ms", 1), ("engine_ms", 2)):
        result[key] = {t: Spread(tuple(1e3 * x for x in per_rep(t, field))) for t in turns}
    for key, field in (("client_ratio", 0), ("server_ratio", 1)):
        first = per_rep(turns[0], field)
        result[key] = {t: ratio(per_rep(t, field), first) for t in turns}
    result["prompt_tokens"] = {t: rounds[0][t - 1][0][3] for t in turns}
    result["messages"] = {t: rounds[0][t - 1][0][4] for t in turns}
    return result


def report(result: dict[str, Any]) -> str:
    """`measure`'s result as a table."""
    first = result["turns"][0]
    lines = [
        f"{result['reps']} repetitions x {result['sessions']} lockstep sessions; tool observation "
        f"{result['observation_tokens']} tokens; {GENERATED_TOKENS} generated tokens per turn; ratios vs "
        f"turn {first}: ratio of medians [range of per-repetition ratios]",
        f"{'turn':>4} {'messages':>8} {'prompt tok':>10} {'overhead ms (client)':>22} {'ratio':>18} "
        f"{'server-side ms':>18} {'ratio':>18} {'engine ms':>18}",
    ]
    for t in result["turns"]:
        client_ratio, client_spread = result["client_ratio"][t]
        server_ratio, server_spread = result["server_ratio"][t]
        lines.append(
            f"{t:>4} {result['messages'][t]:>8} {result['prompt_tokens'][t]:>10} "
            f"{result['client_ms'][t].fmt('.2f'):>22} "
            f"{f'{client_ratio:.2f}x [{client_spread.low:.2f}-{client_spread.high:.2f}]':>18} "
            f"{result['server_ms'][t].fmt('.2f'):>18} "
            f"{f'{server_ratio:.2f}x [{server_spread.low:.2f}-{server_spread.high:.2f}]':>18} "
            f"{result['engine_ms'][t].fmt('.1f'):>18}"
        )
    e = result["engine"]
    lines.append(
        f"engine: {e['finished']:.0f} requests, {e['prefix_hits']:.0f} continued a kept KV "
        f"({e['prefix_reused_tokens']:,.0f} prompt tokens not prefilled, "
        f"{e['prefill_tokens']:,.0f} prefilled)"
    )
    lines.append(result["load"])
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, nargs="+", default=[1, 10, 25, 50], help="turns to report")
    parser.add_argument("--reps", type=int, default=5, help="repetitions")
    parser.add_argument("--sessions", type=int, default=3, help="lockstep sessions per repetition")
    args = parser.parse_args()
    print(report(measure(args.turns, args.reps, sessions=args.sessions)))


if __name__ == "__main__":
    main()
