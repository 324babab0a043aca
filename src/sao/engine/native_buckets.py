"""Bucketed weight transfer to vLLM / SGLang servers: which tensors share a bucket, and its bytes.

A bucket is a run of consecutive tensors (in the order of the update request's ``names``) whose bytes,
each tensor contiguous and in its own dtype, are concatenated into one flat ``uint8`` buffer and sent with
one broadcast from rank 0. The receiving server derives the same buckets from the request's names, dtypes
and shapes, allocates the buffer, receives it and cuts it back into tensors (byte offsets = running sums of
``numel * itemsize``). Which tensors share a bucket is each server's rule, so the trainer must follow it
exactly (`plan_buckets`):

- vLLM, ``/update_weights`` with ``update_info.packed`` true and ``packed_buffer_size_bytes`` B
  (``vllm/distributed/weight_transfer/packed_tensor.py``, ``packed_nccl_broadcast_consumer``): tensors
  are added to a chunk until its size *exceeds* B, the tensor that crossed B included; the rest forms the
  last chunk. A chunk is at most B plus its last tensor; a tensor is never split. One request per push.
- SGLang, ``/update_weights_from_distributed`` with ``load_format="flattened_bucket"``
  (``ModelRunner._update_bucketed_weights_from_distributed``, ``FlattenedTensorBucket`` of
  ``python/sglang/srt/weight_sync/tensor_bucket.py``): *one* broadcast per request, of every tensor the
  request names, byte-concatenated. The trainer chooses the buckets (`fitted_buckets`: at most B bytes,
  or one tensor larger than B alone) and sends one request per bucket.

Alignment. Both servers cut their buffer with ``slice.view(dtype)``, which torch refuses unless the
tensor's byte offset in the buffer is a multiple of its item size. Pushed in one dtype (the engines',
`sao.runtime.weight_sync.push_dtype`) every offset is; otherwise `fitted_buckets` starts a new bucket
before a tensor that would be misaligned, and `misaligned` names the tensors of a vLLM chunk plan that are
(the trainer cannot move them: that plan is vLLM's).

Memory: one bucket buffer on the sending device (reused), plus the cast/contiguous copy of the tensor
being packed when it needs one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "TensorSpec",
    "Wire",
    "fitted_buckets",
    "misaligned",
    "pack_bucket",
    "plan_buckets",
    "send_buckets",
    "tensor_spec_list",
    "unpack_bucket",
    "vllm_packed_chunks",
]

DEFAULT_BUCKET_BYTES = 512 << 20
Wire = Literal["vllm", "sglang"]


@dataclass(frozen=True)
class TensorSpec:
    """What a server is told about one tensor: its name, dtype name (``getattr(torch, dtype)``, e.g.
    ``"bfloat16"``) and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        numel = 1
        for size in self.shape:
            numel *= size
        return numel * _torch_dtype(self.dtype).itemsize

    def as_json(self) -> list[object]:
        return [self.name, self.dtype, list(self.shape)]


