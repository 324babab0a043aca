"""Inference engines: token-in/token-out generation with per-token log-probs and policy versions.

Owns generation, continuous batching, in-flight weight updates and the vLLM/SGLang adapters. Knows nothing
of trajectories, rewards or environments; the OpenAI-compatible gateway and the session recorder are
`sao.serve`'s.
"""

from __future__ import annotations

from typing import Any

from .types import FinishReason, Generation, InferenceEngine, InvalidRequestError, SamplingParams, WeightsLike

__all__ = [
    "FinishReason",
    "Generation",
    "InferenceEngine",
    "InvalidRequestError",
    "LocalEngine",
    "SGLangEngine",
    "SamplingParams",
    "VLLMEngine",
    "WeightsLike",
]


def __getattr__(name: str) -> Any:
    # LocalEngine pulls in transformers; importing it lazily keeps `sao.engine.types` light for the adapters.
    if name == "LocalEngine":
        from .local import LocalEngine

        return LocalEngine
    if name == "VLLMEngine":
        from .vllm import VLLMEngine

        return VLLMEngine
    if name == "SGLangEngine":
        from .sglang import SGLangEngine

        return SGLangEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
