"""SWE-style task instances: SWE-bench's instance fields, plus where the repository lives locally.

A row (one JSONL line) has SWE-bench's fields ``instance_id``, ``repo``, ``base_commit``,
``problem_statement``, ``patch`` (the reference fix, a git diff), ``test_patch`` (the hidden tests, a git
diff), ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` (pytest node ids, a list or — as Hugging Face datasets hold
them — a JSON string of a list), and optionally ``repo_path`` (a local git repository holding
``base_commit``) and ``test_cmd`` (the test command, node ids appended). Other columns (``created_at``,
``version``, ``hints_text``, ...) are kept in ``SWEInstance.extra`` as they came.

``repo_path`` may be relative: it resolves against ``repos_dir`` when given, else the JSONL file's
directory. Missing, it is ``<repo with "/" replaced by "__">`` there. sao never downloads a
repository: loading checks that the directory is a git repository holding ``base_commit`` and raises
ValueError (naming the file:line, or the task, and the field) otherwise.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sao.envs.base import Task
from sao.jsonl import iter_jsonl

__all__ = [
    "DEFAULT_TEST_CMD",
    "SWEInstance",
    "SWEInstanceError",
    "default_repo_dir",
    "instance_from_row",
    "instance_from_task",
    "instance_to_row",
    "load_instances",
    "repo_files",
]

DEFAULT_TEST_CMD = "python -m pytest -rA -p no:cacheprovider -q"
_TEXT_FIELDS = ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch")
_TEST_FIELDS = ("FAIL_TO_PASS", "PASS_TO_PASS")
_NON_EMPTY = ("instance_id", "repo", "base_commit", "problem_statement")
_OWN_FIELDS = frozenset((*_TEXT_FIELDS, *_TEST_FIELDS, "repo_path", "test_cmd"))


class SWEInstanceError(ValueError):
    """A row that is not a usable instance; the message names where (file:line or task) and the field."""


@dataclass(frozen=True)
class SWEInstance:
    """One repository task: fix ``problem_statement`` in ``repo_path`` at ``base_commit``.

    Scored by applying ``test_patch`` and running ``test_cmd`` on ``FAIL_TO_PASS`` (must now pass) and
    ``PASS_TO_PASS`` (must still pass); ``patch`` is the reference fix.
    """

    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    patch: str  # unified diffs (git format), applied with `git apply`
    test_patch: str
    FAIL_TO_PASS: tuple[str, ...]  # pytest node ids, e.g. "tests/test_a.py::test_x"
    PASS_TO_PASS: tuple[str, ...]
    repo_path: str  # local git repository holding base_commit (absolute once loaded)
    test_cmd: str = DEFAULT_TEST_CMD  # node ids are appended
    extra: dict[str, Any] = field(default_factory=dict)  # other SWE-bench fields kept as they came


def default_repo_dir(repo: str) -> str:
    """``repo``'s directory name under a repos dir: ``"synth/ledger-0007"`` → ``"synth__ledger-0007"``."""
    return repo.replace("/", "__")


