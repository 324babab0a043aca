"""Validation of the capacity planner against this machine: predict the measured async / sync GRPO ratios of
`benchmarks/async_vs_sync.py` from stage constants fitted to the same runs.

For each workload directory written by ``async_vs_sync.py --out DIR`` (``results.json`` with the measured
trajectories/s per arm and repetition, and ``logs/<arm>/`` of its last repetition), it

1. takes each arm's stage constants from ``DIR/calibration_<arm>.json`` (written by ``sao plan
   --calibrate DIR/logs/<arm> --out ...``: the engine model fitted to the arm's timeline, the trainer to its
   step times), fitting them from ``logs/<arm>`` when the file is absent: the arms run the engine
   differently (async: its own process and core; sync: in the trainer's process), so each mode is
   predicted with its own constants;
2. takes the workload from the sync GRPO run's ``episodes.jsonl`` (every episode it started was trained,
   so it is an unbiased sample; the async run's window favours short episodes);
3. simulates each arm with its run config (batch, group, staleness, in-flight bound, engine slots) for the
   same number of steps as the measured window, over ``--seeds`` workload seeds;
4. prints predicted vs measured trajectories/s per arm and the predicted vs measured ratio.

    python benchmarks/plan_validation.py benchmarks/results/compute benchmarks/results/agentic
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from sao.config import load_config
from sao.plan import EmpiricalWorkload, StageCosts, calibrate, config_inputs, simulate


def predict(results_dir: Path, seeds: int = 5) -> dict[str, Any]:
    """Predicted and measured trajectories/s per arm, and the async / sync GRPO ratios (see the docstring)."""
    measured = json.loads((results_dir / "results.json").read_text())
    workload = EmpiricalWorkload.from_run_dir(results_dir / "logs" / "grpo")
    out: dict[str, Any] = {"workload": measured["workload"], "arms": {}}
    for arm in ("async", "grpo"):
        run_dir = results_dir / "logs" / arm
        cfg = load_config(run_dir / "config.yaml")
        inputs = config_inputs(cfg)
        stored = results_dir / f"calibration_{arm}.json"
        costs = StageCosts.read(stored) if stored.is_file() else calibrate(run_dir)
        steps = cfg.trainer.total_steps
        rates = [
            simulate(workload, costs, inputs.layout, inputs.policy, steps=steps, warmup_steps=0, seed=s)
            .trajectories_per_s
            for s in range(seeds)
        ]  # fmt: skip
        out["arms"][arm] = {
            "predicted": statistics.median(rates),
            "predicted_range": [min(rates), max(rates)],
            "measured": statistics.median(r["traj_per_s"] for r in measured["arms"][arm]),
        }
    a, g = out["arms"]["async"], out["arms"]["grpo"]
    out["predicted_ratio"] = a["predicted"] / g["predicted"]
    out["measured_ratio"] = measured["ratios"]["grpo"]["median_ratio"]
    out["error"] = out["predicted_ratio"] / out["measured_ratio"] - 1
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="output directories of async_vs_sync.py --out")
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    for d in args.dirs:
        r = predict(d, args.seeds)
        print(f"workload {r['workload']} ({d}):")
        for arm, v in r["arms"].items():
            lo, hi = v["predicted_range"]
            print(f"  {arm:>5}: predicted {v['predicted']:.2f} traj/s [{lo:.2f}-{hi:.2f} over seeds], "
                  f"measured {v['measured']:.2f} (median of the repetitions)")  # fmt: skip
        print(f"  async / sync GRPO: predicted {r['predicted_ratio']:.2f}x, measured "
              f"{r['measured_ratio']:.2f}x, error {r['error']:+.1%} (target within 15 %)")  # fmt: skip


if __name__ == "__main__":
    main()
