"""The colocated CUDA-IPC hand-off: two processes on one GPU, the engine loading the trainer's tensors."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from sao.engine.cuda_ipc import open_shared_state, share_state


def test_cpu_tensors_pass_through_and_unknown_kinds_are_refused():
    state = {"a": torch.arange(3.0)}
    handles, keep = share_state(state)
    assert keep == [] and torch.equal(open_shared_state(handles)["a"], state["a"])
    with pytest.raises(ValueError, match="unknown shared tensor kind"):
        open_shared_state({"a": ("disk", None)})


def _engine_side(model_dir: str, handles, out) -> None:  # the child: an engine colocated on the GPU
    from sao.engine.local import LocalEngine
    from sao.runtime.ray_engine import state_checksum

    shared = open_shared_state(handles)
    assert all(t.is_cuda for t in shared.values())
    engine = LocalEngine(model_dir, device="cuda", dtype="float32", max_running=2)
    import asyncio

    asyncio.run(engine.update_weights(shared, 3))
    out.put((state_checksum(engine.model.state_dict()), engine.version))
    asyncio.run(engine.close())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_an_engine_process_loads_the_trainers_cuda_weights_through_ipc_handles(tiny_moe_dir):
    from sao.models.loading import load_policy
    from sao.runtime.ray_engine import state_checksum

    policy = load_policy(tiny_moe_dir, dtype="float32", device="cuda")
    with torch.no_grad():
        for p in policy.parameters():
            p.mul_(1.25)  # "trained": unlike the weights on disk
    handles, keep = share_state(policy.state_dict())
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=_engine_side, args=(str(tiny_moe_dir), handles, out))
    child.start()
    checksum, version = out.get(timeout=300)
    child.join(timeout=60)
    assert child.exitcode == 0 and version == 3
    assert checksum == state_checksum(policy.state_dict())
    del keep
