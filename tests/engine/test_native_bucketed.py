"""Bucketed native weight transfer: the bucket layouts (pure, and a hypothesis round trip), sao's own
broadcast path and the native sender over gloo between two processes, `NativeSync` against in-process
servers that answer like vLLM 0.33 / SGLang 0.5 and receive the buckets over a real gloo group, and the
``runtime.weight_sync=auto`` resolution.

What cannot run here: the servers themselves (vLLM's transfer engines and SGLang's NCCL group need CUDA),
so the fakes below stand in for them: they take the servers' request bodies, join the group as the
servers' workers do (ranks ``rank_offset`` and up; a trainer-end gloo group instead of vLLM's
``PyNcclCommunicator``), derive the buckets from the bodies by the servers' own rules (written out below
from vLLM's ``packed_nccl_broadcast_consumer`` and SGLang's ``FlattenedTensorBucket``), and cut them with
``view(dtype)`` as the servers do. NCCL to a real server is not exercised.
"""

from __future__ import annotations

import asyncio
import math
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from hypothesis import given, settings
from hypothesis import strategies as st

from sao.config import ConfigError, load_config
from sao.config.schema import weight_sync_path
from sao.engine.native_buckets import (
    TensorSpec,
    fitted_buckets,
    misaligned,
    pack_bucket,
    plan_buckets,
    send_buckets,
    tensor_spec_list,
    unpack_bucket,
    vllm_packed_chunks,
)
from sao.engine.sglang import SGLangEngine
from sao.engine.vllm import VLLMEngine
from sao.engine.weight_broadcast import SyncGroup, WeightReceiver, WeightSender, open_sync_group
from sao.engine.weights import to_engine_state_dict, write_update_dir
from sao.runtime.engine_guard import SupervisedEngine
from sao.runtime.engine_pool import EnginePool
from sao.runtime.native_weight_sync import NativeSender, NativeSync

# ---- the bucket layouts ------------------------------------------------------------------------------------


def test_vllm_chunks_close_once_their_total_exceeds_the_buffer_crossing_tensor_included():
    assert vllm_packed_chunks([3, 3, 3], 5) == [range(0, 2), range(2, 3)]
    assert vllm_packed_chunks([5, 1], 5) == [range(0, 2)]  # reaching the buffer is not exceeding it
    assert vllm_packed_chunks([10, 1, 0], 5) == [range(0, 1), range(1, 3)]
    assert vllm_packed_chunks([0, 0], 5) == [range(0, 2)]  # a chunk of empty tensors is still a chunk
    assert vllm_packed_chunks([], 5) == []
    with pytest.raises(ValueError, match="bucket size"):
        vllm_packed_chunks([1], 0)


def test_fitted_buckets_hold_at_most_the_size_and_a_big_tensor_alone():
    assert fitted_buckets([3, 3, 3], 6) == [range(0, 2), range(2, 3)]
    assert fitted_buckets([2, 10, 2], 6) == [range(0, 1), range(1, 2), range(2, 3)]
    assert fitted_buckets([1, 4], 100, itemsizes=[1, 4]) == [range(0, 1), range(1, 2)]  # offset 1 for f32
    assert fitted_buckets([], 6) == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=30), st.integers(1, 64))
def test_vllm_chunks_follow_the_rule_and_fitted_buckets_are_full(sizes, size):
    chunks = vllm_packed_chunks(sizes, size)
    assert [i for c in chunks for i in c] == list(range(len(sizes)))
    for k, chunk in enumerate(chunks):
        total = sum(sizes[i] for i in chunk)
        if k < len(chunks) - 1:  # closed by its last tensor, which crossed the size
            assert total > size and total - sizes[chunk[-1]] <= size
        else:
            assert total > size or total - sizes[chunk[-1]] <= size
    buckets = fitted_buckets(sizes, size)
    assert [i for b in buckets for i in b] == list(range(len(sizes)))
    for k, bucket in enumerate(buckets):
        total = sum(sizes[i] for i in bucket)
        assert total <= size or len(bucket) == 1
        if k < len(buckets) - 1:  # the next tensor did not fit
            assert total + sizes[buckets[k + 1][0]] > size


