"""Grading a SWE-style instance (`sao.envs.swe_instance.SWEInstance`) in the sandbox that holds the model's
work: whether the hidden tests resolve it. Used by the repository env (`sao.envs.swe_env`) and by any
harness driver with a sandbox of its own.

The workspace contract: the sandbox's directory holds the repository at the instance's base commit, made
a git repository inside the sandbox by `init_repo` (one commit, whose hash `init_repo` returns and
`grade` takes). `grade` keeps whatever the model changed, resets every file the ``test_patch`` touches
to its base content (``git checkout <base> -- file``, or removed when the base has no such file), applies
the ``test_patch`` (``git apply``, from stdin: the hidden tests are never in the sandbox before this), then
removes every ``__pycache__`` (stale bytecode would test old code), then runs ``inst.test_cmd`` (with
``PYTHONDONTWRITEBYTECODE=1``) with the FAIL_TO_PASS and PASS_TO_PASS node ids appended and reads each test's
status from pytest's report (`parse_pytest_log`). Resolved = every FAIL_TO_PASS and every PASS_TO_PASS
test passed (``PASSED`` or ``XFAIL``, as SWE-bench counts them); a test missing from the report did not.

Limitation: the tests run next to the model's code, so code that sabotages pytest (a ``conftest.py``
that marks every test passed) could pass them, as in SWE-bench itself.
"""

from __future__ import annotations

import codecs
import re
import shlex
from dataclasses import dataclass, field

from sao.envs.sandbox import Sandbox
from sao.envs.swe_instance import SWEInstance

__all__ = [
    "GIT_IDENTITY",
    "PASSING",
    "GradeResult",
    "grade",
    "init_repo",
    "parse_pytest_log",
    "patch_paths",
]

GIT_IDENTITY = {"name": "sao", "email": "sao@localhost"}
PASSING = frozenset({"PASSED", "XFAIL"})
MISSING = "MISSING"  # the status of a test the report does not mention
_STATUSES = ("PASSED", "FAILED", "ERROR", "XFAIL", "XPASS", "SKIPPED")
_RANK = {"PASSED": 0, "XFAIL": 0, "SKIPPED": 0, "XPASS": 1, "FAILED": 2, "ERROR": 2}  # worst wins
_ANY = "|".join(_STATUSES)
_SUMMARY = re.compile(rf"^({_ANY}) (\S.*)$")  # -rA: "PASSED nodeid", "FAILED nodeid - msg"
_VERBOSE = re.compile(rf"^(\S.*?::.*?) ({_ANY})(?: +\[ *\d+%\])?$")  # -v: "nodeid PASSED [ 50%]"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass(frozen=True)
class GradeResult:
    """How the hidden tests judged the workspace. ``fail_to_pass`` / ``pass_to_pass``: each node id's
    status (``PASSED``, ``FAILED``, ``ERROR``, ``XFAIL``, ``XPASS``, ``SKIPPED`` or ``MISSING``);
    ``output``: the test run's stdout and stderr; ``error``: why the tests could not run or be read
    (test patch did not apply, time-out, ...), else None."""

    resolved: bool
    fail_to_pass: dict[str, str] = field(default_factory=dict)
    pass_to_pass: dict[str, str] = field(default_factory=dict)
    output: str = ""
    error: str | None = None

    def counts(self) -> dict[str, int]:
        """Passed and failed tests per group (``fail_to_pass_passed``, ..., ``pass_to_pass_failed``)."""
        out = {}
        for group, statuses in (("fail_to_pass", self.fail_to_pass), ("pass_to_pass", self.pass_to_pass)):
            passed = sum(status in PASSING for status in statuses.values())
            out[f"{group}_passed"], out[f"{group}_failed"] = passed, len(statuses) - passed
        return out


def _git_env() -> str:
    name, email = shlex.quote(GIT_IDENTITY["name"]), shlex.quote(GIT_IDENTITY["email"])
    return (
        f"export GIT_AUTHOR_NAME={name} GIT_AUTHOR_EMAIL={email} GIT_COMMITTER_NAME={name}"
        f" GIT_COMMITTER_EMAIL={email} GIT_AUTHOR_DATE='2000-01-01T00:00:00Z'"
        " GIT_COMMITTER_DATE='2000-01-01T00:00:00Z'; "
    )


def init_repo(sandbox: Sandbox, timeout_s: float = 120.0) -> str:
    """Make the sandbox's directory a git repository with everything in it as one commit; returns the
    commit's hash. Also sets a repository-local identity (so the model can commit) and ignores Python
    caches. Raises RuntimeError when git fails (a broken sandbox, not the model's doing)."""
    name, email = shlex.quote(GIT_IDENTITY["name"]), shlex.quote(GIT_IDENTITY["email"])
    script = (
        _git_env() + "git init -q && git config user.name " + name + " && git config user.email " + email
        + " && git config commit.gpgsign false && printf '__pycache__/\\n*.pyc\\n' >> .git/info/exclude"
        " && git add -A && git commit -q --allow-empty -m base && git rev-parse HEAD"
    )  # fmt: skip
    result = sandbox.run(script, timeout_s=timeout_s)
    commit = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    if result.exit_code != 0 or not re.fullmatch(r"[0-9a-f]{40,64}", commit):
        raise RuntimeError(f"could not make the workspace a git repository: {result.as_observation(2000)}")
    return commit


