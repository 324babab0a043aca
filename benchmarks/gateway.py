"""Benchmark: the OpenAI-compatible gateway's requests/s and latency percentiles at 1, 32 and 200 concurrent
sessions, as a ratio against the same requests sent straight to ``LocalEngine.generate`` without HTTP.

Same tiny Qwen3-MoE checkpoint (fp32, CPU), same sessions, same seeds (so the same generated tokens) on
both arms:

- gateway: a real ``sao serve`` process (uvicorn, its own LocalEngine) on 127.0.0.1 and the real openai SDK
  (``AsyncOpenAI``) in this process; each session sends its turns with ``X-Session-Id``, then posts its
  reward (the trajectory is built and kept in the gateway's memory; no ``--out`` file);
- direct: in this process, a LocalEngine with the same settings and, per session, the gateway's own
  recorder (`ChatSession`: render, generate, record, build the trajectory): everything but HTTP, JSON and
  the SDK.

A level of concurrency ``c`` runs ``max(c, --min-sessions)`` sessions of ``--turns`` turns, at most ``c`` at
once (a session holds its slot for all its turns). Requests/s = chat requests / wall seconds of the level
(rewards included in the wall time); latency = one chat request, call to response. Arms and levels are
interleaved (the arm that goes first alternates), ``--repeats`` times after one untimed warm-up round;
it prints per arm the median and range over the repeats, the gateway/direct ratios per repeat, and the
load average. The client shares the 2 cores with the server, as an agent on the same machine would.

    python benchmarks/gateway.py           # default: levels 1, 32, 200; 5 repeats (~35 s on 2 cores)
    python benchmarks/gateway.py --quick   # levels 1, 32; 5 repeats, 1 turn (~20 s)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx

from sao.engine.local import LocalEngine
from sao.engine.types import SamplingParams
from sao.models.loading import load_tokenizer
from sao.models.tiny import tiny_checkpoint
from sao.serve.sessions import ChatSession
from step_cost import _spread

ARMS = ("direct", "gateway")


@dataclass
class Run:
    """One arm at one level: requests/s and each request's latency in seconds."""

    requests_per_s: float
    latencies: list[float]

    def percentile(self, q: int) -> float:
        return statistics.quantiles(self.latencies, n=100, method="inclusive")[q - 1]


def first_message(i: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"session {i}: what is {i % 97} + 1?"}]


def next_messages(messages: list[dict[str, Any]], reply: str, k: int) -> list[dict[str, Any]]:
    return [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": f"and {k}?"}]


async def direct_session(
    engine: LocalEngine, tokenizer: Any, i: int, args: argparse.Namespace
) -> list[float]:
    """One session straight to the engine, recorded as the gateway records it; its request latencies."""
    session = ChatSession(tokenizer, f"direct-{i}")
    eos = tuple({tokenizer.eos_token_id})
    messages, latencies = first_message(i), []
    for k in range(args.turns):
        started = time.perf_counter()
        plan = session.plan(messages)
        params = SamplingParams(max_new_tokens=args.max_tokens, seed=i * 10 + k, stop_token_ids=eos)
        gen = await engine.generate(list(plan.prompt_ids), params)
        session.commit(plan)
        text = session.record_generation(gen.token_ids, gen.logprobs, gen.versions, gen.finish_reason)
        latencies.append(time.perf_counter() - started)
        messages = next_messages(messages, text.removesuffix(tokenizer.eos_token), k)
    session.trajectories([1.0])
    return latencies


async def gateway_session(
    client: Any, http: httpx.AsyncClient, sid: str, i: int, args: argparse.Namespace
) -> list[float]:
    """One session through the gateway with the openai SDK, then its reward; its request latencies."""
    messages, latencies = first_message(i), []
    for k in range(args.turns):
        started = time.perf_counter()
        out = await client.chat.completions.create(
            model="sao",
            messages=messages,
            max_tokens=args.max_tokens,
            seed=i * 10 + k,
            extra_headers={"X-Session-Id": sid},
        )
        latencies.append(time.perf_counter() - started)
        messages = next_messages(messages, out.choices[0].message.content, k)
    r = await http.post(f"/v1/sessions/{sid}/reward", json={"reward": 1.0})
    r.raise_for_status()
    return latencies


async def run_level(
    arm: str, concurrency: int, tag: str, ctx: dict[str, Any], args: argparse.Namespace
) -> Run:
    slots = asyncio.Semaphore(concurrency)

    async def one(i: int) -> list[float]:
        async with slots:
            if arm == "direct":
                return await direct_session(ctx["engine"], ctx["tokenizer"], i, args)
            return await gateway_session(ctx["client"], ctx["http"], f"{tag}-{i}", i, args)

    sessions = max(concurrency, args.min_sessions)
    started = time.perf_counter()
    per_session = await asyncio.gather(*(one(i) for i in range(sessions)))
    seconds = time.perf_counter() - started
    latencies = [s for lat in per_session for s in lat]
    return Run(len(latencies) / seconds, latencies)


def start_server(path: Path, port: int, args: argparse.Namespace) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "sao.cli", "serve", "--model", str(path), "--port", str(port)]
    cmd += ["--device", "cpu", "--dtype", "float32", "--max-running", str(args.max_running)]
    cmd += ["--max-pending", str(max(256, 2 * max(args.levels)))]
    # stderr to a file beside the model, not a pipe nobody reads (a full pipe would stall the server)
    log = open(path.parent / "server.log", "w")  # noqa: SIM115 (closed with the temporary directory)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, text=True)
    deadline = time.time() + 120
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models").status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise RuntimeError(f"sao serve did not come up: {(path.parent / 'server.log').read_text()}")
        time.sleep(0.3)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def measure(path: Path, port: int, args: argparse.Namespace) -> dict[tuple[int, str], list[Run]]:
    from openai import AsyncOpenAI

    engine = LocalEngine(path, device="cpu", dtype="float32", max_running=args.max_running)
    ctx: dict[str, Any] = {"engine": engine, "tokenizer": load_tokenizer(path)}
    url = f"http://127.0.0.1:{port}"
    ctx["client"] = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
    ctx["http"] = httpx.AsyncClient(base_url=url, timeout=300)
    runs: dict[tuple[int, str], list[Run]] = defaultdict(list)
    try:
        for arm in ARMS:  # warm-up: first forwards, connection pool, imports
            await run_level(arm, min(32, max(args.levels)), f"warm-{arm}", ctx, args)
        for rep in range(args.repeats):
            for j, level in enumerate(args.levels):
                order = ARMS if (rep + j) % 2 == 0 else ARMS[::-1]
                for arm in order:
                    runs[(level, arm)].append(await run_level(arm, level, f"r{rep}-c{level}", ctx, args))
    finally:
        await ctx["http"].aclose()
        await ctx["client"].close()
        await engine.close()
    return runs