def test_misaligned_names_a_tensor_the_servers_cannot_view():
    specs = [TensorSpec("mask", "bool", (3,)), TensorSpec("w", "float32", (2,))]
    assert misaligned(specs, vllm_packed_chunks([s.nbytes for s in specs], 100)) == ["w"]
    assert misaligned(specs, plan_buckets(specs, 100, "sglang")) == []  # SGLang's buckets are ours to cut


_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8, torch.int32, torch.int64,
           torch.uint8, torch.bool]  # fmt: skip


def _bits(t: torch.Tensor) -> bytes:
    """The elements' bytes in logical order (a fresh contiguous copy's whole storage)."""
    return bytes(t.detach().contiguous().clone().untyped_storage())


def _random_tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int, transpose: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (math.prod(shape) * dtype.itemsize,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        raw = raw % 2
    tensor = raw.view(dtype).reshape(shape)
    return tensor.t() if transpose and tensor.dim() == 2 else tensor  # a non-contiguous input


_tensors = st.lists(
    st.tuples(st.sampled_from(_DTYPES), st.lists(st.integers(0, 5), max_size=3).map(tuple), st.booleans()),
    min_size=1,
    max_size=8,
)


@settings(max_examples=100, deadline=None)
@given(_tensors, st.integers(0, 2**31), st.integers(1, 96))
def test_buckets_pack_and_unpack_bit_for_bit_for_any_dtypes_and_shapes(entries, seed, size):
    state = {f"t{i}": _random_tensor(d, s, seed + i, tr) for i, (d, s, tr) in enumerate(entries)}
    specs = tensor_spec_list(state)
    tensors = list(state.values())
    for wire in ("vllm", "sglang"):
        got: dict[str, torch.Tensor] = {}
        for bucket in plan_buckets(specs, size, wire):  # type: ignore[arg-type]
            flat = pack_bucket([tensors[i] for i in bucket])
            assert _bits(flat) == b"".join(_bits(tensors[i]) for i in bucket)  # the servers' byte layout
            got.update(unpack_bucket(flat, [specs[i] for i in bucket]))
        assert list(got) == list(state)
        for name, tensor in state.items():
            assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape
            assert _bits(got[name]) == _bits(tensor), (wire, name)


# ---- two processes over gloo -------------------------------------------------------------------------------


class _Counting:
    """A `SyncGroup` that counts its broadcasts."""

    def __init__(self, group: SyncGroup) -> None:
        self.group, self.device, self.calls = group, group.device, 0

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        self.calls += 1
        self.group.broadcast(tensor, src)


def _gloo_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {
        "embed": torch.randn(16, 8, generator=g).to(torch.bfloat16),
        "norm": torch.randn(8, generator=g),
        "ids": torch.arange(5, dtype=torch.int64),
        "lm_head": torch.randn(8, 16, generator=g).t(),
    }


def _gloo_main(rank: int, port: int) -> None:
    torch.set_num_threads(1)
    group = _Counting(open_sync_group("127.0.0.1", port, rank, 2, timeout_s=60))
    state = _gloo_state()
    total = sum(t.numel() * t.element_size() for t in state.values())
    # sao's own path (WeightSender): a length and the metadata, then one broadcast per 100-byte bucket.
    if rank == 0:
        WeightSender(group, bucket_bytes=100).send(state, version=4)  # type: ignore[arg-type]
    else:
        receiver = WeightReceiver(group)  # type: ignore[arg-type]
        got = receiver.receive()
        assert receiver.version == 4 and list(got) == list(state)
        assert all(_bits(got[n]) == _bits(t) for n, t in state.items())
    assert group.calls == 2 + math.ceil(total / 100)
    # The native sender's buckets (SGLang's rule, 200 bytes), cut on the receiver as SGLang does.
    specs = tensor_spec_list(state)
    buckets = plan_buckets(specs, 200, "sglang")
    before = group.calls
    if rank == 0:
        assert send_buckets(group, list(state.values()), buckets, "cpu") == len(buckets)
    else:
        for bucket in buckets:
            flat = torch.empty(sum(specs[i].nbytes for i in bucket), dtype=torch.uint8)
            group.broadcast(flat)
            for name, tensor in unpack_bucket(flat, [specs[i] for i in bucket]):
                assert _bits(tensor) == _bits(state[name]), name
    assert group.calls - before == len(buckets) and 1 < len(buckets) < len(state)
    group.broadcast(torch.zeros(1))  # a barrier: rank 0, which serves the store, leaves last
    group.group.close()


def test_both_broadcast_paths_send_one_broadcast_per_bucket_bit_for_bit_over_gloo():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_gloo_main, args=(port,), nprocs=2, join=True)


