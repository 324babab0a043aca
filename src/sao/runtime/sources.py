"""The run's episode sources — the built-in `Producer`, the `GatewaySource` of external agents, or both —
seen as one by the run loop and the observers: run and stop them together, tell them a batch was trained,
count what is in flight, merge their counters and metrics."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

__all__ = ["Sources"]


class Sources:
    """``Sources(producer, gateway)``; either may be None (not configured)."""

    def __init__(self, *sources: Any) -> None:
        self.items = [s for s in sources if s is not None]
        if not self.items:
            raise ValueError("a run needs at least one episode source")

    async def run(self) -> None:
        await asyncio.gather(*(s.run() for s in self.items))

    def stop(self) -> None:
        for source in self.items:
            source.stop()

    def notify_trained(self) -> None:
        for source in self.items:
            source.notify_trained()

    @property
    def in_flight(self) -> int:
        """Episodes generating or waiting on their env, plus open gateway sessions."""
        return sum(s.in_flight for s in self.items)

    @property
    def counters(self) -> Counter[str]:
        merged: Counter[str] = Counter()
        for source in self.items:
            merged.update(source.counters)
        return merged

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for source in self.items:
            metrics = getattr(source, "metrics", None)
            if metrics is not None:
                out.update(metrics())
        return out
