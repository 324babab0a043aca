"""Bug injection: every place in a module's functions where one small mutation of a given kind applies.

Kinds (`KINDS`):

- ``off_by_one``: a comparison ``<``/``<=``/``>``/``>=`` flipped to its strict or non-strict twin, a
  ``range(...)`` bound or a slice bound moved by one;
- ``wrong_operator``: ``+``↔``-``, ``*``→``//``, ``//``→``*``, ``+=``↔``-=``, ``and``↔``or``;
- ``missing_case``: an ``if`` branch without ``else`` (an early return, a guard, an edge case) or an
  ``elif`` branch deleted, or a comprehension's ``if`` filter dropped;
- ``swapped_args``: two neighbouring positional arguments of a call swapped.

A mutation edits the source text in place (only the mutated expression or the deleted lines change, so the
rest keeps its layout and the fix is a small diff); `find_mutations` keeps a site only when parsing the
mutated text gives exactly the intended syntax tree. Whether a mutation changes behaviour is for the
caller to find out (by running tests).
"""

from __future__ import annotations

import ast
import copy
import itertools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TypeGuard

__all__ = ["KINDS", "Mutation", "apply_mutation", "find_mutations"]

KINDS = ("off_by_one", "wrong_operator", "missing_case", "swapped_args")

_FLIP_COMPARE = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
_FLIP_BINOP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult}
_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.And: "and", ast.Or: "or"}
_SYMBOL.update({ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="})
_SYMMETRIC_CALLS = frozenset({"max", "min"})  # swapping their arguments changes nothing
_TIGHT = (ast.Name, ast.Call, ast.Attribute, ast.Subscript, ast.Constant)  # `x + 1` needs no parentheses


@dataclass(frozen=True)
class Mutation:
    """One edit of a module's source: the characters ``start:end`` become ``replacement``. ``function`` is
    the enclosing top-level function, ``line`` the first line touched (1-based), ``description`` what
    changed (for the instance's metadata)."""

    kind: str
    function: str
    line: int
    description: str
    start: int
    end: int
    replacement: str


def apply_mutation(source: str, mutation: Mutation) -> str:
    """``source`` with ``mutation`` applied."""
    return source[: mutation.start] + mutation.replacement + source[mutation.end :]


class _Text:
    """A module's source with AST positions turned into character offsets."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.starts = [0]
        for line in source.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))

    def at(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col if line <= len(self.starts) - 1 else len(self.source)

    def start(self, node: ast.AST) -> int:
        return self.at(node.lineno, node.col_offset)  # type: ignore[attr-defined]

    def end(self, node: ast.AST) -> int:
        return self.at(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]

    def of(self, node: ast.AST) -> str:
        return self.source[self.start(node) : self.end(node)]

    def splice(self, node: ast.AST, *edits: tuple[int, int, str]) -> str:
        """``node``'s source with the ``(start, end, text)`` edits (offsets in the module, ascending)."""
        out, pos = [], self.start(node)
        for begin, stop, text in edits:
            out += [self.source[pos:begin], text]
            pos = stop
        return "".join([*out, self.source[pos : self.end(node)]])


# (kind, description, node whose source is replaced, its new source, the node it must parse to or None)
_Edit = tuple[str, str, ast.AST, str, "ast.AST | None"]


def _with(node: ast.AST, **fields: object) -> ast.AST:
    new = copy.copy(node)
    for name, value in fields.items():
        setattr(new, name, value)
    return new


def _shift(text: _Text, expr: ast.expr, delta: int) -> str:
    """The source of ``expr`` moved by ``delta`` (±1), folding a constant term: ``n - 1`` + 1 is ``n``."""
    if isinstance(expr, ast.Constant) and type(expr.value) is int:
        return str(expr.value + delta)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Add, ast.Sub)):
        right = expr.right
        if isinstance(right, ast.Constant) and type(right.value) is int:
            total = (right.value if isinstance(expr.op, ast.Add) else -right.value) + delta
            left = text.source[text.start(expr) : text.end(expr.left)]
            return left if total == 0 else f"{left} + {total}" if total > 0 else f"{left} - {-total}"
    tight = isinstance(expr, _TIGHT) or (isinstance(expr, ast.BinOp) and type(expr.op) in _FLIP_BINOP)
    source = text.of(expr) if tight else f"({text.of(expr)})"
    return f"{source} + {delta}" if delta > 0 else f"{source} - {-delta}"


