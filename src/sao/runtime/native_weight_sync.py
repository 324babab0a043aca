"""`NativeSync`: ``runtime.weight_sync`` 'vllm' / 'sglang': trainer rank 0 sends new weights straight into
the vLLM / SGLang server replicas over the servers' own weight-transfer group, in flat buckets.

What it owns: the group of trainer rank 0 (group rank 0) and every worker of every server replica (ranks
1…; a server with W workers, e.g. tensor parallel W, takes W consecutive ranks, counted from its
``/get_world_size`` or ``/get_server_info``), formed on the first push and again when a replica was
replaced; and one push per version:

1. every trainer rank takes part in the full-tensor gather (the one every Ray sync path uses,
   ``TrainerRankActor._pushed_state``: cast to the engines' dtype); rank 0 keeps the state, experts
   unfused into checkpoint names, and returns only its names, dtypes and shapes;
2. each replica's adapter runs its native update with those specs (`VLLMEngine.native_update`,
   `SGLangEngine.native_update`: pause keeping requests in place, load, reset the prefix cache where the
   server needs it, commit the version, resume), while rank 0 broadcasts the buckets
   (`sao.engine.native_buckets`) once for all replicas.

What it does not own: the servers (launched and restarted by the replicas), the HTTP bodies
(`sao.engine.native_sync`), the bucket layouts (`sao.engine.native_buckets`).

Failures. A replica that is not alive, a failed init, update or broadcast: the group is left (the servers'
groups shut down or destroyed, best effort), that version goes through the disk path (`DiskSync`, which
also waits for a restarting replica), and the group is formed again at the next push. A transfer that hangs
ends at the group's timeout (``timeout_s``) before the fallback runs. A group that could not be formed
(e.g. a vLLM server started without ``--weight-transfer-config``) is not tried again with the same servers
(each try waits out the timeout): their pushes go by disk until a replica is replaced.

Needs CUDA on both ends (vLLM's transfer engines, SGLang's NCCL group) and, for vLLM, vLLM importable by
the trainer (its ``trainer_init`` is the trainer's end of vLLM's group). The trainer-rank calls go through
Ray's ``__ray_call__`` (`RayTrainerEnd`), so ``TrainerRankActor`` needs no method of its own for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from sao.engine.native_buckets import (
    DEFAULT_BUCKET_BYTES,
    TensorSpec,
    Wire,
    misaligned,
    plan_buckets,
    send_buckets,
    tensor_spec_list,
)

from .weight_sync import DiskSync

__all__ = ["NativeSender", "NativeSync", "NativeTrainerEnd", "RayTrainerEnd", "vllm_trainer_group"]

log = logging.getLogger(__name__)


# ---- trainer rank 0 ----------------------------------------------------------------------------------------


def vllm_trainer_group(host: str, port: int, world_size: int) -> Any:
    """The trainer's end (rank 0) of a vLLM NCCL weight-transfer group: vLLM's ``trainer_init``
    (``nccl_common.trainer_init`` in vLLM 0.33, ``NCCLWeightTransferEngine.trainer_init`` before), a
    ``PyNcclCommunicator`` on the current CUDA device. Blocks until every worker joined. Raises
    RuntimeError when vLLM is not importable here."""
    try:
        from vllm.distributed.weight_transfer.nccl_common import trainer_init
    except ImportError:
        try:
            from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine
        except ImportError as err:
            raise RuntimeError(
                "runtime.weight_sync='vllm' needs vLLM importable by the trainer ranks (its trainer_init "
                "is the trainer's end of the server's NCCL group); install it there or use 'disk'"
            ) from err
        trainer_init = NCCLWeightTransferEngine.trainer_init
    return trainer_init({"master_address": host, "master_port": int(port), "world_size": int(world_size)})


class NativeSender:
    """Trainer rank 0's end of the native transfer: its group and the state of the push in progress.
    ``vllm_group(host, port, world_size)``: makes the trainer's end of a vLLM group (`vllm_trainer_group`;
    anything with ``broadcast(tensor, src)`` and a ``device`` does)."""

    def __init__(self, vllm_group: Callable[[str, int, int], Any] = vllm_trainer_group) -> None:
        self.vllm_group = vllm_group
        self.group: Any = None
        self.wire: Wire | None = None
        self.device = torch.device("cpu")
        self.state: dict[str, torch.Tensor] | None = None

    def join(self, host: str, port: int, world_size: int, *, wire: Wire, group_name: str, backend: str,
             timeout_s: float) -> None:  # fmt: skip
        """Join the servers' group as rank 0 (leaving any previous one); blocks until all joined. SGLang:
        `open_sync_group` with ``backend`` and ``group_name``; vLLM: `vllm_trainer_group`."""
        from sao.engine.weight_broadcast import open_sync_group

        self.close()
        if wire == "vllm":
            self.group = self.vllm_group(host, port, world_size)
        else:
            self.group = open_sync_group(
                host, port, 0, world_size, backend=backend, timeout_s=timeout_s, group_name=group_name
            )
        self.device = torch.device(self.group.device)  # PyNcclCommunicator and SyncGroup both have one
        self.wire = wire

    def hold(self, state: dict[str, torch.Tensor]) -> list[TensorSpec]:
        """Keep ``state`` (trainer names; fused experts are split into checkpoint names, as the servers
        load them) for the next `send`; returns its specs in sending order."""
        from sao.models.moe_names import unfuse_experts

        self.state = unfuse_experts(state)
        return tensor_spec_list(self.state)

    def send(self, bucket_bytes: int) -> int:
        """Broadcast the held state in the wire's buckets (`send_buckets`), then drop it; returns the number
        of broadcasts. Blocking. Raises RuntimeError without a group or a held state."""
        state, self.state = self.state, None
        if self.group is None or self.wire is None or state is None:
            raise RuntimeError("send before join and hold")
        buckets = plan_buckets(tensor_spec_list(state), bucket_bytes, self.wire)
        sent = send_buckets(self.group, list(state.values()), buckets, self.device)
        if self.device.type == "cuda":  # the broadcasts are queued on the stream: done only once it is
            torch.cuda.current_stream(self.device).synchronize()
        return sent

    def close(self) -> None:
        """Leave the group (idempotent)."""
        group, self.group, self.state = self.group, None, None
        if group is not None:
            for name in ("close", "destroy"):  # SyncGroup.close, vLLM's PyNcclCommunicator.destroy
                if hasattr(group, name):
                    with contextlib.suppress(Exception):
                        getattr(group, name)()
                    break


def _sender(actor: Any) -> NativeSender:
    sender = getattr(actor, "_native_sender", None)
    if sender is None:
        sender = actor._native_sender = NativeSender()
    return sender


def _rank_join(actor: Any, *args: Any, **kwargs: Any) -> None:
    _sender(actor).join(*args, **kwargs)


def _rank_prepare(actor: Any) -> list[TensorSpec] | None:
    state = actor._pushed_state()  # every rank takes part in the gather; rank 0 gets the full state
    return None if state is None else _sender(actor).hold(state)


def _rank_send(actor: Any, bucket_bytes: int) -> int:
    return _sender(actor).send(bucket_bytes)


def _rank_leave(actor: Any) -> None:
    _sender(actor).close()


class NativeTrainerEnd(Protocol):
    """The trainer side of `NativeSync` (all calls awaitable from the driver)."""

    async def rendezvous(self) -> tuple[str, int]: ...
    async def join(self, host: str, port: int, world_size: int, *, wire: Wire, group_name: str,
                   backend: str, timeout_s: float) -> None: ...  # fmt: skip
    async def prepare(self) -> list[TensorSpec]: ...
    async def send(self, bucket_bytes: int) -> int: ...
    async def leave(self) -> None: ...


class RayTrainerEnd:
    """`NativeTrainerEnd` over a `sao.runtime.trainer_group.TrainerGroup`: rank 0's node hosts the group
    (``sync_rendezvous``); the calls run in the rank actors (``__ray_call__``), every rank for `prepare`
    (the gather), rank 0 for the rest."""

    def __init__(self, group: Any) -> None:
        self.group = group

    def _call(self, rank: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return rank.__ray_call__.remote(fn, *args, **kwargs)

    async def rendezvous(self) -> tuple[str, int]:
        return await asyncio.to_thread(self.group.sync_rendezvous)

    async def join(self, host: str, port: int, world_size: int, **kwargs: Any) -> None:
        await self._call(self.group.ranks[0], _rank_join, host, port, world_size, **kwargs)

    async def prepare(self) -> list[TensorSpec]:
        specs = await asyncio.gather(*(self._call(rank, _rank_prepare) for rank in self.group.ranks))
        return specs[0]

    async def send(self, bucket_bytes: int) -> int:
        return await self._call(self.group.ranks[0], _rank_send, bucket_bytes)

    async def leave(self) -> None:
        await self._call(self.group.ranks[0], _rank_leave)


# ---- the driver ------------------------------------------------------------------------------------------


def _adapter(engine: Any) -> Any:
    """The HTTP adapter of a replica's engine (a Ray server replica holds it as ``adapter``)."""
    return getattr(engine, "adapter", engine)


