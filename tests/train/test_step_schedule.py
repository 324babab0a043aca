"""The lr multipliers: the SFT schedule (cosine to a floor) and the RL actor's (floor 0) are one function."""

from __future__ import annotations

import math

import pytest

from sao.train.sft import SFT_LR_FLOOR
from sao.train.step_schedule import actor_lr_factor


def _cosine_to_floor(total: int, warmup: int, floor: float, step: int) -> float:
    """The formula SFT used before the schedules were merged, written out."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


@pytest.mark.parametrize(("total", "warmup"), [(200, 10), (7, 0), (5, 5), (3, 8)])
def test_sft_schedule_warms_up_then_decays_by_cosine_to_its_floor_bit_for_bit(total, warmup):
    factor = actor_lr_factor("cosine", warmup, total, floor=SFT_LR_FLOOR)
    for step in range(total + 20):
        assert factor(step) == _cosine_to_floor(total, warmup, SFT_LR_FLOOR, step), step
    assert factor(max(total, warmup + 1)) == pytest.approx(SFT_LR_FLOOR)


def test_a_floor_lifts_both_decays_and_leaves_warm_up_and_constant_alone():
    lin = actor_lr_factor("linear", 2, 6, floor=0.2)
    assert [lin(s) for s in range(7)] == pytest.approx([0.5, 1.0, 1.0, 0.8, 0.6, 0.4, 0.2])
    assert actor_lr_factor("constant", 0, 5, floor=0.5)(100) == 1.0
    cos = actor_lr_factor("cosine", 0, 4, floor=0.25)
    assert cos(2) == pytest.approx(0.25 + 0.75 * 0.5) and cos(4) == pytest.approx(0.25)


def test_floor_zero_is_the_plain_decay_exactly():
    for schedule in ("cosine", "linear"):
        plain, floored = actor_lr_factor(schedule, 3, 17), actor_lr_factor(schedule, 3, 17, floor=0.0)
        for step in range(25):
            progress = min(1.0, max(0.0, (step - 3) / 14))
            want = 0.5 * (1.0 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress
            if step >= 3:
                assert plain(step) == floored(step) == want


@pytest.mark.parametrize("floor", [-0.1, 1.5])
def test_a_floor_outside_the_unit_interval_is_refused(floor):
    with pytest.raises(ValueError, match="floor"):
        actor_lr_factor("cosine", 0, 10, floor=floor)
