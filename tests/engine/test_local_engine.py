"""LocalEngine: continuous batching equals one-at-a-time generation, recorded log-probs equal teacher forcing,
sampling filters and seeds, in-flight weight updates and versions, finish reasons, bad input, errors, close.
Plus the pure parts: `sampling` against a per-row reference, `Scheduler` admission and slots."""

from __future__ import annotations

import asyncio
import itertools
import random
import threading

import pytest
import torch
from transformers.cache_utils import DynamicCache

from sao.engine.local import LocalEngine
from sao.engine.local_request import Request
from sao.engine.local_scheduler import Scheduler, SlotMove
from sao.engine.sampling import sample, sampling_logprobs
from sao.engine.types import InferenceEngine, InvalidRequestError, SamplingParams
from sao.models.forward import token_logprobs
from sao.models.loading import load_policy
from sao.models.tiny import build_tiny_model, tiny_checkpoint
from sao.types import Batch, Trajectory

GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)


def run(coro):
    return asyncio.run(coro)


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture
def engine(tiny_moe_dir):
    return LocalEngine(tiny_moe_dir, device="cpu", max_running=8)


@pytest.fixture(scope="module")
def new_weights():
    """A state dict in the trainer's (in-memory) naming with other values: the tiny model of seed 1."""
    return build_tiny_model("qwen3_moe", "test", seed=1).state_dict()


def naive_greedy(model, ids: list[int], n: int) -> list[int]:
    """Greedy decoding by a full forward per token (no KV cache): the reference."""
    ids = list(ids)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[-n:]


def mixed_cache_greedy(old_model, new_model, ids: list[int], n: int) -> list[int]:
    """Greedy continuation by ``new_model`` over a KV cache of ``ids[:-1]`` computed by ``old_model`` (HF
    DynamicCache): what an engine that keeps the old KV across an update should produce."""
    cache = DynamicCache(config=old_model.config)
    out = []
    with torch.no_grad():
        old_model(torch.tensor([ids[:-1]]), past_key_values=cache, use_cache=True)
        token = ids[-1]
        for _ in range(n):
            logits = new_model(torch.tensor([[token]]), past_key_values=cache, use_cache=True).logits
            token = int(logits[0, -1].argmax())
            out.append(token)
    return out


# ------------------------------------------------------------------------------------------ sampling.py


def reference_logprobs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """One row, the textbook way: temper, keep the top-k, keep the nucleus, renormalise."""
    if temperature == 0:
        return torch.log_softmax(logits, -1)
    scaled = logits / temperature
    keep = torch.ones_like(scaled, dtype=torch.bool)
    if 0 < top_k < scaled.numel():
        keep &= scaled >= scaled.topk(top_k).values[-1]
    probs = torch.softmax(scaled.masked_fill(~keep, float("-inf")), -1)
    order = probs.argsort(descending=True, stable=True)
    mass = 0.0
    nucleus = torch.zeros_like(keep)
    for tok in order.tolist():
        if mass >= top_p or not keep[tok]:
            break
        nucleus[tok] = True
        mass += float(probs[tok])
    return torch.log_softmax(scaled.masked_fill(~nucleus, float("-inf")), -1)


ROWS = [(1.0, -1, 1.0), (0.7, 5, 1.0), (1.3, -1, 0.8), (0.5, 10, 0.6), (0.0, 3, 0.5), (2.0, 1, 1.0)]


def row_tensors(rows):
    return (
        torch.tensor([r[0] for r in rows]),
        torch.tensor([r[1] for r in rows]),
        torch.tensor([r[2] for r in rows]),
    )


def test_sampling_logprobs_equal_the_filtered_renormalised_distribution():
    logits = torch.randn(len(ROWS), 40, generator=torch.Generator().manual_seed(0)) * 3
    got = sampling_logprobs(logits, *row_tensors(ROWS))
    for i, row in enumerate(ROWS):
        want = reference_logprobs(logits[i], *row)
        assert torch.equal(got[i].isinf(), want.isinf()), f"row {i}: different kept sets"
        finite = want.isfinite()
        torch.testing.assert_close(got[i][finite], want[finite], atol=1e-6, rtol=0)
    assert bool((got[1].isfinite().sum() == 5) & (got[5].isfinite().sum() == 1))


