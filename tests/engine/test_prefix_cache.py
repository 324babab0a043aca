"""LocalEngine keeps an episode's KV across turns: a cached episode records what an uncached one records,
a weight update while the episode waits keeps its cache (and its tokens' versions), eviction re-prefills
with the same result. Plus `PrefixStore` on its own (bound, eviction order, longest match)."""

from __future__ import annotations

import asyncio

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.cache_utils import DynamicCache

from sao.engine.local import LocalEngine
from sao.engine.prefix_store import ParkedKV, PrefixStore
from sao.engine.types import SamplingParams
from sao.models.loading import load_policy
from sao.models.tiny import build_tiny_model

TURN = SamplingParams(max_new_tokens=6, temperature=1.0)


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(3, 250, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


async def episode(engine: LocalEngine, turns: int, seed: int, between=None) -> list:
    """A multi-turn episode: each turn's prompt is the previous turn's prompt + generation + a 9-token
    observation; sampling seeded per turn. ``between(turn)`` runs while the episode 'waits on its tool'."""
    context, out = tokens(20, seed), []
    for turn in range(turns):
        params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=seed * 100 + turn)
        gen = await engine.generate(context, params)
        out.append(gen)
        context = context + gen.token_ids + tokens(9, seed * 100 + turn + 50)
        if between is not None:
            await between(turn)
    return out


def flat(gens) -> tuple[list[int], list[float], list[int]]:
    return (
        [t for g in gens for t in g.token_ids],
        [lp for g in gens for lp in g.logprobs],
        [v for g in gens for v in g.versions],
    )


def test_a_cached_episode_records_the_tokens_and_logprobs_of_an_uncached_one(tiny_moe_dir):
    async def main():
        results = {}
        for name, keep in (("uncached", 0), ("cached", None)):
            engine = LocalEngine(tiny_moe_dir, device="cpu", max_running=4, prefix_cache_tokens=keep)
            async with engine:
                gens = await asyncio.gather(episode(engine, 6, seed=1), episode(engine, 6, seed=2))
                results[name] = (gens, engine.stats())
        return results

    results = asyncio.run(main())
    (plain, plain_stats), (cached, cached_stats) = results["uncached"], results["cached"]
    for a, b in zip(plain, cached, strict=True):
        ta, la, va = flat(a)
        tb, lb, vb = flat(b)
        assert ta == tb
        assert va == vb
        torch.testing.assert_close(torch.tensor(lb), torch.tensor(la), atol=2e-5, rtol=0)
    assert plain_stats["prefix_hits"] == 0
    assert cached_stats["prefix_hits"] == 10  # every turn after the first, in both episodes
    assert [g.metadata.get("cached_prompt_tokens", 0) > 0 for g in cached[0]] == [False] + [True] * 5
    # the second turn of an episode prefilled only its observation + the last sampled token
    assert cached_stats["prefill_tokens"] < plain_stats["prefill_tokens"] / 2
    reused = cached_stats["prefix_reused_tokens"]
    assert cached_stats["prefill_tokens"] + reused == plain_stats["prefill_tokens"]


def test_a_weight_update_while_the_episode_waits_keeps_its_cache_and_versions(tiny_moe_dir):
    new = build_tiny_model("qwen3_moe", "test", seed=1).state_dict()
    greedy = SamplingParams(max_new_tokens=5, temperature=0.0)

    async def main():
        engine = LocalEngine(tiny_moe_dir, device="cpu", max_running=2)
        async with engine:
            first = await engine.generate(tokens(30, 7), greedy)
            await engine.update_weights(new, version=1)  # the episode is waiting on its tool
            context = tokens(30, 7) + first.token_ids + tokens(8, 8)
            second = await engine.generate(context, greedy)
            return first, second, context, engine.stats()

    first, second, context, stats = asyncio.run(main())
    assert first.versions == [0] * 5 and second.versions == [1] * 5
    assert stats["prefix_hits"] == 1
    assert second.metadata["cached_prompt_tokens"] == 30 + 5 - 1
    # Reference: the kept prefix (prompt + first turn, minus its last token) encoded by the old weights,
    # then the new weights read it and continue (HF DynamicCache).
    old = load_policy(tiny_moe_dir, device="cpu")
    fresh = load_policy(tiny_moe_dir, device="cpu")
    fresh.load_state_dict(new)
    kept = 30 + 5 - 1
    cache = DynamicCache(config=old.config)
    out, logprobs = [], []
    with torch.no_grad():
        old(torch.tensor([context[:kept]]), past_key_values=cache, use_cache=True)
        logits = fresh(torch.tensor([context[kept:]]), past_key_values=cache, use_cache=True).logits[0, -1]
        for _ in range(5):
            token = int(logits.argmax())
            out.append(token)
            logprobs.append(float(torch.log_softmax(logits.float(), -1)[token]))
            logits = fresh(torch.tensor([[token]]), past_key_values=cache, use_cache=True).logits[0, -1]
    assert second.token_ids == out
    torch.testing.assert_close(torch.tensor(second.logprobs), torch.tensor(logprobs), atol=1e-4, rtol=0)


