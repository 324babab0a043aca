"""What the owner of a gateway decides about its sessions: admission, where closed sessions go, the rules.

`create_app` serves and records; a `SessionHooks` object decides, per session, whether it may start
(`admit`, awaited before its first generation: it may wait for capacity or refuse with a
`LimitExceededError`, e.g. 429), and learns how each admitted session ended: `closed` with its
trajectories (rewarded, or truncated by the token budget), `abandoned` (no reward before the idle
timeout: never trained), `discarded` (its first request failed before anything was recorded: the admission
is given back). `RecordingHooks` is ``sao serve``'s: admit everything, hand trajectories to a callback. A
training run's hooks (`sao.runtime.gateway_source.GatewaySource`) admit under the staleness rule and queue
trajectories for the trainer.

`SessionRules` are what a run imposes on recorded sessions: a token budget (over it: closed as truncated),
a turn limit, fixed sampling (the trainer scores the distribution the engine sampled from) and a cap on
``max_tokens``. The defaults impose nothing (``sao serve``).

Owns: this contract. Does not own: HTTP, recording (`sao.serve.gateway`, `sao.serve.sessions`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sao.types import Trajectory

__all__ = ["RecordingHooks", "SessionHooks", "SessionRules", "Verifier", "VerifierError"]


class SessionHooks(Protocol):
    """Per-session decisions of the gateway's owner (see the module docstring). ``group_id`` is the id the
    session's first request named (None: none)."""

    async def admit(self, session_id: str, group_id: str | None) -> None: ...

    async def closed(self, session_id: str, group_id: str | None, trajectories: list[Trajectory]) -> None: ...

    def abandoned(self, session_id: str, group_id: str | None) -> None: ...

    def discarded(self, session_id: str, group_id: str | None) -> None: ...


class RecordingHooks:
    """Admit every session; hand each closed session's trajectories to ``on_trajectory`` (if given)."""

    def __init__(self, on_trajectory: Callable[[Trajectory], None] | None = None) -> None:
        self.on_trajectory = on_trajectory

    async def admit(self, session_id: str, group_id: str | None) -> None:
        return None

    async def closed(self, session_id: str, group_id: str | None, trajectories: list[Trajectory]) -> None:
        for traj in trajectories:
            if self.on_trajectory is not None:
                self.on_trajectory(traj)

    def abandoned(self, session_id: str, group_id: str | None) -> None:
        return None

    def discarded(self, session_id: str, group_id: str | None) -> None:
        return None


@dataclass(frozen=True)
class SessionRules:
    """Rules for recorded sessions (None: not imposed).

    ``max_session_tokens``: the token budget of a session's branch (prompt + every turn); a turn is capped by
    what is left, and a session that reaches it is closed as truncated (reward 0, ``finish_reason``
    length) — as the built-in agent loop ends an episode. ``max_turns``: generated turns per session; a
    request beyond gets 409 and the session stays open for its reward. ``temperature``, ``top_p``,
    ``top_k``: the sampling of every recorded request (a request that omits one gets it; one that asks
    for another value gets 400). ``max_tokens_per_turn``: caps a request's ``max_tokens``.
    """

    max_session_tokens: int | None = None
    max_turns: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens_per_turn: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_session_tokens", "max_turns", "max_tokens_per_turn"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"SessionRules.{name} must be >= 1 or None, got {value}")


class VerifierError(ValueError):
    """A verifier cannot score a conversation (unknown task, no scorer, the scorer failed)."""


# ``verifier(task_id, messages) -> reward``: the run's env scores the finished conversation.
Verifier = Callable[[str, Sequence[Mapping[str, Any]]], Awaitable[float]]
