"""Print a before/after table from two `sao eval --out` reports (the quickstart's last step).

python examples/compare_evals.py runs/quickstart/eval_sft.json runs/quickstart/eval_rl.json

``--by-info KEY`` adds a row per value of the samples' ``info[KEY]`` (e.g. ``dataset``: reasoning-gym's
family), each with its own Pass@1 and mean reward.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sao.eval import aggregate


def _groups(report: dict, key: str) -> dict[str, list[dict]]:
    """The report's tasks grouped by their first sample's ``info[key]`` (``?`` when absent)."""
    out: dict[str, list[dict]] = {}
    for task in report["tasks"]:
        info = (task["samples"][0].get("info") or {}) if task["samples"] else {}
        out.setdefault(str(info.get(key, "?")), []).append(task)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--labels", nargs=2, default=("SFT warm start", "after async SAO"))
    parser.add_argument("--by-info", help="also one row per value of this info key (e.g. dataset)")
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
        if args.by_info:
            for value, tasks in sorted(_groups(report, args.by_info).items()):
                g = aggregate(tasks, k)
                table.add_row(f"  {args.by_info}={value}", str(g["tasks"]), f"{g['pass@1']:.3f}",
                              f"{g[f'pass@{k}']:.3f}", f"{g['mean_reward']:.3f}")  # fmt: skip
    Console().print(table)
    delta = 100 * (reports[1]["overall"]["pass@1"] - reports[0]["overall"]["pass@1"])
    print(f"change in Pass@1: {delta:+.1f} points (quickstart target: +15)")


if __name__ == "__main__":
    main()
