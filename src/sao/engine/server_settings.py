"""`ServerSettings`: how a vLLM or SGLang server is started, as the command builders of `sao.engine.vllm`
and `sao.engine.sglang` turn it into flags.

A run fills it from its config (`sao.runtime.engines.server_settings`: ``engine.enforce_eager``,
``engine.max_model_len`` or ``data.max_total_tokens``, ``engine.gpu_memory_fraction``,
``engine.prefix_caching``, ``cluster.engine_gpus``, ``model.rope_scaling``); a library caller may build one
directly. A field left None adds no flag: the server's default, or whatever ``extra_args`` say (they come
last on the command line).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ServerSettings", "last_flag"]


@dataclass(frozen=True)
class ServerSettings:
    """Launch settings of one server.

    ``enforce_eager``: no CUDA graphs (True, the library default, is what a CPU build needs).
    ``max_model_len``: context limit in tokens. ``tensor_parallel_size``: GPUs the model is sharded over.
    ``memory_fraction``: share of GPU memory for weights and KV cache. ``prefix_caching``: reuse the KV of
    shared prefixes (requests are then salted per weight version by the adapters). ``model_overrides``: keys
    of the Hugging Face model config replaced at load (e.g. ``{"rope_parameters": {...}}``), as JSON.
    ``weight_transfer``: the backend of the server's native weight-transfer engine (``"nccl"`` when the run
    pushes weights over vLLM's NCCL transfer, ``runtime.weight_sync=vllm``; vLLM refuses the transfer
    endpoints without ``--weight-transfer-config``); None: not enabled.
    """

    enforce_eager: bool = True
    max_model_len: int | None = None
    tensor_parallel_size: int = 1
    memory_fraction: float | None = None
    prefix_caching: bool = True
    model_overrides: Mapping[str, Any] | None = field(default=None, hash=False)
    weight_transfer: str | None = None

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.memory_fraction is not None and not 0 < self.memory_fraction <= 1:
            raise ValueError(f"memory_fraction must be in (0, 1], got {self.memory_fraction}")


def last_flag(argv: Sequence[str], *flags: str) -> str | None:
    """Which of ``flags`` comes last in ``argv`` (``--flag`` or ``--flag=value``; the one argparse keeps),
    else None."""
    found = None
    for arg in argv:
        name = arg.split("=", 1)[0]
        if name in flags:
            found = name
    return found
