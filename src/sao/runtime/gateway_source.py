"""Episodes from outside: gateway sessions of external agents admitted, grouped and queued for the trainer.

`GatewaySource` is the `sao.serve.hooks.SessionHooks` of a training run (``data.source`` gateway or both)
and stands beside (or instead of) the built-in `Producer`:

* **admission** — a new session (its first request) reserves one start in the `StalenessManager`, as an
  episode of the producer does; a group preset's first session of a group reserves the whole group. Over
  capacity, ``admission="wait"`` holds the request (first come, first served) until a trained batch frees
  room, up to ``admission_timeout_s``, then answers 429 with ``Retry-After``; ``"reject"`` answers 429 at
  once. Waiting is the default because capacity is full in the steady state of asynchronous training (the
  trainer is the bottleneck): with 429s an SDK's few retries would run out and the agent would fail;
- **closing** — a rewarded (or truncated) session's trajectories, one per branch, go to the trainer's
  queue as one item, after the same too-stale drop rule as built-in episodes. A group is queued whole,
  once all ``group_size`` members closed; a group with an abandoned member is dropped whole;
- **losses** — an abandoned session is dropped (``abandoned``), never trained; a session whose first
  request failed gives its start back; a group that never filled is dropped after the idle timeout;
- **value pretraining** — the first ``pretrain_sessions`` sessions (of the initial policy: no step has been
  trained yet) are collected for the critic's pretraining instead of the books (`pretrain_corpus`).

The books stay balanced: ``started = trained + dropped + pending`` in trajectories (`StalenessManager`),
and in sessions ``admitted = rewarded + truncated + abandoned + discarded + open`` (`session_books`).
One event loop; nothing here blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from sao.serve.limits import LimitExceededError
from sao.types import Trajectory

from .clock import VersionProvider
from .staleness import StalenessManager

__all__ = ["GatewaySource"]

_PRETRAIN, _TRAIN = "pretrain", "train"
# How an admitted session ends (besides still being open): ``sessions/<end>`` counters.
_ENDS = ("rewarded", "truncated", "abandoned", "discarded", "lost_on_resume")


@dataclass
class _Group:
    """A group's members: admitted and open, closed (their trajectories), abandoned."""

    size: int
    open: set[str] = field(default_factory=set)
    closed: list[list[Trajectory]] = field(default_factory=list)
    abandoned: int = 0
    last_active: float = field(default_factory=time.monotonic)

    @property
    def sessions(self) -> int:
        return len(self.open) + len(self.closed) + self.abandoned


