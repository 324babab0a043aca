"""Rollout generation: `EngineConfig` and the server flags its launch keys set."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .section import Section

__all__ = [
    "SERVER_LAUNCH_FLAGS",
    "SERVER_OVERRIDE_FLAGS",
    "SERVER_TP_FLAGS",
    "EngineConfig",
    "server_flag_given",
]


class EngineConfig(Section):
    """Rollout generation (the paper evaluates at temperature 1.0, top-p 1.0)."""

    backend: Literal["local", "process", "vllm", "sglang"] = Field(
        "local",
        description="Inference engine: 'local' in the trainer's process (a thread), 'process' the same "
        "engine in a child process of its own (no shared interpreter lock), 'vllm'/'sglang' servers "
        "(launched on the run's model, or engine.attach).",
    )
    threads: int | None = Field(
        None,
        ge=1,
        description="backend=local/process, local runtime: intra-op torch threads of the engine (its loop "
        "thread, or its process); null: half the cores this process may use, at least 1 (torch's own "
        "setting when OMP_NUM_THREADS is set). Logged as runtime/engine_threads.",
    )
    temperature: float = Field(1.0, ge=0, description="Sampling temperature; DIS ratios are exact at 1.0.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    top_k: int = Field(-1, ge=-1, description="Top-k sampling; -1 disables.")
    max_new_tokens: int = Field(2048, ge=1, description="Tokens generated per model turn.")
    max_concurrent: int = Field(64, ge=1, description="Sequences the engine decodes at once.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="Dtype of the engine's weights (independent of the trainer's; weights are cast inside "
        "each push); 'auto' = bfloat16 on GPU, float32 on CPU.",
    )
    python: str | None = Field(
        None,
        description="backend=vllm/sglang: python of the virtualenv with the server "
        "(null: $SAO_VLLM_PYTHON / $SAO_SGLANG_PYTHON, else this one).",
    )
    attach: str | None = Field(
        None,
        description="backend=vllm/sglang: URL of a running server to use instead of launching one; it must "
        "read this machine's files (weights are handed over as directories).",
    )
    server_args: list[str] = Field(
        default_factory=list, description="backend=vllm/sglang: extra command-line arguments of the server."
    )
    max_restarts: int = Field(
        3,
        ge=0,
        description="Restarts of an engine process or server that died, with no trained step in between, "
        "before the run stops with a checkpoint (episodes lost in a crash are dropped as engine_crash).",
    )
    enforce_eager: bool | None = Field(
        None,
        description="backend=vllm/sglang: run the server without CUDA graphs (vLLM --enforce-eager, SGLang "
        "--disable-cuda-graph); null: on when the server has no GPU (runtime.backend=ray with "
        "cluster.engine_gpus=0, or the local runtime with model.device resolving to cpu), off on GPU.",
    )
    max_model_len: int | None = Field(
        None,
        ge=1,
        description="backend=vllm/sglang: the server's context limit in tokens (vLLM --max-model-len, SGLang "
        "--context-length); null: data.max_total_tokens. A server whose limit is below data.max_total_tokens "
        "is refused at start.",
    )
    gpu_memory_fraction: float | None = Field(
        None,
        gt=0,
        le=1,
        description="backend=vllm/sglang: share of the GPU's memory the server may use, weights and KV cache "
        "(vLLM --gpu-memory-utilization, SGLang --mem-fraction-static); null: the server's default.",
    )
    prefix_cache_tokens: int | None = Field(
        None,
        ge=0,
        description="backend=local/process (and Ray LocalEngine replicas): KV positions each engine keeps "
        "for the later turns of episodes (a finished turn's KV, taken by the next turn, which then prefills "
        "only its new tokens); least recently kept evicted first; null: the engine's KV budget (65536).",
    )
    prefix_caching: bool = Field(
        True,
        description="Reuse an episode's earlier turns' KV. local/process: LocalEngine keeps it "
        "(engine.prefix_cache_tokens). backend=vllm/sglang: the server's prefix cache (vLLM automatic "
        "prefix caching, SGLang radix cache), reused across an episode's turns; requests are salted with "
        "the weight version, so a request never reads KV computed by older weights than those it started "
        "under. false: nothing kept (servers: --no-enable-prefix-caching / --disable-radix-cache).",
    )

    @model_validator(mode="after")
    def _backend_options(self) -> EngineConfig:
        if self.threads is not None and self.backend not in ("local", "process"):
            raise ValueError(
                f"engine.threads applies to backends 'local' and 'process', not {self.backend!r}"
            )
        server = ("python", "attach", "server_args")
        if self.backend not in ("vllm", "sglang") and any(getattr(self, k) for k in server):
            name = next(k for k in server if getattr(self, k))
            raise ValueError(f"engine.{name} applies to backends 'vllm' and 'sglang', not {self.backend!r}")
        if self.attach and (self.python or self.server_args):
            raise ValueError("engine.attach uses a running server: engine.python and server_args are unused")
        if self.prefix_cache_tokens is not None and self.backend not in ("local", "process"):
            raise ValueError(
                f"engine.prefix_cache_tokens applies to backends 'local' and 'process' (LocalEngine), not "
                f"{self.backend!r}; a server sizes its own prefix cache"
            )
        if self.prefix_cache_tokens and not self.prefix_caching:
            raise ValueError("engine.prefix_cache_tokens is set but engine.prefix_caching is false")
        launch = [
            k
            for k in SERVER_LAUNCH_FLAGS
            if k != "prefix_caching" and getattr(self, k) != type(self).model_fields[k].default
        ]
        if launch and self.backend not in ("vllm", "sglang"):
            raise ValueError(
                f"engine.{launch[0]} applies to backends 'vllm' and 'sglang', not {self.backend!r}"
            )
        if launch and self.attach:
            raise ValueError(
                f"engine.{launch[0]} sets how sao launches a server; engine.attach uses a running one"
            )
        if self.backend in ("vllm", "sglang"):
            for key in SERVER_LAUNCH_FLAGS:
                given = server_flag_given(self.server_args, SERVER_LAUNCH_FLAGS[key][self.backend])
                explicit = key == "prefix_caching" or getattr(self, key) is not None
                if given and explicit:
                    raise ValueError(
                        f"engine.{key} and engine.server_args both set the server's {given}: set it in "
                        f"engine.{key} only"
                    )
        return self


# The server flags each launch key of `EngineConfig` sets, per backend (the config refuses a key given both
# ways; tests/engine/test_launch_config.py checks the command builders emit exactly these flags).
SERVER_LAUNCH_FLAGS: dict[str, dict[str, tuple[str, ...]]] = {
    "enforce_eager": {"vllm": ("--enforce-eager", "--no-enforce-eager"), "sglang": ("--disable-cuda-graph",)},
    "max_model_len": {"vllm": ("--max-model-len",), "sglang": ("--context-length",)},
    "gpu_memory_fraction": {"vllm": ("--gpu-memory-utilization",), "sglang": ("--mem-fraction-static",)},
    "prefix_caching": {
        "vllm": ("--enable-prefix-caching", "--no-enable-prefix-caching"),
        "sglang": ("--disable-radix-cache",),
    },
}
# Set from cluster.engine_gpus and model.rope_scaling (cross-section: `RunConfig`).
SERVER_TP_FLAGS = {"vllm": ("--tensor-parallel-size", "-tp"), "sglang": ("--tp-size", "--tp")}
SERVER_OVERRIDE_FLAGS = {"vllm": ("--hf-overrides",), "sglang": ("--json-model-override-args",)}


def server_flag_given(server_args: list[str] | tuple[str, ...], flags: tuple[str, ...]) -> str | None:
    """The first of ``flags`` that ``server_args`` sets (``--flag value`` or ``--flag=value``), else None."""
    for arg in server_args:
        name = arg.split("=", 1)[0]
        if name in flags:
            return name
    return None
