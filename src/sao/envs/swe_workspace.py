"""An episode's workspace for a SWE-style instance: a `Sandbox` holding the repository tree at
``base_commit``, made a one-commit git repository inside it.

`open_workspace` writes every file of ``inst.repo_path`` at ``inst.base_commit`` (read with git plumbing by
`sao.envs.swe_instance.repo_files`, never touching the host's work tree) into a fresh sandbox and commits
it there (`sao.envs.swe_grading.init_repo`). The agent works in ``sandbox.root`` (the current directory
of every ``sandbox.run``); ``git diff`` / ``git status`` there show what the episode changed, and
`Workspace.grade` runs the hidden tests on that state (`sao.envs.swe_grading.grade`).

The workspace's commit is not ``base_commit`` itself: the host repository's history (which may hold the
fix) never enters the sandbox. File modes are not kept (every file is written as a regular file; a
symlink becomes a file holding its target, as git stores it).

Owns: building the workspace. Does not own: the instance format (`swe_instance`), the sandbox's limits and
isolation (`sandbox`), the git setup and grading (`swe_grading`).
"""

from __future__ import annotations

from dataclasses import dataclass

from sao.envs.sandbox import Sandbox
from sao.envs.swe_grading import GradeResult, grade, init_repo
from sao.envs.swe_instance import SWEInstance, repo_files

__all__ = ["DEFAULT_OUTPUT_LIMIT", "Workspace", "open_workspace"]

DEFAULT_OUTPUT_LIMIT = 8 << 20  # bytes a command may print: the hidden tests' report of a big suite fits


@dataclass(frozen=True)
class Workspace:
    """An open workspace: its ``sandbox`` (commands run in ``sandbox.root``), the hash of its one commit
    (``base_commit``: what `grade` resets the test files to) and the ``instance`` it holds."""

    sandbox: Sandbox
    base_commit: str
    instance: SWEInstance

    def grade(self, timeout_s: float = 300.0) -> GradeResult:
        """The hidden tests on the workspace as it is now (never raises for what it holds)."""
        return grade(self.sandbox, self.instance, self.base_commit, timeout_s)

    def close(self) -> None:
        """Kill anything left and remove the workspace; idempotent."""
        self.sandbox.close()

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_workspace(
    inst: SWEInstance,
    *,
    timeout_s: float = 30.0,
    memory_mb: int = 2048,
    output_limit: int = DEFAULT_OUTPUT_LIMIT,
) -> Workspace:
    """A fresh sandbox holding ``inst``'s repository at ``base_commit``, committed as a git repository.

    Args:
        inst: the instance (its ``repo_path`` must hold ``base_commit``).
        timeout_s: the sandbox's default wall-clock limit per command, in seconds.
        memory_mb: the sandbox's address-space limit per process, in MiB (pytest wants ~1 GiB or more).
        output_limit: bytes of stdout + stderr a command may print before it is killed.

    Returns:
        The open `Workspace`; the caller closes it (``with open_workspace(...) as ws:`` or ``ws.close()``).

    Raises:
        SWEInstanceError: the repository or commit cannot be read.
        SandboxUnavailableError: no sandbox on this machine (see `sao.envs.sandbox`).
        RuntimeError: git failed inside the sandbox (the sandbox is closed first).
    """
    files: dict[str, str | bytes] = dict(repo_files(inst))
    box = Sandbox(files, timeout_s=timeout_s, memory_mb=memory_mb, output_limit=output_limit)
    try:
        commit = init_repo(box)
    except BaseException:
        box.close()
        raise
    return Workspace(box, commit, inst)