def test_sample_records_the_logprob_of_the_sampled_token_and_never_a_filtered_one():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(len(ROWS), 40, generator=gen) * 3
    full = sampling_logprobs(logits, *row_tensors(ROWS))
    for _ in range(50):
        tokens, logprobs = sample(logits, *row_tensors(ROWS), torch.rand(len(ROWS), generator=gen))
        picked = full.gather(-1, tokens[:, None]).squeeze(-1)
        assert bool(picked.isfinite().all())
        torch.testing.assert_close(logprobs, picked, atol=1e-6, rtol=0)
    assert tokens[4] == logits[4].argmax()  # the greedy row


def test_sample_frequencies_follow_the_distribution_and_rows_are_independent():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -5.0]]).expand(20000, 5)
    params = (torch.full((20000,), 1.0), torch.full((20000,), 3), torch.full((20000,), 0.95))
    tokens, _ = sample(logits, *params, torch.rand(20000, generator=torch.Generator().manual_seed(2)))
    freq = torch.bincount(tokens, minlength=5).float() / 20000
    want = sampling_logprobs(logits[:1], *(p[:1] for p in params))[0].exp()
    torch.testing.assert_close(freq, want, atol=0.015, rtol=0)
    # a row's token depends on its own logits and uniform only
    mixed = torch.randn(6, 40, generator=torch.Generator().manual_seed(3))
    u = torch.rand(6, generator=torch.Generator().manual_seed(4))
    batch_tokens, _ = sample(mixed, *row_tensors(ROWS), u)
    for i in range(6):
        alone, _ = sample(mixed[i : i + 1], *(t[i : i + 1] for t in row_tensors(ROWS)), u[i : i + 1])
        assert alone.item() == batch_tokens[i].item()


# ------------------------------------------------------------------------------------ local_scheduler.py


def fake_request(i: int, reserve: int) -> Request:
    return Request(i, [1], SamplingParams(), reserve, torch.Generator(), lambda g: None)


def test_scheduler_admits_fifo_within_both_bounds_and_keeps_slots_dense():
    sched = Scheduler(max_running=3, max_kv_tokens=100)
    reqs = [fake_request(i, r) for i, r in enumerate([40, 30, 50, 10, 10])]
    for r in reqs:
        sched.add(r)
    assert sched.admit() == reqs[:2]  # the 50 does not fit; FIFO: nothing overtakes it
    assert sched.reserved == 70
    reqs[1].cached = 7
    assert sched.remove(reqs[0]) == SlotMove(src=1, dst=0, length=7)
    assert (reqs[1].slot, reqs[0].slot) == (0, -1)
    assert sched.admit() == [reqs[2], reqs[3]]  # 30 + 50 + 10: the running bound (3) stops at 3
    assert [r.slot for r in sched.running] == [0, 1, 2]
    assert sched.remove(reqs[3]) is None  # the last slot: nothing to move
    with pytest.raises(ValueError, match="max_kv_tokens"):
        sched.add(fake_request(9, 101))
    assert set(sched.drain()) == {reqs[1], reqs[2], reqs[4]} and sched.reserved == 0


# ------------------------------------------------------------------------------------------- the engine


async def staggered(engine, prompts, params_list, delays):
    async def one(p, params, delay):
        await asyncio.sleep(delay)
        return await engine.generate(p, params)

    return await asyncio.gather(*(one(*a) for a in zip(prompts, params_list, delays, strict=True)))


