"""An OpenAI-SDK agent for the gateway-run tests: concurrent workers that play sessions of a few turns
against a run's gateway and keep, per session, what the responses returned and how the session ended."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Played:
    """One session as the agent saw it: every response's generated ids, log-probs and versions, and how
    it ended (``rewarded``, ``abandoned``, ``refused``: its first request got a 4xx, ``swept``: its reward
    came after the gateway's idle timeout had closed it, ``cut``: the run ended under it)."""

    sid: str
    group: str | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turns: int = 0
    branched: bool = False
    end: str = "cut"


async def wait_for_gateway(run_dir: Path, timeout: float = 120.0) -> str:
    """The base URL of the run's gateway, once ``gateway.json`` is written."""
    path = Path(run_dir) / "gateway.json"
    for _ in range(int(timeout / 0.05)):
        if path.is_file():
            return json.loads(path.read_text())["base_url"]
        await asyncio.sleep(0.05)
    raise TimeoutError(f"no {path}")


async def play(
    base_url: str,
    stop: asyncio.Event,
    *,
    workers: int,
    turns: int = 2,
    pause_s: float = 0.05,
    abandon_every: int = 0,
    branch_every: int = 0,
    refuse_every: int = 0,
    group_size: int = 1,
) -> list[Played]:
    """Run ``workers`` concurrent session loops until ``stop``; returns every session played.

    Session ``i`` of the whole run: abandoned (no reward) when ``abandon_every`` divides ``i + 1``, rewrites
    its first message at turn 2 when ``branch_every`` does, opens with a prompt over the token budget when
    ``refuse_every`` does. With ``group_size > 1`` a worker plays one group (its sessions concurrently).
    """
    from openai import APIConnectionError, APIStatusError, AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
    played: list[Played] = []
    counter = iter(range(10**9))

    async def session(i: int, group: str | None) -> None:
        p = Played(f"s{i}", group)
        played.append(p)
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"What is {i % 90} + 7?"}]
        if refuse_every and (i + 1) % refuse_every == 0:
            messages[0]["content"] = "x" * 2000
        extra: dict[str, Any] = {"session_id": p.sid, **({"group_id": group} if group else {})}
        try:
            for k in range(turns):
                if k == 1 and branch_every and (i + 1) % branch_every == 0:
                    messages[0] = {"role": "user", "content": f"What is {i % 90} + 8?"}
                    p.branched = True
                r = await client.chat.completions.create(model="m", messages=messages, extra_body=extra)
                choice = r.choices[0]
                p.token_ids += choice.model_extra["token_ids"]
                p.versions += choice.model_extra["versions"]
                p.logprobs += [c.logprob for c in choice.logprobs.content]
                p.turns += 1
                messages += [{"role": "assistant", "content": choice.message.content},
                             {"role": "user", "content": f"and then {k}?"}]  # fmt: skip
                await asyncio.sleep(pause_s)
            if abandon_every and (i + 1) % abandon_every == 0:
                p.end = "abandoned"
                return
            await client.post(f"/sessions/{p.sid}/reward", body={"reward": float(i % 3 == 0)}, cast_to=object)
            p.end = "rewarded"
        except APIStatusError as err:
            if err.status_code == 400 and p.turns == 0:
                p.end = "refused"
            elif err.status_code == 404 and "closed as abandoned" in str(err):
                p.end = "swept"  # a loaded machine kept it idle past the gateway's timeout: dropped, told
            elif err.status_code != 503:  # 503: the run finished
                raise
        except APIConnectionError:
            pass  # the run finished and its server closed

    async def worker() -> None:
        while not stop.is_set():
            if group_size > 1:
                first = next(counter)
                group = f"g{first}"
                others = [next(counter) for _ in range(group_size - 1)]
                await asyncio.gather(*(session(i, group) for i in [first, *others]))
            else:
                await session(next(counter), None)

    try:
        await asyncio.gather(*(worker() for _ in range(workers)))
    finally:
        await client.close()
    return played
