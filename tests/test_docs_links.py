"""The documentation holds together: every relative link of README.md and docs/ resolves
(docs/check_links.py), every page docs/index.md names exists, and every page under docs/ is reachable from
docs/index.md."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
INDEX = DOCS / "index.md"


def _check_links() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_links", DOCS / "check_links.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check_links = _check_links()


def _md_targets(page: Path) -> list[Path]:
    """The Markdown files ``page`` links to (relative links outside code blocks, anchors dropped)."""
    out = []
    for line in check_links._prose_lines(page.read_text()):
        for target in check_links.LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue
            path = target.partition("#")[0]
            if path.endswith(".md"):
                out.append((page.parent / path).resolve())
    return out


def test_every_relative_link_of_the_readme_and_docs_resolves():
    pages = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    problems = [problem for page in pages for problem in check_links.broken_links(page)]
    assert not problems, "broken links (python docs/check_links.py):\n" + "\n".join(problems)


def test_the_link_check_reports_a_missing_file_and_a_missing_heading(tmp_path, monkeypatch):
    monkeypatch.setattr(check_links, "ROOT", tmp_path)
    (tmp_path / "other.md").write_text("# Real heading\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#real-heading) [gone](missing.md) [bad](other.md#no-such) [web](https://x.org)\n"
        "```\n[in code](ignored.md)\n```\n"
    )
    assert check_links.broken_links(page) == [
        "page.md: (missing.md): no such file",
        "page.md: (other.md#no-such): no heading with anchor #no-such",
    ]


def test_every_page_the_index_names_exists():
    named = _md_targets(INDEX)
    assert len(named) >= 20, "docs/index.md should name the guide, how-to and reference pages"
    missing = [str(p.relative_to(ROOT)) for p in named if not p.is_file()]
    assert not missing, f"docs/index.md names pages that do not exist: {missing}"


def test_every_docs_page_is_reachable_from_the_index():
    seen: set[Path] = set()
    todo = [INDEX.resolve()]
    while todo:
        page = todo.pop()
        if page in seen or not page.is_file():
            continue
        seen.add(page)
        todo.extend(t for t in _md_targets(page) if DOCS.resolve() in t.parents)
    unreachable = sorted(str(p.relative_to(ROOT)) for p in DOCS.resolve().rglob("*.md") if p not in seen)
    assert not unreachable, f"pages no link chain from docs/index.md reaches: {unreachable}"


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [("DIS: direct double-sided importance sampling", "dis-direct-double-sided-importance-sampling"),
     ("The asynchronous runner (`sao.runtime`)", "the-asynchronous-runner-saoruntime"),
     ("Memory of a real model's shape", "memory-of-a-real-models-shape")],
)  # fmt: skip
def test_anchors_follow_githubs_heading_slugs(heading, anchor):
    assert check_links.slug(heading) == anchor
