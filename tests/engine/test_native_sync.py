"""Native weight transfer into vLLM / SGLang: the request bodies, the order of the calls, and the update call
running concurrently with the trainer's broadcast, against a fake server that records every request.

The fake's update (and init) handler returns only once the test's ``send`` (``join``) has run, and ``send``
waits until the update request has arrived: a push that made the two calls one after the other fails (the
handler gives up after ``wait_s``) instead of passing.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import httpx
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from sao.engine.http_protocol import ServerError
from sao.engine.native_bodies import (
    sglang_init_body,
    sglang_update_body,
    tensor_specs,
    vllm_init_body,
    vllm_update_body,
)
from sao.engine.native_sync import (
    broadcast_each,
    init_sglang_native,
    init_vllm_native,
    push_sglang_native,
    push_vllm_native,
    run_concurrently,
)
from sao.engine.sglang import SGLangEngine
from sao.engine.vllm import VLLMEngine
from sao.engine.weight_broadcast import open_sync_group

# Blocking paths: the calls that return only after the trainer's side of the collective ran.
_BLOCKING = {
    "/init_weight_transfer_engine",
    "/update_weights",
    "/init_weights_update_group",
    "/update_weights_from_distributed",
}


class FakeServer:
    """Records ``(path, query, JSON body, arrival time)`` of every POST; blocking paths wait for `sent`.
    ``status`` maps a path to the status (and body) it answers with instead."""

    def __init__(self, wait_s: float = 5.0, status: dict[str, tuple[int, Any]] | None = None) -> None:
        self.requests: list[tuple[str, dict[str, str], Any, float]] = []
        self.events: list[str] = []
        self.arrived = threading.Event()  # a blocking request is in the server
        self.sent = threading.Event()  # the trainer side ran
        self.status = status or {}
        self.app = FastAPI()

        @self.app.post("/{path:path}")
        async def handle(path: str, request: Request) -> JSONResponse:
            raw = await request.body()
            route = "/" + path
            self.requests.append(
                (route, dict(request.query_params), json.loads(raw) if raw else None, time.monotonic())
            )
            self.events.append(route)
            if route in self.status:
                code, body = self.status[route]
                return JSONResponse(body, status_code=code)
            if route in _BLOCKING:
                self.arrived.set()
                if not await asyncio.to_thread(self.sent.wait, wait_s):
                    return JSONResponse(
                        {"error": {"message": "the trainer never broadcast"}}, status_code=500
                    )
                self.events.append(f"{route} returned")
            return JSONResponse({"success": True, "message": "ok"})

    @property
    def paths(self) -> list[str]:
        return [r[0] for r in self.requests]

    def body(self, path: str) -> Any:
        return next(r[2] for r in self.requests if r[0] == path)

    def trainer_side(self) -> Callable[[], Any]:
        """A ``send`` / ``join``: waits until the blocking request is in flight, then releases it."""

        async def run() -> str:
            assert await asyncio.to_thread(self.arrived.wait, 5.0), "the blocking request never arrived"
            self.events.append("send")
            self.sent.set()
            return "joined"

        return run


@pytest.fixture
def fake(serve_app):
    def start(**kwargs: Any) -> tuple[FakeServer, str]:
        server = FakeServer(**kwargs)
        return server, serve_app(server.app)

    made: list[FakeServer] = []

    def tracked(**kwargs: Any) -> tuple[FakeServer, str]:
        server, url = start(**kwargs)
        made.append(server)
        return server, url

    yield tracked
    for server in made:
        server.sent.set()  # release handlers still waiting


def _state() -> dict[str, torch.Tensor]:
    return {
        "model.embed_tokens.weight": torch.arange(12.0).reshape(4, 3).to(torch.bfloat16),
        "model.layers.0.mlp.experts.0.gate_proj.weight": torch.arange(6.0).reshape(2, 3) / 7,
        "lm_head.weight": -torch.arange(12.0).reshape(4, 3).to(torch.bfloat16),
    }


def _run(coro: Any) -> Any:
    async def main() -> Any:
        async with httpx.AsyncClient() as client:
            return await coro(client)

    return asyncio.run(main())


# ---- bodies ------------------------------------------------------------------------------------------------


def test_tensor_specs_list_the_state_in_order_with_torch_dtype_names():
    names, dtypes, shapes = tensor_specs(_state())
    assert names == list(_state())
    assert dtypes == ["bfloat16", "float32", "bfloat16"]
    assert shapes == [[4, 3], [2, 3], [4, 3]]


def test_vllm_bodies_have_the_servers_field_names():
    # vLLM 0.32 vllm/entrypoints/serve/dev/rlhf/api_router.py reads body["init_info"] / body["update_info"]
    # into NCCLWeightTransferInitInfo / NCCLWeightTransferUpdateInfo (vllm/distributed/weight_transfer).
    assert vllm_init_body("10.0.0.1", 29600, 1, 3) == {
        "init_info": {"master_address": "10.0.0.1", "master_port": 29600, "rank_offset": 1, "world_size": 3}
    }
    assert vllm_update_body(["a", "b"], ["bfloat16", "float32"], [(2, 3), []], packed=False) == {
        "update_info": {
            "names": ["a", "b"],
            "dtype_names": ["bfloat16", "float32"],
            "shapes": [[2, 3], []],
            "packed": False,
        }
    }
    with pytest.raises(ValueError, match="2 names, 1 dtypes"):
        vllm_update_body(["a", "b"], ["float32"], [[1], [1]])


def test_sglang_bodies_have_the_servers_field_names():
    # SGLang 0.5.x python/sglang/srt/managers/io_struct.py: InitWeightsUpdateGroupReqInput and
    # UpdateWeightsFromDistributedReqInput.
    assert sglang_init_body("10.0.0.1", 29600, 1, 3, group_name="g") == {
        "master_address": "10.0.0.1",
        "master_port": 29600,
        "rank_offset": 1,
        "world_size": 3,
        "group_name": "g",
        "backend": "nccl",
    }
    assert sglang_update_body(["a"], ["float32"], [(2,)], group_name="g", weight_version="7") == {
        "names": ["a"],
        "dtypes": ["float32"],
        "shapes": [[2]],
        "group_name": "g",
        "flush_cache": False,
        "abort_all_requests": False,
        "weight_version": "7",
    }


def test_broadcast_each_sends_every_tensor_in_body_order_contiguous_and_as_it_is():
    class Recorder:
        def __init__(self) -> None:
            self.sent: list[tuple[torch.Tensor, int]] = []

        def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
            self.sent.append((tensor, src))

    state = {"w": torch.arange(6.0).reshape(2, 3).t(), "b": torch.ones(2, dtype=torch.bfloat16)}
    recorder = Recorder()
    broadcast_each(recorder, state, "cpu")
    assert [src for _, src in recorder.sent] == [0, 0]
    _, dtypes, shapes = tensor_specs(state)
    for (sent, _), want, dtype, shape in zip(recorder.sent, state.values(), dtypes, shapes, strict=True):
        assert sent.is_contiguous() and torch.equal(sent, want)
        assert str(sent.dtype) == f"torch.{dtype}" and list(sent.shape) == shape


# ---- concurrency -------------------------------------------------------------------------------------------


def test_the_fake_server_fails_a_push_that_sends_after_the_call(fake):
    server, url = fake(wait_s=0.5)
    body = vllm_update_body(*tensor_specs(_state()))

    async def sequential(client: httpx.AsyncClient) -> int:
        response = await client.post(f"{url}/update_weights", json=body)
        server.sent.set()
        return response.status_code

    assert _run(sequential) == 500


def test_run_concurrently_cancels_the_call_when_send_fails():
    cancelled = []

    async def slow_call() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "never"

    async def bad_send() -> None:
        raise RuntimeError("nccl broke")

    with pytest.raises(RuntimeError, match="nccl broke"):
        asyncio.run(run_concurrently(slow_call(), bad_send))
    assert cancelled == [True]


# ---- vLLM --------------------------------------------------------------------------------------------------


def test_vllm_push_pauses_starts_updates_while_sending_finishes_and_resumes(fake):
    server, url = fake()
    send = server.trainer_side()

    async def push(client: httpx.AsyncClient) -> None:
        await push_vllm_native(
            client, url, _state(), send, weight_version="4",
            on_paused=lambda: server.events.append("on_paused"),
            on_loaded=lambda: server.events.append("on_loaded"),
        )  # fmt: skip

    _run(push)
    assert server.paths == [
        "/pause",
        "/start_weight_update",
        "/update_weights",
        "/finish_weight_update",
        "/resume",
    ]
    assert server.events == [
        "/pause",
        "on_paused",
        "/start_weight_update",
        "/update_weights",
        "send",  # while /update_weights was in the server
        "/update_weights returned",
        "/finish_weight_update",
        "on_loaded",
        "/resume",
    ]
    assert server.requests[0][1] == {"mode": "keep"}
    assert server.body("/start_weight_update") == {"is_checkpoint_format": True}
    assert server.body("/update_weights") == {
        "update_info": {
            "names": list(_state()),
            "dtype_names": ["bfloat16", "float32", "bfloat16"],
            "shapes": [[4, 3], [2, 3], [4, 3]],
        }
    }
    assert server.body("/finish_weight_update") == {"weight_version": "4"}
    assert server.body("/resume") is None


def test_vllm_push_resumes_and_raises_when_send_fails(fake):
    server, url = fake()

    async def send() -> None:
        await asyncio.to_thread(server.arrived.wait, 5.0)
        raise RuntimeError("nccl broke")

    with pytest.raises(RuntimeError, match="nccl broke"):
        _run(lambda client: push_vllm_native(client, url, _state(), send))
    assert server.paths == ["/pause", "/start_weight_update", "/update_weights", "/resume"]


def test_vllm_push_resumes_cancels_send_and_raises_when_the_update_returns_500(fake):
    server, url = fake(status={"/update_weights": (500, {"error": {"message": "worker died"}})})
    cancelled = []

    async def send() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    with pytest.raises(ServerError, match="worker died") as error:
        _run(lambda client: push_vllm_native(client, url, _state(), send))
    assert error.value.status_code == 500 and cancelled == [True]
    assert server.paths == ["/pause", "/start_weight_update", "/update_weights", "/resume"]


def test_vllm_init_runs_concurrently_with_the_trainer_joining(fake):
    server, url = fake()

    async def init(client: httpx.AsyncClient) -> str:
        return await init_vllm_native(
            client, url, server.trainer_side(), master_address="10.0.0.1", master_port=29600, rank_offset=1,
            world_size=2,
        )  # fmt: skip

    assert _run(init) == "joined"
    assert server.events == ["/init_weight_transfer_engine", "send", "/init_weight_transfer_engine returned"]
    assert server.body("/init_weight_transfer_engine") == vllm_init_body("10.0.0.1", 29600, 1, 2)


def test_vllm_engine_native_update_commits_the_version_while_paused(fake):
    server, url = fake()

    async def update(client: httpx.AsyncClient) -> tuple[int, dict[str, float]]:
        engine = VLLMEngine(url, "m", 64, settle_s=0.001)
        try:
            await engine.native_update(_state(), 5, server.trainer_side())
            return engine.version, engine.stats()
        finally:
            await engine.close()

    version, stats = _run(update)
    assert version == 5 and stats["updates"] == 1 and stats["last_pause_s"] >= 0
    assert server.paths[-2:] == ["/reset_prefix_cache", "/resume"]
    assert server.body("/finish_weight_update") == {"weight_version": "5"}


def test_vllm_engine_keeps_its_version_when_the_native_update_fails(fake):
    server, url = fake(status={"/finish_weight_update": (500, {"error": {"message": "bad layer"}})})

    async def update(client: httpx.AsyncClient) -> int:
        engine = VLLMEngine(url, "m", 64, version=2)
        try:
            with pytest.raises(ServerError, match="bad layer"):
                await engine.native_update(_state(), 3, server.trainer_side())
            return engine.version
        finally:
            await engine.close()

    assert _run(update) == 2
    assert server.paths[-1] == "/resume"


# ---- SGLang ------------------------------------------------------------------------------------------------


def test_sglang_push_pauses_in_place_updates_while_sending_and_continues(fake):
    server, url = fake()

    async def push(client: httpx.AsyncClient) -> None:
        await push_sglang_native(
            client, url, _state(), server.trainer_side(), group_name="g", weight_version="4",
            on_loaded=lambda: server.events.append("on_loaded"),
        )  # fmt: skip

    _run(push)
    assert server.events == [
        "/pause_generation",
        "/begin_weight_update",  # SGLang 0.5.23 loads only inside a weight-update session
        "/update_weights_from_distributed",
        "send",
        "/update_weights_from_distributed returned",
        "/end_weight_update",
        "on_loaded",
        "/continue_generation",
    ]
    assert server.body("/pause_generation") == {"mode": "in_place"}
    assert server.body("/update_weights_from_distributed") == {
        "names": list(_state()),
        "dtypes": ["bfloat16", "float32", "bfloat16"],
        "shapes": [[4, 3], [2, 3], [4, 3]],
        "group_name": "g",
        "flush_cache": False,
        "abort_all_requests": False,
        "weight_version": "4",
    }
    assert server.body("/continue_generation") == {}


def test_sglang_push_continues_and_raises_when_the_server_reports_failure(fake):
    failure = {"success": False, "message": "Failed to update parameter online"}
    server, url = fake(status={"/update_weights_from_distributed": (400, failure)})

    async def send() -> None:
        await asyncio.sleep(10)

    with pytest.raises(ServerError, match="Failed to update parameter online"):
        _run(lambda client: push_sglang_native(client, url, _state(), send))
    assert server.paths == [
        "/pause_generation",
        "/begin_weight_update",
        "/update_weights_from_distributed",
        "/end_weight_update",  # the session is closed whatever the load did
        "/continue_generation",
    ]


def test_sglang_push_without_pause_modes_neither_pauses_nor_continues(fake):
    server, url = fake()
    _run(lambda client: push_sglang_native(client, url, _state(), server.trainer_side(), pause=False))
    assert server.paths == ["/begin_weight_update", "/update_weights_from_distributed", "/end_weight_update"]


def test_sglang_push_to_a_server_without_update_sessions_loads_without_them(fake):
    server, url = fake(status={"/begin_weight_update": (404, {"detail": "Not Found"})})
    _run(lambda client: push_sglang_native(client, url, _state(), server.trainer_side()))
    assert server.paths == ["/pause_generation", "/begin_weight_update", "/update_weights_from_distributed",
                            "/continue_generation"]  # fmt: skip


def test_sglang_init_runs_concurrently_with_the_trainer_joining(fake):
    server, url = fake()

    async def init(client: httpx.AsyncClient) -> str:
        return await init_sglang_native(
            client, url, server.trainer_side(), master_address="10.0.0.1", master_port=29600, rank_offset=1,
            world_size=2, group_name="g",
        )  # fmt: skip

    assert _run(init) == "joined"
    assert server.events == ["/init_weights_update_group", "send", "/init_weights_update_group returned"]
    assert server.body("/init_weights_update_group") == sglang_init_body(
        "10.0.0.1", 29600, 1, 2, group_name="g"
    )


def test_sglang_engine_native_update_retracts_and_flushes_when_recomputing_kv(fake):
    server, url = fake()

    async def update(client: httpx.AsyncClient) -> int:
        engine = SGLangEngine(url, recompute_kv_on_update=True, settle_s=0.001)
        try:
            await engine.native_update(_state(), 9, server.trainer_side(), group_name="g")
            return engine.version
        finally:
            await engine.close()

    assert _run(update) == 9
    assert server.body("/pause_generation") == {"mode": "retract"}
    body = server.body("/update_weights_from_distributed")
    assert (body["flush_cache"], body["weight_version"], body["group_name"]) == (True, "9", "g")


# ---- the SGLang wire, over gloo ----------------------------------------------------------------------------


def _sglang_wire_main(rank: int, port: int) -> None:
    torch.set_num_threads(1)
    state = _state()
    if rank == 0:
        group = open_sync_group("127.0.0.1", port, 0, 2, group_name="g", timeout_s=60)
        broadcast_each(group, state, group.device)
        group.broadcast(torch.zeros(1))
        group.close()
        return
    # The receiver joins the way SGLang 0.5.x's init_weights_update_group does (tcp:// rendezvous, a store
    # prefixed with the group name, torch's group helper), on CPU, and receives as its
    # update_weights_from_distributed does: one async broadcast per (name, dtype, shape), in order.
    from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world
    from torch.distributed.rendezvous import rendezvous

    timeout = timedelta(seconds=60)
    store, _, _ = next(rendezvous(f"tcp://127.0.0.1:{port}", rank, 2, timeout=timeout))
    pg, _ = _new_process_group_helper(
        2, rank, [], Backend("cpu:gloo"), PrefixStore("g", store), group_name="g", timeout=timeout
    )
    _world.pg_group_ranks[pg] = {0: 0, 1: 1}
    names, dtypes, shapes = tensor_specs(state)
    received = [torch.empty(s, dtype=getattr(torch, d)) for d, s in zip(dtypes, shapes, strict=True)]
    for handle in [dist.broadcast(t, src=0, group=pg, async_op=True) for t in received]:
        handle.wait()
    for name, tensor in zip(names, received, strict=True):
        assert torch.equal(tensor, state[name]), name
    dist.broadcast(torch.zeros(1), src=0, group=pg)
    # A group made by the private helper has no teardown of its own: its gloo threads can abort the
    # interpreter's exit ("terminate called without an active exception"). Done and checked: leave now.
    os._exit(0)


def test_open_sync_group_and_broadcast_each_are_the_trainer_end_of_an_sglang_style_group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_sglang_wire_main, args=(port,), nprocs=2, join=True)
