"""The text of a synthetic instance (`sao.envs.swe_synth`): test files, the repository's scaffold, the
git-format diffs of the fix and of the hidden tests, and the problem statement.

Pure functions of their arguments (the problem statement draws its wording from the ``rng`` it is given).
"""

from __future__ import annotations

import difflib
import random
from collections.abc import Sequence

from sao.envs.swe_packages import Family
from sao.envs.swe_synth_check import Case, Outcome

__all__ = ["problem_statement", "render_tests", "scaffold", "unified_diff"]


def _test_function(name: str, case: Case, expected: Outcome) -> str:
    if expected.kind == "raises":
        return f"def {name}():\n    with pytest.raises({expected.exc}):\n        {case.call}\n"
    check = f"is {expected.text}" if expected.text in ("True", "False", "None") else f"== {expected.text}"
    line = f"    assert {case.call} {check}"
    if len(line) <= 100:
        return f"def {name}():\n{line}\n"
    args = "".join(f"        {a!r},\n" for a in case.args)
    return f"def {name}():\n    result = {case.name}(\n{args}    )\n    assert result {check}\n"


def render_tests(package: str, doc: str, tests: Sequence[tuple[str, Case, Outcome]]) -> str:
    """A pytest file of ``(test name, case, expected outcome)``, importing what it calls."""
    imports: dict[str, set[str]] = {}
    for _, case, _ in tests:
        imports.setdefault(case.function.split(".")[0], set()).add(case.name)
    head = "import pytest\n\n" if any(e.kind == "raises" for _, _, e in tests) else ""
    head += "".join(f"from {package}.{m} import {', '.join(sorted(n))}\n" for m, n in sorted(imports.items()))
    body = "\n\n".join(_test_function(name, case, expected) for name, case, expected in tests)
    return f'"""{doc}"""\n\n{head}\n\n{body}'


def scaffold(family: Family, modules: Sequence[str]) -> dict[str, str]:
    """``{path: text}`` of the repository around the package: README, pyproject, .gitignore, __init__."""
    listed = ", ".join(f"`{family.package}.{m}`" for m in modules)
    return {
        "README.md": f"# {family.package}\n\n{family.summary}\n\nModules: {listed}.\n\n"
        "Run the tests with `python -m pytest`.\n",
        "pyproject.toml": f'[project]\nname = "{family.package}"\nversion = "0.1.0"\n'
        'requires-python = ">=3.8"\n\n[tool.pytest.ini_options]\ntestpaths = ["tests"]\n',
        ".gitignore": "__pycache__/\n*.pyc\n.pytest_cache/\n",
        f"{family.package}/__init__.py": f'"""{family.summary}"""\n',
    }


def unified_diff(path: str, old: str, new: str) -> str:
    """A git-format diff turning ``old`` into ``new`` at ``path`` (``old == ""``: a new file)."""
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        f"a/{path}" if old else "/dev/null",
        f"b/{path}",
    )
    return f"diff --git a/{path} b/{path}\n" + ("new file mode 100644\n" if not old else "") + "".join(lines)


def problem_statement(
    rng: random.Random, package: str, shown: Sequence[tuple[Case, Outcome, Outcome]]
) -> str:
    """An issue from one or two failing calls ``(case, expected, actual)``; never names the bug's place."""

    def should(expected: Outcome) -> str:
        return f"raise `{expected.exc}`" if expected.kind == "raises" else f"return `{expected.text}`"

    def did(actual: Outcome) -> str:
        return f"raises `{actual.text}`" if actual.kind == "raises" else f"returns `{actual.text}`"

    case, expected, actual = shown[0]
    module = case.function.split(".")[0]
    title = rng.choice(
        [f"`{case.name}` gives a wrong result", f"Wrong result from `{package}.{module}.{case.name}`"]
    )
    if rng.random() < 0.5:
        body = f"Calling `{case.call}` (from `{package}.{module}`) {did(actual)}, "
        body += f"but it should {should(expected)}."
    else:
        printed = (
            actual.text
            if actual.kind == "value"
            else f"Traceback (most recent call last):\n  ...\n{actual.text}"
        )
        body = (
            f"To reproduce:\n\n```python\n>>> from {package}.{module} import {case.name}\n>>> {case.call}\n"
            f"{printed}\n```\n\nIt should {should(expected)}."
        )
    for case, expected, actual in shown[1:]:
        body += f"\n\nThe same with `{case.call}`: it {did(actual)}; it should {should(expected)}."
    return f"{title}\n\n{body}\n"
