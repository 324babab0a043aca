"""Files on disk for `sao.envs.swe_synth`: package trees, and a repository's one reproducible commit."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["commit_repo", "write_tree"]

_GIT_ENV = {
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "sao synth",
    "GIT_AUTHOR_EMAIL": "synth@sao.invalid",
    "GIT_AUTHOR_DATE": "2025-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "sao synth",
    "GIT_COMMITTER_EMAIL": "synth@sao.invalid",
    "GIT_COMMITTER_DATE": "2025-01-01T00:00:00+0000",
}


def write_tree(root: Path, files: dict[str, str]) -> None:
    """Write ``{relative path: text}`` under ``root`` (UTF-8), making directories as needed."""
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text, encoding="utf-8")


def _git(cwd: Path, *args: str) -> str:
    """``git args`` in ``cwd`` with no user or system config and the fixed identity; its stdout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(_GIT_ENV)
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {cwd}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def commit_repo(target: Path, files: dict[str, str], message: str) -> str:
    """Create ``target`` as a git repository whose one commit (fixed author and dates) holds ``files``;
    the commit hash. An existing ``target`` (made earlier, or by a concurrent call) is kept when its HEAD
    is that same commit, else FileExistsError."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    try:
        write_tree(staging, files)
        _git(staging, "init", "-q", "-b", "main")
        _git(staging, "add", "-A")
        _git(staging, "commit", "-q", "-m", message)
        commit = _git(staging, "rev-parse", "HEAD")
        staging.chmod(0o755)  # mkdtemp made it private
        with contextlib.suppress(OSError):
            staging.rename(target)  # fails when target exists (a non-empty directory)
        if not staging.exists():
            return commit
        head = _git(target, "rev-parse", "HEAD") if (target / ".git").exists() else "(not a repository)"
        if head != commit:
            raise FileExistsError(f"{target} exists with HEAD {head}, not {commit}; use an empty --out")
        return commit
    finally:
        shutil.rmtree(staging, ignore_errors=True)
