"""A deadline on every weight push: `DeadlineSync` wraps any `WeightSync` path.

A push that does not finish within ``runtime.weight_sync_timeout_s`` raises `WeightSyncTimeoutError`,
naming the path, the version and the replicas that had not confirmed it (their reported version is still
older); the run then stops with a checkpoint, as on other fatal faults (`sao.runtime.runner`). The path's
own recovery runs inside the deadline: the broadcast path bounds its collective by its group timeout and
sends that version by the object store when it fails or runs out (`BroadcastSync`).

Cancelling a hung push leaves whatever it waited on (a thread in a collective, an update queued in a stuck
engine) behind: the run stops rather than pushing the next version over it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

__all__ = ["DeadlineSync", "WeightSyncTimeoutError", "replica_engines", "sync_path_name"]

_PATH_NAMES = {"InprocSync": "inproc", "ObjectStoreSync": "object_store", "BroadcastSync": "broadcast",
               "DiskSync": "disk"}  # fmt: skip


class WeightSyncTimeoutError(RuntimeError):
    """A weight push (or its probe) missed the deadline; ``path``, ``version`` and ``replicas`` (names of
    those that had not answered) are attributes too."""

    def __init__(
        self, path: str, version: int, replicas: Sequence[str], timeout_s: float, what: str = "push"
    ):
        self.path, self.version, self.replicas, self.timeout_s = path, version, list(replicas), timeout_s
        waiting = ", ".join(self.replicas) if self.replicas else "none (the trainer's side did not finish)"
        super().__init__(
            f"weight sync path {path!r}: the {what} of version {version} did not finish within "
            f"{timeout_s:g} s (runtime.weight_sync_timeout_s); replicas that had not confirmed it: {waiting}"
        )


def replica_engines(engine: Any) -> list[tuple[str, Any]]:
    """``(name, engine)`` for each replica of the run's engine: an `EnginePool`'s replicas are ``replica{i}``,
    a single engine is ``replica0``; a supervised engine is unwrapped to the one serving now."""
    replicas = getattr(engine, "replicas", None) or [engine]
    return [(f"replica{i}", getattr(r, "engine", r)) for i, r in enumerate(replicas)]


def sync_path_name(sync: Any) -> str:
    """The ``runtime.weight_sync`` name of a `WeightSync` object: its ``path`` attribute, or the servers'
    kind of a native transfer (``wire``: 'vllm' / 'sglang'), or its class's path."""
    name = getattr(sync, "path", None) or getattr(sync, "wire", None)
    return str(name or _PATH_NAMES.get(type(sync).__name__, type(sync).__name__))


class DeadlineSync:
    """``inner``'s push within ``timeout_s`` seconds; ``engine`` is the run's engine (its replicas'
    versions say which ones had not confirmed a push that timed out)."""

    def __init__(self, inner: Any, timeout_s: float, engine: Any) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.inner, self.timeout_s, self.engine = inner, float(timeout_s), engine
        self.path = sync_path_name(inner)

    async def push(self, version: int) -> None:
        try:
            async with asyncio.timeout(self.timeout_s) as deadline:
                await self.inner.push(version)
        except TimeoutError:
            if not deadline.expired():  # a timeout of the path's own, not the deadline
                raise
            behind = [name for name, e in replica_engines(self.engine) if int(e.version) < version]
            raise WeightSyncTimeoutError(self.path, version, behind, self.timeout_s) from None
