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
Versions are attributed as `sao.engine.http_client` describes. `VLLMEngine.native_update` takes the other
path, vLLM's NCCL weight transfer (``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``,
`sao.engine.native_sync`): no file, but CUDA on both sides.

KV of in-flight requests. By default their cached KV (computed by the old weights) is kept: later tokens come
from the new weights reading a prefix encoded by the old ones. With ``recompute_kv_on_update=True`` the
update also preempts every running request (``/reset_prefix_cache?reset_running_requests=true``, while
paused), so vLLM re-prefills prompt + generated tokens with the new weights: later tokens are then exactly
what the new policy gives for that prefix.

Prefix caching (on by default in `launch`). vLLM's block hashes carry no weight version, and its reset
(``/reset_prefix_cache``, `Scheduler.reset_prefix_cache` -> `BlockPool.reset_prefix_cache`) refuses while any
block is held, which paused ``keep`` requests always do: the endpoint then answers 200 and resets nothing.
So each request carries ``cache_salt="sao-v<version>"`` (vLLM hashes the salt into the first block of the
chain): a request only reuses KV written under the version it started with. The reset after a load stays, a
best-effort release of old entries that succeeds when the server is idle.

Known limit (vllm-cpu 0.32): reloading a Qwen3-MoE corrupts its experts on CPU (the CPU MoE kernel's
pre-packed weights are overwritten without re-packing); dense models reload correctly. GPU builds do not
take that path.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
from torch import Tensor