class GatewaySource:
    """See the module docstring.

    Args:
        staleness: the run's books (shared with the trainer and a built-in producer).
        queue: the trainer's queue (``list[Trajectory]`` items).
        clock: the policy version (for the drop rule).
        group_size: sessions per group (1: single rollout, no groups needed).
        admission: ``"wait"`` or ``"reject"`` (see the module docstring).
        admission_timeout_s: the longest wait of ``"wait"``.
        retry_after_s: the ``Retry-After`` of a 429.
        idle_timeout_s: a group with no open member and no activity for this long is dropped.
        pretrain_sessions: sessions collected for value pretraining before training starts (0: none).
    """

    def __init__(
        self,
        staleness: StalenessManager,
        queue: asyncio.Queue[list[Trajectory]],
        clock: VersionProvider,
        *,
        group_size: int = 1,
        admission: str = "wait",
        admission_timeout_s: float = 300.0,
        retry_after_s: int = 1,
        idle_timeout_s: float = 1800.0,
        pretrain_sessions: int = 0,
    ) -> None:
        if admission not in ("wait", "reject"):
            raise ValueError(f"admission must be 'wait' or 'reject', got {admission!r}")
        self.staleness, self.queue, self.clock = staleness, queue, clock
        self.group_size, self.admission = group_size, admission
        self.admission_timeout_s, self.retry_after_s = admission_timeout_s, retry_after_s
        self.idle_timeout_s = idle_timeout_s
        self.counters: Counter[str] = Counter()
        self._open: dict[str, str] = {}  # admitted, not yet closed: session id -> pretrain | train
        self._groups: dict[str, _Group] = {}
        self._reserving: dict[str, asyncio.Future[None]] = {}  # groups whose first member waits
        self._waiters: deque[tuple[int, asyncio.Future[str]]] = deque()
        self._pretrain_quota = pretrain_sessions
        self._pretrain_live = 0  # pretraining sessions granted and not yet closed or lost
        self._corpus: list[Trajectory] = []
        self._pretrain_done = asyncio.Event()
        if pretrain_sessions == 0:
            self._pretrain_done.set()
        self._stopping = False
        self._wake = asyncio.Event()

    # ---- the producer's side of the run ----------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Admitted sessions not yet closed."""
        return len(self._open)

    async def run(self) -> None:
        """Admit waiting sessions as capacity frees and drop groups that never filled, until `stop`."""
        interval = min(max(self.idle_timeout_s / 4, 0.01), 1.0)
        while not self._stopping:
            self._pump()
            self._sweep_groups()
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=interval)

    def stop(self) -> None:
        """The run is over: waiting and new sessions get 503; closing sessions are still counted."""
        self._stopping = True
        self._wake.set()
        while self._waiters:
            _, fut = self._waiters.popleft()
            if not fut.done():
                fut.set_exception(self._finished())

    def notify_trained(self) -> None:
        """A batch was trained: capacity may have freed."""
        self._pump()
        self._wake.set()

    async def pretrain_corpus(self) -> list[Trajectory]:
        """The trajectories of the first ``pretrain_sessions`` closed sessions (waits until they are in)."""
        await self._pretrain_done.wait()
        return list(self._corpus)

    def session_books(self) -> dict[str, int]:
        """Sessions by outcome: ``admitted = rewarded + truncated + abandoned + discarded + open``
        (pretraining sessions included; ``lost_on_resume``: open when the checkpoint was written)."""
        c = self.counters
        return {**{k: c[f"sessions/{k}"] for k in ("admitted", *_ENDS)}, "open": len(self._open)}

    def state_dict(self) -> dict[str, int]:
        return dict(self.counters)

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore the counters; sessions open in the old process are gone (``sessions/lost_on_resume``)."""
        self.counters = Counter({str(k): int(v) for k, v in state.items()})
        books = self.session_books()
        self.counters["sessions/lost_on_resume"] += books["admitted"] - sum(books[k] for k in _ENDS)

    # ---- SessionHooks -----------------------------------------------------------------------------------

    async def admit(self, session_id: str, group_id: str | None) -> None:
        """Reserve the session's start (or its group's); waits or refuses per ``admission``."""
        if self._stopping:
            raise self._finished()
        if self.group_size > 1:
            if not self._pretrain_done.is_set():  # the corpus takes sessions one by one, groups or not
                kind = None if self._waiters else self._try(1)
                if kind is not None:
                    self._open[session_id] = kind
                    self.counters["sessions/admitted"] += 1
                    return
                try:
                    await asyncio.wait_for(self._pretrain_done.wait(), timeout=self.admission_timeout_s)
                except asyncio.TimeoutError:
                    raise self._over_capacity(f" after waiting {self.admission_timeout_s:g} s") from None
            await self._admit_member(session_id, group_id)
        else:
            self._open[session_id] = await self._acquire(1)
        self.counters["sessions/admitted"] += 1

    async def _admit_member(self, session_id: str, group_id: str | None) -> None:
        if group_id is None:
            raise LimitExceededError(
                400,
                f"algo.group_size={self.group_size}: name each session's group (a group_id field in the "
                "request body, or an X-Group-Id header) so its sessions are trained together",
                "group_id_required",
            )
        while group_id in self._reserving:  # its first member is waiting for the group's room
            with contextlib.suppress(Exception):
                await asyncio.shield(self._reserving[group_id])
        group = self._groups.get(group_id)
        if group is None:
            reserving = asyncio.get_running_loop().create_future()
            self._reserving[group_id] = reserving
            try:
                await self._acquire(self.group_size)
                group = self._groups[group_id] = _Group(self.group_size)
            finally:
                del self._reserving[group_id]
                reserving.set_result(None)
        if group.sessions >= group.size:
            raise LimitExceededError(
                400,
                f"group {group_id!r} already has {group.size} sessions (algo.group_size); start a new group",
                "group_full",
            )
        group.open.add(session_id)
        group.last_active = time.monotonic()
        self._open[session_id] = _TRAIN

    async def closed(self, session_id: str, group_id: str | None, trajectories: list[Trajectory]) -> None:
        """A session closed with its trajectories (one per branch): corpus, queue, or its group."""
        kind = self._open.pop(session_id, None)
        if kind is None:
            self.counters["sessions/unknown_closed"] += 1  # admitted by a previous process: not in the books
            return
        truncated = any(t.metadata.get("truncated") for t in trajectories)
        self.counters["sessions/truncated" if truncated else "sessions/rewarded"] += 1
        if kind == _PRETRAIN:
            self._pretrain_live -= 1
            self._corpus.extend(trajectories)
            self.counters["pretrain/trajectories"] += len(trajectories)
            if len(self._corpus) >= self._pretrain_quota:
                self._pretrain_done.set()
            self._pump()
            return
        extra = len(trajectories) - 1
        if extra:
            self.staleness.add_started(extra)
            self.counters["branches"] += extra
        group = self._groups.get(group_id) if group_id is not None and self.group_size > 1 else None
        if group is None or session_id not in group.open:
            self._deliver(trajectories)
            return
        group.open.discard(session_id)
        group.closed.append(trajectories)
        group.last_active = time.monotonic()
        self._finish_group(group_id, group)

    def abandoned(self, session_id: str, group_id: str | None) -> None:
        """A session idle past the timeout without a reward: dropped, never trained."""
        kind = self._open.pop(session_id, None)
        if kind is None:
            return
        self.counters["sessions/abandoned"] += 1
        if kind == _PRETRAIN:
            self._pretrain_live -= 1
            self._pump()  # the corpus still needs a session: admit another
            return
        self._dropped("abandoned", 1)
        group = self._groups.get(group_id) if group_id is not None else None
        if group is not None and session_id in group.open:
            group.open.discard(session_id)
            group.abandoned += 1
            group.last_active = time.monotonic()
            self._finish_group(group_id, group)  # type: ignore[arg-type]

    def discarded(self, session_id: str, group_id: str | None) -> None:
        """A session whose first request failed before anything was recorded: its start is given back."""
        kind = self._open.pop(session_id, None)
        if kind is None:
            return
        self.counters["sessions/discarded"] += 1
        group = self._groups.get(group_id) if group_id is not None else None
        if kind == _TRAIN and group is not None and session_id in group.open:
            group.open.discard(session_id)  # its slot in the group is free for another member
            group.last_active = time.monotonic()
        elif kind == _TRAIN:
            self.staleness.cancel_start(1)
        else:
            self._pretrain_live -= 1
        self._pump()

    # ---- internals -----------------------------------------------------------------------------------

    def _finished(self) -> LimitExceededError:
        return LimitExceededError(503, "the training run has finished; no new sessions", "run_finished")

    def _try(self, n: int) -> str | None:
        """Grant ``n`` starts now if possible: to the pretraining corpus while it is short, else to the
        books; None when neither has room."""
        if not self._pretrain_done.is_set():
            if n == 1 and self._pretrain_live + len(self._corpus) < self._pretrain_quota:
                self._pretrain_live += 1
                return _PRETRAIN
            return None  # training has not started: nothing frees the books yet
        return _TRAIN if self.staleness.try_start(n) else None

    def _pump(self) -> None:
        """Grant waiting sessions in arrival order while there is room."""
        while self._waiters:
            n, fut = self._waiters[0]
            if fut.done():
                self._waiters.popleft()
                continue
            kind = self._try(n)
            if kind is None:
                return
            self._waiters.popleft()
            fut.set_result(kind)

    async def _acquire(self, n: int) -> str:
        if not self._waiters:
            kind = self._try(n)
            if kind is not None:
                return kind
        if self.admission == "reject":
            raise self._over_capacity("")
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiters.append((n, fut))
        self.counters["sessions/waited"] += 1
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout=self.admission_timeout_s)
        except asyncio.TimeoutError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                return fut.result()  # granted at the deadline
            fut.cancel()
            raise self._over_capacity(f" after waiting {self.admission_timeout_s:g} s") from None
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self._give_back(fut.result(), n)  # granted, but nobody will use it
            fut.cancel()
            raise

    def _give_back(self, kind: str, n: int) -> None:
        if kind == _TRAIN:
            self.staleness.cancel_start(n)
        else:
            self._pretrain_live -= n
        self._pump()

    def _over_capacity(self, waited: str) -> LimitExceededError:
        self.counters["sessions/rejected"] += 1
        s = self.staleness.stats()
        what = (
            "the value-pretraining corpus is being collected"
            if not self._pretrain_done.is_set()
            else (
                f"{s.pending} trajectories are started and not yet trained, the capacity "
                f"((runtime.max_staleness + 1) x trainer.batch_size = {s.capacity})"
            )
        )
        return LimitExceededError(
            429, f"no room for a new session{waited}: {what}; retry after {self.retry_after_s} s",
            "over_capacity", self.retry_after_s,
        )  # fmt: skip

    def _dropped(self, reason: str, n: int) -> None:
        if n:
            self.staleness.on_dropped(reason, n)
            self.counters[f"dropped/{reason}"] += n
        self._pump()

    def _deliver(self, trajs: list[Trajectory]) -> None:
        """Queue a session's (or a group's) trajectories unless the drop rule says they are too stale."""
        now = self.clock.get_version()
        oldest = min(min((v for v in t.versions if v >= 0), default=now) for t in trajs)
        if self.staleness.should_drop(oldest, now):
            self._dropped("too_stale", len(trajs))
            return
        self.counters["produced"] += len(trajs)
        self.queue.put_nowait(trajs)

    def _finish_group(self, group_id: str, group: _Group) -> None:
        """Queue (or drop) a group once every member is resolved."""
        if len(group.closed) + group.abandoned < group.size:
            return
        del self._groups[group_id]
        trajs = [t for member in group.closed for t in member]
        if group.abandoned:
            self._dropped("incomplete_group", len(trajs))  # group baselines need every member
        else:
            self._deliver(trajs)

    def _sweep_groups(self) -> None:
        """Drop groups with no open member and no activity for ``idle_timeout_s`` (never filled)."""
        deadline = time.monotonic() - self.idle_timeout_s
        for group_id, group in list(self._groups.items()):
            if group.open or group.last_active > deadline:
                continue
            del self._groups[group_id]
            self._dropped("group_never_filled", group.size - group.sessions)
            self._dropped("incomplete_group", sum(len(m) for m in group.closed))
            self.counters["groups/never_filled"] += 1

    def metrics(self) -> dict[str, float]:
        """``gateway/*`` metrics of a step: the session books and waiting sessions."""
        out: dict[str, Any] = {f"gateway/sessions_{k}": float(v) for k, v in self.session_books().items()}
        out["gateway/waiting"] = float(sum(1 for _, f in self._waiters if not f.done()))
        out["gateway/branches"] = float(self.counters["branches"])
        out["gateway/rejected"] = float(self.counters["sessions/rejected"])
        return out
