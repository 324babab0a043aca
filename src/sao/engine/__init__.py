"""Inference engines: token-in/token-out generation with per-token log-probs and policy versions.

Owns generation, continuous batching, in-flight weight updates, the vLLM/SGLang adapters and the
OpenAI-compatible gateway. Knows nothing of rewards or environments.
"""

from .types import FinishReason, Generation, InferenceEngine, InvalidRequestError, SamplingParams, WeightsLike

__all__ = [
    "FinishReason",
    "Generation",
    "InferenceEngine",
    "InvalidRequestError",
    "SamplingParams",
    "WeightsLike",
]
