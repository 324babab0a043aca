"""The gateway's open sessions: bounded in number, closed as abandoned after an idle timeout.

Guarantees (one event loop; nothing here blocks):

- at most ``max_sessions`` sessions are open; `SessionRegistry.open` of a *new* session beyond that raises
  `LimitExceededError` (429 with ``Retry-After``), after first sweeping the expired ones; requests of sessions
  already open are never refused by it;
- a session with no request in flight for more than ``idle_timeout_s`` seconds (measured from the end of its
  last request) is removed by the next `sweep` and counted in ``abandoned``: it got no reward, so it is
  never turned into trajectories (a made-up reward would train on it; dropping it is the only safe choice);
- a session whose every request failed before anything was recorded is removed on release (a bad first
  request does not hold a slot, and is not counted as abandoned);
- a session closed by the gateway itself (``truncated`` by the token budget) is remembered (the latest
  4096): a later request with its id gets 409 instead of silently starting a new session.

Callbacks tell the owner of the sessions' admission (a training run) what happened: ``on_abandoned`` and
``on_discard`` (removed before anything was recorded) with the entry.

Owns: which sessions are open and their locks. Does not own: HTTP, recording, rewards.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .limits import LimitExceededError
from .sessions import ChatSession

__all__ = ["SessionEntry", "SessionRegistry"]

# How many recently abandoned session ids are remembered, for a clear 404 reason on a late reward.
_REMEMBER_ABANDONED = 4096


@dataclass(eq=False)
class SessionEntry:
    """An open session, the lock that orders its requests, and its activity (``busy``: requests holding
    the entry now; ``last_active``: monotonic seconds at the end of its latest request)."""

    session: ChatSession
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    busy: int = 0
    last_active: float = 0.0
    admission: asyncio.Future[None] | None = None  # the first request's admission (SessionHooks.admit)


class SessionRegistry:
    """Open sessions, least recently active first (see the module docstring for the guarantees).

    Args:
        make_session: builds the `ChatSession` of a new session id.
        max_sessions: open sessions at most.
        idle_timeout_s: seconds without a request after which a session is abandoned.
        retry_after_s: the ``Retry-After`` of a refused new session.
        clock: monotonic seconds (tests may pass their own).
    """

    def __init__(
        self,
        make_session: Callable[[str], ChatSession],
        *,
        max_sessions: int,
        idle_timeout_s: float,
        retry_after_s: int,
        clock: Callable[[], float] = time.monotonic,
        on_abandoned: Callable[[SessionEntry], None] | None = None,
        on_discard: Callable[[SessionEntry], None] | None = None,
    ) -> None:
        self._make = make_session
        self._on_abandoned, self._on_discard = on_abandoned, on_discard
        self._closed_why: OrderedDict[str, str] = OrderedDict()
        self.max_sessions = max_sessions
        self.idle_timeout_s = idle_timeout_s
        self.retry_after_s = retry_after_s
        self._clock = clock
        self._entries: OrderedDict[str, SessionEntry] = OrderedDict()
        self._abandoned_ids: OrderedDict[str, None] = OrderedDict()
        self.abandoned = 0  # sessions closed by the idle timeout
        self.rejected = 0  # new sessions refused by max_sessions
        self.closed = 0  # sessions closed by a reward or by the gateway (truncated)
        self.truncated = 0  # of those, closed as truncated by the token budget

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._entries

    def ids(self) -> list[str]:
        """The open session ids, sorted."""
        return sorted(self._entries)

    def get(self, session_id: str) -> SessionEntry | None:
        return self._entries.get(session_id)

    def was_abandoned(self, session_id: str) -> bool:
        """Whether ``session_id`` was recently closed by the idle timeout (the last 4096 are remembered)."""
        return session_id in self._abandoned_ids

    def open(self, session_id: str) -> SessionEntry:
        """The entry of ``session_id``, created if new, held (``busy``) until `release`. Raises
        `LimitExceededError` (429) for a new session when ``max_sessions`` are open after a sweep."""
        entry = self._entries.get(session_id)
        if entry is None:
            why = self._closed_why.get(session_id)
            if why is not None:
                raise LimitExceededError(
                    409, f"session {session_id!r} was closed: {why}; start a new session id", "session_closed"
                )
            if len(self._entries) >= self.max_sessions:
                self.sweep()
            if len(self._entries) >= self.max_sessions:
                self.rejected += 1
                raise LimitExceededError(
                    429,
                    f"the gateway has {len(self._entries)} open sessions, its limit (max_sessions); close "
                    f"sessions with a reward or retry after {self.retry_after_s} s",
                    "too_many_sessions",
                    self.retry_after_s,
                )
            entry = SessionEntry(self._make(session_id), last_active=self._clock())
            self._entries[session_id] = entry
            self._abandoned_ids.pop(session_id, None)
        self.hold(entry)
        return entry

    def hold(self, entry: SessionEntry) -> None:
        """Mark ``entry`` in use: a sweep skips it until the matching `release`."""
        entry.busy += 1

    def release(self, entry: SessionEntry) -> None:
        """End one use of ``entry``: its idle time starts now; removes a session that recorded nothing."""
        entry.busy -= 1
        entry.last_active = self._clock()
        sid = entry.session.session_id
        if self._entries.get(sid) is not entry:
            return  # closed meanwhile (a reward)
        if entry.busy == 0 and not entry.session.branches:
            del self._entries[sid]
            if self._on_discard is not None:
                self._on_discard(entry)
        else:
            self._entries.move_to_end(sid)

    def pop(self, entry: SessionEntry) -> bool:
        """Close ``entry``'s session (a reward); False if it was no longer open."""
        sid = entry.session.session_id
        if self._entries.get(sid) is not entry:
            return False
        del self._entries[sid]
        self.closed += 1
        return True

    def close(self, entry: SessionEntry, why: str) -> bool:
        """Close ``entry``'s session on the gateway's own account (``why``, e.g. truncated): later requests
        with its id get 409 saying so. False if it was no longer open."""
        if not self.pop(entry):
            return False
        self._closed_why[entry.session.session_id] = why
        self.truncated += 1
        if len(self._closed_why) > _REMEMBER_ABANDONED:
            self._closed_why.popitem(last=False)
        return True

    def closed_why(self, session_id: str) -> str | None:
        """Why the gateway closed ``session_id`` itself (`close`), or None."""
        return self._closed_why.get(session_id)

    def restore(self, entry: SessionEntry) -> None:
        """Reopen a session whose closing failed (an invalid reward), as it was."""
        self._entries[entry.session.session_id] = entry
        self.closed -= 1

    def sweep(self) -> list[str]:
        """Remove the sessions idle longer than ``idle_timeout_s`` (none with a request in flight); returns
        their ids. Costs O(expired + busy) entries: they are kept in order of last activity."""
        deadline = self._clock() - self.idle_timeout_s
        expired = []
        for sid, entry in self._entries.items():
            if entry.last_active > deadline:
                break  # every later entry is more recent
            if entry.busy == 0:
                expired.append(sid)
        for sid in expired:
            entry = self._entries.pop(sid)
            if self._on_abandoned is not None:
                self._on_abandoned(entry)
            self._abandoned_ids[sid] = None
            if len(self._abandoned_ids) > _REMEMBER_ABANDONED:
                self._abandoned_ids.popitem(last=False)
        self.abandoned += len(expired)
        return expired

    async def sweep_forever(self) -> None:
        """`sweep` every ``idle_timeout_s / 4`` seconds (between 10 ms and 60 s) until cancelled, so an idle
        gateway frees abandoned sessions too; requests sweep as well, which makes the counts exact when
        read."""
        interval = min(max(self.idle_timeout_s / 4, 0.01), 60.0)
        while True:
            await asyncio.sleep(interval)
            self.sweep()

    def counters(self) -> dict[str, Any]:
        return {
            "open": len(self._entries),
            "max_sessions": self.max_sessions,
            "idle_timeout_s": self.idle_timeout_s,
            "closed": self.closed,
            "truncated": self.truncated,
            "abandoned": self.abandoned,
            "rejected": self.rejected,
        }
