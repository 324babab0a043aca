"""Weight pushes over a standalone process group: the bucket layout (pure), the protocol over an in-process
fake group, and a real 3-process gloo push next to a default process group in rank 0."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor

from sao.engine.weight_broadcast import (
    Segment,
    SyncGroup,
    WeightReceiver,
    WeightSender,
    copy_plan,
    open_sync_group,
)
from sao.engine.weights import to_engine_state_dict

# ---- the bucket layout -----------------------------------------------------------------------------------


def test_copy_plan_splits_large_tensors_and_packs_small_ones():
    plan = copy_plan([5, 2, 0, 7], bucket_bytes=4)
    assert plan == [
        [Segment(0, 0, 0, 4)],
        [Segment(0, 4, 0, 1), Segment(1, 0, 1, 2), Segment(3, 0, 3, 1)],
        [Segment(3, 1, 0, 4)],
        [Segment(3, 5, 0, 2)],
    ]


def test_copy_plan_covers_every_byte_once_and_fills_all_buckets_but_the_last():
    sizes = [3, 17, 1, 0, 64, 9]
    for bucket_bytes in (1, 4, 16, 64, 1000):
        plan = copy_plan(sizes, bucket_bytes)
        totals = [sum(s.nbytes for s in b) for b in plan]
        assert all(t == bucket_bytes for t in totals[:-1]) and 0 < totals[-1] <= bucket_bytes
        covered = sorted((s.tensor, s.tensor_offset, s.nbytes) for b in plan for s in b)
        for index, size in enumerate(sizes):
            parts = [(off, n) for t, off, n in covered if t == index]
            assert sum(n for _, n in parts) == size
            assert [off for off, _ in parts] == [sum(n for _, n in parts[:i]) for i in range(len(parts))]


def test_copy_plan_of_nothing_is_empty_and_rejects_a_zero_bucket():
    assert copy_plan([], 8) == [] and copy_plan([0, 0], 8) == []
    with pytest.raises(ValueError, match="bucket_bytes"):
        copy_plan([1], 0)


# ---- the protocol, over an in-process fake group ---------------------------------------------------------


class _Recorder:
    """A rank-0 stand-in that keeps a copy of every broadcast."""

    device = torch.device("cpu")

    def __init__(self) -> None:
        self.sent: list[Tensor] = []

    def broadcast(self, tensor: Tensor, src: int = 0) -> None:
        self.sent.append(tensor.clone())


class _Replayer:
    """A receiver stand-in that gets what a `_Recorder` saw, in order."""

    device = torch.device("cpu")

    def __init__(self, sent: list[Tensor]) -> None:
        self.sent = list(sent)

    def broadcast(self, tensor: Tensor, src: int = 0) -> None:
        tensor.copy_(self.sent.pop(0))


def _bits(t: Tensor) -> Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _mixed_state(seed: int) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "w.f32": torch.randn(40, 30, generator=g),
        "w.bf16": torch.randn(64, 64, generator=g).to(torch.bfloat16),
        "idx": torch.arange(100, dtype=torch.int64) * (seed + 1),
        "scalar": torch.tensor(3.5 + seed),
        "noncontig": torch.randn(20, 30, generator=g).t(),
        "special": torch.tensor([float("nan"), -0.0, float("inf")]),
        "mask": torch.arange(11) % (seed + 2) == 0,
        "empty": torch.zeros(0, 3),
    }


def _moe_state(seed: int) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(10, 4, generator=g),
        "model.layers.0.mlp.experts.gate_up_proj": torch.randn(2, 6, 4, generator=g),
        "model.layers.0.mlp.experts.down_proj": torch.randn(2, 4, 3, generator=g),
    }


def _assert_bitwise_equal(got: dict[str, Tensor], want: dict[str, Tensor]) -> None:
    assert list(got) == list(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert torch.equal(_bits(got[name].cpu()), _bits(tensor.cpu())), name


def test_a_push_round_trips_every_dtype_bitwise_with_a_bucket_smaller_than_some_tensors():
    state = _mixed_state(0)
    recorder = _Recorder()
    WeightSender(recorder, bucket_bytes=1000).send(state, version=7)  # type: ignore[arg-type]
    buckets = recorder.sent[2:]
    assert max(b.numel() for b in buckets) == 1000  # bigger than idx and scalar, smaller than the weights
    receiver = WeightReceiver(_Replayer(recorder.sent))  # type: ignore[arg-type]
    _assert_bitwise_equal(receiver.receive(), state)
    assert receiver.version == 7


def test_a_push_with_dtype_and_unfuse_matches_the_disk_path():
    state = _moe_state(1)
    recorder = _Recorder()
    WeightSender(recorder, bucket_bytes=64, dtype=torch.bfloat16, unfuse=True).send(state, 3)  # type: ignore[arg-type]
    got = WeightReceiver(_Replayer(recorder.sent)).receive()  # type: ignore[arg-type]
    _assert_bitwise_equal(got, to_engine_state_dict(state, torch.bfloat16))


def test_the_cast_spares_integer_tensors_and_the_input_is_untouched():
    state = {"w": torch.ones(3), "ids": torch.tensor([1, 2], dtype=torch.int64)}
    before = {k: v.clone() for k, v in state.items()}
    recorder = _Recorder()
    WeightSender(recorder, 8, dtype=torch.float16).send(state, 0)  # type: ignore[arg-type]
    got = WeightReceiver(_Replayer(recorder.sent)).receive()  # type: ignore[arg-type]
    assert got["w"].dtype == torch.float16 and got["ids"].dtype == torch.int64
    _assert_bitwise_equal(state, before)


def test_a_non_tensor_value_is_rejected_before_anything_is_sent():
    recorder = _Recorder()
    with pytest.raises(ValueError, match="'lr' is a float"):
        WeightSender(recorder).send({"w": torch.ones(1), "lr": 0.1}, 0)  # type: ignore[arg-type, dict-item]
    assert recorder.sent == []


def test_a_receiver_rejects_metadata_from_something_else():
    payload = torch.frombuffer(bytearray(b'{"version": 1}'), dtype=torch.uint8)
    replay = _Replayer([torch.tensor([payload.numel()]), payload])
    with pytest.raises(ValueError, match="not from a sao WeightSender"):
        WeightReceiver(replay).receive()  # type: ignore[arg-type]


def test_open_sync_group_validates_its_arguments_before_touching_the_network():
    with pytest.raises(ValueError, match="rank 3"):
        open_sync_group("127.0.0.1", 1, 3, 3)
    with pytest.raises(ValueError, match="backend"):
        open_sync_group("127.0.0.1", 1, 0, 3, backend="mpi")
    with pytest.raises(ValueError, match="gloo moves CPU tensors"):
        open_sync_group("127.0.0.1", 1, 0, 3, device="cuda:0")


# ---- three processes over gloo ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, sync_port: int, default_port: int, backend: str) -> None:
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    if rank == 0:  # the trainer's own world (FSDP's, in a run): a 1-rank default group, made first
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{default_port}", rank=0, world_size=1)
    group: SyncGroup = open_sync_group("127.0.0.1", sync_port, rank, 3, backend=backend, timeout_s=60)
    if rank == 0:
        WeightSender(group, bucket_bytes=1000).send(_mixed_state(0), version=1)
        WeightSender(group, bucket_bytes=100, dtype=torch.bfloat16, unfuse=True).send(_moe_state(5), 2)
        ones = torch.ones(2)
        dist.all_reduce(ones)  # the default group still works, and is still a world of one
        assert dist.get_world_size() == 1 and torch.equal(ones, torch.ones(2))
        dist.destroy_process_group()
    else:
        assert not dist.is_initialized()  # engines have no default group and the sync group made none
        receiver = WeightReceiver(group)
        _assert_bitwise_equal(receiver.receive(), _mixed_state(0))
        assert receiver.version == 1
        _assert_bitwise_equal(receiver.receive(), to_engine_state_dict(_moe_state(5), torch.bfloat16))
        assert receiver.version == 2
        assert not dist.is_initialized()
    group.broadcast(
        torch.zeros(1, device=group.device)
    )  # a barrier: rank 0, which serves the store, leaves after the others
    group.close()


def test_two_pushes_reach_two_receivers_bitwise_beside_a_default_group_in_rank_0():
    mp.spawn(_rank_main, args=(_free_port(), _free_port(), "gloo"), nprocs=3, join=True)


@pytest.mark.gpu
def test_the_same_pushes_over_nccl_one_gpu_per_rank():
    if not dist.is_nccl_available() or torch.cuda.device_count() < 3:
        pytest.skip("needs NCCL and 3 CUDA devices")
    mp.spawn(_rank_main, args=(_free_port(), _free_port(), "nccl"), nprocs=3, join=True)
