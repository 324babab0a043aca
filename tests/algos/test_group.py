"""GRPO advantages: (R − group mean) / (unbiased group std + ε), and broadcasting to action tokens."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sao.algos.group import broadcast_to_tokens, grpo_advantages

F64 = torch.float64
EPS = 1e-6


def test_two_groups_hand_case():
    # Group a (positions 0, 2, 4, 6): rewards 1, 0, 1, 0 → mean .5, unbiased std √(4·.25/3) = √(1/3).
    # Group b (positions 1, 3, 5): rewards 1, 1, 0 → mean 2/3, centred (1/3, 1/3, −2/3),
    # unbiased std √((1/9 + 1/9 + 4/9)/2) = √(1/3).
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0], dtype=F64)
    groups = torch.tensor([0, 1, 0, 1, 0, 1, 0])
    std = math.sqrt(1 / 3) + EPS
    want = torch.tensor([0.5, 1 / 3, -0.5, 1 / 3, 0.5, -2 / 3, -0.5], dtype=F64) / std
    torch.testing.assert_close(grpo_advantages(rewards, groups), want, rtol=1e-12, atol=1e-12)


def test_without_std_normalisation_advantages_are_group_centred_rewards():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0], dtype=F64)
    groups = torch.tensor([0, 1, 0, 1, 0, 1, 0])
    want = torch.tensor([0.5, 1 / 3, -0.5, 1 / 3, 0.5, -2 / 3, -0.5], dtype=F64)
    torch.testing.assert_close(grpo_advantages(rewards, groups, normalize_std=False), want)


def test_singleton_group_and_equal_rewards_get_zero():
    rewards = torch.tensor([0.7, 1.0, 1.0, 1.0, 0.0, 1.0])
    groups = torch.tensor([5, 2, 2, 2, 9, 9])  # group 5 has one member; group 2 has equal rewards
    adv = grpo_advantages(rewards, groups)
    assert adv[:4].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert bool(adv[4:].isfinite().all()) and adv[4] < 0 < adv[5]


def test_string_group_labels_give_the_same_advantages_as_integers():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.25, 1.0])
    by_str = grpo_advantages(rewards, ["p/x", "p/y", "p/x", "p/y", "p/x"])
    by_int = grpo_advantages(rewards, torch.tensor([10, 3, 10, 3, 10]))
    torch.testing.assert_close(by_str, by_int)


@settings(max_examples=60, deadline=None)
@given(
    groups=st.lists(st.integers(0, 4), min_size=1, max_size=24),
    seed=st.integers(0, 2**32 - 1),
    normalize_std=st.booleans(),
)
def test_matches_a_per_group_loop(groups, seed, normalize_std):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 3, (len(groups),), generator=gen).to(F64) / 2
    got = grpo_advantages(rewards, groups, normalize_std=normalize_std)
    for g in set(groups):
        idx = [i for i, x in enumerate(groups) if x == g]
        r = rewards[idx]
        want = r - r.mean()
        if normalize_std:
            std = float(r.std(unbiased=True)) if len(idx) > 1 else 0.0
            want = want / (std + EPS)
        torch.testing.assert_close(got[idx], want, rtol=1e-12, atol=1e-12)


def test_output_dtype_follows_float_rewards_and_integer_rewards_give_float32():
    assert grpo_advantages(torch.tensor([1.0, 0.0], dtype=F64), [0, 0]).dtype == F64
    adv = grpo_advantages(torch.tensor([1, 0]), [0, 0])
    assert adv.dtype == torch.float32
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5]) / (math.sqrt(0.5) + EPS))


def test_mismatched_group_ids_raise():
    with pytest.raises(ValueError, match="group_ids"):
        grpo_advantages(torch.zeros(3), [0, 1])
    with pytest.raises(ValueError, match="rewards"):
        grpo_advantages(torch.zeros(3, 1), [0, 1, 2])


def test_broadcast_to_tokens_fills_action_tokens_only():
    per_seq = torch.tensor([2.0, -1.0])
    mask = torch.tensor([0, 1, 0, 1, 1, 0, 1], dtype=torch.bool)
    out = broadcast_to_tokens(per_seq, mask, torch.tensor([0, 4, 7]))
    assert out.tolist() == [0.0, 2.0, 0.0, 2.0, -1.0, 0.0, -1.0]
