"""Engine replicas that serve with vLLM or SGLang: a Ray actor launches and supervises the server on its
own resources (its GPUs: Ray sets ``CUDA_VISIBLE_DEVICES`` for it, the server inherits it); the driver
talks to the server over HTTP with the existing adapters (`VLLMEngine`, `SGLangEngine`).

`ServerReplica` (the actor body) starts the server as a child in its own session that gets SIGTERM if the
actor dies (``die_with_parent``), so a killed replica leaves no server behind. `ServerReplicaEngine` is the
driver's `InferenceEngine` for one replica: the HTTP adapter for requests and weight updates (a directory
the server reloads: ``runtime.weight_sync=disk``), dead when the actor or the server is; `close` stops the
server and the actor.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sao.engine.server_settings import ServerSettings
from sao.engine.types import Generation, SamplingParams

__all__ = ["ServerReplica", "ServerReplicaEngine", "launch_server_replica"]


class ServerReplica:
    """The actor body: one vLLM or SGLang server on this actor's resources (a sync actor: the server is
    started from its main thread, which lives as long as the actor)."""

    def __init__(self) -> None:
        self.server: Any = None

    def start(self, backend: str, model_dir: str, *, python: str | None, dtype: str, max_running: int,
              settings: ServerSettings, extra_args: Sequence[str], timeout_s: float) -> str:  # fmt: skip
        """Launch the server with ``settings`` (`sao.runtime.engines.server_settings`); returns its base URL
        (this node's address, a free port)."""
        import ray

        from sao.engine.server_process import ServerProcess, free_port

        from .engines import server_extra_args

        host = ray.util.get_node_ip_address()
        port = free_port(host)
        extra = server_extra_args(backend, extra_args, max_running)
        if backend == "vllm":
            from sao.engine.vllm import vllm_server_command, vllm_server_env

            python = python or os.environ.get("SAO_VLLM_PYTHON")
            argv = vllm_server_command(model_dir, python=python or "python", port=port, host=host,
                                       dtype=dtype, settings=settings, extra_args=extra)  # fmt: skip
            env = vllm_server_env()
        else:
            from sao.engine.sglang import sglang_server_command, sglang_server_env

            python = python or os.environ.get("SAO_SGLANG_PYTHON")
            argv = sglang_server_command(model_dir, python=python or "python", port=port, host=host,
                                         dtype=dtype, settings=settings, extra_args=extra)  # fmt: skip
            env = sglang_server_env()
        self.server = ServerProcess.start(argv, f"http://{host}:{port}", env=env, timeout_s=timeout_s,
                                          die_with_parent=True)  # fmt: skip
        return self.server.base_url

    def running(self) -> bool:
        return self.server is not None and self.server.running

    def log_tail(self) -> str:
        return "" if self.server is None else self.server.log_tail()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


async def launch_server_replica(
    cluster: Any, index: int, backend: str, model_dir: Path, *, python: str | None, dtype: str,
    max_running: int, settings: ServerSettings, episode_budget: int, extra_args: Sequence[str],
    timeout_s: float,
) -> ServerReplicaEngine:  # fmt: skip
    """Start replica ``index``'s actor in its bundle, launch its server with ``settings``, attach the HTTP
    adapter (salting requests when the server caches prefixes) and refuse a server whose context limit is
    below ``episode_budget`` (`sao.runtime.engines.check_context_limit`)."""
    import ray

    from sao.engine import SGLangEngine, VLLMEngine

    from .engines import check_context_limit

    actor = cluster.track(ray.remote(ServerReplica).options(**cluster.engine_options(index)).remote())
    try:
        url = await actor.start.remote(backend, str(model_dir), python=python, dtype=dtype,
                                       max_running=max_running, settings=settings,
                                       extra_args=list(extra_args), timeout_s=timeout_s)  # fmt: skip
        if backend == "vllm":
            adapter = await VLLMEngine.attach(url, prefix_caching=settings.prefix_caching)
        else:  # launched with --incremental-streaming-output (sglang_server_command)
            adapter = await SGLangEngine.attach(url, prefix_caching=settings.prefix_caching, incremental=True)
        await check_context_limit(adapter, episode_budget, backend)
    except BaseException:
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
        raise
    return ServerReplicaEngine(actor, index, adapter)


class ServerReplicaEngine:
    """The driver's `InferenceEngine` for one `ServerReplica` (module docstring)."""

    def __init__(self, actor: Any, index: int, adapter: Any) -> None:
        self.actor, self.index, self.adapter = actor, index, adapter
        self._actor_dead = False

    @property
    def version(self) -> int:
        return self.adapter.version

    @property
    def context_limit(self) -> int | None:
        return getattr(self.adapter, "max_model_len", None)

    @property
    def alive(self) -> bool:
        return not self._actor_dead and self.adapter.alive

    async def generate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> Generation:
        gen = await self.adapter.generate(prompt_token_ids, params)
        if gen.finish_reason == "error":
            await self._check_actor()
        return gen

    async def update_weights(self, weights: Any, version: int) -> None:
        await self.adapter.update_weights(weights, version)

    def stats(self) -> dict[str, float]:
        return self.adapter.stats()

    async def score(self, token_ids: Sequence[int]) -> list[float]:
        """The server's teacher-forced log-probs (`VLLMEngine.score` / `SGLangEngine.score`)."""
        return await self.adapter.score(token_ids)

    async def _check_actor(self) -> None:
        try:
            await self.actor.running.remote()
        except Exception:  # the actor is gone, and with it its server
            self._actor_dead = True

    async def close(self) -> None:
        import ray

        with contextlib.suppress(Exception):
            await self.adapter.close()
        with contextlib.suppress(Exception):
            await self.actor.stop.remote()
        with contextlib.suppress(Exception):
            ray.kill(self.actor, no_restart=True)
