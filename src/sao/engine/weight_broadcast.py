"""Weight pushes from trainer rank 0 to engine processes over a standalone process group.

`open_sync_group` builds a process group of its own from a `torch.distributed.TCPStore` that rank 0 (the
trainer) hosts: it never reads or creates the default process group, so a trainer rank that already belongs
to an FSDP world and engine processes that belong to none can both join it. Ranks 1..N are the receivers.
Backends: gloo (CPU tensors) or NCCL (CUDA tensors, one device per rank). The store keys are laid out as
torch's own group helper lays them out for a group named ``group_name`` over a store already prefixed with
``group_name`` (what SGLang's ``/init_weights_update_group`` builds on its side), so with NCCL and SGLang's
group name the trainer end of an SGLang weight-update group is an `open_sync_group` too
(`sao.engine.native_sync`).

`WeightSender.send` / `WeightReceiver.receive` move a whole state dict, bit for bit, in a fixed number of
collectives: a length (one int64), the metadata (UTF-8 JSON: version, bucket size, and per tensor its name,
dtype and shape, in sending order), then the tensors' bytes, concatenated in that order and cut into
buckets of ``bucket_bytes`` (the last one shorter), each broadcast as one flat uint8 buffer. A tensor may
span several buckets, so a bucket smaller than the largest tensor is fine. `copy_plan` is the layout both
sides derive from the metadata. Memory: one bucket buffer per side beyond the tensors themselves (the
receiver allocates its output tensors up front); the sender also makes one temporary copy of the tensor it
is packing when that tensor needs a cast or is not contiguous.

A push is a collective: every rank must call `send` / `receive` the same number of times, in order. A rank
that dies mid-push leaves the others blocked until ``timeout_s``; the group is then unusable (open a new one).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed import PrefixStore, ProcessGroup, TCPStore

from sao.models.moe_names import unfuse_experts

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "Segment",
    "SyncGroup",
    "WeightReceiver",
    "WeightSender",
    "copy_plan",
    "open_sync_group",
]

DEFAULT_BUCKET_BYTES = 256 << 20
_PROTOCOL = "sao-weights-v1"


class SyncGroup:
    """A standalone process group of ``world_size`` ranks; this process is ``rank``. Tensors it broadcasts
    must live on ``device`` (CPU for gloo, this rank's CUDA device for NCCL). Build with `open_sync_group`."""

    def __init__(self, pg: ProcessGroup, store: TCPStore, rank: int, world_size: int, device: torch.device):
        self.pg = pg
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self._store = store  # rank 0 serves the store: it must live as long as the group

    def broadcast(self, tensor: Tensor, src: int = 0) -> None:
        """Overwrite ``tensor`` (contiguous, on ``device``) on every rank with rank ``src``'s, in place.
        Returns when this rank's part is done (NCCL: once ordered before later work on the current stream)."""
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        opts.rootTensor = 0
        self.pg.broadcast([tensor], opts).wait()

    def close(self) -> None:
        """Leave the group (idempotent). Receivers should close before rank 0, which serves the store."""
        if self.pg is not None:
            self.pg.shutdown()
            self.pg = None  # type: ignore[assignment]
            self._store = None  # type: ignore[assignment]


def open_sync_group(
    host: str,
    port: int,
    rank: int,
    world_size: int,
    *,
    backend: str = "gloo",
    timeout_s: float = 300.0,
    group_name: str = "sao_weight_sync",
    device: torch.device | str | None = None,
) -> SyncGroup:
    """Join the group served at ``host:port`` as ``rank`` of ``world_size``; rank 0 serves it.

    Blocks until all ``world_size`` ranks have joined the store (so each rank's call must run concurrently
    with the others', e.g. in a thread while the engines' init requests are in flight), at most
    ``timeout_s``, which also bounds every later collective. ``backend``: ``"gloo"`` or ``"nccl"``;
    ``device`` defaults to the CPU (gloo) or the current CUDA device (NCCL). Raises ValueError for a bad
    rank, backend or device, RuntimeError if NCCL is not available, and the store's error on timeout.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, {world_size})")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl" and not dist.is_nccl_available():
        raise RuntimeError("this torch build has no NCCL")
    if backend == "gloo":
        resolved = torch.device(device or "cpu")
        if resolved.type != "cpu":
            raise ValueError(f"gloo moves CPU tensors here, not {resolved}: use backend='nccl'")
    else:
        resolved = (
            torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        )
    timeout = timedelta(seconds=timeout_s)
    store = TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout)
    group_store = PrefixStore(f"{group_name}/", PrefixStore(group_name, store))
    pg = ProcessGroup(group_store, rank, world_size)
    if backend == "gloo":
        from torch.distributed.distributed_c10d import ProcessGroupGloo

        impl = ProcessGroupGloo(PrefixStore("cpu/", group_store), rank, world_size, timeout=timeout)
        kind = ProcessGroup.BackendType.GLOO
        pg._register_backend(torch.device("cpu"), kind, impl)
    else:
        from torch.distributed.distributed_c10d import ProcessGroupNCCL

        options = ProcessGroupNCCL.Options()
        options._timeout = timeout
        options.is_high_priority_stream = False
        impl = ProcessGroupNCCL(PrefixStore("cuda/", group_store), rank, world_size, options)
        kind = ProcessGroup.BackendType.NCCL
        pg._register_backend(torch.device("cuda"), kind, impl)
    pg._set_default_backend(kind)
    return SyncGroup(pg, store, rank, world_size, resolved)


@dataclass(frozen=True)
class Segment:
    """``nbytes`` bytes of tensor ``tensor`` from byte ``tensor_offset`` on, at byte ``bucket_offset`` of
    their bucket."""

    tensor: int
    tensor_offset: int
    bucket_offset: int
    nbytes: int


def copy_plan(nbytes: Sequence[int], bucket_bytes: int) -> list[list[Segment]]:
    """The buckets (each a list of segments, in order) that carry tensors of ``nbytes`` bytes each,
    concatenated in order and cut every ``bucket_bytes`` bytes. Every bucket is full but the last; no
    bucket is empty. Raises ValueError for ``bucket_bytes < 1``."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    buckets: list[list[Segment]] = []
    current: list[Segment] = []
    filled = 0
    for index, size in enumerate(nbytes):
        offset = 0
        while offset < size:
            n = min(size - offset, bucket_bytes - filled)
            current.append(Segment(index, offset, filled, n))
            offset += n
            filled += n
            if filled == bucket_bytes:
                buckets.append(current)
                current, filled = [], 0
    if current:
        buckets.append(current)
    return buckets


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _parse_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in a weight push")
    return dtype


def _flat_bytes(tensor: Tensor) -> Tensor:
    """A contiguous tensor's storage as a 1-D uint8 view (0-d tensors included)."""
    return tensor.reshape(-1).view(torch.uint8)


def _bucket_sizes(plan: list[list[Segment]]) -> list[int]:
    return [sum(s.nbytes for s in bucket) for bucket in plan]


class WeightSender:
    """Rank 0's end of a weight push (see the module docstring).

    ``dtype``: cast floating-point tensors to it before sending (others keep theirs). ``unfuse``: send MoE
    experts one tensor per expert, in checkpoint names (`sao.models.moe_names.unfuse_experts`, the renaming
    of `sao.engine.weights.to_engine_state_dict`), as vLLM and SGLang load them; without it names pass
    through, as a `LocalEngine` accepts them. Unlike `to_engine_state_dict` nothing is copied up front:
    each tensor is cast while it is packed.
    """

    def __init__(
        self,
        group: SyncGroup,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        *,
        dtype: torch.dtype | None = None,
        unfuse: bool = False,
    ) -> None:
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
        self.group = group
        self.bucket_bytes = bucket_bytes
        self.dtype = dtype
        self.unfuse = unfuse

    def _wire_dtype(self, tensor: Tensor) -> torch.dtype:
        return self.dtype if self.dtype is not None and tensor.is_floating_point() else tensor.dtype

    def send(self, state: Mapping[str, Tensor], version: int) -> None:
        """Broadcast ``state`` (any devices, layouts and dtypes; not modified) as ``version``. Raises
        ValueError on a non-tensor value or a malformed fused expert tensor, before anything is sent."""
        for name, value in state.items():
            if not isinstance(value, Tensor):
                raise ValueError(f"state dict entry {name!r} is a {type(value).__name__}, not a tensor")
        named = list((unfuse_experts(state) if self.unfuse else dict(state)).items())
        dtypes = [self._wire_dtype(t) for _, t in named]
        nbytes = [t.numel() * d.itemsize for (_, t), d in zip(named, dtypes, strict=True)]
        meta = {
            "protocol": _PROTOCOL,
            "version": int(version),
            "bucket_bytes": self.bucket_bytes,
            "tensors": [[n, _dtype_name(d), list(t.shape)] for (n, t), d in zip(named, dtypes, strict=True)],
        }
        device = self.group.device
        payload = torch.frombuffer(bytearray(json.dumps(meta).encode()), dtype=torch.uint8)
        self.group.broadcast(torch.tensor([payload.numel()], dtype=torch.int64, device=device))
        self.group.broadcast(payload.to(device))
        plan = copy_plan(nbytes, self.bucket_bytes)
        if not plan:
            return
        bucket = torch.empty(max(_bucket_sizes(plan)), dtype=torch.uint8, device=device)
        packing: tuple[int, Tensor] | None = None  # the tensor being packed, as bytes
        for segments in plan:
            for s in segments:
                if packing is None or packing[0] != s.tensor:
                    tensor = named[s.tensor][1].detach().to(dtype=dtypes[s.tensor]).contiguous()
                    packing = (s.tensor, _flat_bytes(tensor))
                source = packing[1][s.tensor_offset : s.tensor_offset + s.nbytes]
                bucket[s.bucket_offset : s.bucket_offset + s.nbytes].copy_(source)
            self.group.broadcast(bucket[: segments[-1].bucket_offset + segments[-1].nbytes])


class WeightReceiver:
    """A receiving rank's end of a weight push (see the module docstring). ``version``: that of the last
    push received (None before the first)."""

    def __init__(self, group: SyncGroup) -> None:
        self.group = group
        self.version: int | None = None

    def receive(self) -> dict[str, Tensor]:
        """Block until rank 0 sends, and return its state dict, in its order, bit-for-bit equal to what it
        sent (after its cast and renaming), each tensor new, contiguous and on the group's device. Raises
        ValueError if the metadata is not from a `WeightSender`."""
        device = self.group.device
        length = torch.zeros(1, dtype=torch.int64, device=device)
        self.group.broadcast(length)
        payload = torch.empty(int(length.item()), dtype=torch.uint8, device=device)
        self.group.broadcast(payload)
        meta = json.loads(bytes(payload.cpu().numpy()).decode())
        if not isinstance(meta, dict) or meta.get("protocol") != _PROTOCOL:
            raise ValueError("the weight push metadata is not from a sao WeightSender")
        out: dict[str, Tensor] = {}
        for name, dtype, shape in meta["tensors"]:
            out[name] = torch.empty(shape, dtype=_parse_dtype(dtype), device=device)
        views = [_flat_bytes(t) for t in out.values()]
        plan = copy_plan([v.numel() for v in views], int(meta["bucket_bytes"]))
        if plan:
            bucket = torch.empty(max(_bucket_sizes(plan)), dtype=torch.uint8, device=device)
            for segments, size in zip(plan, _bucket_sizes(plan), strict=True):
                self.group.broadcast(bucket[:size])
                for s in segments:
                    target = views[s.tensor][s.tensor_offset : s.tensor_offset + s.nbytes]
                    target.copy_(bucket[s.bucket_offset : s.bucket_offset + s.nbytes])
        self.version = int(meta["version"])
        return out