def _torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def tensor_spec_list(state: Mapping[str, Tensor]) -> list[TensorSpec]:
    """The `TensorSpec` of every tensor of ``state``, in its iteration order (only dtypes and shapes are
    read, so meta tensors do)."""
    return [TensorSpec(n, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for n, t in state.items()]


def vllm_packed_chunks(nbytes: Sequence[int], buffer_bytes: int) -> list[range]:
    """vLLM's packed chunks of tensors of ``nbytes`` bytes each: consecutive index ranges, each closed once
    its total exceeds ``buffer_bytes`` (the crossing tensor included), the remainder last. Raises
    ValueError for ``buffer_bytes < 1``."""
    if buffer_bytes < 1:
        raise ValueError(f"bucket size must be >= 1 byte, got {buffer_bytes}")
    chunks: list[range] = []
    start, total = 0, 0
    for index, size in enumerate(nbytes):
        total += size
        if total > buffer_bytes:
            chunks.append(range(start, index + 1))
            start, total = index + 1, 0
    if start < len(nbytes):
        chunks.append(range(start, len(nbytes)))
    return chunks


def fitted_buckets(
    nbytes: Sequence[int], bucket_bytes: int, itemsizes: Sequence[int] | None = None
) -> list[range]:
    """Consecutive index ranges of at most ``bucket_bytes`` bytes each; a tensor larger than that is a
    bucket of its own. With ``itemsizes`` (bytes per element of each tensor) a tensor whose offset would
    not be a multiple of its item size starts a new bucket. Raises ValueError for ``bucket_bytes < 1``."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket size must be >= 1 byte, got {bucket_bytes}")
    buckets: list[range] = []
    start, total = 0, 0
    for index, size in enumerate(nbytes):
        unaligned = itemsizes is not None and total % itemsizes[index] != 0
        if index > start and (total + size > bucket_bytes or unaligned):
            buckets.append(range(start, index))
            start, total = index, 0
        total += size
    if start < len(nbytes):
        buckets.append(range(start, len(nbytes)))
    return buckets


def plan_buckets(specs: Sequence[TensorSpec], bucket_bytes: int, wire: Wire) -> list[range]:
    """The buckets of ``specs`` (index ranges into it, in order, covering it) as the ``wire`` server
    receives them: `vllm_packed_chunks` for vLLM, `fitted_buckets` for SGLang."""
    sizes = [s.nbytes for s in specs]
    if wire == "vllm":
        return vllm_packed_chunks(sizes, bucket_bytes)
    if wire == "sglang":
        return fitted_buckets(sizes, bucket_bytes, [_torch_dtype(s.dtype).itemsize for s in specs])
    raise ValueError(f"unknown wire {wire!r}: 'vllm' or 'sglang'")


def misaligned(specs: Sequence[TensorSpec], buckets: Sequence[range]) -> list[str]:
    """Names of the tensors whose byte offset in their bucket is not a multiple of their item size (a
    server's ``view(dtype)`` refuses them; see the module docstring)."""
    out = []
    for bucket in buckets:
        offset = 0
        for i in bucket:
            if offset % _torch_dtype(specs[i].dtype).itemsize:
                out.append(specs[i].name)
            offset += specs[i].nbytes
    return out


def _bytes_of(tensor: Tensor) -> Tensor:
    """A tensor's elements, contiguous, as a 1-D ``uint8`` tensor (a view when already contiguous)."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def pack_bucket(tensors: Sequence[Tensor], out: Tensor | None = None) -> Tensor:
    """The bytes of ``tensors`` (any devices and layouts; not modified), concatenated in order: a 1-D
    ``uint8`` tensor of ``sum(numel * itemsize)`` bytes, written into the front of ``out`` (a 1-D
    ``uint8`` buffer at least that long, on the sending device) when given, else on the first tensor's
    device. Returns the filled part."""
    total = sum(t.numel() * t.element_size() for t in tensors)
    if out is None:
        device = tensors[0].device if tensors else torch.device("cpu")
        out = torch.empty(total, dtype=torch.uint8, device=device)
    elif out.dtype != torch.uint8 or out.dim() != 1 or out.numel() < total:
        raise ValueError(f"out must be a 1-D uint8 buffer of >= {total} bytes")
    offset = 0
    for tensor in tensors:
        raw = _bytes_of(tensor)
        out[offset : offset + raw.numel()].copy_(raw)
        offset += raw.numel()
    return out[:total]


def unpack_bucket(flat: Tensor, specs: Sequence[TensorSpec]) -> list[tuple[str, Tensor]]:
    """``(name, tensor)`` of each spec, cut from the ``uint8`` buffer ``flat`` at running byte offsets:
    views of ``flat`` (clone them before reusing the buffer), or copies where the offset is misaligned (the
    servers refuse those instead). Raises ValueError if ``flat`` is not exactly as long as the specs."""
    total = sum(s.nbytes for s in specs)
    if flat.dtype != torch.uint8 or flat.dim() != 1 or flat.numel() != total:
        got = f"{flat.dtype} {tuple(flat.shape)}"
        raise ValueError(f"expected a 1-D uint8 buffer of {total} bytes, got {got}")
    out: list[tuple[str, Tensor]] = []
    offset = 0
    for spec in specs:
        n, dtype = spec.nbytes, _torch_dtype(spec.dtype)
        part = flat[offset : offset + n]
        if (part.storage_offset() * part.element_size()) % dtype.itemsize:
            part = part.clone()
        out.append((spec.name, part.view(dtype).reshape(spec.shape)))
        offset += n
    return out


def send_buckets(
    group: object,
    tensors: Sequence[Tensor],
    buckets: Sequence[range],
    device: torch.device | str,
) -> int:
    """Rank 0's side of a bucketed transfer: pack each bucket of ``tensors`` (`pack_bucket`) into one reused
    buffer on ``device`` and broadcast it (``group.broadcast(buffer, src=0)``: a
    `sao.engine.weight_broadcast.SyncGroup` or vLLM's ``PyNcclCommunicator``), in order; a bucket of only
    empty tensors is broadcast too (0 bytes), as the servers receive it. Blocking (run it in a thread).
    Returns the number of broadcasts."""
    sizes = [sum(tensors[i].numel() * tensors[i].element_size() for i in b) for b in buckets]
    buffer = torch.empty(max(sizes, default=0), dtype=torch.uint8, device=device)
    for bucket, size in zip(buckets, sizes, strict=True):
        flat = pack_bucket([tensors[i] for i in bucket], buffer)
        assert flat.numel() == size
        group.broadcast(flat, src=0)  # type: ignore[attr-defined]
    return len(buckets)
