"""`VLLMEngine`: the `InferenceEngine` contract over a vLLM OpenAI-compatible server (checked on vLLM 0.32).

The adapter owns the HTTP conversation with one server, which it either launches as a child process
(`VLLMEngine.launch`, any python that has vLLM, e.g. the ``.venv-vllm`` of ``scripts/setup_vllm_cpu.sh``)
or attaches to (`VLLMEngine.attach`). It does not own the model: the weights live in the server. Streams,
versions, counters and shutdown are `HTTPEngine`'s; this module maps the vLLM API.

Generation. Token ids go in as the ``prompt`` of a streamed ``/v1/completions`` request with
``return_token_ids`` (the sampled ids come back in each chunk) and ``logprobs=0`` (the log-prob of the
sampled token only). The server must run with ``--logprobs-mode processed_logprobs``: log-probs are then
those of the distribution actually sampled from (after temperature, top-k and top-p; the untempered one for
greedy), as the contract requires; vLLM's default ``raw_logprobs`` ignores temperature. EOS is not implied
(``ignore_eos``): generation stops on ``stop_token_ids``, a stop string, ``max_new_tokens`` or the context
limit, as in `LocalEngine`; neutral penalties are sent explicitly so that a model's generation config cannot
add any. The pure functions `completion_request` and `parse_chunk` do the mapping.

Weight updates need the server's RL and dev endpoints (``VLLM_SERVER_DEV_MODE=1``, set by `launch`):
``POST /pause?mode=keep`` freezes every request in the scheduler (nothing is aborted) and returns once the
engine's output queue is drained; ``POST /collective_rpc`` ``reload_weights(weights_path=DIR)`` reloads in
place from a safetensors directory (a state dict is first written there, experts unfused, by
`sao.engine.weights.write_update_dir`); then, if needed, ``/reset_prefix_cache``; then ``POST /resume``.
Versions are attributed as `sao.engine.http_server` describes. `VLLMEngine.native_update` takes the other
path, vLLM's NCCL weight transfer (``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``,
`sao.engine.native_sync`): no file, but CUDA on both sides.

KV of in-flight requests. By default their cached KV (computed by the old weights) is kept: later tokens come
from the new weights reading a prefix encoded by the old ones. With ``recompute_kv_on_update=True`` the
update also preempts every running request (``/reset_prefix_cache?reset_running_requests=true``, while
paused), so vLLM re-prefills prompt + generated tokens with the new weights: later tokens are then exactly
what the new policy gives for that prefix. `launch` disables prefix caching, which would otherwise serve KV
computed by old weights to new requests.

Known limit (vllm-cpu 0.32): reloading a Qwen3-MoE corrupts its experts on CPU (the CPU MoE kernel's
pre-packed weights are overwritten without re-packing); dense models reload correctly. GPU builds do not
take that path.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
from torch import Tensor

from sao.engine.http_server import HTTPEngine, ServerError, TokenDelta, checked_prompt
from sao.engine.native_sync import push_vllm_native
from sao.engine.server_process import free_port
from sao.engine.types import FinishReason, SamplingParams

__all__ = ["VLLMEngine", "completion_request", "parse_chunk", "vllm_server_command", "vllm_server_env"]

_FINISH_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


def completion_request(
    prompt_token_ids: Sequence[int],
    params: SamplingParams,
    *,
    model: str,
    max_model_len: int,
    request_id: str,
) -> dict[str, Any]:
    """The JSON body of a streamed ``/v1/completions`` request for one token-in/token-out generation.

    ``max_tokens`` is ``max_new_tokens`` capped by the context left after the prompt (vLLM rejects a
    request whose prompt + max_tokens exceeds ``max_model_len``; the contract ends it with ``length``).
    Raises `InvalidRequestError` for invalid params, an empty prompt, a non-integer or negative token id, or a
    prompt that leaves no room for one new token.
    """
    prompt, max_tokens = checked_prompt(prompt_token_ids, params, max_model_len)
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "stop_token_ids": list(params.stop_token_ids),
        "stop": list(params.stop),
        "seed": params.seed,
        "ignore_eos": True,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "logprobs": 0,
        "return_token_ids": True,
        "skip_special_tokens": False,
        "stream": True,
        "request_id": request_id,
    }


def parse_chunk(chunk: Mapping[str, Any]) -> TokenDelta:
    """Map one ``/v1/completions`` stream chunk (``text_completion`` object, one choice) to a
    `TokenDelta`. An error object (``{"error": {...}}``) becomes ``finish_reason="error"``. Raises
    ValueError if token ids and log-probs disagree in length (the server is not sending what we asked)."""
    if "error" in chunk:
        err = chunk["error"]
        if not isinstance(err, Mapping):
            return TokenDelta((), (), "error", error=str(err))
        invalid = err.get("code") in (400, 422)
        return TokenDelta((), (), "error", error=str(err.get("message", err)), invalid_request=invalid)
    choices = chunk.get("choices") or []
    if not choices:  # e.g. a usage-only chunk
        return TokenDelta((), ())
    choice = choices[0]
    token_ids = tuple(int(t) for t in choice.get("token_ids") or ())
    lp = choice.get("logprobs") or {}
    logprobs = tuple(float(x) for x in lp.get("token_logprobs") or ())
    if len(token_ids) != len(logprobs):
        raise ValueError(
            f"vLLM chunk has {len(token_ids)} token ids but {len(logprobs)} log-probs; does the server "
            "support return_token_ids and logprobs?"
        )
    reason = choice.get("finish_reason")
    finish = None if reason is None else _FINISH_REASONS.get(reason, "error")
    error = None if finish != "error" else f"vLLM finish_reason {reason!r}"
    return TokenDelta(token_ids, logprobs, finish, choice.get("stop_reason"), error)


def vllm_server_command(
    model_dir: str | Path,
    *,
    python: str | Path,
    port: int,
    host: str = "127.0.0.1",
    dtype: str = "float32",
    enforce_eager: bool = True,
    max_model_len: int | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """argv of a vLLM OpenAI-compatible server fit for RL: processed log-probs (the sampled distribution),
    no prefix caching (it would serve KV of old weights after an update). ``python -m
    vllm.entrypoints.openai.api_server`` rather than the ``vllm`` script, which fails in the vllm-cpu
    package."""
    argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir)]
    argv += ["--host", host, "--port", str(port), "--dtype", dtype]
    argv += ["--logprobs-mode", "processed_logprobs", "--no-enable-prefix-caching"]
    if enforce_eager:
        argv.append("--enforce-eager")
    if max_model_len is not None:
        argv += ["--max-model-len", str(max_model_len)]
    return argv + list(extra_args)


def vllm_server_env(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment plus ``VLLM_SERVER_DEV_MODE=1`` (the pause/resume and collective_rpc
    endpoints) and ``HF_HUB_OFFLINE=1`` unless set, then ``overrides``."""
    env = dict(os.environ)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.update(overrides or {})
    return env