def report(runs: dict[tuple[int, str], list[Run]], args: argparse.Namespace) -> None:
    for level in args.levels:
        sessions = max(level, args.min_sessions)
        print(f"concurrency {level} ({sessions} sessions x {args.turns} turns per repeat):")
        for arm in ARMS:
            rs = runs[(level, arm)]
            lat = {q: [1000 * r.percentile(q) for r in rs] for q in (50, 90, 99)}
            print(
                f"  {arm:<8} req/s {_spread([r.requests_per_s for r in rs], '.1f')}; latency ms p50 "
                f"{statistics.median(lat[50]):.1f}, p90 {statistics.median(lat[90]):.1f}, p99 "
                f"{statistics.median(lat[99]):.1f} (medians over repeats)"
            )
        pairs = list(zip(runs[(level, "gateway")], runs[(level, "direct")], strict=True))
        throughput = [g.requests_per_s / d.requests_per_s for g, d in pairs]
        p50 = [g.percentile(50) / d.percentile(50) for g, d in pairs]
        print(f"  gateway / direct req/s per repeat: {_spread(throughput, '.2f')}")
        print(f"  gateway / direct p50 latency per repeat: {_spread(p50, '.2f')}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 32, 200], help="concurrent sessions")
    parser.add_argument("--turns", type=int, default=2, help="chat requests per session")
    parser.add_argument("--max-tokens", type=int, default=8, help="max_tokens of each request")
    parser.add_argument("--min-sessions", type=int, default=16, help="sessions per level at least")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (arms interleaved)")
    parser.add_argument("--max-running", type=int, default=32, help="engine sequences decoded at once")
    parser.add_argument("--size", default="test", choices=["test", "small"], help="tiny model size")
    parser.add_argument("--quick", action="store_true", help="levels 1 and 32, 1 turn")
    args = parser.parse_args()
    if args.quick:
        args.levels, args.turns = [1, 32], 1
    if args.repeats < 1 or args.turns < 1 or min(args.levels) < 1:
        parser.error("--repeats, --turns and --levels must be >= 1")

    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_checkpoint(Path(tmp), "qwen3_moe", args.size, seed=0)
        port = free_port()
        server = start_server(path, port, args)
        load_start = os.getloadavg()
        started = time.perf_counter()
        try:
            runs = asyncio.run(measure(path, port, args))
        except Exception:
            print(f"the gateway's log:\n{(path.parent / 'server.log').read_text()[-4000:]}", file=sys.stderr)
            raise
        finally:
            server.terminate()
            server.wait(timeout=30)
        seconds = time.perf_counter() - started
    print(
        f"workload: tiny qwen3_moe/{args.size} fp32 CPU, {args.turns} turns per session, max_tokens "
        f"{args.max_tokens}, engine max_running {args.max_running} (both arms), {args.repeats} repeats "
        f"after a warm-up, arms interleaved; {seconds:.0f} s in all"
    )
    report(runs, args)
    load = ", ".join(f"{x:.2f}" for x in load_start), ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average (1, 5, 15 min): {load[0]} before, {load[1]} after")
    print(
        "reproduce: HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/gateway.py --levels "
        f"{' '.join(map(str, args.levels))} --turns {args.turns} --max-tokens {args.max_tokens} "
        f"--repeats {args.repeats} --max-running {args.max_running} --size {args.size}"
    )


if __name__ == "__main__":
    main()
