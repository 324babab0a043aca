"""`SGLangEngine`: the `InferenceEngine` contract over an SGLang server's native API (written for 0.5.2x).

The adapter launches (`SGLangEngine.launch`) or attaches to (`SGLangEngine.attach`) one server; streams,
versions, counters and shutdown are `HTTPEngine`'s, this module maps SGLang's API. There is no CPU wheel of
SGLang for this project, so the mapping is unit-tested on JSON shaped like the server's and the server path
by a GPU test.

Generation: ``POST /generate``, streamed (`sao.engine.sglang_api` maps the request and the chunks).

Log-probs. SGLang reports ``log_softmax(logits / temperature)``, computed *before* top-k / top-p filtering
(unless ``SGLANG_RETURN_ORIGINAL_LOGPROB`` is set, which makes them untempered: leave it unset). Without
filters that is the contract's sampled distribution; with top-k or top-p it is not renormalised over the
kept tokens, and the generation says so in ``metadata["logprobs"] = "before_top_k_top_p"``. SGLang honours
``sampling_seed`` only under ``--enable-deterministic-inference``.

Weight updates: ``POST /pause_generation`` with ``mode="in_place"`` (requests keep their KV) or, with
``recompute_kv_on_update``, ``mode="retract"`` (running requests go back to the queue and are re-prefilled
with the new weights); ``POST /update_weights_from_disk`` (``model_path``: a checkpoint directory, written by
`sao.engine.weights.write_update_dir` for a state dict, ``weight_version``, ``keep_pause``, and
``flush_cache`` only in retract mode); then ``POST /continue_generation``. Servers
older than 0.5.6, whose ``/pause_generation`` aborts everything, are updated without a pause (their weight
update waits for running requests to finish). ``/update_weights_from_tensor`` (same-GPU tensor handles) and
``/update_weights_from_distributed`` (an NCCL group with the trainer) are the paths for co-located and
multi-node GPU training; the latter is `SGLangEngine.native_update` (`sao.engine.native_sync`).

Prefix caching (the radix cache, kept by `launch` unless ``settings.prefix_caching`` is off). Radix keys
carry no weight version, and `Scheduler.flush_cache` only empties the tree when no request is running or
waiting (else it returns False, and an update asked to flush asserts on it): with requests paused in place
it cannot run. So each request carries ``extra_key="sao-v<version>"`` (SGLang's radix namespace,
``RadixKey.extra_key``): a request only reuses KV written under the version it started with; old entries
age out by LRU.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
from torch import Tensor

from sao.engine.http_client import HTTPEngine
from sao.engine.http_protocol import TokenDelta
from sao.engine.native_sync import push_sglang_native
from sao.engine.server_process import free_port
from sao.engine.server_settings import ServerSettings, last_flag
from sao.engine.sglang_api import generate_request, parse_generate_chunk
from sao.engine.types import Generation, SamplingParams

__all__ = ["SGLangEngine", "sglang_server_command", "sglang_server_env", "supports_pause_modes"]

_PAUSE_MODES_SINCE = (0, 5, 6)  # /pause_generation takes a mode (older servers always abort)


def supports_pause_modes(version: str | None) -> bool:
    """Whether an SGLang server of ``version`` (e.g. ``"0.5.23"``, ``"0.5.10.post1"``) has
    ``/pause_generation`` modes; unknown versions are assumed recent."""
    if not version:
        return True
    numbers = tuple(int(n) for n in re.findall(r"\d+", version.split("+")[0])[:3])
    return numbers >= _PAUSE_MODES_SINCE


def sglang_server_command(
    model_dir: str | Path,
    *,
    python: str | Path,
    port: int,
    host: str = "127.0.0.1",
    dtype: str = "auto",
    settings: ServerSettings | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """argv of an SGLang server for RL: streamed output as per-chunk deltas
    (``--incremental-streaming-output``), then ``settings`` as flags (`ServerSettings`, default
    ``ServerSettings()``: each only when it departs from SGLang's default), then ``extra_args``."""
    settings = settings or ServerSettings()
    argv = [str(python), "-m", "sglang.launch_server", "--model-path", str(model_dir)]
    argv += ["--host", host, "--port", str(port), "--dtype", dtype, "--incremental-streaming-output"]
    if not settings.prefix_caching:
        argv.append("--disable-radix-cache")
    if settings.enforce_eager:
        argv.append("--disable-cuda-graph")
    if settings.max_model_len is not None:
        argv += ["--context-length", str(settings.max_model_len)]
    if settings.tensor_parallel_size > 1:
        argv += ["--tp-size", str(settings.tensor_parallel_size)]
    if settings.memory_fraction is not None:
        argv += ["--mem-fraction-static", str(settings.memory_fraction)]
    if settings.model_overrides:
        argv += ["--json-model-override-args", json.dumps(dict(settings.model_overrides), sort_keys=True)]
    return argv + list(extra_args)


def sglang_server_env(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment plus ``HF_HUB_OFFLINE=1`` unless set, then ``overrides``."""
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.update(overrides or {})
    return env


class SGLangEngine(HTTPEngine):
    """`InferenceEngine` over one SGLang server; see the module docstring. Build with `launch` or `attach`.

    ``max_model_len``: the server's context limit, if known (caps ``max_new_tokens``). ``incremental``: the
    server streams deltas. ``pause_modes``: ``/pause_generation`` takes a mode (SGLang >= 0.5.6).
    ``prefix_caching``: the server keeps its radix cache (then each request carries the weight version as
    its ``extra_key``, see the module docstring). Other arguments: `HTTPEngine`.
    """

    engine_name = "sglang"
    generate_path = "/generate"

    def __init__(
        self,
        base_url: str,
        *,
        max_model_len: int | None = None,
        incremental: bool = False,
        pause_modes: bool = True,
        recompute_kv_on_update: bool = False,
        prefix_caching: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(base_url, **kwargs)
        self.max_model_len = max_model_len
        self.incremental = incremental
        self.pause_modes = pause_modes
        self.recompute_kv_on_update = recompute_kv_on_update
        self.prefix_caching = prefix_caching

    @classmethod
    async def attach(cls, base_url: str, **kwargs: Any) -> SGLangEngine:
        """An adapter for the server at ``base_url``; the context limit, streaming mode, version and model
        path come from ``/get_server_info``. ``kwargs`` go to the constructor (and win)."""
        async with httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=60.0) as client:
            response = await client.get("/get_server_info")
            response.raise_for_status()
            info = response.json()
        context = info.get("context_length")
        kwargs.setdefault("max_model_len", int(context) if context else None)
        kwargs.setdefault("incremental", bool(info.get("incremental_streaming_output", False)))
        kwargs.setdefault("pause_modes", supports_pause_modes(info.get("version")))
        kwargs.setdefault("prefix_caching", not info.get("disable_radix_cache", False))
        model_path = info.get("model_path")
        if model_path and Path(model_path).is_dir():
            kwargs.setdefault("config_dir", model_path)
        return cls(base_url, **kwargs)

    @classmethod
    async def launch(
        cls,
        model_dir: str | Path,
        *,
        python: str | Path | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        dtype: str = "auto",
        settings: ServerSettings | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        startup_timeout_s: float = 900.0,
        log_path: str | Path | None = None,
        **kwargs: Any,
    ) -> SGLangEngine:
        """Start ``python -m sglang.launch_server`` on ``model_dir`` with ``settings`` and ``extra_args``
        (`sglang_server_command`; python: the argument, else ``$SAO_SGLANG_PYTHON``, else this interpreter)
        and attach to it; `close` stops it. Streaming mode and prefix caching are taken from the command.
        Raises RuntimeError or TimeoutError, quoting the server log, if it does not come up."""
        python = python or os.environ.get("SAO_SGLANG_PYTHON") or sys.executable
        port = port or free_port(host)
        argv = sglang_server_command(
            model_dir, python=python, port=port, host=host, dtype=dtype, settings=settings,
            extra_args=extra_args,
        )  # fmt: skip
        kwargs.setdefault("incremental", last_flag(argv, "--incremental-streaming-output") is not None)
        kwargs.setdefault("prefix_caching", last_flag(argv, "--disable-radix-cache") is None)
        return await cls._start_and_attach(
            argv, f"http://{host}:{port}", env=sglang_server_env(env), timeout_s=startup_timeout_s,
            log_path=log_path, config_dir=model_dir, **kwargs,
        )  # fmt: skip

    def _request_body(
        self, prompt_token_ids: Sequence[int], params: SamplingParams, request_id: str
    ) -> dict[str, Any]:
        return generate_request(
            prompt_token_ids, params, request_id=request_id, max_model_len=self.max_model_len,
            extra_key=f"sao-v{self.version}" if self.prefix_caching else None,
        )  # fmt: skip

    def _parse_chunk(self, data: Mapping[str, Any], received: int) -> TokenDelta:
        return parse_generate_chunk(data, received, self.incremental)

    async def generate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> Generation:
        gen = await super().generate(prompt_token_ids, params)
        if params.top_k != -1 or params.top_p < 1:
            gen.metadata["logprobs"] = "before_top_k_top_p"
        return gen

    async def _reload(self, path: Path, version: int) -> None:
        mode = "retract" if self.recompute_kv_on_update else "in_place"
        body = {
            "model_path": str(path),
            "weight_version": str(version),
            "abort_all_requests": False,
            # In place, running requests hold KV that a flush would drop; retracted ones are re-prefilled.
            "flush_cache": mode == "retract",
            "keep_pause": True,
        }
        if not self.pause_modes:
            # Old servers: /pause_generation would abort; their update waits for running requests instead.
            self._mark_paused()
            await self._load(body)
            await self._commit_version(version)
            return
        await self._post("/pause_generation", json={"mode": mode})
        self._mark_paused()
        try:
            await self._load(body)
            await self._commit_version(version)
        finally:
            await self._post("/continue_generation", json={})

    async def _load(self, body: Mapping[str, Any]) -> None:
        result = (await self._post("/update_weights_from_disk", json=dict(body))).json()
        if not result.get("success", False):
            raise RuntimeError(f"SGLang update_weights_from_disk failed: {result.get('message', result)}")

    async def native_update(
        self,
        state: Mapping[str, Tensor],
        version: int,
        send: Callable[[], Awaitable[Any]],
        **kwargs: Any,
    ) -> None:
        """Load ``state`` (engine names, experts unfused, in the served dtype) as ``version`` over the
        server's weight-update group (joined before, `sao.engine.native_sync.init_sglang_native`; pass its
        ``group_name`` in ``kwargs`` if not the default) while ``send()`` broadcasts the same tensors in order
        (`sao.engine.native_sync.broadcast_each`; with ``bucket_bytes``, one flat bucket per request,
        `sao.engine.native_buckets.send_buckets`). Paused and versions committed as in `update_weights`;
        ``kwargs`` go to `push_sglang_native`. Raises `ServerError` or ``send``'s error (the version is then
        unchanged)."""
        mode = "retract" if self.recompute_kv_on_update else "in_place"
        async with self._updating():
            await push_sglang_native(
                self._client, self.base_url, state, send, weight_version=str(version), mode=mode,
                flush_cache=mode == "retract", pause=self.pause_modes, on_paused=self._mark_paused,
                on_loaded=lambda: self._commit_version(version), **kwargs,
            )  # fmt: skip

    async def native_workers(self) -> int | None:
        """How many ranks this server takes in a weight-update group (``tp_size`` of
        ``/get_server_info``: SGLang's workers join at ``rank_offset + tp_rank``), or None if unsaid."""
        response = await self._client.get("/get_server_info", timeout=60.0)
        response.raise_for_status()
        tp_size = response.json().get("tp_size")
        return None if tp_size is None else int(tp_size)

    async def native_init(self, join: Callable[[], Awaitable[Any]], **kwargs: Any) -> Any:
        """Join the server's weight-update group while ``join()`` joins the trainer (rank 0); ``kwargs``
        go to `sao.engine.native_sync.init_sglang_native` (``group_name``, ``backend``)."""
        from sao.engine.native_sync import init_sglang_native

        return await init_sglang_native(self._client, self.base_url, join, **kwargs)

    async def native_close(self, group_name: str) -> None:
        """Destroy the server's weight-update group ``group_name`` (``/destroy_weights_update_group``)."""
        await self._post("/destroy_weights_update_group", json={"group_name": group_name})

    async def score(self, token_ids: Sequence[int]) -> list[float]:
        """Teacher-forced log-probs of ``token_ids[1:]`` (temperature 1) under the served weights: one
        ``/generate`` request with ``logprob_start_len=0`` (`sao.engine.scoring`). Raises ValueError when the
        answer lacks them, `ServerError` when the server refuses."""
        from sao.engine.scoring import parse_sglang_scores, sglang_score_request

        body = sglang_score_request(token_ids)
        answer = (await self._post(self.generate_path, json=body)).json()
        return parse_sglang_scores(answer, body["input_ids"])
