"""The pre-registered verdict rule (`sao.sweep.verdict`) on hand-made differences."""

from __future__ import annotations

import pytest

from sao.sweep.stats import Difference
from sao.sweep.verdict import claim_verdict, min_p_value, part_verdict, read_differences


def _d(mean: float, low: float, high: float, p: float, n: int = 3) -> Difference:
    return Difference("x", "y", mean, low, high, p, n, n, "permutation")


def test_the_smallest_p_value_follows_the_seed_counts():
    assert min_p_value(3, 3) == pytest.approx(0.1)  # 2 of the 20 ways to split 6 values 3/3
    assert min_p_value(5, 5) == pytest.approx(2 / 252)
    assert min_p_value(0, 3) == 1.0


@pytest.mark.parametrize(
    ("diff", "verdict"),
    [
        (_d(0.05, 0.02, 0.08, 0.1), "reproduced"),  # 3 seeds: complete separation is the floor
        (_d(0.05, 0.02, 0.08, 0.2), "inconclusive"),  # interval above 0 but the seeds overlap
        (_d(0.05, 0.02, 0.08, 0.1, n=5), "inconclusive"),  # 5 seeds need p <= 0.05
        (_d(0.05, 0.02, 0.08, 0.03, n=5), "reproduced"),
        (_d(-0.05, -0.08, -0.02, 0.1), "not reproduced"),  # the interval excludes the paper's direction
        (_d(0.004, -0.01, 0.015, 0.7), "not reproduced"),  # inside +-0.02: no effect that matters
        (_d(0.01, -0.03, 0.05, 0.6), "inconclusive"),
        (None, "not run"),
    ],
)
def test_a_part_is_judged_by_sign_interval_and_p(diff, verdict):
    assert part_verdict(diff, delta=0.02) == verdict


def test_a_claim_is_reproduced_only_when_every_part_is():
    assert claim_verdict(["reproduced", "reproduced"]) == "reproduced"
    assert claim_verdict(["reproduced", "inconclusive"]) == "partly"
    assert claim_verdict(["not reproduced", "not reproduced"]) == "not reproduced"
    assert claim_verdict(["not reproduced", "inconclusive"]) == "inconclusive"
    assert claim_verdict(["reproduced", "not run"]) == "not run"


def test_differences_read_both_ways_round(tmp_path):
    path = tmp_path / "differences.csv"
    path.write_text(
        "metric,a,b,diff,low,high,p_value,test,n_a,n_b\n"
        'reward/mean (tail 0.2),sao,grpo,0.05,0.01,0.09,0.1,"permutation",3,3\n'
    )
    diffs = read_differences(path)
    forward, backward = (
        diffs[("reward/mean (tail 0.2)", "sao", "grpo")],
        diffs[("reward/mean (tail 0.2)", "grpo", "sao")],
    )
    assert (forward.mean, forward.low, forward.high) == (0.05, 0.01, 0.09)
    assert (backward.mean, backward.low, backward.high) == (-0.05, -0.09, -0.01) and backward.p_value == 0.1
    assert part_verdict(forward, 0.02) == "reproduced" and part_verdict(backward, 0.02) == "not reproduced"
