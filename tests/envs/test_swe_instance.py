"""The SWE-style instance format: loading JSONL rows (SWE-bench field names), their errors, and reading a
repository's tree at the base commit."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from sao.envs.swe_instance import (
    DEFAULT_TEST_CMD,
    SWEInstanceError,
    instance_from_task,
    instance_to_row,
    load_instances,
    repo_files,
)
from sao.envs.tasks import load_tasks

_GIT_ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t",
}


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, env=_GIT_ENV, check=True, capture_output=True, text=True
    ).stdout.strip()


def _make_repo(path: Path, files: dict[str, bytes]) -> str:
    path.mkdir(parents=True)
    _git(path, "init", "-q", "-b", "main")
    for name, content in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(content)
    _git(path, "add", "-A")
    _git(path, "commit", "-q", "-m", "base")
    return _git(path, "rev-parse", "HEAD")


FILES = {
    "pkg/__init__.py": b"",
    "pkg/mod.py": b"def f():\n    return 1\n",
    "tests/test_mod.py": b"from pkg.mod import f\n\n\ndef test_f():\n    assert f() == 1\n",
    "data/blob.bin": bytes(range(256)) * 3,
    "README.md": "caf\u00e9\n".encode(),
}


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str]:
    """A repository at ``tmp/repos/acme__widgets`` and its commit."""
    path = tmp_path / "repos" / "acme__widgets"
    return path, _make_repo(path, FILES)


def _row(commit: str, **changes: Any) -> dict[str, Any]:
    row = {
        "instance_id": "acme__widgets-1",
        "repo": "acme/widgets",
        "base_commit": commit,
        "problem_statement": "f() is wrong",
        "patch": "diff --git a/pkg/mod.py b/pkg/mod.py\n",
        "test_patch": "diff --git a/tests/test_new.py b/tests/test_new.py\n",
        "FAIL_TO_PASS": ["tests/test_new.py::test_g"],
        "PASS_TO_PASS": ["tests/test_mod.py::test_f"],
        "created_at": "2024-05-01T00:00:00Z",
        "version": "1.0",
        "repo_path": "repos/acme__widgets",
    }
    row.update(changes)
    return {k: v for k, v in row.items() if v is not None}


def _write_rows(path: Path, *rows: dict[str, Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_relative_repo_path_resolves_against_the_file_directory(tmp_path, repo):
    path, commit = repo
    (inst,) = load_instances(_write_rows(tmp_path / "i.jsonl", _row(commit)))
    assert inst.repo_path == str(path.resolve())
    assert inst.FAIL_TO_PASS == ("tests/test_new.py::test_g",)
    assert inst.PASS_TO_PASS == ("tests/test_mod.py::test_f",)
    assert inst.test_cmd == DEFAULT_TEST_CMD
    assert inst.extra == {"created_at": "2024-05-01T00:00:00Z", "version": "1.0"}


def test_repos_dir_anchors_relative_paths_and_supplies_missing_ones(tmp_path, repo):
    path, commit = repo
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    rows = _write_rows(
        elsewhere / "i.jsonl",
        _row(commit, repo_path="acme__widgets"),
        _row(commit, instance_id="two", repo_path=None),  # missing: <repos_dir>/acme__widgets
    )
    first, second = load_instances(rows, repos_dir=tmp_path / "repos")
    assert first.repo_path == second.repo_path == str(path.resolve())
    beside = _write_rows(tmp_path / "repos" / "i.jsonl", _row(commit, repo_path=None))
    assert load_instances(beside)[0].repo_path == str(path.resolve())  # no repos_dir: the file's directory


def test_hugging_face_string_form_of_test_lists_is_parsed(tmp_path, repo):
    _, commit = repo
    row = _row(commit, FAIL_TO_PASS='["tests/a.py::t1", "tests/a.py::t2"]', PASS_TO_PASS="[]")
    (inst,) = load_instances(_write_rows(tmp_path / "i.jsonl", row))
    assert inst.FAIL_TO_PASS == ("tests/a.py::t1", "tests/a.py::t2")
    assert inst.PASS_TO_PASS == ()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"base_commit": None}, "missing field 'base_commit'"),
        ({"problem_statement": " "}, "problem_statement must be a non-empty string"),
        ({"FAIL_TO_PASS": "tests/a.py::t"}, "FAIL_TO_PASS is a string but not a JSON list"),
        ({"FAIL_TO_PASS": [1, 2]}, "FAIL_TO_PASS must be a list of test node ids"),
        ({"PASS_TO_PASS": {"a": 1}}, "PASS_TO_PASS must be a list of test node ids"),
        ({"FAIL_TO_PASS": []}, "FAIL_TO_PASS is empty"),
        ({"test_cmd": ""}, "test_cmd must be a non-empty string"),
        ({"repo_path": "repos/nowhere"}, "repos/nowhere does not exist"),
        ({"base_commit": "0" * 40}, f"commit {'0' * 40} is not in the repository"),
    ],
)
def test_a_bad_row_is_refused_naming_file_line_and_field(tmp_path, repo, changes, message):
    _, commit = repo
    path = _write_rows(tmp_path / "i.jsonl", _row(commit, instance_id="ok"), _row(commit, **changes))
    with pytest.raises(SWEInstanceError) as err:
        load_instances(path)
    assert f"{path}:2: " in str(err.value)
    assert message in str(err.value)


def test_a_plain_directory_inside_another_repository_is_not_a_repository(tmp_path, repo):
    _, commit = repo
    outer = tmp_path / "outer"
    _make_repo(outer, {"x": b"x"})
    (outer / "plain").mkdir()
    path = _write_rows(tmp_path / "i.jsonl", _row(commit, repo_path="outer/plain"))
    with pytest.raises(SWEInstanceError, match=r"i\.jsonl:1: .*outer/plain is not a git repository"):
        load_instances(path)


def test_invalid_json_duplicate_ids_and_empty_files_are_refused(tmp_path, repo):
    _, commit = repo
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(_row(commit)) + "\n{not json\n")
    with pytest.raises(SWEInstanceError, match=r"bad\.jsonl:2: invalid JSON"):
        load_instances(bad)
    twice = _write_rows(tmp_path / "twice.jsonl", _row(commit), _row(commit))
    with pytest.raises(SWEInstanceError, match=r"twice\.jsonl:2: instance_id 'acme__widgets-1' already used"):
        load_instances(twice)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(SWEInstanceError, match="has no instances"):
        load_instances(empty)


def test_row_round_trip_keeps_every_field(tmp_path, repo):
    _, commit = repo
    (inst,) = load_instances(_write_rows(tmp_path / "i.jsonl", _row(commit, test_cmd="pytest -x")))
    row = instance_to_row(inst, tmp_path)
    assert row["repo_path"] == "repos/acme__widgets"
    assert row == {**_row(commit, test_cmd="pytest -x")}
    (again,) = load_instances(_write_rows(tmp_path / "j.jsonl", row))
    assert again == inst


def test_a_task_loaded_by_sao_becomes_the_same_instance(tmp_path, repo):
    _, commit = repo
    path = _write_rows(tmp_path / "i.jsonl", _row(commit))
    (task,) = load_tasks(path, id_field="instance_id", prompt_field="problem_statement")
    assert instance_from_task(task, repos_dir=tmp_path) == load_instances(path)[0]
    with pytest.raises(SWEInstanceError, match="repo_path 'repos/acme__widgets' is relative; give repos_dir"):
        instance_from_task(task)


def test_repo_files_is_the_tree_at_base_commit_not_the_work_tree(tmp_path, repo):
    path, commit = repo
    (inst,) = load_instances(_write_rows(tmp_path / "i.jsonl", _row(commit)))
    (path / "pkg" / "mod.py").write_text("changed in the work tree\n")  # not committed
    (path / "untracked.txt").write_text("u")
    _git(path, "commit", "-q", "--allow-empty", "-m", "later")  # HEAD moves on; base_commit does not
    archive = subprocess.run(["git", "-C", str(path), "archive", commit], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        checkout = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    files = repo_files(inst)
    assert files == checkout == FILES
    files["pkg/mod.py"] = b"mutated by a caller"
    assert repo_files(inst)["pkg/mod.py"] == FILES["pkg/mod.py"]  # the cache hands out copies