def _gap_edit(text: _Text, left: ast.AST, right: ast.AST, old: str, new: str) -> tuple[int, int, str]:
    """Replace the operator ``old`` by ``new`` between two operands (the gap holds only it and brackets)."""
    begin, stop = text.end(left), text.start(right)
    gap = text.source[begin:stop]
    pattern = rf"\b{old}\b" if old.isalpha() else re.escape(old)
    return begin, stop, re.sub(pattern, new, gap, count=1)


def _is_range(node: ast.AST) -> TypeGuard[ast.Call]:
    """A ``range(stop)`` or ``range(start, stop)`` call."""
    is_call = isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range"
    return is_call and 1 <= len(node.args) <= 2 and not node.keywords


def _off_by_one(text: _Text, node: ast.AST) -> Iterator[_Edit]:
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _FLIP_COMPARE:
        old, new = type(node.ops[0]), _FLIP_COMPARE[type(node.ops[0])]
        edit = _gap_edit(text, node.left, node.comparators[0], _SYMBOL[old], _SYMBOL[new])
        desc = f"comparison `{_SYMBOL[old]}` -> `{_SYMBOL[new]}`"
        yield "off_by_one", desc, node, text.splice(node, edit), _with(node, ops=[new()])
    bounds: list[tuple[str, ast.expr]] = []
    if _is_range(node):
        last = len(node.args) - 1
        bounds += [("range stop" if i == last else "range start", a) for i, a in enumerate(node.args)]
    if isinstance(node, ast.Slice) and node.step is None:
        bounds += [
            (f"slice {n}", b) for n, b in (("start", node.lower), ("stop", node.upper)) if b is not None
        ]
    for name, bound in bounds:
        for delta in (1, -1):
            yield "off_by_one", f"{name} {delta:+d}", bound, _shift(text, bound, delta), None


def _has_text(node: ast.AST) -> bool:
    return any(
        isinstance(n, ast.JoinedStr) or (isinstance(n, ast.Constant) and isinstance(n.value, str))
        for n in ast.walk(node)
    )


def _wrong_operator(text: _Text, node: ast.AST) -> Iterator[_Edit]:
    if isinstance(node, ast.BinOp) and type(node.op) in _FLIP_BINOP and not _has_text(node):
        old, new = type(node.op), _FLIP_BINOP[type(node.op)]
        edit = _gap_edit(text, node.left, node.right, _SYMBOL[old], _SYMBOL[new])
        desc = f"operator `{_SYMBOL[old]}` -> `{_SYMBOL[new]}`"
        yield "wrong_operator", desc, node, text.splice(node, edit), _with(node, op=new())
    if isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.Add, ast.Sub)) and not _has_text(node):
        old, new = type(node.op), _FLIP_BINOP[type(node.op)]
        edit = _gap_edit(text, node.target, node.value, _SYMBOL[old] + "=", _SYMBOL[new] + "=")
        desc = f"operator `{_SYMBOL[old]}=` -> `{_SYMBOL[new]}=`"
        yield "wrong_operator", desc, node, text.splice(node, edit), _with(node, op=new())
    if isinstance(node, ast.BoolOp):
        old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
        edits = [_gap_edit(text, a, b, old, new) for a, b in itertools.pairwise(node.values)]
        intended = _with(node, op=ast.Or() if old == "and" else ast.And())
        yield "wrong_operator", f"operator `{old}` -> `{new}`", node, text.splice(node, *edits), intended


def _missing_filter(text: _Text, node: ast.AST) -> Iterator[_Edit]:
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
        for g, gen in enumerate(node.generators):
            for k, cond in enumerate(gen.ifs):
                before = gen.ifs[k - 1] if k else gen.iter
                intended = copy.deepcopy(node)
                del intended.generators[g].ifs[k]
                edit = (text.end(before), text.end(cond), "")
                yield "missing_case", "comprehension filter dropped", node, text.splice(node, edit), intended


