"""Tests for sao.types: Trajectory invariants, packing into Batch, padded/packed conversion, JSONL I/O."""

from __future__ import annotations

import copy
import itertools
import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sao.types import Batch, BatchError, Trajectory, TrajectoryError, load_jsonl, save_jsonl


def build(segments: list[tuple[str, int]], rewards=(1.0,), version=3, **kwargs) -> Trajectory:
    """A trajectory from ("prompt" | "act" | "obs", length) segments; each "act" span starts a new turn."""
    token_ids, mask, logprobs, versions, turn_ids = [], [], [], [], []
    turn = -1
    for kind, n in segments:
        if kind == "act":
            turn += 1
        for _ in range(n):
            token_ids.append(len(token_ids) + 10)
            mask.append(int(kind == "act"))
            logprobs.append(-0.25 - 0.01 * len(logprobs) if kind == "act" else 0.0)
            versions.append(version if kind == "act" else -1)
            turn_ids.append(turn)
    kwargs.setdefault("prompt_id", "p0")
    return Trajectory(
        token_ids=token_ids,
        action_mask=mask,
        rollout_logprobs=logprobs,
        versions=versions,
        turn_ids=turn_ids,
        rewards=list(rewards),
        **kwargs,
    )


TWO_TURNS = [("prompt", 3), ("act", 2), ("obs", 2), ("act", 3)]  # tokens 0-2 | 3-4 | 5-6 | 7-9


def test_two_turn_trajectory_counts_turns_tokens_and_response():
    traj = build(TWO_TURNS)
    assert traj.num_turns == 2
    assert traj.num_tokens == 10
    assert traj.num_action_tokens == 5
    assert traj.response_length == 7
    assert traj.turn_ids == [-1, -1, -1, 0, 0, 0, 0, 1, 1, 1]
    traj.validate()


def test_outcome_reward_sits_on_last_action_token():
    traj = build([*TWO_TURNS, ("obs", 2)], rewards=[0.75])
    expected = [0.0] * 12
    expected[9] = 0.75
    assert traj.token_rewards() == expected
    assert traj.outcome_reward == 0.75


def test_per_turn_rewards_land_on_each_span_end():
    traj = build(TWO_TURNS, rewards=[0.5, -2.0])
    expected = [0.0] * 10
    expected[4], expected[9] = 0.5, -2.0
    assert traj.token_rewards() == expected
    assert traj.outcome_reward == -2.0


def test_adjacent_actions_with_different_turn_ids_are_two_turns():
    traj = build([("prompt", 1), ("act", 2), ("act", 2)], rewards=[1.0, 2.0])
    assert traj.num_turns == 2
    assert traj.token_rewards() == [0.0, 0.0, 1.0, 0.0, 2.0]


def test_rewards_of_neither_outcome_nor_per_turn_length_are_rejected():
    traj = build(TWO_TURNS, rewards=[1.0, 2.0, 3.0])
    with pytest.raises(TrajectoryError, match="rewards") as info:
        traj.validate()
    assert info.value.field == "rewards"


def _mismatched_lengths(t: Trajectory) -> None:
    t.versions.pop()


def _nan_logprob(t: Trajectory) -> None:
    t.rollout_logprobs[4] = math.nan


def _positive_logprob(t: Trajectory) -> None:
    t.rollout_logprobs[4] = 0.5


def _unversioned_action(t: Trajectory) -> None:
    t.versions[7] = -1


def _versioned_observation(t: Trajectory) -> None:
    t.versions[5] = 2


def _no_action_tokens(t: Trajectory) -> None:
    t.action_mask[:] = [0] * len(t.action_mask)


def _mask_not_binary(t: Trajectory) -> None:
    t.action_mask[3] = 2


def _empty_rewards(t: Trajectory) -> None:
    t.rewards.clear()


def _nan_reward(t: Trajectory) -> None:
    t.rewards[0] = math.nan


def _float_token_id(t: Trajectory) -> None:
    t.token_ids[0] = 1.5


BREAKAGES = [
    (_mismatched_lengths, "versions"),
    (_nan_logprob, "rollout_logprobs"),
    (_positive_logprob, "rollout_logprobs"),
    (_unversioned_action, "versions"),
    (_versioned_observation, "versions"),
    (_no_action_tokens, "action_mask"),
    (_mask_not_binary, "action_mask"),
    (_empty_rewards, "rewards"),
    (_nan_reward, "rewards"),
    (_float_token_id, "token_ids"),
]


