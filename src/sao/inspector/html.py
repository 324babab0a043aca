"""The inspector's one self-contained HTML file: the view document (`sao.inspector.sources`) as JSON in a
``<script type="application/json">``, the styles and the script (``assets/``) inlined; no server, no
external asset, opens from disk in any browser."""

from __future__ import annotations

import html
import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["render_html", "write_html"]

_TEMPLATE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="sao inspect">
<title>{title}</title>
<style>
{css}
</style>
</head>
<body>
<header>
<h1>{title}</h1>
<div class="meta">{meta}</div>
{skipped}
</header>
<details id="weight-checks" class="checks" hidden></details>
<main>
<section id="list">
<div class="filters">
<label>step <select id="f-step"></select></label>
<label>reward &ge; <input id="f-rmin" type="number" step="any"></label>
<label>&le; <input id="f-rmax" type="number" step="any"></label>
<label>prompt <input id="f-prompt" type="text" placeholder="id contains"></label>
<label><input id="f-masked" type="checkbox"> with masked tokens</label>
</div>
<div id="list-count" class="count"></div>
<table id="traj-table"></table>
</section>
<section id="detail"></section>
</main>
<div id="tooltip"></div>
<script id="sao-data" type="application/json">{data}</script>
<script>
{js}
</script>
</body>
</html>
"""

_META_LABELS = (("name", "run"), ("preset", "preset"), ("advantage", "advantage"), ("policy_loss", "loss"),
                ("eps_low", "ε_low"), ("eps_high", "ε_high"), ("gamma", "γ"), ("lam_policy", "λ policy"),
                ("lam_critic", "λ critic"), ("k_critic", "K"), ("group_size", "group size"),
                ("model", "model"), ("k", "k"))  # fmt: skip


def _asset(name: str) -> str:
    return resources.files("sao.inspector").joinpath("assets", name).read_text(encoding="utf-8")


def _json_for_script(doc: dict[str, Any]) -> str:
    """JSON that cannot end the script element (every ``<`` escaped) and has no NaN (not JSON)."""
    return json.dumps(doc, allow_nan=False, separators=(",", ":")).replace("<", "\\u003c")


def render_html(doc: dict[str, Any]) -> str:
    """The report of view document ``doc`` (its ``title``, ``source``, ``kind``, ``meta``, ``trajectories``,
    ``skipped``, and a run's ``weight_checks``: shown as the "weight sync" panel above the list)."""
    meta = doc.get("meta") or {}
    parts = [f"{label} {meta[key]}" for key, label in _META_LABELS if meta.get(key) is not None]
    parts.insert(0, str(doc.get("source", "")))
    skipped = doc.get("skipped") or []
    note = ""
    if skipped:
        shown = "; ".join(skipped[:3]) + (f"; … {len(skipped) - 3} more" if len(skipped) > 3 else "")
        note = f'<div class="skipped">{len(skipped)} entries not shown: {html.escape(shown)}</div>'
    return _TEMPLATE.format(
        title=html.escape(str(doc.get("title", "sao inspect"))),
        meta=html.escape(" · ".join(parts)),
        skipped=note,
        css=_asset("inspector.css"),
        js=_asset("inspector.js"),
        data=_json_for_script(doc),
    )


def write_html(doc: dict[str, Any], out: str | os.PathLike[str]) -> Path:
    """Write `render_html` of ``doc`` to ``out`` (parents created); returns the path."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(doc), encoding="utf-8")
    return path
