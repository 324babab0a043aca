"""Staleness control for asynchronous training (the capacity rule of AReaL, plus an optional drop rule).

The producer asks before starting an episode; the trainer reports what it consumed. Two rules:

* **capacity**: at most ``(max_staleness + 1) · batch_size`` trajectories may be *started but not yet
  trained* (in flight, queued, or in the batch being trained). With ``max_staleness = 0`` the producer
  can run at most one batch ahead of the trainer, so no trajectory is older than one policy version when
  its batch is trained; the bound grows by one batch per version of staleness allowed.
* **drop** (optional, ``drop_older_than = τ``): a finished trajectory whose oldest action token was
  produced more than τ versions before the current policy version is dropped instead of trained.

Every trajectory is accounted for exactly once: ``started = trained + dropped + pending``, and drops are
counted by reason. Thread-safe (a lock), so an engine thread, the producer and the trainer may share it.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass

__all__ = ["StalenessManager", "StalenessStats"]


@dataclass(frozen=True)
class StalenessStats:
    started: int
    trained: int
    dropped: int
    pending: int  # started, not yet trained or dropped
    capacity: int
    drops_by_reason: dict[str, int]


class StalenessManager:
    """Admission and drop decisions for a producer/trainer pair (see the module docstring)."""

    def __init__(self, batch_size: int, max_staleness: int, drop_older_than: int | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        if drop_older_than is not None and drop_older_than < 0:
            raise ValueError(f"drop_older_than must be >= 0 or None, got {drop_older_than}")
        self.batch_size = batch_size
        self.max_staleness = max_staleness
        self.drop_older_than = drop_older_than
        self._lock = threading.Lock()
        self._started = 0
        self._trained = 0
        self._drops: Counter[str] = Counter()

    @property
    def capacity(self) -> int:
        return (self.max_staleness + 1) * self.batch_size

    def try_start(self, n: int = 1) -> bool:
        """Reserve ``n`` episode starts (a group starts together); False when over capacity."""
        with self._lock:
            if self._pending() + n > self.capacity:
                return False
            self._started += n
            return True

    def add_started(self, n: int) -> None:
        """Count ``n`` trajectories that began without a reservation of their own (the extra branches of a
        gateway session that rewrote its history); they may take the books over capacity briefly."""
        with self._lock:
            self._started += n

    def cancel_start(self, n: int = 1) -> None:
        """Give back ``n`` reserved starts that never began (a gateway session whose first request failed
        before anything was recorded): as if `try_start` had not been called for them."""
        with self._lock:
            pending = self._pending()
            if n > pending:
                raise ValueError(f"cannot cancel {n} starts: only {pending} are pending")
            self._started -= n

    def _pending(self) -> int:
        """Started, not yet trained or dropped (call with the lock held)."""
        return self._started - self._trained - sum(self._drops.values())

    def should_drop(self, oldest_version: int, current_version: int) -> bool:
        """Whether a finished trajectory is too stale to train under the drop rule."""
        return self.drop_older_than is not None and current_version - oldest_version > self.drop_older_than

    def on_dropped(self, reason: str, n: int = 1) -> None:
        """Count ``n`` started trajectories that will never be trained, with a reason."""
        with self._lock:
            self._drops[reason] += n

    def on_trained(self, n: int) -> None:
        """Count ``n`` trajectories consumed by an optimizer step."""
        with self._lock:
            self._trained += n

    def stats(self) -> StalenessStats:
        with self._lock:
            dropped = sum(self._drops.values())
            return StalenessStats(
                started=self._started,
                trained=self._trained,
                dropped=dropped,
                pending=self._started - self._trained - dropped,
                capacity=self.capacity,
                drops_by_reason=dict(self._drops),
            )

    def state_dict(self) -> dict[str, object]:
        with self._lock:
            return {"started": self._started, "trained": self._trained, "drops": dict(self._drops)}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore counters on resume. In-flight episodes of the old process are gone: they are counted as
        dropped with reason ``lost_on_resume`` so the books still balance."""
        with self._lock:
            self._started = int(state["started"])  # type: ignore[arg-type]
            self._trained = int(state["trained"])  # type: ignore[arg-type]
            self._drops = Counter({str(k): int(v) for k, v in dict(state["drops"]).items()})  # type: ignore[arg-type]
            lost = self._pending()
            if lost > 0:
                self._drops["lost_on_resume"] += lost
