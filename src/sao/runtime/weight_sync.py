"""`WeightSync.push(version)`: the trainer's new weights to every engine, one protocol for every path.

``runtime.weight_sync`` picks the path (``auto``: ``inproc`` for the local runtime; for Ray ``broadcast``
with LocalEngine replicas, ``vllm`` / ``sglang`` with server replicas when engines and trainer have GPUs,
else ``disk``):

- ``inproc`` (`InprocSync`): the local runtime's actor state dict handed to the engine in process, cast to
  the engine's dtype on the way (`push_dtype`): a float32-master trainer feeds a bfloat16 engine half the
  bytes, and the engine never holds a reference to the trainer's live weights.
- ``object_store`` (`ObjectStoreSync`): trainer rank 0 puts the full state into Ray's object store; each
  replica resolves the reference itself (the tensors never pass through the driver). Small models, CPU.
- ``broadcast`` (`BroadcastSync`): a standalone process group of trainer rank 0 (rank 0) and the
  replicas (ranks 1…N), formed on the first push and again after a replica was restarted; every FSDP rank
  takes part in the ``full_tensor`` gather, rank 0 sends bucketed tensors (gloo on CPU, NCCL on GPU).
- ``vllm`` / ``sglang`` (`sao.runtime.native_weight_sync.NativeSync`): trainer rank 0 into the servers'
  own NCCL weight-transfer group, in flat buckets (``runtime.weight_bucket_mb``); falls back to disk.
- ``disk`` (`DiskSync`): rank 0 writes a safetensors directory under ``run_dir/weights/``, the replicas
  reload from it (any shared filesystem; the last two versions are kept).

Every path updates the engines between decode steps (in-flight requests continue with the new weights; one
trajectory spans versions). `latest` gives a restarted replica the current weights the same way as
``object_store`` (a reference to rank 0's full state), whatever the path.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "BroadcastSync",
    "DiskSync",
    "InprocSync",
    "ObjectStoreSync",
    "WeightSync",
    "push_dtype",
]

log = logging.getLogger(__name__)


class WeightSync(Protocol):
    async def push(self, version: int) -> None:
        """Every engine decodes with the trainer's current weights as ``version`` once this returns."""
        ...


def push_dtype(backend: str, dtype: str, device: str) -> Any:
    """The ``torch.dtype`` weights are pushed in to an engine of ``engine.backend`` / ``engine.dtype`` on
    ``device``, or None (push the trainer's dtype; the engine casts on load). ``local``/``process`` engines
    load with `sao.models.loading.resolve_dtype` (``auto``: bfloat16 on CUDA, float32 elsewhere), so their
    dtype is known here; a server's ``auto`` is its own choice (the checkpoint's dtype), so it is not
    guessed. Raises ValueError for an unknown dtype."""
    from sao.models.loading import resolve_device, resolve_dtype

    if dtype == "auto" and backend not in ("local", "process"):
        return None
    return resolve_dtype(dtype, resolve_device(device) if dtype == "auto" else "cpu")


class InprocSync:
    """The local runtime: the actor's state dict to the engine, in process, cast to ``dtype`` (the engine's,
    `push_dtype`; None: as the trainer holds it). The trainer's weights are never changed."""

    def __init__(self, engine: Any, actor: Any, dtype: Any = None) -> None:
        self.engine, self.actor, self.dtype = engine, actor, dtype

    async def push(self, version: int) -> None:
        from sao.engine.weights import cast_state_dict

        await self.engine.update_weights(cast_state_dict(self.actor.state_dict(), self.dtype), version)


class ObjectStoreSync:
    """Rank 0's full state through Ray's object store to every replica of ``pool``."""

    def __init__(self, group: Any, pool: Any) -> None:
        self.group, self.pool = group, pool

    async def latest(self) -> Any:
        """A reference to the full current weights (every trainer rank takes part in the gather)."""
        return self.group.full_state_ref()

    async def push(self, version: int) -> None:
        ref = await self.latest()
        await self.pool.update_weights(ref, version)