def _git(repo_path: str, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run read-only git plumbing in ``repo_path`` (never in a repository above it, nor one an inherited
    ``GIT_DIR`` / ``GIT_WORK_TREE`` or other ``GIT_*`` variable points at)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env["GIT_CEILING_DIRECTORIES"] = str(Path(repo_path).parent)
    return subprocess.run(
        ["git", "-C", repo_path, *args], input=stdin, capture_output=True, env=env, check=False
    )


_FOUND: set[tuple[str, str]] = set()  # (repo_path, commit) pairs already checked (only successes are kept)


def _commit_problem(repo_path: str, commit: str) -> str | None:
    """Why ``repo_path`` at ``commit`` is unusable (a sentence), or None when the repository holds it."""
    if (repo_path, commit) in _FOUND:
        return None
    if not Path(repo_path).is_dir():
        return f"repository directory {repo_path} does not exist (sao never downloads repositories)"
    if _git(repo_path, "rev-parse", "--git-dir").returncode != 0:
        return f"{repo_path} is not a git repository"
    if _git(repo_path, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        return f"commit {commit} is not in the repository {repo_path}"
    _FOUND.add((repo_path, commit))
    return None


def _node_ids(value: Any, name: str, where: str) -> tuple[str, ...]:
    if isinstance(value, str):  # the Hugging Face dataset form: a JSON string of a list
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise SWEInstanceError(f"{where}: {name} is a string but not a JSON list: {err.msg}") from None
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise SWEInstanceError(f"{where}: {name} must be a list of test node ids (strings), got {value!r}")
    return tuple(value)


def _repo_path(row: dict[str, Any], where: str, base_dir: Path | None, repos_dir: Path | None) -> str:
    raw = row.get("repo_path")
    if raw is not None and (not isinstance(raw, str) or not raw):
        raise SWEInstanceError(f"{where}: repo_path must be a non-empty string, got {raw!r}")
    anchor = repos_dir if repos_dir is not None else base_dir
    path = Path(raw if raw is not None else default_repo_dir(row["repo"])).expanduser()
    if not path.is_absolute():
        if anchor is None:
            named = f"repo_path {raw!r} is relative" if raw is not None else "no repo_path"
            raise SWEInstanceError(f"{where}: {named}; give repos_dir to find the repository")
        path = anchor / path
    return str(path.resolve())


def instance_from_row(
    row: Any, where: str, *, base_dir: str | os.PathLike[str] | None = None, repos_dir: Any = None
) -> SWEInstance:
    """Validate one row and build its instance.

    Args:
        row: the decoded JSON object.
        where: how errors name the row (``"instances.jsonl:3"``).
        base_dir: what a relative (or missing) ``repo_path`` resolves against when ``repos_dir`` is not given.
        repos_dir: where repositories live: a relative ``repo_path`` resolves here, a missing one is
            ``repos_dir / default_repo_dir(repo)``.

    Raises:
        SWEInstanceError: a missing or ill-typed field, or a repository / commit that is not there.
    """
    if not isinstance(row, dict):
        raise SWEInstanceError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for name in (*_TEXT_FIELDS, *_TEST_FIELDS):
        if name not in row or row[name] is None:
            raise SWEInstanceError(f"{where}: missing field {name!r}")
    for name in _TEXT_FIELDS:
        if not isinstance(row[name], str) or (name in _NON_EMPTY and not row[name].strip()):
            raise SWEInstanceError(f"{where}: {name} must be a non-empty string, got {row[name]!r}")
    fail_to_pass = _node_ids(row["FAIL_TO_PASS"], "FAIL_TO_PASS", where)
    if not fail_to_pass:
        raise SWEInstanceError(f"{where}: FAIL_TO_PASS is empty; an instance needs a failing test to fix")
    pass_to_pass = _node_ids(row["PASS_TO_PASS"], "PASS_TO_PASS", where)
    test_cmd = row.get("test_cmd", DEFAULT_TEST_CMD)
    if not isinstance(test_cmd, str) or not test_cmd.strip():
        raise SWEInstanceError(f"{where}: test_cmd must be a non-empty string, got {test_cmd!r}")
    repo_path = _repo_path(
        row,
        where,
        Path(base_dir).resolve() if base_dir is not None else None,
        Path(repos_dir).expanduser().resolve() if repos_dir is not None else None,
    )
    problem = _commit_problem(repo_path, row["base_commit"])
    if problem is not None:
        raise SWEInstanceError(f"{where}: repo_path / base_commit: {problem}")
    return SWEInstance(
        instance_id=row["instance_id"],
        repo=row["repo"],
        base_commit=row["base_commit"],
        problem_statement=row["problem_statement"],
        patch=row["patch"],
        test_patch=row["test_patch"],
        FAIL_TO_PASS=fail_to_pass,
        PASS_TO_PASS=pass_to_pass,
        repo_path=repo_path,
        test_cmd=test_cmd,
        extra={k: v for k, v in row.items() if k not in _OWN_FIELDS},
    )


def load_instances(
    path: str | os.PathLike[str], repos_dir: str | os.PathLike[str] | None = None
) -> list[SWEInstance]:
    """Read a JSONL file of instances (SWE-bench field names), in file order.

    Relative ``repo_path`` values resolve against ``repos_dir`` when given, else the file's directory.

    Raises:
        SWEInstanceError (a ValueError): a missing or empty file, invalid JSON, a bad row (the message names
            ``file:line`` and the field), or an ``instance_id`` used twice.
    """
    path = Path(path)
    if not path.is_file():
        raise SWEInstanceError(f"instance file {str(path)!r} does not exist")
    instances: list[SWEInstance] = []
    seen: dict[str, str] = {}
    for line, row in iter_jsonl(path, SWEInstanceError):
        where = f"{path}:{line}"
        inst = instance_from_row(row, where, base_dir=path.parent, repos_dir=repos_dir)
        if inst.instance_id in seen:
            raise SWEInstanceError(
                f"{where}: instance_id {inst.instance_id!r} already used at {seen[inst.instance_id]}"
            )
        seen[inst.instance_id] = where
        instances.append(inst)
    if not instances:
        raise SWEInstanceError(f"{path} has no instances")
    return instances


def instance_from_task(task: Task, repos_dir: str | os.PathLike[str] | None = None) -> SWEInstance:
    """The instance a `Task` holds: a JSONL row loaded by sao's task loader with
    ``data.id_field=instance_id`` and ``data.prompt_field=problem_statement`` (the other columns are in
    ``task.metadata``). A relative ``repo_path`` needs ``repos_dir`` (the loader does not keep the file's
    directory); `sao.envs.swe_synth.make_tasks` writes absolute paths."""
    row = dict(task.metadata)
    row.setdefault("instance_id", task.id)
    if "problem_statement" not in row:
        if not isinstance(task.prompt, str):
            raise SWEInstanceError(f"task {task.id!r}: problem_statement must be a string prompt")
        row["problem_statement"] = task.prompt
    return instance_from_row(row, f"task {task.id!r}", repos_dir=repos_dir)


def instance_to_row(inst: SWEInstance, base_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The JSONL row of ``inst`` (SWE-bench field names; node ids as lists; ``extra`` merged back).

    With ``base_dir``, ``repo_path`` is written relative to it (as `load_instances` resolves it against
    the file's directory); otherwise as it is.
    """
    repo_path = inst.repo_path
    if base_dir is not None:
        repo_path = os.path.relpath(Path(inst.repo_path).resolve(), Path(base_dir).resolve())
    row: dict[str, Any] = {name: getattr(inst, name) for name in _TEXT_FIELDS}
    row.update(FAIL_TO_PASS=list(inst.FAIL_TO_PASS), PASS_TO_PASS=list(inst.PASS_TO_PASS))
    row.update(inst.extra)
    row.update(repo_path=repo_path, test_cmd=inst.test_cmd)
    return row


@functools.lru_cache(maxsize=8)  # whole trees as bytes: a real repository is tens of MB
def _tree(repo_path: str, commit: str) -> tuple[tuple[str, bytes], ...]:
    """``(path, content)`` of every blob at ``commit``, read with git plumbing (the work tree untouched)."""
    listing = _git(repo_path, "ls-tree", "-r", "-z", "--full-tree", commit)
    if listing.returncode != 0:
        raise SWEInstanceError(f"{repo_path}: cannot list commit {commit}: {listing.stderr.decode().strip()}")
    entries: list[tuple[str, str]] = []  # (path, blob sha); submodules (type "commit") are left out
    for item in listing.stdout.split(b"\0"):
        if not item:
            continue
        meta, path = item.split(b"\t", 1)
        _mode, kind, sha = meta.split(b" ")
        if kind == b"blob":
            entries.append((path.decode("utf-8", "surrogateescape"), sha.decode()))
    shas = sorted({sha for _, sha in entries})
    batch = _git(repo_path, "cat-file", "--batch", stdin="".join(f"{s}\n" for s in shas).encode())
    if batch.returncode != 0:
        raise SWEInstanceError(f"{repo_path}: git cat-file failed: {batch.stderr.decode().strip()}")
    blobs: dict[str, bytes] = {}
    out, pos = batch.stdout, 0
    for sha in shas:
        header_end = out.index(b"\n", pos)
        size = int(out[pos:header_end].split(b" ")[2])
        blobs[sha] = out[header_end + 1 : header_end + 1 + size]
        pos = header_end + 1 + size + 1  # content, then a newline
    return tuple((path, blobs[sha]) for path, sha in entries)


def repo_files(inst: SWEInstance) -> dict[str, bytes]:
    """The repository tree at ``inst.base_commit``: ``{relative path: content}`` for every file (a
    symlink's content is its target, as git stores it; submodules are left out). Read with git plumbing,
    never touching the work tree; cached per ``(repo_path, base_commit)``, a fresh dict each call."""
    return dict(_tree(inst.repo_path, inst.base_commit))