def test_continuous_batching_gives_the_same_greedy_tokens_as_one_at_a_time(engine):
    prompts = [prompt(n, i) for i, n in enumerate([3, 17, 1, 9, 30, 5])]
    params = [SamplingParams(max_new_tokens=n, temperature=0.0) for n in [12, 5, 20, 9, 14, 3]]

    async def main():
        together = await staggered(engine, prompts, params, [0, 0, 0.005, 0.01, 0.01, 0.02])
        alone = [await engine.generate(p, sp) for p, sp in zip(prompts, params, strict=True)]
        await engine.close()
        return together, alone

    together, alone = run(main())
    for t, a, sp in zip(together, alone, params, strict=True):
        assert t.token_ids == a.token_ids and len(t.token_ids) == sp.max_new_tokens
        assert t.finish_reason == "length"
        torch.testing.assert_close(torch.tensor(t.logprobs), torch.tensor(a.logprobs), atol=1e-5, rtol=0)
    assert together[4].token_ids == naive_greedy(engine.model, prompts[4], 14)


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen3"])
def test_recorded_logprobs_equal_teacher_forced_logprobs(arch, tiny_moe_dir, tiny_dense_dir):
    path = tiny_moe_dir if arch == "qwen3_moe" else tiny_dense_dir
    engine = LocalEngine(path, device="cpu", dtype="float32", max_running=4)
    lengths, news = [2, 11, 5, 23, 8, 1], [15, 4, 25, 9, 6, 12]  # 6 requests, 4 slots: queueing and moves

    async def main():
        ps = [prompt(n, 10 + i) for i, n in enumerate(lengths)]
        outs = await asyncio.gather(
            *(
                engine.generate(p, SamplingParams(max_new_tokens=n, seed=i))
                for i, (p, n) in enumerate(zip(ps, news, strict=True))
            )
        )
        await engine.close()
        return ps, outs

    ps, outs = run(main())
    trajs = [
        Trajectory(
            prompt_id=str(i),
            token_ids=p + o.token_ids,
            action_mask=[0] * len(p) + [1] * len(o.token_ids),
            rollout_logprobs=[0.0] * len(p) + o.logprobs,
            versions=[-1] * len(p) + o.versions,
            turn_ids=[-1] * len(p) + [0] * len(o.token_ids),
            rewards=[0.0],
        )
        for i, (p, o) in enumerate(zip(ps, outs, strict=True))
    ]
    batch = Batch.from_trajectories(trajs)
    trainer_model = load_policy(path, dtype="float32", device="cpu")
    with torch.no_grad():
        teacher, _ = token_logprobs(trainer_model, batch)
    mask = batch.action_mask
    torch.testing.assert_close(teacher[mask], batch.rollout_logprobs[mask], atol=1e-4, rtol=0)
    assert all(o.versions == [0] * len(o.token_ids) for o in outs)


def test_filtered_sampling_records_logprobs_of_the_renormalised_distribution(engine):
    params = [
        SamplingParams(max_new_tokens=10, temperature=0.7, top_k=20, seed=1),
        SamplingParams(max_new_tokens=10, temperature=1.5, top_p=0.8, seed=2),
        SamplingParams(max_new_tokens=10, temperature=0.9, top_k=50, top_p=0.9, seed=3),
    ]
    prompts = [prompt(n, 20 + n) for n in (4, 9, 2)]

    async def main():
        outs = await asyncio.gather(*(engine.generate(p, sp) for p, sp in zip(prompts, params, strict=True)))
        await engine.close()
        return outs

    for p, sp, out in zip(prompts, params, run(main()), strict=True):
        with torch.no_grad():
            logits = engine.model(torch.tensor([p + out.token_ids])).logits[0, len(p) - 1 : -1]
        for j, tok in enumerate(out.token_ids):
            want = reference_logprobs(logits[j], sp.temperature, sp.top_k, sp.top_p)[tok]
            assert want.isfinite()
            assert abs(out.logprobs[j] - float(want)) < 1e-4


def test_seeded_request_is_reproducible_whatever_else_runs(engine):
    target = SamplingParams(max_new_tokens=16, temperature=1.0, top_p=0.9, seed=1234)
    p = prompt(7, 99)

    async def main():
        alone = await engine.generate(p, target)
        others = [engine.generate(prompt(3 + i, i), SamplingParams(max_new_tokens=5 + i)) for i in range(10)]
        loaded = await asyncio.gather(*others[:5], engine.generate(p, target), *others[5:])
        await engine.close()
        return alone, loaded[5]

    alone, loaded = run(main())
    assert alone.token_ids == loaded.token_ids
    torch.testing.assert_close(torch.tensor(alone.logprobs), torch.tensor(loaded.logprobs), atol=1e-5, rtol=0)


async def update_when(engine, tokens_generated: int, weights, version: int) -> None:
    while engine.stats()["tokens_generated"] < tokens_generated:
        await asyncio.sleep(0.0005)
    await engine.update_weights(weights, version)