@pytest.mark.parametrize(("breakage", "field"), BREAKAGES, ids=[b.__name__ for b, _ in BREAKAGES])
def test_validate_names_trajectory_and_field(breakage, field):
    traj = build(TWO_TURNS, traj_id="t-123", prompt_id="prompt-9")
    breakage(traj)
    with pytest.raises(TrajectoryError) as info:
        traj.validate()
    message = str(info.value)
    assert info.value.field == field
    assert "t-123" in message and "prompt-9" in message and field in message


@pytest.mark.parametrize(("breakage", "field"), BREAKAGES, ids=[b.__name__ for b, _ in BREAKAGES])
def test_from_trajectories_names_batch_index_and_field(breakage, field):
    trajs = [build(TWO_TURNS, traj_id=f"t{i}") for i in range(3)]
    breakage(trajs[2])
    with pytest.raises(TrajectoryError) as info:
        Batch.from_trajectories(trajs)
    assert "batch index 2" in str(info.value) and "t2" in str(info.value)
    assert info.value.field == field


def test_from_trajectories_rejects_a_repeated_traj_id():
    traj = build(TWO_TURNS)
    with pytest.raises(TrajectoryError, match="batch index 1: traj_id"):
        Batch.from_trajectories([traj, traj])


def test_from_trajectories_does_not_mutate_inputs():
    trajs = [build(TWO_TURNS, rewards=[0.5, 1.0]), build([("prompt", 1), ("act", 4)])]
    before = copy.deepcopy(trajs)
    Batch.from_trajectories(trajs)
    assert trajs == before


def test_packing_hand_built_batch():
    a = build(TWO_TURNS, rewards=[0.5, 2.0], traj_id="a", group_id="g")
    b = build([("prompt", 2), ("act", 2)], rewards=[-1.0], traj_id="b", prompt_id="p1")
    batch = Batch.from_trajectories([a, b])
    batch.validate()
    assert batch.cu_seqlens.tolist() == [0, 10, 14] and batch.cu_seqlens.dtype == torch.int32
    assert batch.position_ids.tolist() == [*range(10), *range(4)]
    assert batch.seq_ids.tolist() == [0] * 10 + [1] * 4
    assert batch.seq_lengths.tolist() == [10, 4]
    assert batch.max_seqlen == 10 and batch.num_sequences == 2 and batch.num_tokens == 14
    assert batch.token_ids.tolist() == a.token_ids + b.token_ids
    assert batch.action_mask.dtype == torch.bool and batch.action_mask.tolist() == [
        bool(m) for m in a.action_mask + b.action_mask
    ]
    assert batch.token_rewards.tolist() == a.token_rewards() + b.token_rewards()
    assert batch.outcome_rewards.tolist() == [2.0, -1.0]
    assert batch.versions.tolist() == a.versions + b.versions
    assert torch.allclose(batch.rollout_logprobs, torch.tensor(a.rollout_logprobs + b.rollout_logprobs))
    assert (
        batch.prompt_ids == ["p0", "p1"] and batch.group_ids == ["g", None] and batch.traj_ids == ["a", "b"]
    )


@st.composite
def trajectories(draw, max_trajs: int = 5) -> list[Trajectory]:
    out = []
    for i in range(draw(st.integers(1, max_trajs))):
        segments = [("prompt", draw(st.integers(0, 4)))]
        for _ in range(draw(st.integers(1, 3))):
            segments += [("act", draw(st.integers(1, 4))), ("obs", draw(st.integers(0, 3)))]
        out.append(build(segments, rewards=[draw(st.floats(-5, 5))], traj_id=f"t{i}", version=i))
    return out


@settings(max_examples=80, deadline=None)
@given(trajs=trajectories(), per_turn=st.lists(st.booleans(), min_size=5, max_size=5))
def test_whole_batch_check_packs_what_the_per_trajectory_check_packs(trajs, per_turn):
    """`Batch.from_trajectories` checks a valid batch with whole-batch operations; the tensors are those
    of the trajectories' own checks, concatenated (outcome and per-turn rewards, back-to-back turns)."""
    for traj, turns in zip(trajs, per_turn, strict=False):
        if turns:
            traj.rewards = [float(i) - 0.5 for i in range(traj.num_turns)]
    batch = Batch.from_trajectories(trajs)
    parts = [t._validated_tensors() for t in trajs]
    assert torch.equal(batch.token_ids, torch.cat([p.token_ids for p in parts]))
    assert torch.equal(batch.action_mask, torch.cat([p.action for p in parts]))
    assert torch.equal(batch.rollout_logprobs, torch.cat([p.logprobs for p in parts]).float())
    assert torch.equal(batch.versions, torch.cat([p.versions for p in parts]))
    assert torch.equal(batch.turn_ids, torch.cat([p.turn_ids for p in parts]))
    assert torch.equal(batch.token_rewards, torch.cat([p.token_rewards for p in parts]).float())
    assert batch.token_ids.dtype == batch.versions.dtype == batch.turn_ids.dtype == torch.long