class DiskSync(ObjectStoreSync):
    """Rank 0 writes ``root/v{version:08d}`` (safetensors, engine names); the replicas reload from it."""

    def __init__(self, group: Any, pool: Any, root: Path, keep: int = 2) -> None:
        super().__init__(group, pool)
        self.root, self.keep = Path(root), keep

    async def push(self, version: int) -> None:
        directory = self.root / f"v{version:08d}"
        if directory.exists():  # a version written before a restart of the run
            shutil.rmtree(directory)
        path = await asyncio.to_thread(self.group.write_weights, directory)
        await self.pool.update_weights(Path(path), version)
        for old in sorted(self.root.glob("v*"))[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)


class BroadcastSync(ObjectStoreSync):
    """A process group of trainer rank 0 and the replicas; see the module docstring.

    Before each push every member is pinged (``ready``, ``ping_timeout_s``): a collective with a dead
    member would block the others until the group's ``timeout_s``. When one is dead, that version goes
    through the object store (which restarts the dead replica with it, `SupervisedEngine`), and the group
    is formed again, with the fresh replica, at the next push. A member dying between the ping and the
    end of the broadcast leaves the others blocked for at most ``timeout_s``, then the same fallback runs;
    so does a broadcast (send and every replica's load) that takes longer than ``timeout_s``.
    """

    def __init__(self, group: Any, pool: Any, backend: str = "gloo", *, timeout_s: float = 120.0,
                 ping_timeout_s: float = 10.0, bucket_bytes: int | None = None) -> None:  # fmt: skip
        super().__init__(group, pool)
        self.bucket_bytes = bucket_bytes  # None: WeightSender's default
        self.backend, self.timeout_s, self.ping_timeout_s = backend, timeout_s, ping_timeout_s
        self._members: list[Any] | None = None  # the replica actors of the current weight group
        self.formed = 0  # how many times the weight group was formed
        self.fallbacks = 0  # versions that went by the object store instead

    def _current(self) -> list[Any]:
        return [replica.engine.actor for replica in self.pool.replicas]

    async def _all_alive(self, members: list[Any]) -> bool:
        try:
            await asyncio.wait_for(asyncio.gather(*(m.ready.remote() for m in members)), self.ping_timeout_s)
        except Exception:
            return False
        return True

    async def _form(self, members: list[Any]) -> None:
        """(Re)form the weight group with ``members`` (the old group's members leave it first)."""
        await self._leave()
        world = len(members) + 1
        host, port = await asyncio.to_thread(self.group.sync_rendezvous)
        how = (world, self.backend, self.timeout_s)
        await asyncio.gather(
            asyncio.to_thread(self.group.join_sync_group, host, port, *how),
            *(m.join_sync_group.remote(host, port, i, *how) for i, m in enumerate(members, 1)),
        )
        self._members = members
        self.formed += 1

    async def _leave(self) -> None:
        if self._members is None:
            return
        old, self._members = self._members, None
        await asyncio.gather(*(m.leave_sync_group.remote() for m in old), return_exceptions=True)
        await self.group.leave_sync_group_async()

    async def push(self, version: int) -> None:
        members = self._current()
        try:
            if not await self._all_alive(members):
                raise RuntimeError("an engine replica does not answer")
            if self._members != members:
                await self._form(members)
            # Bounded like the group's collectives: a replica whose load hangs after the broadcast does not
            # hold the push forever; this version then goes by the object store like any failure.
            await asyncio.wait_for(
                asyncio.gather(
                    asyncio.to_thread(self.group.broadcast, version, self.bucket_bytes),
                    *(m.receive_broadcast.remote() for m in members),
                ),
                self.timeout_s,
            )
        except Exception as err:  # this version by the object store (restarting a dead replica with it)
            log.warning("weight broadcast of version %d failed (%s); this version goes by the object store",
                        version, err)  # fmt: skip
            self.fallbacks += 1
            await self._leave()
            await super().push(version)
            return
        for replica in self.pool.replicas:
            replica.engine.set_version(version)