@pytest.mark.parametrize("recompute", [True, False])
def test_versions_switch_exactly_at_the_update(recompute, tiny_moe_dir, new_weights):
    engine = LocalEngine(tiny_moe_dir, device="cpu", recompute_kv_on_update=recompute)
    p = prompt(6, 5)
    params = SamplingParams(max_new_tokens=300, temperature=0.0)

    async def main():
        out, _ = await asyncio.gather(engine.generate(p, params), update_when(engine, 10, new_weights, 1))
        await engine.close()
        return out

    out = run(main())
    k = out.versions.index(1)
    assert 10 <= k < len(out.versions) - 1
    assert out.versions == [0] * k + [1] * (len(out.versions) - k)
    assert engine.stats()["version"] == 1 and engine.version == 1
    old = naive_greedy(load_policy(tiny_moe_dir, dtype="float32", device="cpu"), p, k)
    assert out.token_ids[:k] == old
    new_model = build_tiny_model("qwen3_moe", "test", seed=1).eval()
    if recompute:  # the new weights re-encode the prefix: exactly the new policy's continuation
        assert out.token_ids[k : k + 8] == naive_greedy(new_model, p + out.token_ids[:k], 8)
    else:  # the prefix KV stays as the old weights computed it; the new weights read it from token k on
        old_model = load_policy(tiny_moe_dir, dtype="float32", device="cpu")
        assert out.token_ids[k : k + 8] == mixed_cache_greedy(old_model, new_model, p + out.token_ids[:k], 8)


def test_update_from_a_checkpoint_directory_and_bad_updates(tiny_moe_dir, tmp_path):
    new_dir = tiny_checkpoint(tmp_path / "v1", "qwen3_moe", "test", seed=1)  # per-expert names on disk
    engine = LocalEngine(tiny_moe_dir, device="cpu")
    reference = LocalEngine(new_dir, device="cpu")
    p = prompt(5, 3)

    async def main():
        with pytest.raises(ValueError, match="not a parameter"):
            await engine.update_weights({"no.such.weight": torch.zeros(1)}, 1)
        name, tensor = next(iter(engine.model.state_dict().items()))
        with pytest.raises(ValueError, match="shape"):
            await engine.update_weights({name: torch.zeros(*tensor.shape, 2)}, 1)
        assert engine.version == 0
        await engine.update_weights(new_dir, 3)
        with pytest.raises(ValueError, match="older"):
            await engine.update_weights(new_dir, 2)
        got, want = await asyncio.gather(engine.generate(p, GREEDY), reference.generate(p, GREEDY))
        await asyncio.gather(engine.close(), reference.close())
        return got, want

    got, want = run(main())
    assert got.token_ids == want.token_ids and got.versions == [3] * 12
    assert engine.stats()["last_update_latency_s"] > 0


def test_200_concurrent_requests_with_frequent_updates_none_lost_or_duplicated(tiny_moe_dir, new_weights):
    engine = LocalEngine(tiny_moe_dir, device="cpu", max_running=32)
    old_weights = {k: v.clone() for k, v in engine.model.state_dict().items()}
    rng = random.Random(0)
    stop_id = 7
    specs = [
        (
            prompt(rng.randint(1, 24), i),
            SamplingParams(max_new_tokens=rng.randint(1, 24), stop_token_ids=(stop_id,), seed=i),
        )
        for i in range(200)
    ]

    async def updater(done: asyncio.Event):
        version = 0
        while not done.is_set():
            steps = engine.stats()["decode_steps"]
            while engine.stats()["decode_steps"] < steps + 3 and not done.is_set():
                await asyncio.sleep(0.0005)
            version += 1
            await engine.update_weights(new_weights if version % 2 else old_weights, version)
        return version

    async def main():
        done = asyncio.Event()
        task = asyncio.create_task(updater(done))
        outs = await asyncio.gather(*(engine.generate(p, sp) for p, sp in specs))
        done.set()
        versions = await task
        stats = engine.stats()
        await engine.close()
        return outs, versions, stats

    outs, last_version, stats = run(main())
    assert last_version >= 5
    assert stats["finished"] == 200 and stats["running"] == 0 and stats["waiting"] == 0
    assert sorted(o.metadata["request_id"] for o in outs) == sorted(
        set(o.metadata["request_id"] for o in outs)
    )
    seen_versions = set()
    for (_p, sp), out in zip(specs, outs, strict=True):
        n = len(out.token_ids)
        if out.finish_reason == "stop":
            assert out.token_ids[-1] == stop_id and stop_id not in out.token_ids[:-1]
        else:
            assert out.finish_reason == "length" and n == sp.max_new_tokens and stop_id not in out.token_ids
        assert len(out.logprobs) == len(out.versions) == n
        assert all(a <= b for a, b in itertools.pairwise(out.versions))
        seen_versions.update(out.versions)
    assert len(seen_versions) >= 3
    assert stats["tokens_generated"] == sum(len(o.token_ids) for o in outs)


