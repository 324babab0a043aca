"""A tiny hand-made SWE-style instance for the tests: ``calc/ops.py`` with a bug in ``add``,
``tests/test_ops.py`` testing ``mul`` (PASS_TO_PASS), and hidden tests that change ``tests/test_ops.py`` and
add ``tests/test_new.py`` (FAIL_TO_PASS), all made with git in a temporary directory."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from sao.envs.base import Task
from sao.envs.swe_instance import SWEInstance, instance_to_row

BUGGY = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
FIXED = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"
OLD_TESTS = "from calc.ops import mul\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n"
NEW_TESTS = (
    OLD_TESTS.replace("import mul", "import add, mul") + "\n\ndef test_add():\n    assert add(2, 3) == 5\n"
)
NEW_FILE = "from calc.ops import add\n\n\ndef test_add_negative():\n    assert add(-1, -1) == -2\n"
F2P = ("tests/test_ops.py::test_add", "tests/test_new.py::test_add_negative")
P2P = ("tests/test_ops.py::test_mul",)


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, check=True)
    return out.stdout


def diff_of(repo: Path, files: dict[str, str]) -> str:
    """The git diff that writes ``files`` over the committed tree (the work tree is restored after)."""
    for path, text in files.items():
        (repo / path).write_text(text)
    git(repo, "add", "-A")
    diff = git(repo, "diff", "--cached")
    git(repo, "reset", "-q", "--hard", "HEAD")
    return diff


def make_instance(root: Path) -> SWEInstance:
    """A tiny repository (``calc/ops.py`` with a bug in ``add``; ``tests/test_ops.py`` testing ``mul``),
    its reference patch, and hidden tests that change ``tests/test_ops.py`` and add ``tests/test_new.py``."""
    repo = root / "calc-repo"
    (repo / "calc").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "calc" / "__init__.py").write_text("")
    (repo / "calc" / "ops.py").write_text(BUGGY)
    (repo / "tests" / "test_ops.py").write_text(OLD_TESTS)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    patch = diff_of(repo, {"calc/ops.py": FIXED})
    test_patch = diff_of(repo, {"tests/test_ops.py": NEW_TESTS, "tests/test_new.py": NEW_FILE})
    return SWEInstance(
        instance_id="calc__add-1",
        repo="calc/calc",
        base_commit=base,
        problem_statement="add(2, 3) returns -1 instead of 5.",
        patch=patch,
        test_patch=test_patch,
        FAIL_TO_PASS=F2P,
        PASS_TO_PASS=P2P,
        repo_path=str(repo),
    )


def task_of(inst: SWEInstance) -> Task:
    """The `Task` sao's loader makes of the instance's JSONL row (id and prompt fields taken out)."""
    row = instance_to_row(inst)
    return Task(id=row.pop("instance_id"), prompt=row.pop("problem_statement"), metadata=row)