from sao.engine.http_client import HTTPEngine
from sao.engine.http_protocol import ServerError, TokenDelta, checked_prompt
from sao.engine.native_sync import push_vllm_native
from sao.engine.server_process import free_port
from sao.engine.server_settings import ServerSettings, last_flag
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
    cache_salt: str | None = None,
) -> dict[str, Any]:
    """The JSON body of a streamed ``/v1/completions`` request for one token-in/token-out generation.

    ``max_tokens`` is ``max_new_tokens`` capped by the context left after the prompt (vLLM rejects a
    request whose prompt + max_tokens exceeds ``max_model_len``; the contract ends it with ``length``).
    ``cache_salt``: the prefix-cache namespace (vLLM mixes it into the hash of the first KV block, so only
    requests with the same salt share cached KV). Raises `InvalidRequestError` for invalid params, an empty
    prompt, a non-integer or negative token id, or a prompt that leaves no room for one new token.
    """
    prompt, max_tokens = checked_prompt(prompt_token_ids, params, max_model_len)
    body: dict[str, Any] = {
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
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    return body


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
    settings: ServerSettings | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """argv of a vLLM OpenAI-compatible server fit for RL: processed log-probs (the sampled distribution),
    then ``settings`` as flags (`ServerSettings`, default ``ServerSettings()``; prefix caching on or off
    explicitly, the others only when set), then ``extra_args``. ``python -m
    vllm.entrypoints.openai.api_server`` rather than the ``vllm`` script, which fails in the vllm-cpu
    package."""
    settings = settings or ServerSettings()
    argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir)]
    argv += ["--host", host, "--port", str(port), "--dtype", dtype]
    argv += ["--logprobs-mode", "processed_logprobs"]
    argv.append("--enable-prefix-caching" if settings.prefix_caching else "--no-enable-prefix-caching")
    if settings.enforce_eager:
        argv.append("--enforce-eager")
    if settings.max_model_len is not None:
        argv += ["--max-model-len", str(settings.max_model_len)]
    if settings.tensor_parallel_size > 1:
        argv += ["--tensor-parallel-size", str(settings.tensor_parallel_size)]
    if settings.memory_fraction is not None:
        argv += ["--gpu-memory-utilization", str(settings.memory_fraction)]
    if settings.model_overrides:
        argv += ["--hf-overrides", json.dumps(dict(settings.model_overrides), sort_keys=True)]
    if settings.weight_transfer is not None:
        argv += ["--weight-transfer-config", json.dumps({"backend": settings.weight_transfer})]
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
    ``prefix_caching``: whether the server caches prefixes (then requests are salted with the version
    and each update also asks for a reset, see the module docstring).
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
        settings: ServerSettings | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        startup_timeout_s: float = 600.0,
        log_path: str | Path | None = None,
        **kwargs: Any,
    ) -> VLLMEngine:
        """Start ``python -m vllm.entrypoints.openai.api_server`` on ``model_dir`` with ``settings`` and
        ``extra_args`` (`vllm_server_command`; python: the argument, else ``$SAO_VLLM_PYTHON``, else this
        interpreter) and attach to it; `close` stops it. ``env`` overrides `vllm_server_env` (on CPU e.g.
        ``VLLM_CPU_OMP_THREADS_BIND``, ``VLLM_CPU_KVCACHE_SPACE``). The adapter salts its requests per weight
        version when the command leaves prefix caching on. Raises RuntimeError or TimeoutError, quoting the
        server log, if it does not come up."""
        python = python or os.environ.get("SAO_VLLM_PYTHON") or sys.executable
        port = port or free_port(host)
        argv = vllm_server_command(
            model_dir, python=python, port=port, host=host, dtype=dtype, settings=settings,
            extra_args=extra_args,
        )  # fmt: skip
        caching = last_flag(argv, "--enable-prefix-caching", "--no-enable-prefix-caching")
        kwargs.setdefault("prefix_caching", caching == "--enable-prefix-caching")
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
            cache_salt=f"sao-v{self.version}" if self.prefix_caching else None,
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
        ``send()`` broadcasts the same tensors in order (`sao.engine.native_sync.broadcast_each`; in a group
        initialized packed, ``bucket_bytes``, `sao.engine.native_buckets.send_buckets`). Paused, prefix
        cache reset and versions committed as in `update_weights`; ``kwargs`` go to `push_vllm_native`.
        Raises `ServerError` or ``send``'s error (the version is then unchanged)."""
        async with self._updating():
            await push_vllm_native(
                self._client, self.base_url, state, send, weight_version=str(version),
                on_paused=self._mark_paused, on_loaded=lambda: self._after_load(version), **kwargs,
            )  # fmt: skip

    async def native_workers(self) -> int | None:
        """How many ranks this server takes in a weight-transfer group (``GET /get_world_size``: its
        tensor x pipeline x data parallel workers), or None when the server has no such endpoint."""
        response = await self._client.get("/get_world_size", timeout=60.0)
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise ServerError(f"vLLM /get_world_size failed ({response.status_code})", response.status_code)
        return int(response.json()["world_size"])

    async def native_init(self, join: Callable[[], Awaitable[Any]], **kwargs: Any) -> Any:
        """Join the server's weight-transfer group while ``join()`` joins the trainer (rank 0);
        ``kwargs`` go to `sao.engine.native_sync.init_vllm_native` (``bucket_bytes``: packed pushes)."""
        from sao.engine.native_sync import init_vllm_native

        return await init_vllm_native(self._client, self.base_url, join, **kwargs)

    async def native_close(self, group_name: str = "") -> None:
        """Shut the server's weight-transfer group down (``/shutdown_weight_transfer_engine``, vLLM 0.33;
        a server without it keeps its group until the next init replaces it). ``group_name``: unused
        (vLLM has one group)."""
        response = await self._client.post("/shutdown_weight_transfer_engine", timeout=60.0)
        if response.status_code not in (200, 404):
            raise ServerError(f"vLLM /shutdown_weight_transfer_engine failed ({response.status_code})",
                              response.status_code)  # fmt: skip

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

    async def score(self, token_ids: Sequence[int]) -> list[float]:
        """Teacher-forced log-probs of ``token_ids[1:]`` (temperature 1) under the served weights: one
        ``/v1/completions`` request with ``prompt_logprobs=0`` (`sao.engine.scoring`). Raises ValueError
        when the answer lacks them, `ServerError` when the server refuses."""
        from sao.engine.scoring import parse_vllm_scores, vllm_score_request

        body = vllm_score_request(token_ids, self.model)
        return parse_vllm_scores((await self._post(self.generate_path, json=body)).json(), body["prompt"])