def test_recompute_on_update_drops_the_kept_cache(tiny_moe_dir):
    new = build_tiny_model("qwen3_moe", "test", seed=1).state_dict()

    async def main():
        engine = LocalEngine(tiny_moe_dir, device="cpu", recompute_kv_on_update=True)
        async with engine:
            first = await engine.generate(tokens(30, 7), TURN)
            await engine.update_weights(new, version=1)
            await engine.generate(tokens(30, 7) + first.token_ids + tokens(8, 8), TURN)
            return engine.stats()

    stats = asyncio.run(main())
    assert stats["prefix_hits"] == 0 and stats["prefix_entries"] == 1  # only the second turn is kept


def test_eviction_under_memory_pressure_re_prefills_and_records_identically(tiny_moe_dir):
    async def interleaved(engine):  # three episodes take turns: each turn parks a context the next evicts
        runs = [episode(engine, 4, seed=s) for s in (3, 4, 5)]
        return await asyncio.gather(*runs)

    async def main():
        out = {}
        for name, keep in (("uncached", 0), ("tight", 80), ("roomy", None)):
            engine = LocalEngine(tiny_moe_dir, device="cpu", max_running=1, prefix_cache_tokens=keep)
            async with engine:
                out[name] = (await interleaved(engine), engine.stats())
        return out

    out = asyncio.run(main())
    reference = [flat(g) for g in out["uncached"][0]]
    for name in ("tight", "roomy"):
        for (ta, la, va), gens in zip(reference, out[name][0], strict=True):
            tb, lb, vb = flat(gens)
            assert (tb, vb) == (ta, va)
            torch.testing.assert_close(torch.tensor(lb), torch.tensor(la), atol=2e-5, rtol=0)
    tight, roomy = out["tight"][1], out["roomy"][1]
    assert tight["prefix_evictions"] > 0 and roomy["prefix_evictions"] == 0
    assert tight["prefix_cached_tokens"] <= 80
    assert 0 < tight["prefix_hits"] < roomy["prefix_hits"] == 9
    assert tight["prefill_tokens"] > roomy["prefill_tokens"]


# ------------------------------------------------------------------------------------------ PrefixStore


def entry(toks: list[int], length: int | None = None) -> ParkedKV:
    n = len(toks) - 1 if length is None else length
    kv = [torch.zeros(1, n, 2)]
    return ParkedKV(list(toks), n, kv, kv, version=0)


def test_store_evicts_the_least_recently_kept_and_refuses_oversized_entries():
    store = PrefixStore(max_tokens=10, block=2)
    assert store.park(entry([1, 2, 3, 4, 5]))  # 4 positions
    assert store.park(entry([6, 7, 8, 9, 10]))  # 8
    assert not store.park(entry(list(range(20))))  # 19 > 10 on its own
    assert store.park(entry([11, 12, 13, 14]))  # 3: 11 > 10, the oldest goes
    assert store.evictions == 1 and store.evicted_tokens == 4 and store.tokens_held == 7
    assert store.take([1, 2, 3, 4, 5, 6]) is None
    hit = store.take([6, 7, 8, 9, 10, 99])
    assert hit is not None and hit.length == 4 and store.tokens_held == 3
    assert store.take([6, 7, 8, 9, 10, 99]) is None  # taken: consumed


def test_identical_contexts_park_one_entry_each_and_each_takes_one():
    store = PrefixStore(max_tokens=100, block=2)
    for _ in range(3):
        store.park(entry([1, 2, 3, 4, 5]))
    assert len(store) == 3 and store.tokens_held == 12
    assert [store.take([1, 2, 3, 4, 5, 6]) is not None for _ in range(4)] == [True, True, True, False]


def test_store_needs_one_prompt_token_left_to_feed():
    store = PrefixStore(max_tokens=100, block=3)
    store.park(entry([1, 2, 3, 4]))  # keeps 3 positions: [1, 2, 3]
    assert store.take([1, 2, 3]) is None  # nothing left to feed
    assert store.take([1, 2, 3, 4]).length == 3


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 3), min_size=2, max_size=12), min_size=1, max_size=6),
    st.lists(st.integers(0, 3), min_size=1, max_size=14),
    st.integers(1, 5),
)
def test_store_takes_the_longest_kept_prefix_of_the_prompt(contexts, prompt, block):
    store = PrefixStore(max_tokens=1000, block=block)
    for ctx in contexts:
        store.park(entry(ctx))
    kept = {(tuple(c[: len(c) - 1])) for c in contexts}
    matches = [k for k in kept if len(k) <= len(prompt) - 1 and list(k) == prompt[: len(k)]]
    hit = store.take(prompt)
    if not matches:
        assert hit is None
    else:
        assert hit is not None and hit.length == max(len(k) for k in matches)
        assert hit.tokens[: hit.length] == prompt[: hit.length]
