"""Native weight transfer into vLLM and SGLang servers: the order of the calls (their bodies:
`sao.engine.native_bodies`).

Instead of reloading from a directory, a server can receive new weights over a collective group it shares
with the trainer, which is rank 0 of that group; a server's workers are ranks ``rank_offset`` and up. The
HTTP calls carry only metadata (names, dtypes, shapes); the tensors travel in the group. Two calls block
until the trainer's side of the group does its part, so each must run *concurrently* with it, never before
or after (that deadlocks until a timeout):

- init (vLLM ``/init_weight_transfer_engine``, SGLang ``/init_weights_update_group``) returns once the
  server's workers have joined the group, which needs the trainer joining at the same time
  (`init_vllm_native`, `init_sglang_native`; ``join`` is the trainer side, e.g. a thread running
  `sao.engine.weight_broadcast.open_sync_group` for SGLang, vLLM's ``trainer_init`` for vLLM);
- the update (vLLM ``/update_weights``, SGLang ``/update_weights_from_distributed``) returns once every
  tensor is received and loaded, which needs the trainer broadcasting them (``send``).

Wire order and packing. Unbucketed, both servers receive one broadcast per tensor from rank 0, in the
order of ``names``, each of exactly its dtype and shape (vLLM: ``NCCLWeightTransferEngine.receive_weights``
with ``packed`` false; SGLang: ``update_weights_from_distributed`` without a ``load_format``): the bodies
list ``state`` in its iteration order and `broadcast_each` sends ``state.values()`` in that order.
Bucketed (``bucket_bytes``; `sao.engine.native_buckets` has the layouts and the servers' rules), the
tensors travel as flat byte buckets, one broadcast each (`sao.engine.native_buckets.send_buckets`):
vLLM is told at init (``init_info.packed`` and ``packed_buffer_size_bytes``: vLLM 0.33's
``NCCLWeightTransferInitInfo`` in ``vllm/distributed/weight_transfer/nccl_common.py``; some earlier
releases took them in ``update_info`` instead, `vllm_update_body`'s ``extra``) and takes the whole push in
one ``/update_weights``, deriving the chunks itself; SGLang takes one
``/update_weights_from_distributed`` per bucket with ``load_format: "flattened_bucket"`` (one broadcast
per request), sent one after the other while ``send`` broadcasts the buckets in the same order (the
broadcast of bucket k+1 waits in the group until the server's request k+1 arrives).

The group. SGLang's workers join a torch process group, whose trainer end is `open_sync_group` with
``backend="nccl"`` and the same ``group_name`` (same store layout; SGLang also takes ``backend="gloo"``, but
then torch builds a gloo backend for CUDA tensors too, which `open_sync_group` does not). vLLM's NCCL engine
joins with its own ``StatelessProcessGroup`` + ``PyNcclCommunicator``: the trainer end must be vLLM's
``trainer_init`` (vLLM installed on the trainer); that communicator has the ``broadcast(tensor, src)`` that
`broadcast_each` uses. vLLM's released transfer engines (nccl, ipc, sparse_nccl) all need CUDA.

Several servers in one group: every server's push must be in flight while the one broadcast runs. Run
their pushes concurrently with one shared send, e.g. ``task = asyncio.create_task(...)`` and
``send = lambda: asyncio.shield(task)`` (the shield keeps one failing push from cancelling the others' send).

Failures. The pushes resume generation in a ``finally`` whatever fails; if the update call or ``send``
fails, the other is cancelled and awaited, and the first error is raised. A ``send`` blocked in a thread
cannot be interrupted: it ends at the group's timeout. After a failed transfer the server's weights are
partly updated and the group should be considered broken (re-init it, or reload from a checkpoint).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

import httpx
import torch
from torch import Tensor

from sao.engine.http_protocol import ServerError, error_message
from sao.engine.native_bodies import (
    SGLANG_GROUP,
    sglang_init_body,
    sglang_update_bodies,
    tensor_specs,
    vllm_init_body,
    vllm_update_body,
)
from sao.engine.native_buckets import misaligned, plan_buckets, tensor_spec_list

__all__ = [
    "Broadcaster",
    "broadcast_each",
    "init_sglang_native",
    "init_vllm_native",
    "push_sglang_native",
    "push_vllm_native",
    "run_concurrently",
]

T = TypeVar("T")


class Broadcaster(Protocol):
    """What sends one tensor to a group: `sao.engine.weight_broadcast.SyncGroup` or vLLM's
    ``PyNcclCommunicator``."""

    def broadcast(self, tensor: Tensor, src: int = 0) -> Any: ...


def broadcast_each(group: Broadcaster, state: Mapping[str, Tensor], device: torch.device | str) -> None:
    """Broadcast every tensor of ``state`` from rank 0, one call each, in iteration order, as it is (dtype
    and shape), moved to ``device`` and made contiguous: what both servers receive, unpacked, for a body
    built from the same ``state``. Blocking: run it in a thread (``asyncio.to_thread``) as the ``send``."""
    for tensor in state.values():
        group.broadcast(tensor.detach().to(device).contiguous(), src=0)


# ---- calls -------------------------------------------------------------------------------------------------


async def run_concurrently(call: Awaitable[T], send: Callable[[], Awaitable[Any]]) -> T:
    """Await ``call`` and ``send()`` together; return ``call``'s result. If either fails, the other is
    cancelled and awaited, then the failure is raised (``call``'s first if both failed)."""

    async def run_send() -> None:
        await send()

    call_task, send_task = asyncio.ensure_future(call), asyncio.ensure_future(run_send())
    tasks = (call_task, send_task)
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
    return call_task.result()


async def _post_checked(
    client: httpx.AsyncClient, url: str, what: str, timeout_s: float, **kwargs: Any
) -> httpx.Response:
    """POST; `ServerError` (with the status) unless 200 and, for a body with ``success``, success."""
    response = await client.post(url, timeout=timeout_s, **kwargs)
    return _check_answer(response, url, what)


def _check_answer(response: httpx.Response, url: str, what: str) -> httpx.Response:
    """``response`` unless it is not 200 or, for a body with ``success``, not a success (`ServerError`)."""
    if response.status_code != 200:
        message = error_message(response.text)
        raise ServerError(f"{url} ({what}) failed ({response.status_code}): {message}", response.status_code)
    try:
        result = response.json()
    except ValueError:
        return response
    if isinstance(result, Mapping) and result.get("success") is False:
        raise ServerError(f"{url} ({what}) failed: {result.get('message', result)}", response.status_code)
    return response


async def init_vllm_native(
    client: httpx.AsyncClient,
    base_url: str,
    join: Callable[[], Awaitable[T]],
    *,
    master_address: str,
    master_port: int,
    rank_offset: int,
    world_size: int,
    bucket_bytes: int | None = None,
    init_extra: Mapping[str, Any] | None = None,
    timeout_s: float = 600.0,
) -> T:
    """``POST /init_weight_transfer_engine`` to the vLLM server at ``base_url`` concurrently with ``join()``
    (the trainer joining the same group as rank 0); return what ``join`` returns. ``bucket_bytes``: every
    later push of this group is packed (``packed: true``, ``packed_buffer_size_bytes``). Raises
    `ServerError`."""
    extra = dict(init_extra or {})
    if bucket_bytes is not None:
        extra.update(packed=True, packed_buffer_size_bytes=int(bucket_bytes))
    body = vllm_init_body(master_address, master_port, rank_offset, world_size, **extra)
    url = base_url.rstrip("/") + "/init_weight_transfer_engine"
    return await _init_concurrently(client, url, body, "vLLM weight transfer init", join, timeout_s)


async def init_sglang_native(
    client: httpx.AsyncClient,
    base_url: str,
    join: Callable[[], Awaitable[T]],
    *,
    master_address: str,
    master_port: int,
    rank_offset: int,
    world_size: int,
    group_name: str = SGLANG_GROUP,
    backend: str = "nccl",
    timeout_s: float = 600.0,
) -> T:
    """``POST /init_weights_update_group`` to the SGLang server at ``base_url`` concurrently with ``join()``;
    return what ``join`` returns. Raises `ServerError` (also for ``success: false``)."""
    body = sglang_init_body(
        master_address, master_port, rank_offset, world_size, group_name=group_name, backend=backend
    )
    url = base_url.rstrip("/") + "/init_weights_update_group"
    return await _init_concurrently(client, url, body, "SGLang group init", join, timeout_s)


async def _init_concurrently(
    client: httpx.AsyncClient, url: str, body: Mapping[str, Any], what: str,
    join: Callable[[], Awaitable[T]], timeout_s: float,
) -> T:  # fmt: skip
    """The init call and ``join()`` at once (each blocks until the other side joined); ``join``'s result."""
    joined: list[T] = []

    async def run_join() -> None:
        joined.append(await join())

    await run_concurrently(_post_checked(client, url, what, timeout_s, json=body), run_join)
    return joined[0]


async def _then_always(steps: Awaitable[None], finally_: Awaitable[Any]) -> None:
    """Await ``steps`` then ``finally_``, which runs even if ``steps`` fails or is cancelled; the first
    error wins (a failure of ``finally_`` after one of ``steps`` is dropped, not raised over it)."""
    try:
        await steps
    except BaseException:
        with contextlib.suppress(Exception):
            await finally_
        raise
    await finally_


async def _maybe(hook: Callable[[], Any] | None) -> None:
    if hook is not None:
        result = hook()
        if asyncio.iscoroutine(result):
            await result


async def push_vllm_native(
    client: httpx.AsyncClient,
    base_url: str,
    state: Mapping[str, Tensor],
    send: Callable[[], Awaitable[Any]],
    *,
    weight_version: str | None = None,
    update_extra: Mapping[str, Any] | None = None,
    bucket_bytes: int | None = None,
    on_paused: Callable[[], Any] | None = None,
    on_loaded: Callable[[], Any] | None = None,
    timeout_s: float = 600.0,
) -> None:
    """Load ``state`` (engine names; only its names, dtypes and shapes are read) into the vLLM server at
    ``base_url`` while ``send()`` broadcasts the same tensors: one per tensor (`broadcast_each`), or, in a
    group initialized packed with ``bucket_bytes`` (`init_vllm_native`), in vLLM's chunks (``send`` is
    `sao.engine.native_buckets.send_buckets` over ``plan_buckets(..., "vllm")``; the body is the same).

    Order: ``POST /pause?mode=keep`` (requests freeze in the scheduler, none aborted), ``on_paused()``,
    ``POST /start_weight_update`` (``is_checkpoint_format``: checkpoint names and layout, loaded layer by
    layer), ``POST /update_weights`` concurrently with ``send()``, ``POST /finish_weight_update`` (per-layer
    post-processing; ``weight_version``), ``on_loaded()`` (still paused; sync or async), and always
    ``POST /resume``. Needs ``VLLM_SERVER_DEV_MODE=1`` on the server. Raises `ServerError` or ``send``'s
    error (see the module docstring); ValueError, before any request, when a packed tensor would sit at a
    byte offset vLLM cannot view (`sao.engine.native_buckets.misaligned`).
    """
    base = base_url.rstrip("/")
    names, dtypes, shapes = tensor_specs(state)
    if bucket_bytes is not None:
        specs = tensor_spec_list(state)
        bad = misaligned(specs, plan_buckets(specs, bucket_bytes, "vllm"))
        if bad:
            raise ValueError(
                f"packed transfer: {bad[0]!r} (and {len(bad) - 1} more) would sit at a byte offset that is "
                "not a multiple of its item size; push in one dtype"
            )
    update = vllm_update_body(names, dtypes, shapes, **(update_extra or {}))

    async def steps() -> None:
        response = await client.post(f"{base}/pause", params={"mode": "keep"}, timeout=timeout_s)
        if response.status_code == 404:
            raise ServerError(f"vLLM at {base} has no /pause: start it with VLLM_SERVER_DEV_MODE=1", 404)
        if response.status_code != 200:
            message = error_message(response.text)
            raise ServerError(f"vLLM /pause failed ({response.status_code}): {message}", response.status_code)
        await _maybe(on_paused)
        start = {"is_checkpoint_format": True}
        await _post_checked(client, f"{base}/start_weight_update", "vLLM start", timeout_s, json=start)
        loading = _post_checked(client, f"{base}/update_weights", "vLLM update", timeout_s, json=update)
        await run_concurrently(loading, send)
        finish = {"weight_version": weight_version}
        await _post_checked(client, f"{base}/finish_weight_update", "vLLM finish", timeout_s, json=finish)
        await _maybe(on_loaded)

    await _then_always(steps(), _post_checked(client, f"{base}/resume", "vLLM resume", timeout_s))


async def _sglang_update_session(
    client: httpx.AsyncClient, base: str, bodies: list[dict[str, Any]], timeout_s: float
) -> None:
    """The ``/update_weights_from_distributed`` requests of one push, in order, inside a
    ``/begin_weight_update`` … ``/end_weight_update`` session that ends even if a request fails (no session
    on a server without them: 404)."""
    url = f"{base}/update_weights_from_distributed"

    async def loads() -> None:
        for body in bodies:
            await _post_checked(client, url, "SGLang update", timeout_s, json=body)

    begin = await client.post(f"{base}/begin_weight_update", json={}, timeout=timeout_s)
    if begin.status_code == 404:  # a server before update sessions
        await loads()
        return
    _check_answer(begin, f"{base}/begin_weight_update", "SGLang begin")
    end = _post_checked(client, f"{base}/end_weight_update", "SGLang end", timeout_s, json={})
    await _then_always(loads(), end)


async def push_sglang_native(
    client: httpx.AsyncClient,
    base_url: str,
    state: Mapping[str, Tensor],
    send: Callable[[], Awaitable[Any]],
    *,
    group_name: str = SGLANG_GROUP,
    weight_version: str | None = None,
    mode: str = "in_place",
    flush_cache: bool = False,
    pause: bool = True,
    bucket_bytes: int | None = None,
    on_paused: Callable[[], Any] | None = None,
    on_loaded: Callable[[], Any] | None = None,
    timeout_s: float = 600.0,
) -> None:
    """Load ``state`` (engine names; only its names, dtypes and shapes are read) into the SGLang server at
    ``base_url`` while ``send()`` broadcasts the same tensors in group ``group_name``: one per tensor
    (`broadcast_each`), or with ``bucket_bytes`` one flat buffer per bucket of ``plan_buckets(...,
    "sglang")`` (`sao.engine.native_buckets.send_buckets`), one request per bucket in order,
    ``weight_version`` and ``flush_cache`` on the last one only.

    Order: ``POST /pause_generation`` with ``mode`` (``"in_place"``: requests keep their KV;
    ``"retract"``: they are re-prefilled, and then ``flush_cache`` may be true), ``on_paused()``,
    ``POST /begin_weight_update`` (the session SGLang 0.5.23 requires around distributed loads; skipped on a
    server without it, 404), ``POST /update_weights_from_distributed`` (each bucket's) concurrently with
    ``send()``, always ``POST /end_weight_update`` after a begun session, ``on_loaded()`` (still paused),
    and always ``POST /continue_generation``. ``pause=False`` skips pause and continue (servers before
    0.5.6, whose pause aborts everything). Raises `ServerError` (also for ``success: false``) or ``send``'s
    error (see the module docstring).
    """
    base = base_url.rstrip("/")
    bodies = sglang_update_bodies(state, group_name, weight_version, flush_cache, bucket_bytes)

    async def steps() -> None:
        if pause:
            await _post_checked(
                client, f"{base}/pause_generation", "SGLang pause", timeout_s, json={"mode": mode}
            )
        await _maybe(on_paused)
        await run_concurrently(_sglang_update_session(client, base, bodies, timeout_s), send)
        await _maybe(on_loaded)

    if not pause:
        await steps()
        return
    await _then_always(
        steps(), _post_checked(client, f"{base}/continue_generation", "SGLang continue", timeout_s, json={})
    )