def _swapped_args(text: _Text, node: ast.AST) -> Iterator[_Edit]:
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)) or node.keywords:
        return
    if node.func.id in _SYMMETRIC_CALLS or any(isinstance(a, ast.Starred) for a in node.args):
        return
    for i, (a, b) in enumerate(itertools.pairwise(node.args)):
        if ast.dump(a) != ast.dump(b):
            swapped = text.of(b) + text.source[text.end(a) : text.start(b)] + text.of(a)
            intended = _with(node, args=[*node.args[:i], b, a, *node.args[i + 2 :]])
            desc = f"arguments {i + 1} and {i + 2} of `{node.func.id}` swapped"
            yield (
                "swapped_args",
                desc,
                node,
                text.splice(node, (text.start(a), text.end(b), swapped)),
                intended,
            )


_EDITORS = (_off_by_one, _wrong_operator, _missing_filter, _swapped_args)


def _branch_removals(func: ast.FunctionDef, lines: list[str]) -> Iterator[tuple[ast.If, bool]]:
    """``(if node, is an elif)`` for each ``if`` without ``else`` in a block of two or more statements, and
    each ``elif`` (deleting its lines leaves the chain valid: the next ``elif`` / ``else`` follows on)."""
    for owner in ast.walk(func):
        for name in ("body", "orelse"):
            block = getattr(owner, name, None)
            if not isinstance(block, list):
                continue
            for stmt in block:
                if not isinstance(stmt, ast.If):
                    continue
                is_elif = name == "orelse" and lines[stmt.lineno - 1].lstrip().startswith("elif ")
                if is_elif or (not stmt.orelse and len(block) >= 2):
                    yield stmt, is_elif


def _parses_to(source: str, node: ast.AST, intended: ast.AST | None) -> bool:
    """Whether ``source`` (the new text of ``node``) is exactly the ``intended`` node."""
    if intended is None:
        return True
    try:
        if isinstance(node, ast.stmt):
            parsed: ast.AST = ast.parse(source).body[0]
        else:
            parsed = ast.parse(f"(\n{source}\n)", mode="eval").body
    except SyntaxError:
        return False
    return ast.dump(parsed) == ast.dump(intended)


def find_mutations(source: str, kinds: Iterable[str] = KINDS) -> list[Mutation]:
    """Every valid mutation of ``kinds`` inside the top-level functions of ``source``, in source order.

    Raises ValueError for an unknown kind."""
    wanted = set(kinds)
    unknown = sorted(wanted - set(KINDS))
    if unknown:
        raise ValueError(f"unknown mutation kinds {unknown}; known: {list(KINDS)}")
    tree, text = ast.parse(source), _Text(source)
    lines = source.splitlines(keepends=True)
    found: list[Mutation] = []
    for func in tree.body:
        if not isinstance(func, ast.FunctionDef):
            continue
        in_fstring = {id(n) for j in ast.walk(func) if isinstance(j, ast.JoinedStr) for n in ast.walk(j)}
        for node in ast.walk(func):
            if id(node) in in_fstring or node is func:
                continue
            for editor in _EDITORS:
                for kind, desc, target, new_text, intended in editor(text, node):
                    if kind in wanted and _parses_to(new_text, target, intended):
                        start, end = text.start(target), text.end(target)
                        found.append(Mutation(kind, func.name, target.lineno, desc, start, end, new_text))
        if "missing_case" in wanted:
            for stmt, is_elif in _branch_removals(func, lines):
                start, end = text.at(stmt.lineno, 0), text.at((stmt.body[-1].end_lineno or 0) + 1, 0)
                desc = "elif branch deleted" if is_elif else "if branch deleted"
                found.append(Mutation("missing_case", func.name, stmt.lineno, desc, start, end, ""))
    checked = [m for m in found if _changes_only(source, tree, m)]
    return sorted(checked, key=lambda m: (m.start, m.end, m.kind, m.description, m.replacement))


def _changes_only(source: str, tree: ast.Module, mutation: Mutation) -> bool:
    """Whether the mutated module parses, differs from the original, and differs only in the function."""
    try:
        after = ast.parse(apply_mutation(source, mutation))
    except SyntaxError:
        return False
    if ast.dump(after) == ast.dump(tree) or len(after.body) != len(tree.body):
        return False
    return all(
        (isinstance(a, ast.FunctionDef) and a.name == mutation.function) or ast.dump(a) == ast.dump(b)
        for a, b in zip(tree.body, after.body, strict=True)
    )
