"""The planner against measurements of this machine (benchmarks/results, written by async_vs_sync.py): from
stage constants fitted to the measured runs and the sync run's episodes, it predicts the measured async /
sync GRPO ratio of both workloads within 15 % (docs/performance.md)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def _validation():
    spec = importlib.util.spec_from_file_location("plan_validation", RESULTS.parent / "plan_validation.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("workload", ["compute", "agentic"])
def test_the_planner_predicts_the_measured_async_over_sync_ratio_within_15_percent(workload):
    out = _validation().predict(RESULTS / workload, seeds=3)
    measured = json.loads((RESULTS / workload / "results.json").read_text())
    assert out["measured_ratio"] == measured["ratios"]["grpo"]["median_ratio"]
    assert abs(out["error"]) <= 0.15, out
    for arm in ("async", "grpo"):  # each arm's own rate too, not only their ratio
        assert abs(out["arms"][arm]["predicted"] / out["arms"][arm]["measured"] - 1) <= 0.25, out
