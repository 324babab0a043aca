"""`shard_indices`: whole groups to ranks, token-balanced, deterministic."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sao.train.split import shard_indices

batches = st.lists(st.tuples(st.integers(0, 6), st.integers(1, 200)), min_size=1, max_size=40)


def _group_ids(rows: list[tuple[int, int]]) -> list[str | None]:
    return [None if g == 0 else f"g{g}" for g, _ in rows]  # group 0: trajectories without a group


@settings(max_examples=200, deadline=None)
@given(rows=batches, world=st.integers(1, 5))
def test_shards_partition_the_batch_in_ascending_order(rows, world):
    shards = shard_indices(_group_ids(rows), [n for _, n in rows], world)
    assert len(shards) == world
    assert sorted(i for s in shards for i in s) == list(range(len(rows)))
    assert all(s == sorted(s) for s in shards)


@settings(max_examples=200, deadline=None)
@given(rows=batches, world=st.integers(1, 5))
def test_groups_stay_whole_and_load_is_balanced(rows, world):
    ids, lengths = _group_ids(rows), [n for _, n in rows]
    shards = shard_indices(ids, lengths, world)
    rank_of = {i: r for r, s in enumerate(shards) for i in s}
    for i, gid in enumerate(ids):
        for j, other in enumerate(ids):
            if gid is not None and gid == other:
                assert rank_of[i] == rank_of[j]
    group_tokens: dict[object, int] = {}
    for i, gid in enumerate(ids):
        key = gid if gid is not None else ("single", i)
        group_tokens[key] = group_tokens.get(key, 0) + lengths[i]
    loads = [sum(lengths[i] for i in s) for s in shards]
    assert max(loads) <= sum(lengths) / world + max(group_tokens.values())
    assert shard_indices(ids, lengths, world) == shards  # deterministic


def test_largest_groups_go_first_to_the_least_loaded_rank():
    ids = ["a", "a", "b", "c", "c", "d"]
    lengths = [10, 10, 30, 5, 5, 12]  # a=20, b=30, c=10, d=12
    assert shard_indices(ids, lengths, 2) == [
        [2, 3, 4],
        [0, 1, 5],
    ]  # b, a, then d → r1 (20 < 30), c → r0 (30 < 32)


def test_fewer_groups_than_ranks_leaves_ranks_empty():
    assert shard_indices(["a", "a"], [3, 4], 3) == [[0, 1], [], []]


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="world"):
        shard_indices(["a"], [1], 0)
    with pytest.raises(ValueError, match="lengths"):
        shard_indices(["a", "b"], [1], 2)