@settings(max_examples=60, deadline=None)
@given(trajs=trajectories(), side=st.sampled_from(["left", "right"]))
def test_pad_unpad_round_trip_and_padded_layout(trajs, side):
    batch = Batch.from_trajectories(trajs)
    batch.validate()
    x = torch.randn(batch.num_tokens, 3)
    assert torch.equal(batch.unpad(batch.pad(x, side), side), x)

    padded = batch.to_padded(pad_token_id=-7, side=side)
    L = batch.max_seqlen
    assert padded.input_ids.shape == (len(trajs), L)
    for b, traj in enumerate(trajs):  # a naive reference, row by row
        n = traj.num_tokens
        real = slice(0, n) if side == "right" else slice(L - n, L)
        pad = slice(n, L) if side == "right" else slice(0, L - n)
        assert padded.input_ids[b, real].tolist() == traj.token_ids
        assert (padded.input_ids[b, pad] == -7).all()
        assert padded.attention_mask[b].sum() == n and padded.attention_mask[b, real].all()
        assert padded.position_ids[b, real].tolist() == list(range(n))
        assert (padded.versions[b, pad] == -1).all() and not padded.action_mask[b, pad].any()
    for name, packed_name in [
        ("input_ids", "token_ids"),
        ("action_mask", "action_mask"),
        ("rollout_logprobs", "rollout_logprobs"),
        ("versions", "versions"),
        ("token_rewards", "token_rewards"),
        ("position_ids", "position_ids"),
    ]:
        assert torch.equal(batch.unpad(getattr(padded, name), side), getattr(batch, packed_name))


@settings(max_examples=60, deadline=None)
@given(trajs=trajectories(max_trajs=8), max_tokens=st.integers(1, 30))
def test_split_respects_budget_and_keeps_every_trajectory_once_in_order(trajs, max_tokens):
    batch = Batch.from_trajectories(trajs)
    parts = batch.split(max_tokens)
    assert [t for part in parts for t in part.traj_ids] == [t.traj_id for t in trajs]
    for part in parts:
        part.validate()
        assert part.num_tokens <= max_tokens or part.num_sequences == 1
    for earlier, later in itertools.pairwise(parts):  # greedy: the next sequence did not fit
        assert earlier.num_tokens + int(later.seq_lengths[0]) > max_tokens
    assert torch.equal(torch.cat([p.token_ids for p in parts]), batch.token_ids)
    assert torch.equal(torch.cat([p.token_rewards for p in parts]), batch.token_rewards)


def test_select_matches_packing_the_selected_trajectories():
    trajs = [
        build([("prompt", i), ("act", 3 - i % 2), ("obs", i)], traj_id=f"t{i}", version=i) for i in range(5)
    ]
    batch = Batch.from_trajectories(trajs)
    picked = batch.select([3, 0, -1])
    expected = Batch.from_trajectories([trajs[3], trajs[0], trajs[4]])
    for name in ("token_ids", "action_mask", "versions", "turn_ids", "position_ids", "seq_ids", "cu_seqlens"):
        assert torch.equal(getattr(picked, name), getattr(expected, name)), name
    assert torch.equal(picked.rollout_logprobs, expected.rollout_logprobs)
    assert torch.equal(picked.outcome_rewards, expected.outcome_rewards)
    assert picked.traj_ids == ["t3", "t0", "t4"] and picked.max_seqlen == expected.max_seqlen
    with pytest.raises(IndexError):
        batch.select([5])


def test_to_device_returns_an_equal_copy():
    batch = Batch.from_trajectories([build(TWO_TURNS)])
    moved = batch.to("cpu")
    assert moved is not batch and moved.traj_ids == batch.traj_ids
    assert torch.equal(moved.token_ids, batch.token_ids) and moved.cu_seqlens.dtype == torch.int32


def test_pad_and_unpad_carry_gradients():
    batch = Batch.from_trajectories([build(TWO_TURNS), build([("act", 2)])])
    x = torch.randn(batch.num_tokens, requires_grad=True)
    (batch.pad(x) * 2).sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 2.0))


def _break_batch(batch: Batch, name: str) -> Batch:
    if name == "rollout_logprobs":
        batch.rollout_logprobs[12] = math.nan  # action token of sequence 1 (position 2)
    elif name == "versions":
        batch.versions[12] = -1
    elif name == "cu_seqlens":
        batch.cu_seqlens[-1] = 13
    elif name == "seq_ids":
        batch.seq_ids[9] = 1
    elif name == "turn_ids":
        batch.turn_ids = batch.turn_ids[:-1]
    elif name == "action_mask":
        batch.action_mask[10:] = False
    return batch


