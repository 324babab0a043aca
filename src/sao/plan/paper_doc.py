"""The generated parts of docs/paper_configs.md: the resource plans of the paper configs (`configs/paper/`).

The page's prose is written by hand; the blocks between ``<!-- plan:NAME -->`` and ``<!-- /plan -->`` are
this module's output, rebuilt from the configs and `sao.plan.resources` by

    python -m sao.plan.paper_doc            # rewrites docs/paper_configs.md in place
    python -m sao.plan.paper_doc --check    # exit 1 if the page is out of date (the tests run this)

Blocks: ``plan:FILE`` (the rich table `sao plan configs/paper/FILE.yaml` prints, 130 columns),
``plan:summary`` (one row per file of the figures that differ between them) and ``plan:summary_micro_batch``
(the same with ``trainer.gradient_sync=micro_batch``).

Owns: the blocks' content. Does not own: the figures (`sao.plan.resources`), the rest of the page.
"""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

from rich.console import Console

from sao.config import load_config
from sao.plan.resource_table import format_resource_plan
from sao.plan.resources import ResourcePlan, resource_plan

__all__ = ["WIDTH", "render_blocks", "render_page"]

WIDTH = 130
_BLOCK = re.compile(r"(<!-- plan:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /plan -->)", re.DOTALL)


def _b(n: int) -> str:
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"


def _table(plan: ResourcePlan) -> str:
    console = Console(width=WIDTH, record=True, file=io.StringIO(), color_system=None)
    console.print(format_resource_plan(plan))
    text = "\n".join(line.rstrip() for line in console.export_text().splitlines())
    return f"```text\n{text}\n```\n"


def _summary(plans: dict[str, ResourcePlan]) -> str:
    head = ("| file | GPUs | KV per full sequence | full sequences per replica (all) "
            "| trainer state (per GPU) | micro-batch tokens | activations per GPU "
            "| trainer peak per GPU (of 80 GiB) |")  # fmt: skip
    lines = [head, "|" + "---|" * 8]
    for name, p in plans.items():
        m = p.trainer_memory
        assert (
            m is not None
            and p.trainer_state_bytes_per_gpu is not None
            and p.sequences_per_replica is not None
        )
        gpus = f"{p.total_gpus:g} (trainer {p.trainer_gpus:g} + engines {p.engine_gpus:g})"
        seqs = f"{p.sequences_per_replica} ({p.sequences_per_replica * p.engine_replicas})"
        state = f"{_b(p.trainer_state_bytes)} ({_b(p.trainer_state_bytes_per_gpu)})"
        act = _b(m.activations_kept + max(m.activations_working, m.lm_head_chunk))
        left = p.trainer_headroom_bytes or 0
        peak = f"{_b(m.peak)} " + (f"({_b(left)} left)" if left > 0 else "(**does not fit**)")
        row = (
            f"`{name}`",
            gpus,
            _b(p.kv_bytes_per_sequence),
            seqs,
            state,
            f"{p.micro_batch_tokens:,}",
            act,
            peak,
        )
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def render_blocks(config_dir: Path) -> dict[str, str]:
    """Block name → generated body, for every config in ``config_dir``, the summary, and the summary with
    one gradient reduce per micro-batch (``summary_micro_batch``: ``trainer.gradient_sync=micro_batch``)."""
    files = sorted(config_dir.glob("*.yaml"))
    plans = {p.stem: resource_plan(load_config(p)) for p in files}
    blocks = {name: _table(plan) for name, plan in plans.items()}
    blocks["summary"] = _summary(plans)
    per_micro_batch = ["trainer.gradient_sync=micro_batch"]
    blocks["summary_micro_batch"] = _summary(
        {p.stem: resource_plan(load_config(p, per_micro_batch)) for p in files}
    )
    return blocks


def render_page(page: str, blocks: dict[str, str]) -> str:
    """``page`` with the body of every ``plan:NAME`` block replaced; raises KeyError for an unknown name."""

    def body(match: re.Match[str]) -> str:
        return match.group(1) + blocks[match.group("name")] + match.group(4)

    return _BLOCK.sub(body, page)


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parents[3]
    page_path = root / "docs" / "paper_configs.md"
    page = page_path.read_text()
    new = render_page(page, render_blocks(root / "configs" / "paper"))
    if "--check" in argv:
        if new != page:
            print(f"{page_path} is out of date: run python -m sao.plan.paper_doc", file=sys.stderr)
            return 1
        return 0
    page_path.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
