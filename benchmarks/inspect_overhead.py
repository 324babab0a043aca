"""Benchmark: what keeping trajectories for `sao inspect` (``logging.inspect_every``) costs a training run.

The workload is the CPU quickstart (configs/quickstart.yaml, from its SFT warm start runs/quickstart/sft,
written by ``make demo``) cut to ``--steps`` steps, without value pretraining or held-out evaluation, so the
window is the training loop alone: from the end of step 1 to the end of the last step (``runtime/elapsed_s``
of the step records). Arms, interleaved and repeated:

1. ``off``: ``logging.inspect_every=null`` (the baseline);
2. ``quickstart``: every 10 steps, 8 trajectories (what configs/quickstart.yaml sets);
3. ``every_step``: every step, the whole batch (16 trajectories): the upper bound.

Per arm it prints the loop's seconds (median [range]), the ratio to ``off`` (ratio of medians [range of the
per-repetition ratios]), the share of the loop the inspector's own work took (the runs' ``runtime/inspect_s``
summed, over the loop), and the disk the kept files use.

    python benchmarks/inspect_overhead.py --reps 5            # ~5 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from harness import LoadWatch, Spread, interleaved, ratio
from sao.config import load_config
from sao.runtime.runner import train_sync_entry

ROOT = Path(__file__).resolve().parents[1]
ARMS = {
    "off": ["logging.inspect_every=null"],
    "quickstart": ["logging.inspect_every=10", "logging.inspect_samples=8"],
    "every_step": ["logging.inspect_every=1", "logging.inspect_samples=16"],
}


def run_arm(overrides: list[str], steps: int, model: str, rep: int) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix="sao-inspect-bench-"))
    try:
        cfg = load_config(ROOT / "configs" / "quickstart.yaml", [
            f"model.path={model}", f"trainer.total_steps={steps}", "critic.pretrain.enabled=false",
            "data.eval_file=null", "logging.eval_every=null", f"logging.checkpoint_every={steps}",
            f"logging.run_dir={run_dir}", f"trainer.seed={rep}", *overrides,
        ])  # fmt: skip
        train_sync_entry(cfg)
        records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        steps_seen = [r for r in records if "runtime/elapsed_s" in r and "reward/mean" in r]
        loop = steps_seen[-1]["runtime/elapsed_s"] - steps_seen[0]["runtime/elapsed_s"]
        inspect_s = sum(r.get("runtime/inspect_s", 0.0) for r in steps_seen[1:])
        kept = run_dir / "inspect"
        disk = sum(p.stat().st_size for p in kept.iterdir()) if kept.is_dir() else 0
        return {"loop_s": loop, "inspect_s": inspect_s, "disk": disk}
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--model", default=str(ROOT / "runs" / "quickstart" / "sft"))
    args = ap.parse_args()
    if not (Path(args.model) / "config.json").exists():
        raise SystemExit(
            f"{args.model}: no model (run `make demo` once: it writes the quickstart's warm start)"
        )
    watch = LoadWatch()
    print("warm-up run (not counted)", flush=True)
    run_arm(ARMS["off"], 3, args.model, 99)

    def show(name: str, rep: int, r: dict[str, Any]) -> None:
        print(
            f"  rep {rep} {name:>10}: loop {r['loop_s']:.1f} s, inspector {r['inspect_s']:.2f} s", flush=True
        )

    arms = {name: (lambda rep, o=o: run_arm(o, args.steps, args.model, rep)) for name, o in ARMS.items()}
    results = interleaved(arms, args.reps, on_result=show)
    base = [r["loop_s"] for r in results["off"]]
    print(f"\nquickstart workload, {args.steps} steps, {args.reps} repetitions (loop: steps 2-{args.steps})")
    for name, rs in results.items():
        loop = [r["loop_s"] for r in rs]
        share = Spread(tuple(r["inspect_s"] / r["loop_s"] for r in rs))
        med, spread = ratio(loop, base)
        disk = max(r["disk"] for r in rs) / 2**20
        print(f"{name:>10}: loop {Spread(tuple(loop)).fmt('.1f', ' s')}, x{med:.3f} vs off "
              f"[{spread.low:.3f}-{spread.high:.3f}], inspector's own time {100 * share.median:.2f} % of the "
              f"loop [{100 * share.low:.2f}-{100 * share.high:.2f}], kept files {disk:.2f} MiB")  # fmt: skip
    print(watch.report())


if __name__ == "__main__":
    main()
