"""`sao config --explain [KEY]` and `sao config --reference`: the config schema (`sao.cli.config_docs`) as
rich tables with a loaded config's values, or as the Markdown of docs/reference/config.md.

Both print the same blocks: one per section (its own keys in a table), one per discriminated union (its
type key), then one per variant of the union (the variant's keys).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from sao.cli.config_docs import Choice, Leaf, Section, describe, select
from sao.config import ConfigError, RunConfig, load_config

# ModelConfig's complaint when neither model source is set: --explain then fills one in to show the rest.
_NO_MODEL_SOURCE = "model.path and model.tiny_arch"
_PLACEHOLDER_MODEL = ("model", "tiny_arch", "qwen3")

REFERENCE_HEADER = """\
# Config reference

Generated from the schema by `sao config --reference` (`make docs-reference`); do not edit by hand.
Set a key in the YAML file (`section: {key: value}`) or on the command line (`section.key=value`).
`sao config --explain [KEY] [CONFIG.yaml] [KEY=VALUE]...` prints the same for one key or section, with the
value a preset, a file and overrides give it; `sao presets` lists the algorithm presets.
"""


@dataclass(frozen=True)
class Block:
    """One heading and its table: a section's own leaves, a union's type key, or a variant's leaves.
    ``tag``: the variant's type value (``tag_key`` its key name), None for sections and unions."""

    key: str
    description: str
    leaves: tuple[Leaf, ...]
    depth: int
    tag_key: str = ""
    tag: str | None = None
    selected: bool = False


def blocks(root: Section) -> Iterator[Block]:
    """The blocks of ``root`` in declaration order; depth 1 for top-level sections (and the root's own
    keys), one more per level of nesting; the root is left out when it has no keys of its own."""
    own = tuple(c for c in root.children if isinstance(c, Leaf))
    if own:
        yield Block("", "", own, 1)
    for child in root.children:
        if not isinstance(child, Leaf):
            yield from _blocks(child, 1)


def _blocks(node: Section | Choice, depth: int, tag_key: str = "") -> Iterator[Block]:
    if isinstance(node, Choice):
        yield Block(node.key, node.description, (node.tag,), depth)
        for variant in node.variants:
            yield from _blocks(variant, depth + 1, node.tag.key.rsplit(".", 1)[-1])
        return
    own = tuple(c for c in node.children if isinstance(c, Leaf))
    description = node.description + (" Accepts further keys, passed on as given." if node.open else "")
    yield Block(node.key, description, own, depth, tag_key, node.tag, node.selected)
    for child in node.children:
        if not isinstance(child, Leaf):
            yield from _blocks(child, depth + 1)


def split_explain_args(args: Sequence[str]) -> tuple[str | None, str | None, list[str]]:
    """``[KEY] [CONFIG.yaml] [KEY=VALUE]...`` in any order: (config file, key to explain, overrides). A word
    without ``=`` is the config file when it ends in .yaml/.yml or names a file, else the key.

    Raises:
        ValueError: two config files or two keys.
    """
    path: str | None = None
    key: str | None = None
    overrides: list[str] = []
    for arg in args:
        if "=" in arg:
            overrides.append(arg)
        elif arg.endswith((".yaml", ".yml")) or Path(arg).is_file():
            if path is not None:
                raise ValueError(f"two config files: {path!r} and {arg!r}")
            path = arg
        elif key is not None:
            raise ValueError(f"one KEY to explain, got {key!r} and {arg!r}")
        else:
            key = arg
    return path, key, overrides


def resolved_values(path: str | None, overrides: Sequence[str]) -> dict[str, Any]:
    """The loaded config as plain data. Without a model source, as if a tiny model were set, with
    model.tiny_arch shown null: explaining keys needs no model.

    Raises:
        ConfigError: the config does not load (with a model source filled in if it lacked one).
    """
    try:
        return load_config(path, overrides).to_yaml_dict()
    except ConfigError as err:
        if _NO_MODEL_SOURCE not in str(err):
            raise
        missing = err
    section, key, value = _PLACEHOLDER_MODEL
    try:
        values = load_config(path, [*overrides, f"{section}.{key}={value}"]).to_yaml_dict()
    except ConfigError:
        raise missing from None
    values[section][key] = None
    return values


def explain(args: Sequence[str]) -> tuple[Section, str]:
    """The tree that ``sao config --explain ARGS`` prints, and a line saying where its values come from.

    Raises:
        ValueError: bad arguments; ConfigError (a ValueError) for a config that does not load; UnknownKeyError
            for a key not in the schema.
    """
    path, key, overrides = split_explain_args(args)
    values = resolved_values(path, overrides)
    root = describe(RunConfig, values)
    preset = values.get("algo", {}).get("preset") if isinstance(values.get("algo"), dict) else None
    sources = [f"preset {preset}" if preset else "defaults", *([path] if path else []), *overrides]
    origin = f"value: {', '.join(sources)} (bold where it differs from the default)"
    return (select(root, key) if key else root), origin


def print_explain(root: Section, console: Console, origin: str | None = None) -> None:
    """Each block as a heading line and a table: key, type, default, value (when known), description."""
    if origin:
        console.print(Text(origin, style="dim"))
    show_value = origin is not None
    for i, block in enumerate(blocks(root)):
        if i:
            console.print()
        heading = Text(block.key or "top level", style="bold cyan")
        if block.tag is not None:
            heading.append(f" {block.tag_key}: {block.tag}", style="bold magenta")
            if block.selected:
                heading.append(" (selected)", style="green")
        if block.description:
            heading.append(f"  {block.description}")
        console.print(heading)
        if block.leaves:
            console.print(_table(block.leaves, show_value))


def _table(rows: Sequence[Leaf], show_value: bool) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("key", no_wrap=True, style="cyan")
    table.add_column("type", max_width=34, overflow="fold")
    table.add_column("default", max_width=24, overflow="fold")
    if show_value:
        table.add_column("value", max_width=24, overflow="fold")
    table.add_column("description", ratio=1)
    for leaf in rows:
        value = leaf.value if leaf.value is not None else "-"
        changed = leaf.value is not None and leaf.value != leaf.default
        cells = [Text(leaf.key), Text(leaf.type), Text(leaf.default)]
        if show_value:
            cells.append(Text(value, style="bold yellow" if changed else ""))
        table.add_row(*cells, Text(leaf.description))
    return table


def reference_markdown(root: Section) -> str:
    """docs/reference/config.md: a header, then per block a heading, its description and a table of
    key | type | default | description."""
    lines = [REFERENCE_HEADER.rstrip("\n")]
    for block in blocks(root):
        title = f"`{block.key}`" if block.key else "Top level"
        if block.tag is not None:
            title += f" with `{block.tag_key}: {block.tag}`"
        lines += ["", f"{'#' * min(block.depth + 1, 6)} {title}", ""]
        if block.description:
            lines += [_md_text(block.description), ""]
        if block.leaves:
            lines += ["| key | type | default | description |", "|---|---|---|---|"]
            lines += [
                f"| {_md_code(leaf.key)} | {_md_code(leaf.type)} | {_md_code(leaf.default)} | "
                f"{_md_text(leaf.description)} |"
                for leaf in block.leaves
            ]
    return "\n".join(lines) + "\n"


def _md_text(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")


def _md_code(text: str) -> str:
    return f"`{text.replace('|', chr(92) + '|')}`" if text else ""
