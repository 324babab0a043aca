"""Layering: what the engine and the trainer may import, checked on the source with `ast`.

`sao.engine` generates tokens and knows nothing of trajectories, rewards or envs; `sao.train` does not
reach up into `sao.runtime`. Every import counts: top-level or inside a function, absolute or relative.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

ENGINE_FORBIDDEN = ("sao.trajectory", "sao.batch", "sao.types", "sao.envs", "sao.rollout", "sao.serve")


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path) -> set[str]:
    """Every module ``path`` imports (``from X import a`` counts as X and as ``X.a``), relative imports
    resolved against the module's package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                base_name = ".".join(base + ([node.module] if node.module else []))
            else:
                base_name = node.module or ""
            if base_name:
                found.add(base_name)
            found.update(f"{base_name}.{alias.name}" if base_name else alias.name for alias in node.names)
    return found


def _violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    root = SRC.joinpath(*package.split("."))
    files = sorted(root.rglob("*.py"))
    assert files, f"no modules under {root}"
    out = []
    for path in files:
        for name in sorted(_imported(path)):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                out.append(f"{path.relative_to(SRC)} imports {name}")
    return out


def test_engine_imports_nothing_of_trajectories_rewards_envs_or_serving():
    assert _violations("sao.engine", ENGINE_FORBIDDEN) == []


def test_train_does_not_import_runtime():
    assert _violations("sao.train", ("sao.runtime",)) == []
