"""One engine replica as an event-driven processor-sharing server (no event per token).

Every step advances each active sequence by one token, so all active sequences move together in a
*virtual time* ``v`` measured in tokens per sequence: a sequence admitted at ``v_a`` to generate ``g``
tokens finishes at ``v_a + g``, and the next finish is the smallest such point (a heap). Between events
the active set is fixed, and with ``K = Σ_i (ctx_i − v_a,i)`` the context sum at virtual time ``v`` is
``K + B·v``, so a step at ``v`` takes ``τ(v) = A + β·v`` seconds (``A = t0 + t1·B + c·K``, ``β = c·B``).
Advancing from ``v`` by ``Δv`` tokens takes ``τ(v)·Δv + β·Δv²/2`` seconds and the inverse is a quadratic:
exact for the model up to treating the integer steps as a continuum (a step's context is the mean over the
step instead of its value at the step's start: half a token per sequence).

Prefill: admitting a sequence with ``n`` new tokens (the prompt, or the last observation: the rest of
the context is assumed cached on this replica) costs ``p·n`` seconds during which no sequence of the
replica advances. At most ``max_running`` sequences are active; further admissions wait FIFO. While
``frozen`` (a weight push) nothing advances and prefills wait. The replica keeps the cumulative counters the
runtime's timeline reports (busy seconds, decode steps, tokens generated, context tokens, prefill tokens),
and the virtual time at each weight version change, so a sequence's tokens can be split by version.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .costs import EngineCosts

__all__ = ["Replica", "Sequence"]

_EPS_TOKENS = 1e-6  # finish points within this many tokens of v count as reached (float round-off)
_EPS_TIME = 1e-12  # ... or within this fraction of the wall clock


@dataclass(eq=False)
class Sequence:
    """One generation request: ``prefill`` new tokens, ``context`` tokens in all once prefilled, ``gen`` to
    generate (at least 1: a reply ends with a token); ``owner`` is whatever the caller needs back."""

    prefill: int
    context: int
    gen: int
    owner: Any = None
    v_start: float = field(default=0.0, init=False)
    v_end: float = field(default=0.0, init=False)


class Replica:
    def __init__(self, costs: EngineCosts, max_running: int) -> None:
        if max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {max_running}")
        self.costs, self.max_running = costs, max_running
        self.v = 0.0  # virtual time (tokens per active sequence so far)
        self.t = 0.0  # wall time at which ``v`` holds
        self.stall_end = 0.0  # prefill work runs until this wall time
        self.frozen_at: float | None = None
        self.frozen_prefill_s = 0.0
        self.active: set[Sequence] = set()
        self.waiting: deque[Sequence] = deque()
        self._heap: list[tuple[float, int, Sequence]] = []
        self._k = 0.0
        self._ids = 0
        self.epoch = 0  # bumped by the simulator whenever the next event may have moved
        self.marks_v: list[float] = [0.0]  # virtual time from which ``marks_version[i]`` holds
        self.marks_version: list[int] = [0]
        # Cumulative counters (the runtime's timeline names), and ∫ active sequences dt.
        self.busy_s = 0.0
        self.decode_steps = 0.0
        self.tokens_generated = 0.0
        self.context_tokens = 0.0
        self.prefill_tokens = 0.0
        self.occupancy_s = 0.0

    # ---- time ---------------------------------------------------------------------------------------

    def _coefficients(self) -> tuple[float, float]:
        """``(τ(v), β)``: the step time now and its growth per token of virtual time."""
        b = len(self.active)
        c = self.costs
        return c.t0_s + c.t1_s * b + c.c_s * (self._k + b * self.v), c.c_s * b

    def advance(self, t: float) -> None:
        """Move the state to wall time ``t`` (no earlier than the last call)."""
        dt = t - self.t
        if dt <= 0:
            return
        b = len(self.active)
        self.occupancy_s += b * dt
        if self.frozen_at is not None:
            self.t = t
            return
        stall = max(0.0, min(self.stall_end, t) - self.t)
        self.busy_s += stall
        if self.costs.p_s > 0:  # prefill tokens are counted as their work runs (samples split it exactly)
            self.prefill_tokens += stall / self.costs.p_s
        decode = dt - stall
        if b and decode > 0:
            tau, beta = self._coefficients()
            dv = 2 * decode / (tau + math.sqrt(tau * tau + 2 * beta * decode))
            self.decode_steps += dv
            self.tokens_generated += b * dv
            self.context_tokens += (self._k + b * self.v) * dv + b * dv * dv / 2
            self.v += dv
            self.busy_s += decode
        self.t = t

    def _reached(self, v_end: float) -> bool:
        """Whether ``v_end`` is reached now, up to float round-off in tokens or in wall time (a finish
        less than ~1e-12 of the clock away would never be reached: ``t + δ == t``)."""
        if v_end <= self.v + _EPS_TOKENS:
            return True
        if self.frozen_at is not None or self.stall_end > self.t:
            return False
        dv = v_end - self.v
        tau, beta = self._coefficients()
        if tau * dv + beta * dv * dv / 2 > _EPS_TIME * max(1.0, self.t):
            return False
        self.v = v_end
        return True

    def next_event(self) -> float | None:
        """Wall time of the next finish if nothing else changes; None when idle or frozen."""
        if self.frozen_at is not None or not self._heap:
            return None
        dv = max(0.0, self._heap[0][0] - self.v)
        tau, beta = self._coefficients()
        return max(self.t, self.stall_end) + tau * dv + beta * dv * dv / 2

    # ---- sequences ----------------------------------------------------------------------------------

    def submit(self, seq: Sequence, t: float) -> None:
        """A request arrives at ``t``: it runs now if there is room, else waits (FIFO)."""
        self.advance(t)
        if len(self.active) < self.max_running:
            self._activate(seq, t)
        else:
            self.waiting.append(seq)

    def _activate(self, seq: Sequence, t: float) -> None:
        seq.v_start, seq.v_end = self.v, self.v + max(1, seq.gen)
        self.active.add(seq)
        self._k += seq.context - self.v
        self._ids += 1
        heapq.heappush(self._heap, (seq.v_end, self._ids, seq))
        cost = self.costs.p_s * seq.prefill
        if cost == 0:
            self.prefill_tokens += seq.prefill
        if self.frozen_at is not None:
            self.frozen_prefill_s += cost
        else:
            self.stall_end = max(self.stall_end, t) + cost

    def pop_finished(self, t: float) -> list[Sequence]:
        """Advance to ``t`` and remove the sequences done by then (then admit waiting ones)."""
        self.advance(t)
        done = []
        while self._heap and self._reached(self._heap[0][0]):
            seq = heapq.heappop(self._heap)[2]
            self.active.discard(seq)
            self._k -= seq.context - seq.v_start
            done.append(seq)
        if not self.active:
            self._k = 0.0  # drop the round-off of many additions and removals
        while self.waiting and len(self.active) < self.max_running:
            self._activate(self.waiting.popleft(), t)
        return done

    # ---- weight pushes ------------------------------------------------------------------------------

    def freeze(self, t: float) -> None:
        self.advance(t)
        self.frozen_at = t

    def unfreeze(self, t: float, version: int) -> None:
        """End of a push at ``t``: tokens from now on carry ``version``; queued prefills start."""
        assert self.frozen_at is not None
        self.advance(t)
        if self.stall_end > self.frozen_at:
            self.stall_end += t - self.frozen_at
        if self.frozen_prefill_s:
            self.stall_end = max(self.stall_end, t) + self.frozen_prefill_s
        self.frozen_at, self.frozen_prefill_s = None, 0.0
        self.marks_v.append(self.v)
        self.marks_version.append(version)

    def tokens_by_version(self, seq: Sequence) -> list[tuple[int, float]]:
        """``(version, tokens)`` of a finished sequence's generated tokens."""
        i = bisect.bisect_right(self.marks_v, seq.v_start) - 1
        out: list[tuple[int, float]] = []
        lo = seq.v_start
        while lo < seq.v_end:
            hi = self.marks_v[i + 1] if i + 1 < len(self.marks_v) else math.inf
            top = min(hi, seq.v_end)
            if top > lo:
                out.append((self.marks_version[i], top - lo))
            lo, i = top, i + 1
        return out

    @property
    def queued(self) -> int:
        """Requests at this replica: running plus waiting (the router's load measure)."""
        return len(self.active) + len(self.waiting)