def _unquote(path: str) -> str:
    """A path as git prints it in a diff header (C-quoted when it has special characters)."""
    if len(path) >= 2 and path[0] == path[-1] == '"':
        raw = codecs.escape_decode(path[1:-1].encode("utf-8"))[0]
        return raw.decode("utf-8", "surrogateescape")  # type: ignore[union-attr]
    return path


def patch_paths(patch: str) -> list[str]:
    """Every path a git diff touches (old and new sides, renames included), in order, without repeats."""
    found: list[str] = []
    for line in patch.splitlines():
        path = None
        if line.startswith(("--- ", "+++ ")):
            side = line[4:].split("\t")[0]
            side = _unquote(side)
            if side != "/dev/null" and side[:2] in ("a/", "b/"):
                path = side[2:]
        elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
            path = _unquote(line.split(" ", 2)[2])
        if path and path not in found:
            found.append(path)
    return found


def _node_id_and_message(rest: str) -> str:
    """The node id at the start of a summary line's remainder (``nodeid - message``); a `` - `` inside
    the brackets of a parametrized id is part of the id."""
    depth = 0
    for i, char in enumerate(rest):
        if char == "[":
            depth += 1
        elif char == "]":
            depth = max(depth - 1, 0)
        elif depth == 0 and rest.startswith(" - ", i):
            return rest[:i]
    return rest.rstrip()


def parse_pytest_log(text: str) -> dict[str, str]:
    """Each test's status in a pytest report: the ``-rA`` short summary (``PASSED nodeid``, ``FAILED
    nodeid - message``, ``ERROR nodeid``, ``XFAIL nodeid - reason``) and the ``-v`` lines (``nodeid PASSED
    [ 50%]``). A test listed twice (passed, then an error at teardown) gets its worst status. ``SKIPPED
    [1] file:line`` summary lines name no test and are skipped."""
    statuses: dict[str, str] = {}
    for raw in _ANSI.sub("", text).splitlines():
        line = raw.rstrip()
        match = _SUMMARY.match(line)
        if match:
            status, rest = match.groups()
            if rest.startswith("["):
                continue
            node = _node_id_and_message(rest)
        else:
            match = _VERBOSE.match(line)
            if not match:
                continue
            node, status = match.groups()
        old = statuses.get(node)
        if old is None or _RANK[status] > _RANK[old]:
            statuses[node] = status
    return statuses


def _reset_script(base_commit: str, paths: list[str], apply: bool) -> str:
    """Shell: put each path back as the base commit has it (or remove it), then ``git apply`` stdin; and
    remove every ``__pycache__``: Python trusts a cached module whose source has the same size and mtime
    second, so an edit of the same length made within a second of an earlier test run (the model's, or the
    grading before a fix) would otherwise be tested as the old code."""
    base = shlex.quote(base_commit)
    steps = [
        f"if git cat-file -e {base}:{shlex.quote(p)} 2>/dev/null;"
        f" then git checkout -q {base} -- {shlex.quote(p)}; else rm -rf -- {shlex.quote(p)}; fi"
        for p in paths
    ]
    caches = "find . -name __pycache__ -type d -prune -exec rm -rf {} +"
    return " && ".join([*steps, "git apply --whitespace=nowarn -" if apply else "true", caches])


def grade(sandbox: Sandbox, inst: SWEInstance, base_commit: str, timeout_s: float = 300.0) -> GradeResult:
    """Run ``inst``'s hidden tests on the sandbox's workspace (see the module docstring).

    Args:
        sandbox: holds the workspace made by `init_repo`, with the model's changes.
        inst: the instance (its ``test_patch``, ``test_cmd`` and node ids).
        base_commit: the hash `init_repo` returned for this workspace.
        timeout_s: seconds the test run may take (the reset and ``git apply`` get the same bound).

    Never raises for what the workspace holds: a patch that does not apply, a time-out or an unreadable
    report is a not-resolved result with ``error`` set.
    """
    apply = bool(inst.test_patch.strip())
    script = _reset_script(base_commit, patch_paths(inst.test_patch), apply)
    reset = sandbox.run(script, timeout_s, inst.test_patch if apply else None)
    if reset.exit_code != 0:
        return GradeResult(False, error=f"the test patch did not apply: {reset.as_observation(2000)}")
    node_ids = list(dict.fromkeys((*inst.FAIL_TO_PASS, *inst.PASS_TO_PASS)))
    # no bytecode written either: a later grading of an edit within the same second reads the source
    command = (
        "export PYTHONDONTWRITEBYTECODE=1; " + inst.test_cmd + "".join(" " + shlex.quote(n) for n in node_ids)
    )
    run = sandbox.run(command, timeout_s)
    output = run.stdout + (("\n[stderr]\n" + run.stderr) if run.stderr.strip() else "")
    statuses = parse_pytest_log(run.stdout)
    f2p = {node: statuses.get(node, MISSING) for node in inst.FAIL_TO_PASS}
    p2p = {node: statuses.get(node, MISSING) for node in inst.PASS_TO_PASS}
    error = None
    if run.timed_out:
        error = f"the tests timed out after {timeout_s} s"
    elif run.truncated:
        error = f"the test output passed the sandbox's output limit ({sandbox.output_limit} bytes)"
    elif run.oom:
        error = "the tests ran out of memory"
    elif not statuses:
        error = f"no test results in the output of {inst.test_cmd!r} (exit code {run.exit_code})"
    resolved = error is None and all(s in PASSING for s in (*f2p.values(), *p2p.values()))
    return GradeResult(resolved, f2p, p2p, output, error)
