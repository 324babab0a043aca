"""`RunningBatch`: the sequences of the `sao.engine.local.LocalEngine` loop and one step over them.

A step admits waiting requests (`local_scheduler`: FIFO, at most ``max_running`` sequences and
``max_kv_tokens`` reserved KV tokens), gives each newly admitted one the kept KV of an earlier request its
prompt continues (`prefix_store`), and runs **one** forward (`local_step`): the admitted requests' prompts
(prefill, packed, each with per-sequence causal attention) followed by one decode token per running
sequence, over per-sequence KV in slot buffers (`kv_cache` explains the layout and why batched rows equal
one-sequence forwards). The LM head runs on the decode rows only; each row is sampled with its request's
parameters and generator (`sampling`) and appended with the weights' version. Requests that stopped
(`local_request.StopChecker`) leave the batch, the KV of those that ended normally kept for a later turn.

Owns: the scheduler, the slot KV cache, the kept prefixes, the step counters. Does not own: the loop thread,
the inbox, weight loading or delivering results across threads (the engine's ``deliver`` does that). Only
the engine's loop thread calls it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from sao.engine.kv_cache import SlotKVCache
from sao.engine.local_request import Request, StopChecker
from sao.engine.local_scheduler import Scheduler
from sao.engine.local_step import StepRunner
from sao.engine.prefix_store import ParkedKV, PrefixStore
from sao.engine.types import FinishReason, Generation

__all__ = ["RunningBatch"]

_STEP_COUNTERS = (
    "tokens_generated",
    "prefill_tokens",
    "decode_steps",
    "context_tokens",
    "prefix_hits",
    "prefix_reused_tokens",
)


class RunningBatch:
    """The engine's running and waiting requests (see the module docstring). ``version``: the policy
    version of the weights the forwards use now (the engine sets it when it applies an update);
    ``counters``: tokens generated and prefilled, decode steps, context tokens, prefix hits and reused
    tokens, since start. ``deliver(request, generation)`` hands a finished request's result on."""

    def __init__(
        self,
        model: nn.Module,
        device: torch.device,
        *,
        max_running: int,
        max_kv_tokens: int,
        context_limit: int,
        prefix_cache_tokens: int,
        lean: bool,
        stop: StopChecker,
        deliver: Callable[[Request, Generation], None],
    ) -> None:
        self.scheduler = Scheduler(max_running, max_kv_tokens)
        self.cache = SlotKVCache(max_running, context_limit)
        self.prefixes = PrefixStore(prefix_cache_tokens)
        self.run_step = StepRunner(model, self.cache, device, lean=lean)
        self.stop = stop
        self.deliver = deliver
        self.version = 0
        self.counters = dict.fromkeys(_STEP_COUNTERS, 0)

    def has_work(self) -> bool:
        return bool(self.scheduler.running or self.scheduler.waiting)

    def weights_changed(self, version: int, recompute_kv: bool) -> None:
        """New weights are in place as ``version``; with ``recompute_kv`` every running sequence is
        re-prefilled in the next step and no kept prefix survives."""
        self.version = version
        if recompute_kv:
            for request in self.scheduler.running:
                request.cached = 0
            self.prefixes.clear()

    def drop_cancelled(self) -> None:
        sched = self.scheduler
        for request in [r for r in (*sched.running, *sched.waiting) if r.cancelled]:
            self.finish(request, "abort", cancelled=True)

    def step(self) -> None:
        """Admit, run one forward for every running sequence, finish those that stopped."""
        for request in self.scheduler.admit():
            self._resume_prefix(request)
        running = list(self.scheduler.running)
        if not running:
            return
        try:
            tokens, logprobs, prefill_tokens = self.run_step(running)
        except Exception as err:
            self.cache.clear()
            for request in running:
                self.finish(request, "error", error=f"engine step failed: {err!r}")
            return
        self.counters["prefill_tokens"] += prefill_tokens
        self.counters["decode_steps"] += 1
        self.counters["tokens_generated"] += len(running)
        self.counters["context_tokens"] += sum(len(r.tokens) for r in running)
        for request, token, logprob in zip(running, tokens, logprobs, strict=True):
            request.append(token, logprob, self.version)
        for request in running:  # only now: a removal moves another request's cache rows, all now current
            try:
                verdict = self.stop(request)
            except Exception as err:
                self.finish(request, "error", error=f"stop check failed: {err!r}")
                continue
            if verdict is not None:
                self.finish(request, verdict[0], **verdict[1])

    def finish(self, request: Request, reason: FinishReason, error: str | None = None, **meta: Any) -> None:
        """Take ``request`` out of the batch (keeping its KV for a later turn if it ended normally) and
        deliver its result."""
        if reason in ("stop", "length") and request.slot >= 0:
            self._park(request)
        if request.reused:
            meta["cached_prompt_tokens"] = request.reused
        move = self.scheduler.remove(request)
        if move is not None:
            self.cache.move(*move)
        self.deliver(request, request.result(reason, error, **meta))

    def drain(self) -> list[Request]:
        """Every request still held, taken out of the batch; the KV cache and kept prefixes are emptied."""
        requests = self.scheduler.drain()
        self.cache.clear()
        self.prefixes.clear()
        return requests

    def memory_stats(self) -> dict[str, float]:
        """``kv_tokens_reserved``, ``kv_capacity`` (positions per slot allocated now),
        ``prefix_cached_tokens`` / ``prefix_entries`` (kept now), ``prefix_evictions`` /
        ``prefix_evicted_tokens`` (dropped for room)."""
        return {
            "kv_tokens_reserved": float(self.scheduler.reserved),
            "kv_capacity": float(self.cache.capacity),
            "prefix_cached_tokens": float(self.prefixes.tokens_held),
            "prefix_entries": float(len(self.prefixes)),
            "prefix_evictions": float(self.prefixes.evictions),
            "prefix_evicted_tokens": float(self.prefixes.evicted_tokens),
        }

    def _resume_prefix(self, request: Request) -> None:
        """Give a newly admitted request the kept KV of an earlier request its prompt continues, if any."""
        entry = self.prefixes.take(request.prompt)
        if entry is None:
            return
        self.cache.load(request.slot, entry.keys, entry.values)
        request.cached = entry.length
        request.reused = entry.length
        self.counters["prefix_hits"] += 1
        self.counters["prefix_reused_tokens"] += entry.length

    def _park(self, request: Request) -> None:
        """Keep the KV of a request that finished normally for a later turn (`prefix_store`)."""
        length = min(request.cached, len(request.tokens) - 1)
        if not self.prefixes.fits(length):  # decided before copying the KV out
            return
        keys, values = self.cache.save(request.slot, length)
        self.prefixes.park(ParkedKV(list(request.tokens), length, keys, values, self.version))
