"""Check, before C7's round-two sweep, that the style warm start samples every style the schedule shifts to.

For each style the env rewards (cute, chuunibyou, classical), the warm start plays the ``style_shift`` env
with that style preferred from the first episode on (``schedule=[[0, style]]``), ``--k`` samples of each of
``--n`` topics at temperature 1 with the run's token limits: its Pass@1 is the share of replies that earn
the reward in that style (quality x style). The check passes when every style's Pass@1 is at least
``--min-reward`` and the largest is at most ``--max-ratio`` times the smallest (all styles in support, at
comparable probability); it prints the table and exits 1 otherwise.

    .venv/bin/python experiments/style_support.py --model runs/experiments/style/sft
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from sao.envs import make_env_tasks
from sao.envs.judges import STYLES
from sao.envs.tasks import save_tasks_jsonl
from sao.eval import EvalSettings, run_eval


def style_rewards(model: Path, n: int, k: int, seed: int) -> dict[str, float]:
    """Pass@1 per style of ``model`` on ``n`` generated topics, ``k`` samples each."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        tasks = Path(tmp) / "topics.jsonl"
        save_tasks_jsonl(tasks, make_env_tasks("style_shift", n, seed=seed))
        for style in STYLES:
            settings = EvalSettings(k=k, seed=seed, max_turns=1, max_tokens_per_turn=96, max_total_tokens=160,
                                    env="style_shift", env_kwargs={"schedule": [[0, style]]})  # fmt: skip
            report = run_eval(model, [tasks], settings, device="cpu", dtype="float32")
            out[style] = float(report["overall"]["pass@1"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--n", type=int, default=64, help="topics")
    parser.add_argument("--k", type=int, default=4, help="samples per topic and style")
    parser.add_argument("--seed", type=int, default=321)
    parser.add_argument("--min-reward", type=float, default=0.1)
    parser.add_argument("--max-ratio", type=float, default=2.5)
    parser.add_argument("--out", type=Path, help="write the table as JSON here when the check passes")
    args = parser.parse_args()
    rewards = style_rewards(args.model, args.n, args.k, args.seed)
    low, high = min(rewards.values()), max(rewards.values())
    ok = low >= args.min_reward and high <= args.max_ratio * low
    for style, value in rewards.items():
        print(f"{style:12s} Pass@1 {value:.3f}")
    print(f"{'supported' if ok else 'NOT supported'}: min {low:.3f} (want >= {args.min_reward}), "
          f"max/min {high / low if low else float('inf'):.2f} (want <= {args.max_ratio})")  # fmt: skip
    if args.out and ok:  # the file says the check passed (make's target: no file, no sweep)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"pass@1": rewards, "supported": ok}, indent=2) + "\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
