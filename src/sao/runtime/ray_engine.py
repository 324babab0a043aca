"""One engine replica of the distributed runtime: a Ray actor holding a `LocalEngine`, and its proxy.

`EngineReplica` (the actor class, ``ray.remote`` applied by `replica_class`) loads the policy from a
checkpoint directory and serves `generate` / `update_weights` / `stats` from its own event loop (an async
actor: many requests in flight). Weights reach it from the trainer, never through the driver: as an object
reference Ray resolves in the replica (``object_store``), over the broadcast group it joins
(``broadcast``, `join_sync_group` + `receive_broadcast`), or as a directory (``disk``).

`RemoteEngine` is the driver's `InferenceEngine` for one replica: each call is a remote call; when the
actor has died its requests fail with `EngineCrashedError` and ``alive`` turns False, so a
`SupervisedEngine` around it starts a new replica (episodes in flight on the dead one are dropped as
``engine_crash``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sao.engine.types import EngineCrashedError, Generation, SamplingParams

__all__ = [
    "EngineReplica",
    "RemoteEngine",
    "apply_logging",
    "logging_settings",
    "replica_class",
    "state_checksum",
]


def logging_settings() -> dict[str, Any]:
    """The driver's transformers verbosity and progress-bar switch, for its actors to copy (a CLI that
    silenced load reports and progress bars gets silent actors too)."""
    from transformers.utils import logging as hf_logging

    return {"verbosity": hf_logging.get_verbosity(), "progress_bar": hf_logging.is_progress_bar_enabled()}


def apply_logging(settings: dict[str, Any] | None) -> None:
    """In an actor: the driver's `logging_settings`; FSDP2's notice that a wrapped module returned a view
    (sao never modifies those outputs in place) is silenced."""
    import warnings

    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    if settings is None:
        return
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity(settings["verbosity"])
    if not settings["progress_bar"]:
        hf_logging.disable_progress_bar()


def state_checksum(state: dict[str, Any]) -> dict[str, float]:
    """``{name: float64 sum of the tensor}`` of a state dict (a cheap equality check across processes)."""
    return {name: float(t.detach().double().sum()) for name, t in sorted(state.items())}


class EngineReplica:
    """The actor body (see the module docstring); ``threads`` torch threads, ``seed`` the engine seed."""

    def __init__(self, model_dir: str, tokenizer_dir: str, *, device: str, dtype: str, max_running: int,
                 seed: int, threads: int, logging: dict[str, Any] | None = None,
                 prefix_cache_tokens: int | None = None) -> None:  # fmt: skip
        import torch

        apply_logging(logging)
        from sao.engine import LocalEngine
        from sao.models.loading import load_tokenizer

        torch.set_num_threads(threads)
        self.engine = LocalEngine(Path(model_dir), load_tokenizer(Path(tokenizer_dir)), device=device,
                                  dtype=dtype, max_running=max_running, seed=seed,
                                  prefix_cache_tokens=prefix_cache_tokens)  # fmt: skip
        self.engine.start()
        self._sync: Any = None

    async def ready(self) -> dict[str, Any]:
        import os

        engine = self.engine
        return {"pid": os.getpid(), "context_limit": engine.context_limit, "version": engine.version}

    async def generate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> Generation:
        return await self.engine.generate(prompt_token_ids, params)

    async def update_weights(self, weights: Any, version: int) -> None:
        await self.engine.update_weights(weights, version)

    def stats(self) -> dict[str, float]:
        return self.engine.stats()

    async def score(self, token_ids: list[int]) -> list[float]:
        """`LocalEngine.score`: teacher-forced log-probs under the weights this replica holds now."""
        return await self.engine.score(token_ids)

    def checksum(self) -> dict[str, float]:
        """`state_checksum` of the weights the engine decodes with now."""
        return state_checksum(self.engine.model.state_dict())

    async def join_sync_group(
        self, host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float
    ) -> None:
        """Join the broadcast group of trainer rank 0 (group rank 0) and the replicas (ranks 1…)."""
        from sao.engine.weight_broadcast import open_sync_group

        join = functools.partial(open_sync_group, backend=backend, timeout_s=timeout_s)
        self._sync = await asyncio.to_thread(join, host, port, rank, world_size)

    async def receive_broadcast(self) -> int:
        """Receive one weight broadcast and load it; returns its version."""
        from sao.engine.weight_broadcast import WeightReceiver

        if self._sync is None:
            raise RuntimeError("receive_broadcast before join_sync_group")
        receiver = WeightReceiver(self._sync)
        state = await asyncio.to_thread(receiver.receive)
        await self.engine.update_weights(state, receiver.version)
        return receiver.version

    def leave_sync_group(self) -> None:
        if self._sync is not None:
            self._sync.close()
        self._sync = None

    async def close(self) -> None:
        await self.engine.close()


def replica_class() -> Any:
    """`EngineReplica` as a Ray actor class (Ray is imported only when a distributed run starts)."""
    import ray

    return ray.remote(EngineReplica)


class RemoteEngine:
    """The driver-side `InferenceEngine` of one `EngineReplica` actor (module docstring)."""

    def __init__(self, actor: Any, index: int, info: dict[str, Any]) -> None:
        self.actor, self.index = actor, index
        self.context_limit = int(info["context_limit"])
        self.alive = True
        self._version = int(info.get("version", 0))
        self._stats: dict[str, float] = {}
        self._stats_ref: Any = None

    @property
    def version(self) -> int:
        return self._version

    async def generate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> Generation:
        return await self._call(self.actor.generate.remote(list(prompt_token_ids), params))

    async def update_weights(self, weights: Any, version: int) -> None:
        await self._call(self.actor.update_weights.remote(weights, version))
        self._version = version

    async def score(self, token_ids: Sequence[int]) -> list[float]:
        """The replica's `EngineReplica.score` (`sao.engine.scoring`)."""
        return await self._call(self.actor.score.remote(list(token_ids)))

    def set_version(self, version: int) -> None:
        """Record that the replica now decodes with ``version`` (after a broadcast it received)."""
        self._version = version

    def stats(self) -> dict[str, float]:
        """The replica's last reported stats (refreshed in the background; never blocks)."""
        import ray

        if self._stats_ref is not None:
            ready, _ = ray.wait([self._stats_ref], timeout=0)
            if ready:
                with contextlib.suppress(Exception):  # a dead replica keeps its last figures
                    self._stats = ray.get(self._stats_ref)
                self._stats_ref = None
        if self._stats_ref is None and self.alive:
            self._stats_ref = self.actor.stats.remote()
        return dict(self._stats)

    async def close(self) -> None:
        import ray

        if self.alive:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.actor.close.remote(), timeout=30)
        with contextlib.suppress(Exception):
            ray.kill(self.actor, no_restart=True)
        self.alive = False

    async def _call(self, ref: Any) -> Any:
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        try:
            return await ref
        except (RayActorError, ActorDiedError, ActorUnavailableError) as err:
            self.alive = False
            raise EngineCrashedError(f"engine replica {self.index} died: {err}") from err
