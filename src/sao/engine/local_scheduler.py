"""Admission control for the local engine: a FIFO waiting queue and the running set with its slots.

A request is admitted when fewer than ``max_running`` requests run and its KV reservation fits in what the
running ones leave of ``max_kv_tokens``. The reservation is the request's worst case,
``min(prompt + max_new_tokens, context limit)`` tokens, held until it finishes: admitted requests never
have to be preempted for memory, at the price of admitting fewer requests than their actual use would
allow. Admission is strictly first-come first-served (a large request at the head waits for room rather
than being overtaken forever).

Running requests occupy slots ``0 .. B-1`` in order (`SlotKVCache` rows): removing one moves the last
running request into its slot, and `remove` returns that move for the cache to copy.

Owns: who waits, who runs, in which slot. Does not own: the model, the cache buffers, threads.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from sao.engine.local_request import Request

__all__ = ["Scheduler", "SlotMove"]


class SlotMove(NamedTuple):
    """Copy ``length`` cached positions from slot ``src`` to slot ``dst``."""

    src: int
    dst: int
    length: int


class Scheduler:
    """Waiting queue plus running set, bounded by ``max_running`` requests and ``max_kv_tokens`` reserved
    KV tokens. Not thread-safe: the engine loop owns it."""

    def __init__(self, max_running: int, max_kv_tokens: int) -> None:
        if max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {max_running}")
        if max_kv_tokens < 2:
            raise ValueError(f"max_kv_tokens must be >= 2, got {max_kv_tokens}")
        self.max_running = max_running
        self.max_kv_tokens = max_kv_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # running[s].slot == s
        self.reserved = 0

    def add(self, request: Request) -> None:
        if request.kv_reserve > self.max_kv_tokens:
            raise ValueError(
                f"request {request.request_id} reserves {request.kv_reserve} KV tokens, more than "
                f"max_kv_tokens={self.max_kv_tokens}"
            )
        self.waiting.append(request)

    def admit(self) -> list[Request]:
        """Move waiting requests into the running set while both bounds allow; returns the admitted ones
        (each with its slot set)."""
        admitted = []
        while self.waiting and len(self.running) < self.max_running:
            head = self.waiting[0]
            if self.reserved + head.kv_reserve > self.max_kv_tokens:
                break
            self.waiting.popleft()
            head.slot = len(self.running)
            self.running.append(head)
            self.reserved += head.kv_reserve
            admitted.append(head)
        return admitted

    def remove(self, request: Request) -> SlotMove | None:
        """Take ``request`` out of the running set (or the waiting queue). Returns the slot move that keeps
        slots dense, if one is needed."""
        if request.slot < 0:
            self.waiting.remove(request)
            return None
        slot, last = request.slot, self.running.pop()
        self.reserved -= request.kv_reserve
        request.slot = -1
        if last is request:
            return None
        self.running[slot] = last
        last.slot = slot
        return SlotMove(src=len(self.running), dst=slot, length=last.cached)

    def drain(self) -> list[Request]:
        """Remove and return every request, running ones first."""
        everything = [*self.running, *self.waiting]
        for request in everything:
            request.slot = -1
        self.running, self.waiting, self.reserved = [], deque(), 0
        return everything
