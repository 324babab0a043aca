"""The JSON bodies of the native weight-transfer calls of vLLM and SGLang (`sao.engine.native_sync` makes the
calls): group init, and the update's metadata (names, dtype names, shapes) in the state's iteration order,
which is the order the tensors are broadcast in. Bucketed SGLang pushes send one body per bucket
(`sao.engine.native_buckets` has the layouts).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor

from sao.engine.native_buckets import plan_buckets, tensor_spec_list

__all__ = [
    "SGLANG_GROUP",
    "sglang_init_body",
    "sglang_update_bodies",
    "sglang_update_body",
    "tensor_specs",
    "vllm_init_body",
    "vllm_update_body",
]

SGLANG_GROUP = "weight_update_group"  # SGLang's default group name


def tensor_specs(state: Mapping[str, Tensor]) -> tuple[list[str], list[str], list[list[int]]]:
    """``(names, dtype names, shapes)`` of ``state`` in its iteration order; dtype names as the servers
    parse them (``getattr(torch, name)``: ``"bfloat16"``, ``"float32"``)."""
    names = list(state)
    dtypes = [str(t.dtype).removeprefix("torch.") for t in state.values()]
    shapes = [list(t.shape) for t in state.values()]
    return names, dtypes, shapes


def vllm_init_body(
    master_address: str, master_port: int, rank_offset: int, world_size: int, **extra: Any
) -> dict[str, Any]:
    """Body of vLLM's ``POST /init_weight_transfer_engine`` (NCCL backend, ``NCCLWeightTransferInitInfo``).
    ``world_size``: the trainer plus every worker of every server in the group. ``extra``: further
    ``init_info`` fields of the server's release (vLLM refuses unknown ones)."""
    info = {
        "master_address": master_address,
        "master_port": int(master_port),
        "rank_offset": int(rank_offset),
        "world_size": int(world_size),
    }
    return {"init_info": {**info, **extra}}


def vllm_update_body(
    names: Sequence[str], dtype_names: Sequence[str], shapes: Sequence[Sequence[int]], **extra: Any
) -> dict[str, Any]:
    """Body of vLLM's ``POST /update_weights`` (``NCCLWeightTransferUpdateInfo``). ``extra``: further
    ``update_info`` fields of the server's release, e.g. ``packed=False`` where it is one (vLLM refuses
    unknown ones). Raises ValueError if the three lists differ in length."""
    if not len(names) == len(dtype_names) == len(shapes):
        raise ValueError(f"{len(names)} names, {len(dtype_names)} dtypes, {len(shapes)} shapes")
    info = {"names": list(names), "dtype_names": list(dtype_names), "shapes": [list(s) for s in shapes]}
    return {"update_info": {**info, **extra}}


def sglang_init_body(
    master_address: str,
    master_port: int,
    rank_offset: int,
    world_size: int,
    *,
    group_name: str = SGLANG_GROUP,
    backend: str = "nccl",
) -> dict[str, Any]:
    """Body of SGLang's ``POST /init_weights_update_group`` (``InitWeightsUpdateGroupReqInput``)."""
    return {
        "master_address": master_address,
        "master_port": int(master_port),
        "rank_offset": int(rank_offset),
        "world_size": int(world_size),
        "group_name": group_name,
        "backend": backend,
    }


def sglang_update_body(
    names: Sequence[str],
    dtypes: Sequence[str],
    shapes: Sequence[Sequence[int]],
    *,
    group_name: str = SGLANG_GROUP,
    weight_version: str | None = None,
    flush_cache: bool = False,
    load_format: str | None = None,
) -> dict[str, Any]:
    """Body of SGLang's ``POST /update_weights_from_distributed`` (``UpdateWeightsFromDistributedReqInput``).
    ``flush_cache`` false keeps the KV of requests paused in place (a flush would drop it); nothing is
    aborted. ``load_format="flattened_bucket"``: the tensors come as one flat byte buffer, one broadcast.
    Raises ValueError if the three lists differ in length."""
    if not len(names) == len(dtypes) == len(shapes):
        raise ValueError(f"{len(names)} names, {len(dtypes)} dtypes, {len(shapes)} shapes")
    body: dict[str, Any] = {
        "names": list(names),
        "dtypes": list(dtypes),
        "shapes": [list(s) for s in shapes],
        "group_name": group_name,
        "flush_cache": flush_cache,
        "abort_all_requests": False,
    }
    if weight_version is not None:
        body["weight_version"] = weight_version
    if load_format is not None:
        body["load_format"] = load_format
    return body


def sglang_update_bodies(
    state: Mapping[str, Tensor],
    group_name: str,
    weight_version: str | None,
    flush_cache: bool,
    bucket_bytes: int | None,
) -> list[dict[str, Any]]:
    """The ``/update_weights_from_distributed`` bodies of one push: one for every tensor, or one per
    bucket (``flattened_bucket``), the version and the flush on the last."""
    specs = tensor_spec_list(state)
    if bucket_bytes is None:
        buckets, load_format = [range(len(specs))], None
    else:
        buckets, load_format = plan_buckets(specs, bucket_bytes, "sglang"), "flattened_bucket"
    bodies = []
    for k, bucket in enumerate(buckets):
        last = k == len(buckets) - 1
        part = [specs[i] for i in bucket]
        body = sglang_update_body(
            [s.name for s in part], [s.dtype for s in part], [list(s.shape) for s in part],
            group_name=group_name, weight_version=weight_version if last else None,
            flush_cache=flush_cache and last, load_format=load_format,
        )  # fmt: skip
        bodies.append(body)
    return bodies