def _raise_first_error(results: list[Any]) -> None:
    for result in results:
        if isinstance(result, BaseException):
            raise result


class NativeSync(DiskSync):
    """``runtime.weight_sync`` 'vllm' / 'sglang' (module docstring); the fallback is `DiskSync` under
    ``root``. ``wire``: the servers' kind. ``bucket_bytes``: bucket size (``runtime.weight_bucket_mb``).
    ``backend``: SGLang's group backend (``nccl``; ``gloo`` only for CPU tests). ``timeout_s``: the group's
    timeout. ``default_workers``: workers of a server that does not say. ``trainer``: the trainer end
    (default `RayTrainerEnd` over ``group``)."""

    def __init__(
        self, group: Any, pool: Any, root: Path, *, wire: Wire, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        backend: str = "nccl", timeout_s: float = 600.0, default_workers: int = 1,
        trainer: NativeTrainerEnd | None = None,
    ) -> None:  # fmt: skip
        super().__init__(group, pool, root)
        if wire not in ("vllm", "sglang"):
            raise ValueError(f"wire must be 'vllm' or 'sglang', got {wire!r}")
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
        self.wire, self.bucket_bytes, self.backend = wire, bucket_bytes, backend
        self.timeout_s, self.default_workers = timeout_s, default_workers
        self.trainer: NativeTrainerEnd = trainer if trainer is not None else RayTrainerEnd(group)
        self._members: list[Any] | None = None  # the adapters of the current group
        self._unformable: list[Any] | None = None  # adapters a group could not be formed with
        self._group_name = ""
        self._names = itertools.count()
        self.formed = 0  # times the group was formed
        self.fallbacks = 0  # versions that went by disk instead
        self.last_broadcasts = 0  # broadcasts of the last native push (one per bucket)

    def _current(self) -> list[Any]:
        return [_adapter(replica.engine) for replica in self.pool.replicas]

    async def _form(self, members: list[Any]) -> None:
        """(Re)form the group: rank 0 joins while every server's init call is in flight."""
        await self._leave()
        workers = [(await m.native_workers()) or self.default_workers for m in members]
        world = 1 + sum(workers)
        host, port = await self.trainer.rendezvous()
        name = f"sao_native_{next(self._names)}"
        how = {"wire": self.wire, "group_name": name, "backend": self.backend, "timeout_s": self.timeout_s}
        joining = asyncio.ensure_future(self.trainer.join(host, port, world, **how))
        if self.wire == "vllm":
            extra: dict[str, Any] = {"bucket_bytes": self.bucket_bytes}
        else:
            extra = {"group_name": name, "backend": self.backend}
        offsets = itertools.accumulate([1, *workers[:-1]])
        inits = [
            m.native_init(lambda: asyncio.shield(joining), master_address=host, master_port=port,
                          rank_offset=offset, world_size=world, timeout_s=self.timeout_s, **extra)
            for m, offset in zip(members, offsets, strict=True)
        ]  # fmt: skip
        results = await asyncio.gather(*inits, return_exceptions=True)
        results += await asyncio.gather(joining, return_exceptions=True)
        self._members, self._group_name = members, name  # so that _leave cleans up after a partial init
        if any(isinstance(r, BaseException) for r in results):
            self._unformable = members  # not again with these servers (each try waits out the timeout)
        _raise_first_error(results)
        self.formed += 1

    async def _leave(self) -> None:
        if self._members is None:
            return
        old, self._members = self._members, None
        closes = [m.native_close(self._group_name) for m in old if getattr(m, "alive", True)]
        await asyncio.gather(*closes, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.trainer.leave()

    async def _native_push(self, members: list[Any], version: int) -> None:
        alive = [
            r.alive and getattr(m, "alive", True) for r, m in zip(self.pool.replicas, members, strict=True)
        ]
        if not all(alive):
            raise RuntimeError(f"server replica {alive.index(False)} is not alive")
        if self._unformable == members:
            raise RuntimeError("no weight-transfer group could be formed with these servers")
        if self._members != members:
            await self._form(members)
        specs = await self.trainer.prepare()
        bad = misaligned(specs, plan_buckets(specs, self.bucket_bytes, self.wire))
        if bad:
            raise ValueError(f"{bad[0]!r} sits at a byte offset its server cannot view; push in one dtype")
        meta = {s.name: torch.empty(s.shape, dtype=getattr(torch, s.dtype), device="meta") for s in specs}
        sending = asyncio.ensure_future(self.trainer.send(self.bucket_bytes))
        extra = {"bucket_bytes": self.bucket_bytes}
        if self.wire == "sglang":
            extra["group_name"] = self._group_name
        updates = [m.native_update(meta, version, lambda: asyncio.shield(sending), **extra) for m in members]
        results = await asyncio.gather(*updates, return_exceptions=True)
        sent = await asyncio.gather(sending, return_exceptions=True)
        _raise_first_error(results + sent)
        self.last_broadcasts = sent[0]

    async def push(self, version: int) -> None:
        members = self._current()
        try:
            await self._native_push(members, version)
        except asyncio.CancelledError:  # e.g. a push deadline: the group may be mid-transfer, form it anew
            self._members = None
            raise
        except Exception as err:  # this version from disk (a restarting replica gets it too)
            log.warning("native weight transfer (%s) of version %d failed (%s: %s); it goes by disk",
                        self.wire, version, type(err).__name__, err)  # fmt: skip
            self.fallbacks += 1
            await self._leave()
            await super().push(version)
