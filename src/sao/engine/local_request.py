"""One request inside the local engine: its tokens so far, sampling state, finish rules and delivery.

Bookkeeping invariant while a request runs: ``tokens`` = prompt + generated; the KV of ``tokens[:cached]``
is in the cache and ``tokens[-1]`` is the *pending* token, the input of the next decode step (so
``cached == len(tokens) - 1`` after every step; a fresh or re-prefilled request has ``cached = 0`` and
catches up in one prefill segment).

Owns: a request's state and when it is finished. Does not own: scheduling, the model or threads.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import index
from typing import Any

import torch

from sao.engine.types import FinishReason, Generation, InvalidRequestError, SamplingParams

__all__ = ["Request", "StopChecker", "check_request"]

# A byte-level token can be a fraction of a character: decode this many tokens per character of the longest
# stop string (UTF-8 needs at most 4) when looking for a stop string that the newest token completed.
_TOKENS_PER_CHAR = 4


def check_request(
    prompt_token_ids: Sequence[int],
    params: SamplingParams,
    vocab_size: int,
    context_limit: int,
    has_tokenizer: bool,
) -> list[int]:
    """The prompt as a list of ints, or `InvalidRequestError` naming what the engine cannot serve: invalid
    sampling values, an empty prompt, a non-integer or out-of-vocabulary id, a prompt that leaves no room
    for one generated token within ``context_limit``, stop strings without a tokenizer."""
    if not isinstance(params, SamplingParams):
        raise InvalidRequestError(f"params must be SamplingParams, got {type(params).__name__}")
    params.validate()
    try:
        prompt = list(map(index, prompt_token_ids))  # C-speed: this runs on every turn's whole context
    except TypeError as err:
        raise InvalidRequestError(f"prompt token ids must be integers: {err}") from None
    if not prompt:
        raise InvalidRequestError("empty prompt")
    if min(prompt) < 0 or max(prompt) >= vocab_size:
        bad = next(i for i, t in enumerate(prompt) if not 0 <= t < vocab_size)
        raise InvalidRequestError(
            f"prompt token {bad} is {prompt[bad]}, outside the vocabulary [0, {vocab_size})"
        )
    if len(prompt) >= context_limit:
        raise InvalidRequestError(
            f"prompt of {len(prompt)} tokens leaves no room in the context limit of {context_limit}"
        )
    if params.stop and not has_tokenizer:
        raise InvalidRequestError("stop strings need a tokenizer; the engine has none")
    return prompt


@dataclass(eq=False)
class Request:
    """A request's state. ``deliver`` hands the finished `Generation` back to the caller (called once)."""

    request_id: int
    prompt: list[int]
    params: SamplingParams
    kv_reserve: int  # KV tokens reserved for the request's whole life (admission control)
    generator: torch.Generator
    deliver: Callable[[Generation], None]
    tokens: list[int] = field(init=False)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    cached: int = 0
    reused: int = 0  # prompt positions whose KV came from a kept earlier request (`prefix_store`)
    slot: int = -1
    cancelled: bool = False
    done: bool = False
    arrival: float = field(default_factory=time.perf_counter)
    first_token: float | None = None

    def __post_init__(self) -> None:
        self.tokens = list(self.prompt)

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - len(self.prompt)

    def append(self, token: int, logprob: float, version: int) -> None:
        """Record a sampled token; the previously pending token's KV is now cached."""
        self.cached = len(self.tokens)
        self.tokens.append(token)
        self.logprobs.append(logprob)
        self.versions.append(version)
        if self.first_token is None:
            self.first_token = time.perf_counter()

    def result(self, reason: FinishReason, error: str | None = None, **metadata: Any) -> Generation:
        """The `Generation` of what was generated so far."""
        now = time.perf_counter()
        meta: dict[str, Any] = {"request_id": self.request_id, "latency_s": now - self.arrival}
        if self.first_token is not None:
            meta["time_to_first_token_s"] = self.first_token - self.arrival
        meta.update(metadata)
        return Generation(
            token_ids=self.tokens[len(self.prompt) :],
            logprobs=list(self.logprobs),
            versions=list(self.versions),
            finish_reason=reason,
            prompt_tokens=len(self.prompt),
            error=error,
            metadata=meta,
        )


class StopChecker:
    """Decides whether a request just finished. ``decode`` turns token ids into text (needed only for stop
    strings); ``context_limit`` bounds prompt + generated tokens."""

    def __init__(self, context_limit: int, decode: Callable[[list[int]], str] | None) -> None:
        self.context_limit = context_limit
        self.decode = decode

    def __call__(self, request: Request) -> tuple[FinishReason, dict[str, Any]] | None:
        """``(finish_reason, metadata)`` if the newest token ended the request, else None. A stop token or
        string wins over the length limits when both happen on the same token."""
        params = request.params
        token = request.tokens[-1]
        if token in params.stop_token_ids:
            return "stop", {"stop_reason": token}
        if params.stop:
            assert self.decode is not None  # checked at submission
            window = _TOKENS_PER_CHAR * max(len(s) for s in params.stop) + _TOKENS_PER_CHAR
            generated = request.tokens[len(request.prompt) :]
            text = self.decode(generated[-window:])
            # The text before the newest token held no stop string (it would have stopped then), so any
            # match in the window was completed by the newest token.
            for stop in params.stop:
                if stop in text:
                    return "stop", {"stop_reason": stop}
        if request.num_generated >= params.max_new_tokens:
            return "length", {}
        if len(request.tokens) >= self.context_limit:
            return "length", {"context_limit": self.context_limit}
        return None