class VLLMEngine(HTTPEngine):
    """`InferenceEngine` over one vLLM server; see the module docstring. Build with `launch` or `attach`.

    ``model``/``max_model_len``: the served model name and its context limit (``/v1/models``).
    ``prefix_caching``: whether the server caches prefixes (then each update resets that cache).
    Other arguments: `HTTPEngine`.
    """

    engine_name = "vllm"
    generate_path = "/v1/completions"

    def __init__(
        self,
        base_url: str,
        model: str,
        max_model_len: int,
        *,
        recompute_kv_on_update: bool = False,
        prefix_caching: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(base_url, **kwargs)
        self.model = model
        self.max_model_len = max_model_len
        self.recompute_kv_on_update = recompute_kv_on_update
        self.prefix_caching = prefix_caching

    @classmethod
    async def attach(cls, base_url: str, **kwargs: Any) -> VLLMEngine:
        """An adapter for the server at ``base_url``; the served model and context limit come from
        ``/v1/models``. ``kwargs`` go to the constructor. The server should run with ``--logprobs-mode
        processed_logprobs`` (else log-probs ignore temperature) and ``VLLM_SERVER_DEV_MODE=1`` (else
        `update_weights` raises)."""
        async with httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=30.0) as client:
            response = await client.get("/v1/models")
            response.raise_for_status()
            served = response.json()["data"][0]
        kwargs.setdefault("config_dir", served.get("root"))
        return cls(base_url, served["id"], int(served["max_model_len"]), **kwargs)

    @classmethod
    async def launch(
        cls,
        model_dir: str | Path,
        *,
        python: str | Path | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        dtype: str = "float32",
        enforce_eager: bool = True,
        max_model_len: int | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        startup_timeout_s: float = 600.0,
        log_path: str | Path | None = None,
        **kwargs: Any,
    ) -> VLLMEngine:
        """Start ``python -m vllm.entrypoints.openai.api_server`` on ``model_dir`` (python: the argument,
        else ``$SAO_VLLM_PYTHON``, else this interpreter) and attach to it; `close` stops it. ``env``
        overrides `vllm_server_env` (on CPU e.g. ``VLLM_CPU_OMP_THREADS_BIND``, ``VLLM_CPU_KVCACHE_SPACE``).
        Raises RuntimeError or TimeoutError, quoting the server log, if it does not come up."""
        python = python or os.environ.get("SAO_VLLM_PYTHON") or sys.executable
        port = port or free_port(host)
        argv = vllm_server_command(
            model_dir,
            python=python,
            port=port,
            host=host,
            dtype=dtype,
            enforce_eager=enforce_eager,
            max_model_len=max_model_len,
            extra_args=extra_args,
        )
        kwargs.setdefault("prefix_caching", "--enable-prefix-caching" in extra_args)
        return await cls._start_and_attach(
            argv, f"http://{host}:{port}", env=vllm_server_env(env), timeout_s=startup_timeout_s,
            log_path=log_path, **kwargs,
        )  # fmt: skip

    def _request_body(
        self, prompt_token_ids: Sequence[int], params: SamplingParams, request_id: str
    ) -> dict[str, Any]:
        return completion_request(
            prompt_token_ids,
            params,
            model=self.model,
            max_model_len=self.max_model_len,
            request_id=request_id,
        )

    def _parse_chunk(self, data: Mapping[str, Any], received: int) -> TokenDelta:
        return parse_chunk(data)

    async def _reload(self, path: Path, version: int) -> None:
        await self._post_rl("/pause", params={"mode": "keep"})
        self._mark_paused()
        try:
            rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}
            await self._post_rl("/collective_rpc", json=rpc)
            await self._after_load(version)
        finally:
            await self._post_rl("/resume")

    async def _after_load(self, version: int) -> None:
        if self.recompute_kv_on_update or self.prefix_caching:
            reset = "true" if self.recompute_kv_on_update else "false"
            await self._post_rl("/reset_prefix_cache", params={"reset_running_requests": reset})
        await self._commit_version(version)

    async def native_update(
        self,
        state: Mapping[str, Tensor],
        version: int,
        send: Callable[[], Awaitable[Any]],
        **kwargs: Any,
    ) -> None:
        """Load ``state`` (engine names, experts unfused, in the served dtype) as ``version`` over the
        server's weight-transfer group (joined before, `sao.engine.native_sync.init_vllm_native`) while
        ``send()`` broadcasts the same tensors in order (`sao.engine.native_sync.broadcast_each`). Paused,
        prefix cache reset and versions committed as in `update_weights`; ``kwargs`` go to
        `push_vllm_native`. Raises `ServerError` or ``send``'s error (the version is then unchanged)."""
        async with self._updating():
            await push_vllm_native(
                self._client, self.base_url, state, send, weight_version=str(version),
                on_paused=self._mark_paused, on_loaded=lambda: self._after_load(version), **kwargs,
            )  # fmt: skip

    async def _post_rl(self, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return await self._post(path, **kwargs)
        except ServerError as e:
            if e.status_code == 404:
                raise ServerError(
                    f"vLLM at {self.base_url} has no {path} endpoint: start it with VLLM_SERVER_DEV_MODE=1",
                    404,
                ) from e
            raise