def test_finish_reasons_stop_token_stop_string_max_new_tokens_and_context(tiny_moe_dir, tiny_tokenizer):
    engine = LocalEngine(tiny_moe_dir, device="cpu", max_model_len=40)
    p = [ord(c) for c in "Once upon a time"]

    async def main():
        base = await engine.generate(p, SamplingParams(max_new_tokens=20, temperature=0.0))
        gen = base.token_ids
        stop_tok = await engine.generate(
            p, SamplingParams(max_new_tokens=20, temperature=0.0, stop_token_ids=(gen[4],))
        )
        j = next(j for j in range(3, 20) if 33 <= gen[j] <= 126)  # a printable ASCII byte
        stop = (chr(gen[j - 1]) if 33 <= gen[j - 1] <= 126 else "") + chr(gen[j])
        stop_str = await engine.generate(p, SamplingParams(max_new_tokens=20, temperature=0.0, stop=(stop,)))
        context = await engine.generate(p, SamplingParams(max_new_tokens=100, temperature=0.0))
        await engine.close()
        return gen, stop_tok, stop, stop_str, context

    gen, stop_tok, stop, stop_str, context = run(main())
    first = gen.index(gen[4])
    assert stop_tok.finish_reason == "stop" and stop_tok.token_ids == gen[: first + 1]
    cut = next(j for j in range(1, 21) if stop in tiny_tokenizer.decode(gen[:j], skip_special_tokens=True))
    assert stop_str.finish_reason == "stop" and stop_str.token_ids == gen[:cut]
    assert stop_str.metadata["stop_reason"] == stop
    assert context.finish_reason == "length" and len(p) + len(context.token_ids) == 40
    assert context.token_ids[:20] == gen


def test_the_kv_budget_bounds_admission_and_the_context(tiny_moe_dir):
    engine = LocalEngine(tiny_moe_dir, device="cpu", max_running=8, max_kv_tokens=64)
    assert engine.context_limit == 64
    params = SamplingParams(max_new_tokens=30, temperature=0.0)  # reserves 10 + 30 = 40 of 64 KV tokens

    async def main():
        with pytest.raises(InvalidRequestError, match="context limit of 64"):
            await engine.generate([1] * 64, params)
        tasks = [asyncio.create_task(engine.generate(prompt(10, i), params)) for i in range(3)]
        peak = 0.0
        while not all(t.done() for t in tasks):
            stats = engine.stats()
            assert stats["kv_tokens_reserved"] <= 64
            peak = max(peak, stats["running"])
            await asyncio.sleep(0.0005)
        await engine.close()
        return [t.result() for t in tasks], peak

    outs, peak = run(main())
    assert peak == 1 and all(len(o.token_ids) == 30 for o in outs)


def test_bad_requests_raise_while_the_others_complete(engine):
    bad = [
        ([], GREEDY),
        (prompt(4, 0), SamplingParams(temperature=-1.0)),
        (prompt(4, 0), SamplingParams(top_p=0.0)),
        (prompt(4, 0), SamplingParams(top_k=0)),
        (prompt(4, 0), SamplingParams(max_new_tokens=0)),
        ([1, 2, engine.vocab_size], GREEDY),
        ([-3, 2], GREEDY),
        ([0] * engine.context_limit, GREEDY),
        (["a", 2], GREEDY),
    ]

    async def main():
        good = [engine.generate(prompt(3 + i, i), GREEDY) for i in range(4)]
        results = await asyncio.gather(
            *good[:2], *(engine.generate(p, sp) for p, sp in bad), *good[2:], return_exceptions=True
        )
        await engine.close()
        return results

    results = run(main())
    oks, errors = results[:2] + results[-2:], results[2:-2]
    assert all(r.finish_reason == "length" and len(r.token_ids) == 12 for r in oks)
    assert all(isinstance(e, InvalidRequestError) for e in errors), errors