@pytest.mark.parametrize(
    "field", ["rollout_logprobs", "versions", "cu_seqlens", "seq_ids", "turn_ids", "action_mask"]
)
def test_batch_validate_names_field_and_trajectory(field):
    a, b = build(TWO_TURNS, traj_id="first"), build([("prompt", 2), ("act", 2)], traj_id="second")
    batch = _break_batch(Batch.from_trajectories([a, b]), field)
    with pytest.raises(BatchError) as info:
        batch.validate()
    assert info.value.field == field
    if field in ("rollout_logprobs", "versions", "action_mask"):
        assert "batch index 1 (traj_id=second)" in str(info.value)
    if field == "seq_ids":
        assert "batch index 0 (traj_id=first)" in str(info.value)


def test_jsonl_round_trip(tmp_path):
    trajs = [
        build(TWO_TURNS, rewards=[0.5, 1.0], group_id="g", metadata={"env": "math", "timings": {"gen": 1.5}}),
        build([("prompt", 2), ("act", 1)], finish_reason="length"),
    ]
    path = tmp_path / "trajs.jsonl"
    save_jsonl(path, trajs)
    assert load_jsonl(path) == trajs
    assert [Trajectory.from_dict(json.loads(json.dumps(t.to_dict()))) for t in trajs] == trajs
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize(
    ("bad_line", "expected"),
    [
        ('{"prompt_id": "p", "token_ids": [1', "invalid JSON"),
        ('{"prompt_id": "p", "unknown_key": 1}', "unknown_key"),
        ("[1, 2]", "JSON object"),
    ],
)
def test_load_jsonl_names_file_and_line_of_a_bad_record(tmp_path, bad_line, expected):
    path = tmp_path / "trajs.jsonl"
    save_jsonl(path, [build(TWO_TURNS), build(TWO_TURNS)])
    with path.open("a") as f:
        f.write(bad_line + "\n")
    with pytest.raises(TrajectoryError) as info:
        load_jsonl(path)
    assert f"{path}:3:" in str(info.value) and expected in str(info.value)


def test_load_jsonl_validates_unless_told_not_to(tmp_path):
    traj = build(TWO_TURNS)
    traj.versions[3] = -1
    path = tmp_path / "trajs.jsonl"
    save_jsonl(path, [traj])
    with pytest.raises(TrajectoryError, match=r":1: .*versions"):
        load_jsonl(path)
    assert load_jsonl(path, validate=False) == [traj]


FINISHES = {"stop": False, "length": True, "max_turns": True, "error": False, "abort": False}


@pytest.mark.parametrize(("finish", "truncated"), list(FINISHES.items()))
def test_trajectory_is_truncated_when_the_token_or_turn_budget_cut_it(finish, truncated):
    assert build(TWO_TURNS, finish_reason=finish).truncated is truncated


def test_batch_truncated_per_trajectory_survives_to_select_and_split():
    trajs = [build(TWO_TURNS, traj_id=f"t{i}", finish_reason=finish) for i, finish in enumerate(FINISHES)]
    batch = Batch.from_trajectories(trajs)
    batch.validate()
    assert batch.truncated.dtype == torch.bool and batch.truncated.tolist() == list(FINISHES.values())
    assert batch.to("cpu").truncated.tolist() == list(FINISHES.values())
    assert batch.select([2, 0, 1]).truncated.tolist() == [True, False, True]
    parts = batch.split(10)  # one trajectory (10 tokens) per part
    assert [p.truncated.tolist() for p in parts] == [[t] for t in FINISHES.values()]
    bad = Batch.from_trajectories(trajs)
    bad.truncated = bad.truncated[:-1]
    with pytest.raises(BatchError, match="truncated"):
        bad.validate()
    bad.truncated = torch.zeros(len(trajs))
    with pytest.raises(BatchError, match="truncated: must be bool"):
        bad.validate()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_batch_operations_on_cuda():
    trajs = [build(TWO_TURNS, traj_id="a"), build([("prompt", 2), ("act", 2)], traj_id="b")]
    cpu = Batch.from_trajectories(trajs)
    gpu = Batch.from_trajectories(trajs, device="cuda")
    gpu.validate()
    assert gpu.token_ids.is_cuda and gpu.cu_seqlens.is_cuda
    assert torch.equal(gpu.unpad(gpu.pad(gpu.rollout_logprobs, "left"), "left").cpu(), cpu.rollout_logprobs)
    assert [p.traj_ids for p in gpu.split(10)] == [["a"], ["b"]]
    assert torch.equal(gpu.select([1, 0]).token_ids.cpu(), cpu.select([1, 0]).token_ids)
    assert gpu.truncated.is_cuda and gpu.split(10)[0].truncated.is_cuda
