"""ProcessEngine: the local engine in a child process gives the local engine's results; weight updates go
through shared memory (and leave no files); invalid requests, cancellation, a killed child and close."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
import torch

from sao.engine.local import LocalEngine
from sao.engine.process import ProcessEngine
from sao.engine.shared_weights import SharedWeights
from sao.engine.types import InvalidRequestError, SamplingParams
from sao.models.tiny import build_tiny_model, tiny_checkpoint

SEEDED = [SamplingParams(max_new_tokens=12, seed=s) for s in range(6)]


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _leftover_weight_files(engine: ProcessEngine) -> list[str]:
    from sao.engine.shared_weights import _shm_dir

    return [p.name for p in _shm_dir().glob(f"sao-weights-{os.getpid()}-*")]


@pytest.fixture(scope="module")
def engine(tiny_moe_dir):
    """One child process for the module (startup imports transformers: seconds)."""
    eng = ProcessEngine(tiny_moe_dir, tiny_moe_dir, device="cpu", dtype="float32", max_running=8, threads=1)
    yield eng
    asyncio.run(eng.close())


async def _generate_all(engine, prompts, params):
    return await asyncio.gather(*(engine.generate(p, sp) for p, sp in zip(prompts, params, strict=True)))


def test_the_child_generates_exactly_what_a_local_engine_generates(engine, tiny_moe_dir):
    prompts = [prompt(5 + i, i) for i in range(len(SEEDED))]
    local = LocalEngine(tiny_moe_dir, device="cpu", dtype="float32", max_running=8)

    async def main():
        got = await _generate_all(engine, prompts, SEEDED)
        want = await _generate_all(local, prompts, SEEDED)
        await local.close()
        return got, want

    got, want = asyncio.run(main())
    for g, w in zip(got, want, strict=True):
        assert (g.token_ids, g.versions, g.finish_reason) == (w.token_ids, w.versions, w.finish_reason)
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-5)
    assert engine.stats()["tokens_generated"] >= 12 * len(SEEDED)


def test_weight_updates_through_shared_memory_match_a_local_engine_and_leave_no_files(
    engine, tiny_moe_dir, tmp_path
):
    new = build_tiny_model("qwen3_moe", "test", seed=1)
    new_state = new.state_dict()
    old_state = build_tiny_model("qwen3_moe", "test", seed=0).state_dict()
    p = prompt(7, 11)
    greedy = SamplingParams(max_new_tokens=10, temperature=0.0)
    reference = LocalEngine(new, device="cpu", max_running=2)

    async def main():
        want = await reference.generate(p, greedy)
        await reference.close()
        start = engine.version
        await engine.update_weights(new_state, start + 1)  # first full state dict: new shared buffers
        first = await engine.generate(p, greedy)
        await engine.update_weights(old_state, start + 2)  # same layout: written into the same buffers
        second = await engine.generate(p, greedy)
        await engine.update_weights({k: v for k, v in new_state.items() if "layers.0." in k}, start + 3)
        with pytest.raises(ValueError, match="not a parameter"):
            await engine.update_weights({"no.such.weight": torch.zeros(1)}, start + 4)
        with pytest.raises(ValueError, match="older"):
            await engine.update_weights(new_state, start)
        assert engine.version == start + 3
        directory = tiny_checkpoint(tmp_path / "v1", "qwen3_moe", "test", seed=1)
        await engine.update_weights(directory, start + 5)
        third = await engine.generate(p, greedy)
        return start, want, first, second, third

    start, want, first, second, third = asyncio.run(main())
    assert first.token_ids == want.token_ids and first.versions == [start + 1] * 10
    assert second.token_ids != want.token_ids and second.versions == [start + 2] * 10
    assert third.token_ids == want.token_ids and third.versions == [start + 5] * 10
    assert engine.version == start + 5
    assert _leftover_weight_files(engine) == []


def test_an_update_lands_between_decode_steps_of_a_running_request(engine):
    weights = build_tiny_model("qwen3_moe", "test", seed=2).state_dict()
    params = SamplingParams(max_new_tokens=400, temperature=0.0)

    async def attempt():
        version = engine.version + 1
        task = asyncio.create_task(engine.generate(prompt(4, 3), params))
        await asyncio.sleep(0.1)  # the request is running in the child (400 tokens take ~0.5 s)
        await engine.update_weights(weights, version)
        return version, await task

    for _ in range(3):  # on a busy machine the request may finish before the update: try again
        version, out = asyncio.run(attempt())
        if version in out.versions and out.versions[0] == version - 1:
            break
    k = out.versions.index(version)
    assert k > 0 and out.versions == [version - 1] * k + [version] * (len(out.versions) - k)


def test_invalid_requests_fail_at_once_and_cancellation_reaches_the_child(engine):
    async def main():
        with pytest.raises(InvalidRequestError, match="empty prompt"):
            await engine.generate([], SamplingParams())
        with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
            await engine.generate([10**9], SamplingParams())
        task = asyncio.create_task(engine.generate(prompt(4, 1), SamplingParams(max_new_tokens=400)))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await engine.generate(prompt(4, 2), SamplingParams(max_new_tokens=3, seed=0))

    out = asyncio.run(main())
    assert len(out.token_ids) == 3  # still serving
    assert engine.stats()["running"] == 0.0 and engine.stats()["aborted"] >= 1  # the cancelled request


def test_a_killed_child_fails_pending_and_later_calls_instead_of_hanging(tiny_moe_dir):
    eng = ProcessEngine(tiny_moe_dir, device="cpu", dtype="float32", threads=1)

    async def main():
        task = asyncio.create_task(eng.generate(prompt(4, 1), SamplingParams(max_new_tokens=5000)))
        await asyncio.sleep(0.2)
        os.kill(eng._process.pid, signal.SIGKILL)
        pending = await asyncio.wait_for(task, 30)
        later = await eng.generate(prompt(4, 1), SamplingParams(max_new_tokens=3))
        with pytest.raises(RuntimeError, match="closed"):
            await eng.update_weights({"x": torch.zeros(1)}, 1)
        await eng.close()
        return pending, later

    pending, later = asyncio.run(main())
    for out in (pending, later):
        assert out.finish_reason == "error" and "exited with code -9" in out.error
    assert eng.stats()["process_alive"] == 0.0
    assert _leftover_weight_files(eng) == []  # the refused update left no shared-memory file


def test_close_aborts_running_requests_and_a_bad_model_path_fails_with_the_childs_error(
    tiny_moe_dir, tmp_path
):
    eng = ProcessEngine(tiny_moe_dir, device="cpu", dtype="float32", threads=1)

    async def main():
        task = asyncio.create_task(eng.generate(prompt(4, 1), SamplingParams(max_new_tokens=5000)))
        await asyncio.sleep(0.2)
        await eng.close()
        await eng.close()  # idempotent
        return await task, await eng.generate(prompt(4, 1), SamplingParams(max_new_tokens=3))

    running, later = asyncio.run(main())
    assert running.finish_reason == "abort" and 0 < len(running.token_ids) < 5000
    assert later.finish_reason == "abort" and eng._process.returncode == 0
    with pytest.raises(RuntimeError, match="failed to start") as err:
        ProcessEngine(tmp_path / "no-such-model", device="cpu")
    assert "no-such-model" in str(err.value)


def test_shared_weights_round_trip_through_pickle_as_file_mappings(tmp_path):
    import pickle

    state = {"a": torch.arange(6.0).view(2, 3), "b": torch.ones(4, dtype=torch.bfloat16), "c": torch.zeros(0)}
    shared = SharedWeights.allocate(state)
    shared.write(state)
    other = pickle.loads(pickle.dumps(shared)).attach()  # what the child does
    assert set(shared.files) == {"float32", "bfloat16"}
    for name, tensor in other.tensors().items():
        assert torch.equal(tensor, state[name]) and tensor.dtype == state[name].dtype
    shared.write({**state, "a": state["a"] + 1})  # the receiver sees writes: same memory
    assert torch.equal(other.tensors()["a"], state["a"] + 1)
    shared.unlink()
    assert not any(os.path.exists(path) for path, _ in shared.files.values())
    assert shared.matches(state) and not shared.matches({"a": state["a"]})
