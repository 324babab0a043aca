"""Print a before/after table from two `sao eval --out` reports (the quickstart's last step).

python examples/compare_evals.py runs/quickstart/eval_sft.json runs/quickstart/eval_rl.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--labels", nargs=2, default=("SFT warm start", "after async SAO"))
    args = parser.parse_args()
    reports = [json.loads(p.read_text()) for p in (args.before, args.after)]
    k = reports[0]["k"]
    table = Table(title=f"held-out success rate (Pass@1 over k={k} samples per task)")
    for column in ("policy", "tasks", "pass@1", f"pass@{k}", "mean reward"):
        table.add_column(column)
    for label, report in zip(args.labels, reports, strict=True):
        o = report["overall"]
        table.add_row(
            label, str(o["tasks"]), f"{o['pass@1']:.3f}", f"{o[f'pass@{k}']:.3f}", f"{o['mean_reward']:.3f}"
        )
    Console().print(table)
    delta = 100 * (reports[1]["overall"]["pass@1"] - reports[0]["overall"]["pass@1"])
    print(f"change in Pass@1: {delta:+.1f} points (quickstart target: +15)")


if __name__ == "__main__":
    main()
