"""The engine as the gateway calls it: one generation under the context cap, the engine's refusals and
failures as HTTP errors, and the unrecorded generations of a request that names no session.

Owns: those calls, the context the gateway serves (``context``: the smaller of ``max_context_tokens`` and
the engine's own limit) and the stop tokens of a chat turn (``eos``). Does not own: sessions and their
rules (`sao.serve.turns`), the in-flight gate (`sao.serve.limits.PendingGate`, taken by the caller of
`GatewayEngine.generate` and by `GatewayEngine.unrecorded`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Sequence
from typing import Any

from fastapi import HTTPException

from sao.engine.types import (
    EngineCrashedError,
    Generation,
    InferenceEngine,
    InvalidRequestError,
    SamplingParams,
)
from sao.models.chat_delta import end_of_turn_token

from .limits import GatewayLimits, PendingGate, cap_max_tokens, engine_context_limit
from .sessions import ChatSession

__all__ = ["GatewayEngine"]


class GatewayEngine:
    """``engine`` behind a gateway with ``limits``; ``gate`` bounds the requests in flight."""

    def __init__(
        self, engine: InferenceEngine, tokenizer: Any, limits: GatewayLimits, gate: PendingGate
    ) -> None:
        self.engine, self.tokenizer, self.gate = engine, tokenizer, gate
        self.retry_after_s = limits.retry_after_s
        known = [c for c in (limits.max_context_tokens, engine_context_limit(engine)) if c is not None]
        self.context = min(known) if known else None
        self.end_of_turn, end_of_turn_id = end_of_turn_token(tokenizer)
        self.eos = [t for t in {tokenizer.eos_token_id, end_of_turn_id} if isinstance(t, int)]

    def new_session(self, session_id: str) -> ChatSession:
        """An empty session recording with this gateway's tokenizer and end-of-turn token."""
        return ChatSession(self.tokenizer, session_id, end_of_turn=self.end_of_turn)

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        """The engine's generation with ``max_new_tokens`` capped by the context; engine refusals and
        failures as HTTP errors (400 invalid, 503 restarting with ``Retry-After``, 500 failed)."""
        max_new = cap_max_tokens(params.max_new_tokens, len(prompt_ids), self.context)
        try:
            gen = await self.engine.generate(prompt_ids, dataclasses.replace(params, max_new_tokens=max_new))
        except InvalidRequestError as err:
            raise HTTPException(400, str(err)) from None
        except EngineCrashedError as err:  # a supervised engine is restarting: try again shortly
            retry = {"Retry-After": str(self.retry_after_s)}
            raise HTTPException(503, f"the engine is restarting: {err}", headers=retry) from None
        if gen.finish_reason == "error":
            raise HTTPException(500, f"generation failed: {gen.error}")
        return gen

    async def unrecorded(
        self, messages: list[dict[str, Any]], tools: list[Any] | None, params: SamplingParams, n: int
    ) -> tuple[Sequence[int], list[Generation]]:
        """Render ``messages`` in a throwaway session and generate ``n`` times, under one gate slot (seeds
        ``seed + i`` when a seed is given, so the choices differ): ``(prompt_ids, generations)``."""
        session = self.new_session(f"anon-{uuid.uuid4().hex}")
        try:
            prompt_ids = session.plan(messages, tools).prompt_ids
        except Exception as err:  # the template rejected the conversation: the client's input
            raise HTTPException(400, f"cannot render messages with the chat template: {err}") from None
        seeds = [None if params.seed is None else params.seed + i for i in range(n)]
        with self.gate.slot():
            gens = await asyncio.gather(
                *(self.generate(prompt_ids, dataclasses.replace(params, seed=seed)) for seed in seeds)
            )
        return prompt_ids, list(gens)
