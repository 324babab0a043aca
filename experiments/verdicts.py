"""Round two's verdicts and claim figures from the sweep reports (docs/results/<spec>/), by the rule fixed
before the runs (experiments/README.md; `sao.sweep.verdict`) and the parts in experiments/claims.yaml.

Prints the summary table (claim x testbed -> verdict, each part's difference with its interval and p-value)
as Markdown, and draws one figure per claim, docs/results/claims/<claim>.png: for each testbed, the curve of
the primary metric over training steps for the arms the claim compares, mean over seeds with its 95 %
bootstrap band (the report's curves.csv). A spec whose report is missing is "not run".

    .venv/bin/python experiments/verdicts.py [--claims experiments/claims.yaml] [--results docs/results]
"""

from __future__ import annotations

import argparse
import csv
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

from sao.sweep.verdict import Part, claim_verdict, part_verdict, read_differences


def load_claims(path: Path) -> dict[str, dict[str, Any]]:
    """claims.yaml: ``{claim: {title, delta, testbeds: {name: {spec, parts: [Part, ...]}}}}``."""
    claims = yaml.safe_load(path.read_text())["claims"]
    for claim in claims.values():
        for testbed in claim["testbeds"].values():
            testbed["parts"] = [Part(m, hi, lo, float(claim["delta"])) for m, hi, lo in testbed["parts"]]
    return claims


def _fmt(part: Part, diffs: dict[tuple[str, str, str], Any]) -> str:
    d = diffs.get((part.metric, part.high, part.low))
    if d is None:
        return f"{part.high} − {part.low}: not run"
    return f"{part.high} − {part.low} {d.mean:+.3f} [{d.low:+.3f}, {d.high:+.3f}], p = {d.p_value:.2g}"


def summary(claims: dict[str, dict[str, Any]], results: Path) -> list[str]:
    """The Markdown summary table, one row per claim and testbed."""
    lines = [
        "| claim | testbed | verdict | primary metric | parts: high − low, 95 % interval, p |",
        "|---|---|---|---|---|",
    ]
    for name, claim in claims.items():
        for testbed, tb in claim["testbeds"].items():
            path = results / tb["spec"] / "differences.csv"
            diffs = read_differences(path) if path.exists() else {}
            verdicts = [part_verdict(diffs.get((p.metric, p.high, p.low)), p.delta) for p in tb["parts"]]
            metrics = sorted({p.metric for p in tb["parts"]})
            parts = "; ".join(_fmt(p, diffs) for p in tb["parts"])
            verdict = claim_verdict(verdicts)
            lines.append(f"| {name} {claim['title']} | {testbed} (`{tb['spec']}`) | **{verdict}** | "
                         f"{', '.join(metrics)} | {parts} |")  # fmt: skip
    return lines


def _curves(path: Path) -> dict[tuple[str, str], list[tuple[float, float, float, float]]]:
    """curves.csv's step-axis rows: ``(arm, metric) -> [(step, mean, low, high), ...]``."""
    out: dict[tuple[str, str], list[tuple[float, float, float, float]]] = defaultdict(list)
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row["axis"] == "step":
                point = tuple(float(row[k]) for k in ("x", "mean", "low", "high"))
                out[(row["arm"], row["metric"])].append(point)  # type: ignore[arg-type]
    return out


def figure(name: str, claim: dict[str, Any], results: Path, out: Path) -> Path | None:
    """The claim's figure (None when no testbed has curves yet)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    testbeds = [
        (t, tb) for t, tb in claim["testbeds"].items() if (results / tb["spec"] / "curves.csv").exists()
    ]
    if not testbeds:
        return None
    metrics = [
        (t, tb, m) for t, tb in testbeds for m in dict.fromkeys(p.metric.split(" (")[0] for p in tb["parts"])
    ]
    fig, axes = plt.subplots(1, len(metrics), figsize=(max(7, 5 * len(metrics)), 3.8), squeeze=False)
    for ax, (testbed, tb, metric) in zip(axes[0], metrics, strict=True):
        curves = _curves(results / tb["spec"] / "curves.csv")
        arms = dict.fromkeys(a for p in tb["parts"] for a in (p.high, p.low))
        for arm in arms:
            points = sorted(curves.get((arm, metric), []))
            if points:
                x, mean, low, high = zip(*points, strict=True)
                (line,) = ax.plot(x, mean, label=arm)
                ax.fill_between(x, low, high, alpha=0.2, color=line.get_color())
        ax.set_title(f"{testbed} ({tb['spec']})", fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylabel(metric)
        ax.legend(fontsize=8)
    fig.suptitle(textwrap.fill(f"{name}: {claim['title']}", 90), fontsize=10)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name.lower()}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--claims", type=Path, default=Path("experiments/claims.yaml"))
    parser.add_argument("--results", type=Path, default=Path("docs/results"))
    parser.add_argument("--no-figures", action="store_true")
    args = parser.parse_args()
    claims = load_claims(args.claims)
    print("\n".join(summary(claims, args.results)))
    if not args.no_figures:
        for name, claim in claims.items():
            path = figure(name, claim, args.results, args.results / "claims")
            if path is not None:
                print(f"wrote {path}")


if __name__ == "__main__":
    main()