def test_a_borrowed_model_needs_a_tokenizer_for_stop_strings_and_gets_its_attention_back(tiny_moe_dir):
    model = load_policy(tiny_moe_dir, dtype="float32", device="cpu")
    engine = LocalEngine(model)
    assert isinstance(engine, InferenceEngine) and engine.model is model
    with pytest.raises(InvalidRequestError, match="tokenizer"):
        run(engine.generate([1, 2], SamplingParams(stop=("x",))))
    run(engine.close())
    assert model.config._attn_implementation == "sdpa"


def test_an_engine_step_error_fails_the_running_requests_and_the_engine_keeps_serving(engine, monkeypatch):
    real = engine._batch.run_step.forward
    calls = {"n": 0}

    def flaky(plan, ids, positions, num_decode):
        if num_decode == 3 and not calls["n"]:  # once, when all three requests run
            calls["n"] += 1
            raise RuntimeError("boom")
        return real(plan, ids, positions, num_decode)

    monkeypatch.setattr(engine._batch.run_step, "forward", flaky)

    async def main():
        failed = await asyncio.gather(*(engine.generate(prompt(4, i), GREEDY) for i in range(3)))
        after = await engine.generate(prompt(4, 0), GREEDY)
        await engine.close()
        return failed, after

    failed, after = run(main())
    assert all(f.finish_reason == "error" and "boom" in f.error for f in failed)
    assert after.finish_reason == "length" and len(after.token_ids) == 12
    assert engine.stats()["errors"] == 3


def test_a_crashed_engine_loop_fails_pending_and_later_requests_instead_of_hanging(engine, monkeypatch):
    def broken():
        raise RuntimeError("scheduler bug")

    monkeypatch.setattr(engine._batch.scheduler, "admit", broken)

    async def main():
        first = await engine.generate(prompt(4, 0), GREEDY)
        later = await engine.generate(prompt(4, 1), GREEDY)
        await engine.close()
        return first, later

    first, later = run(main())
    assert first.finish_reason == later.finish_reason == "error"
    assert "scheduler bug" in first.error and "scheduler bug" in later.error


def test_close_aborts_running_and_waiting_requests(tiny_moe_dir):
    engine = LocalEngine(tiny_moe_dir, device="cpu", max_running=2)
    long = SamplingParams(max_new_tokens=3000, temperature=0.0)

    async def main():
        tasks = [asyncio.create_task(engine.generate(prompt(4, i), long)) for i in range(4)]
        while engine.stats()["tokens_generated"] < 10:
            await asyncio.sleep(0.001)
        await engine.close()
        outs = await asyncio.gather(*tasks)
        late = await engine.generate(prompt(4, 0), long)
        return outs, late

    outs, late = run(main())
    assert [o.finish_reason for o in outs] == ["abort"] * 4
    assert len(outs[0].token_ids) >= 5 and outs[3].token_ids == []  # running / never admitted
    assert late.finish_reason == "abort"
    assert engine.stats()["aborted"] == 5


def test_generate_from_several_event_loops_and_cancellation(engine):
    results = {}

    def worker(i):
        results[i] = asyncio.run(engine.generate(prompt(5, i), GREEDY))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [0, 1, 2] and all(len(r.token_ids) == 12 for r in results.values())

    async def cancel_one():
        task = asyncio.create_task(engine.generate(prompt(5, 9), SamplingParams(max_new_tokens=3000)))
        while engine.stats()["running"] < 1:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        while engine.stats()["running"] > 0:
            await asyncio.sleep(0.001)
        out = await engine.generate(prompt(5, 0), GREEDY)
        stats = engine.stats()
        await engine.close()
        return out, stats

    out, stats = run(cancel_one())
    assert out.token_ids == results[0].token_ids
    assert stats["finished"] == 5 and stats["aborted"] == 1
    assert 0.0 <= stats["idle_fraction"] <= 1.0 and stats["decode_steps"] > 0
