"""Inference engines: token-in/token-out generation with per-token log-probs and policy versions.

`types` is the contract every engine meets (`InferenceEngine`, `SamplingParams`, `Generation`). The engines:
`LocalEngine` (`local`: in process, CPU or one GPU, continuous batching; its parts `local_scheduler`,
`local_request`, `local_step`, `kv_cache`, `prefix_store`, `lean_forward`, `sampling`, `local_weights`),
`ProcessEngine` (`process`, `process_child`: the local engine in a child process, weights through
`shared_weights`), and the vLLM / SGLang adapters (`vllm`, `sglang`, over `http_client`, `http_protocol`,
`server_process`, `server_settings`). Weight updates of server engines: `weights` (names and
the disk hand-off), `native_sync` and `native_buckets` (over a collective group that `weight_broadcast`
builds); `cuda_ipc` hands weights over by CUDA IPC handles on a shared GPU. `scoring` gives the
teacher-forced log-probs of the weight-push check; `futures` hands results from engine threads to callers.

Knows nothing of trajectories, rewards or environments; the OpenAI-compatible gateway and the session
recorder are `sao.serve`'s.
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