# ---- NativeSync against servers that answer like vLLM / SGLang ---------------------------------------------

_TIMEOUT_S = 3.0
_VLLM_GROUP = "sao_test_vllm"  # the trainer end and the fake's workers meet under it (vLLM's is its own)


def _vllm_chunks(sizes: list[int], buffer_bytes: int) -> list[list[int]]:
    """vLLM's consumer (``packed_nccl_broadcast_consumer``): tensors until the total exceeds the buffer."""
    chunks, current, total = [], [], 0
    for index, size in enumerate(sizes):
        current.append(index)
        total += size
        if total > buffer_bytes:
            chunks.append(current)
            current, total = [], 0
    if current:
        chunks.append(current)
    return chunks


def _specs(names: list[str], dtypes: list[str], shapes: list[list[int]]) -> list[TensorSpec]:
    return [TensorSpec(n, d, tuple(s)) for n, d, s in zip(names, dtypes, shapes, strict=True)]


_SESSION = ("/begin_weight_update", "/update_weights_from_distributed", "/end_weight_update")


class FakeServer:
    """Answers like a vLLM 0.33 (``wire="vllm"``) or SGLang 0.5 server with ``workers`` workers, records
    ``(path, body or query)`` of every POST, and receives weights over the group for real (module
    docstring): ``weights`` is what every worker got. ``fail``: path -> status it answers instead."""

    def __init__(self, wire: str, workers: int = 1) -> None:
        self.wire, self.workers = wire, workers
        self.requests: list[tuple[str, Any]] = []
        self.weights: dict[str, torch.Tensor] = {}
        self.groups: list[SyncGroup] = []
        self.packed_bytes: int | None = None
        self.fail: dict[str, int] = {}
        self.session = False  # SGLang 0.5.23 loads only between /begin_weight_update and /end_weight_update
        self.app = FastAPI()

        @self.app.get("/get_world_size")
        async def world_size() -> dict[str, int]:
            return {"world_size": workers}

        @self.app.get("/get_server_info")
        async def server_info() -> dict[str, Any]:
            return {"tp_size": workers, "version": "0.5.23"}

        @self.app.post("/{path:path}")
        async def handle(path: str, request: Request) -> JSONResponse:
            route = "/" + path
            raw = await request.body()
            body = await request.json() if raw else dict(request.query_params)
            self.requests.append((route, body))
            if route in self.fail:
                return JSONResponse({"success": False, "message": f"{route} refused"}, self.fail[route])
            if self.wire == "sglang" and route in _SESSION:
                opening = route == "/begin_weight_update"
                if opening == self.session:  # a second begin, or a load or an end outside a session
                    return JSONResponse({"success": False, "message": "weight-update session"}, 400)
                if route != "/update_weights_from_distributed":
                    self.session = opening
            return JSONResponse(await asyncio.to_thread(self._answer, route, body))

    @property
    def paths(self) -> list[str]:
        return [path for path, _ in self.requests]

    def bodies(self, path: str) -> list[Any]:
        return [body for p, body in self.requests if p == path]

    def _answer(self, route: str, body: Any) -> dict[str, Any]:
        if route == "/init_weight_transfer_engine":
            info = body["init_info"]
            self.packed_bytes = info["packed_buffer_size_bytes"] if info.get("packed") else None
            self._join(info["master_address"], info["master_port"], info["rank_offset"], info["world_size"],
                       _VLLM_GROUP)  # fmt: skip
        elif route == "/init_weights_update_group":
            assert body["backend"] == "gloo"
            self._join(body["master_address"], body["master_port"], body["rank_offset"], body["world_size"],
                       body["group_name"])  # fmt: skip
        elif route == "/update_weights":
            info = body["update_info"]
            specs = _specs(info["names"], info["dtype_names"], info["shapes"])
            if self.packed_bytes is None:
                self._receive(specs, [[i] for i in range(len(specs))], flat=False)
            else:
                self._receive(specs, _vllm_chunks([s.nbytes for s in specs], self.packed_bytes), flat=True)
        elif route == "/update_weights_from_distributed":
            specs = _specs(body["names"], body["dtypes"], body["shapes"])
            flat = body.get("load_format") == "flattened_bucket"
            each = [[i] for i in range(len(specs))]
            self._receive(specs, [list(range(len(specs)))] if flat else each, flat)
        elif route in ("/destroy_weights_update_group", "/shutdown_weight_transfer_engine"):
            for group in self.groups:
                group.close()
            self.groups = []
        return {"success": True, "message": "ok"}

    def _on_workers(self, work: Any) -> list[Any]:
        """``work(worker)`` on every worker at once (a collective needs them all), results in order."""
        results: list[Any] = [None] * self.workers
        errors: list[BaseException] = []

        def run(i: int) -> None:
            try:
                results[i] = work(i)
            except BaseException as err:
                errors.append(err)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(self.workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return results

    def _join(self, host: str, port: int, offset: int, world: int, name: str) -> None:
        join = lambda i: open_sync_group(host, port, offset + i, world, timeout_s=_TIMEOUT_S, group_name=name)  # noqa: E731
        self.groups = self._on_workers(join)

    def _receive(self, specs: list[TensorSpec], buckets: list[list[int]], flat: bool) -> None:
        def receive(i: int) -> dict[str, torch.Tensor]:
            got = {}
            for bucket in buckets:
                if not flat:  # one broadcast of exactly the tensor's dtype and shape
                    spec = specs[bucket[0]]
                    tensor = torch.empty(spec.shape, dtype=getattr(torch, spec.dtype))
                    self.groups[i].broadcast(tensor)
                    got[spec.name] = tensor
                    continue
                buffer = torch.empty(sum(specs[j].nbytes for j in bucket), dtype=torch.uint8)
                self.groups[i].broadcast(buffer)
                offset = 0
                for j in bucket:  # cut as the servers do: a slice viewed as the dtype (refuses misalignment)
                    spec = specs[j]
                    part = buffer[offset : offset + spec.nbytes]
                    got[spec.name] = part.view(getattr(torch, spec.dtype)).reshape(spec.shape).clone()
                    offset += spec.nbytes
            return got

        received = self._on_workers(receive)
        for other in received[1:]:
            assert all(_bits(other[n]) == _bits(t) for n, t in received[0].items())
        self.weights.update(received[0])


class _Remote:
    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def remote(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return asyncio.ensure_future(asyncio.to_thread(fn, self.actor, *args, **kwargs))


def _gloo_trainer_end(host: str, port: int, world_size: int) -> SyncGroup:
    return open_sync_group(host, port, 0, world_size, timeout_s=_TIMEOUT_S, group_name=_VLLM_GROUP)


class FakeRankActor:
    """A trainer rank as `RayTrainerEnd` reaches it: ``__ray_call__.remote(fn, ...)`` runs ``fn(actor, ...)``
    (here in a thread); ``_pushed_state`` is rank 0's full state and None elsewhere, as after the gather."""

    def __init__(self, rank: int, owner: FakeTrainerGroup) -> None:
        self.rank, self.owner, self.gathers = rank, owner, 0
        self.__ray_call__ = _Remote(self)
        if rank == 0:  # the trainer's end of the vLLM group: gloo in place of vLLM's trainer_init
            self._native_sender = NativeSender(vllm_group=_gloo_trainer_end)

    def _pushed_state(self) -> dict[str, torch.Tensor] | None:
        self.gathers += 1
        return dict(self.owner.state) if self.rank == 0 else None


class FakeTrainerGroup:
    """What `NativeSync` and its disk fallback use of a `TrainerGroup`."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        self.state = state
        self.ranks = [FakeRankActor(0, self), FakeRankActor(1, self)]

    def sync_rendezvous(self) -> tuple[str, int]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return "127.0.0.1", s.getsockname()[1]

    def write_weights(self, directory: Path) -> str:
        return str(write_update_dir(self.state, directory))


def _state(seed: int) -> dict[str, torch.Tensor]:
    """Aligned for both servers (every offset a multiple of its item size), with fused experts."""
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(12, 4, generator=g).to(torch.bfloat16),
        "model.layers.0.mlp.experts.gate_up_proj": torch.randn(2, 6, 4, generator=g),
        "model.layers.0.mlp.experts.down_proj": torch.randn(2, 4, 3, generator=g),
        "model.norm.weight": torch.randn(4, generator=g),
        "lm_head.weight": torch.randn(12, 4, generator=g).to(torch.bfloat16),
    }


async def _close(sync: NativeSync, engines: list[Any]) -> None:
    await sync._leave()  # the servers' groups and the trainer's end, before the servers go
    for engine in engines:
        await engine.close()


async def _unused() -> Any:
    raise AssertionError("no replica restarts in these tests")


def _pool(engines: list[Any]) -> EnginePool:
    return EnginePool([SupervisedEngine(e, _unused, _unused, max_restarts=0) for e in engines])


@pytest.fixture
def servers(serve_app):
    def start(wire: str, workers: list[int]) -> tuple[list[FakeServer], list[str]]:
        fakes = [FakeServer(wire, w) for w in workers]
        return fakes, [serve_app(f.app) for f in fakes]

    return start


def _run(main: Any) -> Any:
    return asyncio.run(main())


def _assert_received(server: FakeServer, state: dict[str, torch.Tensor]) -> None:
    want = to_engine_state_dict(state)  # what the disk path writes: checkpoint names, experts unfused
    assert list(server.weights) == list(want)
    assert all(_bits(server.weights[n]) == _bits(t) for n, t in want.items())


def test_vllm_replicas_get_every_bucket_of_each_push_in_the_pause_update_resume_order(servers, tmp_path):
    fakes, urls = servers("vllm", [2, 1])  # 2 + 1 workers: ranks 1-2 and 3 of a world of 4
    group = FakeTrainerGroup(_state(0))

    async def main() -> tuple[list[int], int, tuple[int, int]]:
        engines = [VLLMEngine(url, "m", 64, settle_s=0.001) for url in urls]
        sync = NativeSync(group, _pool(engines), tmp_path, wire="vllm", bucket_bytes=64, backend="gloo",
                          timeout_s=_TIMEOUT_S)  # fmt: skip
        try:
            await sync.push(1)
            broadcasts = sync.last_broadcasts
            for fake in fakes:
                _assert_received(fake, group.state)
            group.state = _state(1)
            await sync.push(2)
            return [e.version for e in engines], broadcasts, (sync.formed, sync.fallbacks)
        finally:
            await _close(sync, engines)

    versions, broadcasts, (formed, fallbacks) = _run(main)
    assert versions == [2, 2] and (formed, fallbacks) == (1, 0)
    sizes = [s.nbytes for s in tensor_spec_list(to_engine_state_dict(group.state))]
    assert broadcasts == len(_vllm_chunks(sizes, 64)) > 1  # one broadcast per chunk, not per tensor
    inits = [f.bodies("/init_weight_transfer_engine")[0]["init_info"] for f in fakes]
    keys = ("rank_offset", "world_size", "packed", "packed_buffer_size_bytes")
    assert [tuple(i[k] for k in keys) for i in inits] == [(1, 4, True, 64), (3, 4, True, 64)]
    push = ["/pause", "/start_weight_update", "/update_weights", "/finish_weight_update"]
    push += ["/reset_prefix_cache", "/resume"]
    for fake in fakes:
        assert fake.paths == [
            "/init_weight_transfer_engine",
            *push,
            *push,
            "/shutdown_weight_transfer_engine",
        ]
        assert fake.bodies("/pause")[0] == {"mode": "keep"}
        assert [b["weight_version"] for b in fake.bodies("/finish_weight_update")] == ["1", "2"]
        assert set(fake.bodies("/update_weights")[1]["update_info"]) == {"names", "dtype_names", "shapes"}
        _assert_received(fake, group.state)


def test_sglang_replicas_get_one_flattened_bucket_request_per_bucket_version_on_the_last(servers, tmp_path):
    fakes, urls = servers("sglang", [1, 2])
    group = FakeTrainerGroup(_state(2))

    async def main() -> tuple[list[int], int]:
        engines = [SGLangEngine(url, settle_s=0.001) for url in urls]
        sync = NativeSync(group, _pool(engines), tmp_path, wire="sglang", bucket_bytes=96, backend="gloo",
                          timeout_s=_TIMEOUT_S)  # fmt: skip
        try:
            await sync.push(7)
            return [e.version for e in engines], sync.last_broadcasts
        finally:
            await _close(sync, engines)

    versions, broadcasts = _run(main)
    specs = tensor_spec_list(to_engine_state_dict(group.state))
    buckets = fitted_buckets([s.nbytes for s in specs], 96)
    assert versions == [7, 7] and broadcasts == len(buckets) > 1
    inits = [f.bodies("/init_weights_update_group")[0] for f in fakes]
    assert [(i["rank_offset"], i["world_size"]) for i in inits] == [(1, 4), (2, 4)]
    assert inits[0]["group_name"] == inits[1]["group_name"]
    for fake in fakes:
        updates = fake.bodies("/update_weights_from_distributed")
        updated = ["/update_weights_from_distributed"] * len(buckets)
        pushed = ["/pause_generation", "/begin_weight_update", *updated, "/end_weight_update"]
        pushed += ["/continue_generation"]
        assert fake.paths == ["/init_weights_update_group", *pushed, "/destroy_weights_update_group"]
        assert [u["names"] for u in updates] == [[specs[i].name for i in b] for b in buckets]
        assert {(u["load_format"], u["group_name"], u["flush_cache"]) for u in updates} == {
            ("flattened_bucket", inits[0]["group_name"], False)
        }
        assert ["weight_version" in u for u in updates] == [False] * (len(buckets) - 1) + [True]
        assert updates[-1]["weight_version"] == "7"
        _assert_received(fake, group.state)


def test_a_replaced_replica_gets_a_fresh_group_and_the_old_one_is_destroyed(servers, tmp_path):
    (fake,), (url,) = servers("sglang", [1])
    group = FakeTrainerGroup(_state(4))

    async def main() -> tuple[int, int]:
        engines = [SGLangEngine(url, settle_s=0.001)]
        pool = _pool(engines)
        sync = NativeSync(group, pool, tmp_path, wire="sglang", bucket_bytes=128, backend="gloo",
                          timeout_s=_TIMEOUT_S)  # fmt: skip
        try:
            await sync.push(1)
            engines.append(SGLangEngine(url, settle_s=0.001))  # what a restart leaves in the replica
            pool.replicas[0]._engine = engines[-1]
            group.state = _state(5)
            await sync.push(2)
            return sync.formed, engines[-1].version
        finally:
            await _close(sync, engines)

    assert _run(main) == (2, 2)
    names = [b["group_name"] for b in fake.bodies("/init_weights_update_group")]
    assert len(set(names)) == 2 and fake.bodies("/destroy_weights_update_group")[0]["group_name"] == names[0]
    inits = [i for i, path in enumerate(fake.paths) if path == "/init_weights_update_group"]
    assert inits[0] < fake.paths.index("/destroy_weights_update_group") < inits[1]  # old left before new
    _assert_received(fake, group.state)


def test_a_group_that_cannot_be_formed_sends_by_disk_until_a_replica_is_replaced(servers, tmp_path):
    (fake,), (url,) = servers("sglang", [1])
    fake.fail["/init_weights_update_group"] = 400
    group = FakeTrainerGroup(_state(3))

    async def main() -> list[tuple[int, int, int]]:
        engines = [SGLangEngine(url, settle_s=0.001)]
        pool = _pool(engines)
        sync = NativeSync(group, pool, tmp_path / "weights", wire="sglang", bucket_bytes=128, backend="gloo",
                          timeout_s=_TIMEOUT_S)  # fmt: skip
        seen = []
        try:
            for version in (1, 2, 3):
                if version == 3:  # the server was fixed and the replica restarted
                    fake.fail.clear()
                    engines.append(SGLangEngine(url, settle_s=0.001))
                    pool.replicas[0]._engine = engines[-1]
                await sync.push(version)
                seen.append((engines[-1].version, sync.fallbacks, sync.formed))
            return seen
        finally:
            await _close(sync, engines)

    # 1: the init fails (the trainer's join waits out the timeout), disk; 2: disk at once, no new init;
    # 3: a new replica, a new group, native.
    assert _run(main) == [(1, 1, 0), (2, 2, 0), (3, 2, 1)]
    assert len(fake.bodies("/init_weights_update_group")) == 2
    disk = fake.bodies("/update_weights_from_disk")
    assert [Path(d["model_path"]).name for d in disk] == ["v00000001", "v00000002"]
    assert "/destroy_weights_update_group" in fake.paths  # the half-formed group was left
    assert fake.bodies("/update_weights_from_distributed")[-1]["weight_version"] == "3"
    _assert_received(fake, group.state)


def test_a_vllm_chunk_the_server_could_not_cut_is_refused_before_any_broadcast(servers, tmp_path):
    (fake,), (url,) = servers("vllm", [1])
    group = FakeTrainerGroup({"mask": torch.tensor([True, False, True]), "w": torch.ones(2)})

    async def main() -> int:
        engine = VLLMEngine(url, "m", 64, settle_s=0.001)
        sync = NativeSync(group, _pool([engine]), tmp_path, wire="vllm", bucket_bytes=1024, backend="gloo",
                          timeout_s=_TIMEOUT_S)  # fmt: skip
        try:
            await sync.push(1)
            return sync.fallbacks
        finally:
            await _close(sync, [engine])

    assert _run(main) == 1
    assert "/update_weights" not in fake.paths and "/start_weight_update" not in fake.paths
    assert fake.bodies("/collective_rpc")[0]["method"] == "reload_weights"  # the version went by disk


# ---- runtime.weight_sync=auto ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "runtime", "engine", "engine_gpus", "trainer_gpus", "path"),
    [
        ("auto", "local", "local", 0, 0, "inproc"),
        ("auto", "local", "vllm", 1, 1, "inproc"),
        ("auto", "ray", "local", 1, 1, "broadcast"),
        ("auto", "ray", "vllm", 1, 1, "vllm"),
        ("auto", "ray", "sglang", 2, 1, "sglang"),
        ("auto", "ray", "vllm", 0, 1, "disk"),  # CPU servers
        ("auto", "ray", "sglang", 1, 0, "disk"),  # a CPU trainer
        ("disk", "ray", "vllm", 1, 1, "disk"),
        ("sglang", "ray", "sglang", 1, 1, "sglang"),
    ],
)
def test_auto_picks_the_native_transfer_only_for_servers_with_gpus_on_both_ends(
    setting, runtime, engine, engine_gpus, trainer_gpus, path
):
    gpus = {"engine_gpus": engine_gpus, "trainer_gpus": trainer_gpus}
    assert weight_sync_path(setting, runtime, engine, **gpus) == path


_RAY = ["model.tiny_arch=qwen3_moe", "runtime.backend=ray"]
_GPU_RAY = [*_RAY, "cluster.num_gpus=2", "cluster.engine_gpus=1", "cluster.trainer_gpus=1"]


def test_a_gpu_ray_config_with_server_replicas_resolves_auto_to_their_native_transfer():
    for server in ("vllm", "sglang"):
        cfg = load_config(None, [*_GPU_RAY, f"engine.backend={server}", "runtime.weight_bucket_mb=64"])
        assert cfg.runtime.resolved_weight_sync(server, cfg.cluster) == server
        assert cfg.runtime.weight_bucket_mb == 64
    cpu = load_config(None, [*_RAY, "engine.backend=vllm"])
    assert cpu.runtime.resolved_weight_sync("vllm", cpu.cluster) == "disk"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([*_GPU_RAY, "engine.backend=vllm", "runtime.weight_sync=sglang"], r"runtime\.weight_sync='sglang'"),
        ([*_GPU_RAY, "runtime.weight_sync=vllm"], r"runtime\.weight_sync='vllm' is the native transfer"),
        ([*_RAY, "engine.backend=sglang", "runtime.weight_sync=sglang"], r"'sglang' \(NCCL\) needs GPUs"),
        (
            ["model.tiny_arch=qwen3_moe", "engine.backend=vllm", "runtime.weight_sync=vllm"],
            r"runtime\.weight_sync='vllm' applies to runtime\.backend='ray'",
        ),
        (["model.tiny_arch=qwen3_moe", "runtime.weight_bucket_mb=64"], r"runtime\.weight_bucket_mb applies"),
        (
            [*_RAY, "engine.backend=vllm", "runtime.weight_bucket_mb=64"],
            r"runtime\.weight_bucket_mb .*resolves to 'disk'",
        ),
    ],
)
def test_a_native_sync_that_cannot_apply_is_a_config_error_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)
