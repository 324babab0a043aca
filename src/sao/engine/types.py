"""The inference-engine contract: sampling parameters, a generation result, the async engine protocol.

Every engine (the in-process `LocalEngine`, the vLLM and SGLang adapters) is token-in/token-out: it takes
prompt token ids and returns the generated token ids with, per token, the log-probability of the
distribution it was actually sampled from and the policy version of the weights that produced it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from torch import Tensor

__all__ = [
    "EngineCrashedError",
    "FinishReason",
    "Generation",
    "InferenceEngine",
    "InvalidRequestError",
    "SamplingParams",
    "WeightsLike",
]

FinishReason = Literal["stop", "length", "abort", "error"]
WeightsLike = Mapping[str, Tensor] | str | Path


class EngineCrashedError(RuntimeError):
    """The engine process or server died while serving this request (raised by a supervised engine,
    `sao.runtime.engine_guard.SupervisedEngine`, which restarts it). The request is lost; later requests
    go to the restarted engine."""


class InvalidRequestError(ValueError):
    """A request the engine cannot serve (empty or too long prompt, invalid sampling values).

    Raised by ``generate`` for that request only; the engine keeps serving the others.
    """


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion.

    ``top_k = -1`` and ``top_p = 1`` disable those filters; ``temperature = 0`` is greedy (its recorded
    log-probs are those of the untempered distribution). ``stop_token_ids`` end generation when sampled
    (the stop token is part of the output: it was generated); ``stop`` strings end it when the decoded
    output contains one (the output keeps every token up to the one completing the string). ``seed``
    makes one request's sampling reproducible whatever else the engine is running.
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def validate(self) -> None:
        """Raise `InvalidRequestError` naming the first invalid field."""
        if self.max_new_tokens < 1:
            raise InvalidRequestError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise InvalidRequestError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not (0 < self.top_p <= 1):
            raise InvalidRequestError(f"top_p must lie in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise InvalidRequestError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise InvalidRequestError(f"stop_token_ids must be non-negative ints, got {self.stop_token_ids}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequestError(f"stop strings must be non-empty strings, got {self.stop}")


@dataclass
class Generation:
    """One completion. ``token_ids``, ``logprobs`` and ``versions`` have one entry per generated token.

    ``logprobs[i]`` is the log-probability of ``token_ids[i]`` under the distribution it was sampled from
    (after temperature, top-k and top-p); ``versions[i]`` the policy version of the weights that
    computed it. ``finish_reason``: ``stop`` (stop token or string), ``length`` (max_new_tokens or the
    context limit), ``abort`` (engine shut down), ``error`` (see ``error``).
    """

    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: FinishReason
    prompt_tokens: int = 0
    error: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class InferenceEngine(Protocol):
    """What the rollout side needs from any engine (all methods are safe to call concurrently)."""

    @property
    def version(self) -> int:
        """Policy version of the weights that decode steps use now."""
        ...

    async def generate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> Generation:
        """Generate one completion; raises `InvalidRequestError` for a request it cannot serve."""
        ...

    async def update_weights(self, weights: WeightsLike, version: int) -> None:
        """Load new weights (a state dict in the trainer's naming, or a checkpoint directory) as ``version``.

        In-flight requests are never aborted: they continue with the new weights from the next decode
        step on, so one completion can span several versions.
        """
        ...

    def stats(self) -> dict[str, float]:
        """Counters and gauges: running/waiting requests, tokens generated, idle fraction, ..."""
        ...

    async def close(self) -> None:
        """Stop serving; pending requests finish with ``finish_reason="abort"``."""
        ...
