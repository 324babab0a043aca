"""Which trainer rank trains which trajectories of a batch: whole groups, token-balanced.

The sharded `sao.train.step.Trainer` computes the same update for any partition of the batch (advantages
and denominators are taken over the whole batch on every rank), so the partition only decides the work:
the step takes as long as its most loaded rank. Groups stay whole anyway (a group shares a prompt, and
group statistics then never need another rank).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

__all__ = ["shard_indices"]


def shard_indices(
    group_ids: Sequence[Hashable | None], lengths: Sequence[int], world: int
) -> list[list[int]]:
    """Batch indices for each of ``world`` ranks: every trajectory on exactly one rank, groups whole.

    Greedy, largest first: the groups in decreasing token count (ties: first seen first) each go to the
    least loaded rank so far (ties: the lowest rank). Deterministic; each rank's indices ascend. A group id
    of None is a group of one. The most loaded rank has at most ``total / world + largest group`` tokens.
    With fewer groups than ranks some ranks get no trajectory (an empty list): the trainer runs only
    zero-weight padding micro-batches there.

    Args:
        group_ids: ``(B,)`` the group of each trajectory (`Batch.group_ids`).
        lengths: ``(B,)`` its tokens (`Batch.seq_lengths`), each >= 0.
        world: the number of ranks, >= 1.
    """
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    if len(group_ids) != len(lengths):
        raise ValueError(f"{len(group_ids)} group ids for {len(lengths)} lengths")
    if any(n < 0 for n in lengths):
        raise ValueError("lengths must be >= 0")
    groups: dict[Hashable, list[int]] = {}
    for i, gid in enumerate(group_ids):
        groups.setdefault(("group", gid) if gid is not None else ("single", i), []).append(i)
    members = list(groups.values())
    tokens = [sum(lengths[i] for i in m) for m in members]
    order = sorted(range(len(members)), key=lambda g: -tokens[g])  # stable: ties keep first-seen order
    loads = [0] * world
    shards: list[list[int]] = [[] for _ in range(world)]
    for g in order:
        rank = min(range(world), key=lambda r: loads[r])  # the first of the least loaded
        loads[rank] += tokens[g]
        shards[rank].extend(members[g])
    return [sorted(shard) for shard in shards]
