"""The repository environment's tools (`sao.envs.swe_env`): their OpenAI function schemas (`SWE_TOOLS`)
and what each does to an episode's `sao.envs.sandbox.Sandbox` (`run_tool`).

- ``bash {command}``: a shell command in the repository, run in the sandbox (its time and memory limits);
  the output, then ``[stderr]`` and stderr, then how it ended (``[exit code N]``, ``[timed out ...]``).
- ``view {path, view_range?}``: a text file with line numbers (``view_range`` ``[start, end]``, 1-based,
  inclusive, ``end`` -1 for the last line), or a directory's entries two levels deep (hidden ones skipped).
- ``str_replace {path, old_str, new_str}``: replace the one occurrence of ``old_str``; none or several
  is an error naming the lines of the matches; answers with the edited lines.
- ``create {path, file_text}``: write a file (parents made; an existing file is overwritten, and the
  answer says so).
- ``submit {}``: handled by the env (it ends the episode).

``view``, ``str_replace`` and ``create`` run here, outside the sandbox, on the sandbox's directory: no
sandboxed process outlives its run, so nothing moves under them. Each path is resolved (symlinks
followed) and refused unless it stays inside the repository; files are opened without following a final
symlink and must be regular UTF-8 text files. Every failure is an ``error: ...`` text, never an
exception; only a closed sandbox raises.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from sao.envs.sandbox import Sandbox
from sao.envs.sandbox_result import excerpt
from sao.envs.tools import ToolCall, function_tool

__all__ = [
    "MUTATING_TOOLS",
    "SWE_TOOLS",
    "ToolError",
    "ToolLimits",
    "disk_usage_bytes",
    "resolve_path",
    "run_tool",
    "truncate_observation",
]

MUTATING_TOOLS = frozenset({"bash", "str_replace", "create"})  # after these the env checks the disk
_SNIPPET_LINES = 4  # lines shown around an edit
_LISTING_DEPTH = 2


def _text(description: str) -> dict[str, str]:
    return {"type": "string", "description": description}


_PATH = _text("path of a file or directory, relative to the repository")
SWE_TOOLS = [
    function_tool(
        "bash",
        "Run a shell command in the repository (no network); returns its output and exit code.",
        {"command": _text("the bash command")},
        ["command"],
    ),
    function_tool(
        "view",
        "Show a text file with line numbers, or list a directory two levels deep.",
        {
            "path": _PATH,
            "view_range": {
                "type": "array",
                "items": {"type": "integer"},
                "description": "optional [start, end] line range, 1-based, inclusive; end -1 = the last line",
            },
        },
        ["path"],
    ),
    function_tool(
        "str_replace",
        "Replace the exact text old_str, which must occur exactly once in the file, with new_str.",
        {"path": _PATH, "old_str": _text("the exact text to replace"), "new_str": _text("the new text")},
        ["path", "old_str", "new_str"],
    ),
    function_tool(
        "create",
        "Write a file with the given content (parent directories are made; an existing file is overwritten).",
        {"path": _PATH, "file_text": _text("the full content of the file")},
        ["path", "file_text"],
    ),
    function_tool("submit", "Finish: hidden tests then check the repository as it is.", {}, []),
]


class ToolError(Exception):
    """A tool call the model got wrong; its message becomes the ``error: ...`` observation."""


@dataclass(frozen=True)
class ToolLimits:
    """``command_timeout_s``: seconds a ``bash`` call may run; ``max_observation_chars``: longest tool
    answer (longer ones keep head and tail around a note); ``max_file_bytes``: largest file ``view`` and
    ``str_replace`` read."""

    command_timeout_s: float = 60.0
    max_observation_chars: int = 10000
    max_file_bytes: int = 16 << 20

    def __post_init__(self) -> None:
        if not self.command_timeout_s > 0:
            raise ValueError(f"command_timeout_s must be > 0, got {self.command_timeout_s}")
        if self.max_observation_chars < 200:
            raise ValueError(f"max_observation_chars must be >= 200, got {self.max_observation_chars}")
        if self.max_file_bytes < 1:
            raise ValueError(f"max_file_bytes must be >= 1, got {self.max_file_bytes}")


def truncate_observation(text: str, max_chars: int, hint: str = "view a line range or grep for it") -> str:
    """``text`` if it has at most ``max_chars`` characters, else its head and tail around a note saying
    how many characters were cut and how to see them (``hint``); the result has at most ``max_chars``."""
    return excerpt(text, max_chars, "\n[... {} characters cut; " + hint + " ...]\n", min_room=2)


def run_tool(sandbox: Sandbox, call: ToolCall, limits: ToolLimits) -> str:
    """The answer to one tool call (``submit`` excluded): its text, or ``error: ...``."""
    tool = _TOOLS.get(call.name)
    if tool is None:
        known = ", ".join([*_TOOLS, "submit"])
        return f"error: unknown tool {call.name!r}; the tools are {known}"
    try:
        return tool(sandbox, call.arguments, limits)
    except ToolError as err:
        return f"error: {call.name}: {err}"
    except (OSError, ValueError) as err:  # a path out of the repository, a file that vanished, ...
        return f"error: {call.name}: {err}"


def _str_arg(args: dict[str, Any], key: str, *, allow_empty: bool = True) -> str:
    value = args.get(key)
    if not isinstance(value, str):
        raise ToolError(f'needs a string "{key}" argument')
    if not allow_empty and not value:
        raise ToolError(f'"{key}" must not be empty')
    return value


def resolve_path(sandbox: Sandbox, path: str) -> tuple[Path, str]:
    """``(absolute path with symlinks resolved, path relative to the repository)`` of ``path`` (relative to
    the repository, or absolute inside it). Raises ValueError when it leads out of the repository."""
    root = sandbox.root.resolve()
    given = PurePosixPath(path)
    if given.is_absolute():
        for base in (sandbox.root, root):
            if given.is_relative_to(base):
                given = given.relative_to(base)
                break
        else:
            raise ValueError(f"{path!r} is outside the repository; give a path relative to it")
    try:
        full = (root / given).resolve()
    except (OSError, RuntimeError) as err:  # a symlink loop
        raise ValueError(f"{path!r} cannot be resolved: {err}") from err
    if not full.is_relative_to(root):
        raise ValueError(f"{path!r} leads out of the repository")
    return full, full.relative_to(root).as_posix() or "."


def _read_text(full: Path, shown: str, max_bytes: int) -> str:
    """A regular UTF-8 text file's content (no final symlink followed)."""
    fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ToolError(f"{shown} is not a regular file")
        if info.st_size > max_bytes:
            raise ToolError(f"{shown} has {info.st_size} bytes (> {max_bytes}); use bash (head, sed, grep)")
        data = f.read(max_bytes + 1)
    if b"\0" in data[:8192]:
        raise ToolError(f"{shown} is a binary file; use bash to inspect it")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ToolError(f"{shown} is not UTF-8 text ({err.reason} at byte {err.start}); use bash") from err


def _numbered(lines: list[str], first: int) -> str:
    return "\n".join(f"{first + i:6}\t{line}" for i, line in enumerate(lines))


def _bash(sandbox: Sandbox, args: dict[str, Any], limits: ToolLimits) -> str:
    command = _str_arg(args, "command", allow_empty=False)
    result = sandbox.run(command, timeout_s=limits.command_timeout_s)
    body = result.stdout
    if result.stderr:
        body = body.rstrip("\n") + ("\n" if body else "") + "[stderr]\n" + result.stderr
    status = result.status_line() or "[exit code 0]"
    budget = limits.max_observation_chars - len(status) - 1
    hint = "redirect the output to a file and grep or view a line range of it"
    body = truncate_observation(body.rstrip("\n"), budget, hint)
    return f"{body}\n{status}" if body else status


def _view_range(value: Any, num_lines: int) -> tuple[int, int]:
    """1-based inclusive ``(start, end)`` of ``view_range`` in a file of ``num_lines`` lines."""
    if isinstance(value, str):
        with contextlib.suppress(json.JSONDecodeError):
            value = json.loads(value)
    ok = isinstance(value, list) and len(value) == 2 and all(type(v) is int for v in value)
    if not ok:
        raise ToolError(f"view_range must be two integers [start, end], got {value!r}")
    start, end = value
    if not 1 <= start <= num_lines:
        raise ToolError(f"view_range start {start} is not a line of the file (1..{num_lines})")
    end = num_lines if end == -1 else end
    if end < start:
        raise ToolError(f"view_range end {value[1]} is before its start {start} (use -1 for the last line)")
    return start, min(end, num_lines)


def _listing(full: Path, shown: str) -> str:
    entries: list[str] = []

    def walk(directory: Path, depth: int) -> None:
        with os.scandir(directory) as it:
            children = sorted((e for e in it if not e.name.startswith(".")), key=lambda e: e.name)
        for entry in children:
            rel = Path(entry.path).relative_to(full).as_posix()
            is_dir = entry.is_dir(follow_symlinks=False)
            entries.append(rel + ("/" if is_dir else "@" if entry.is_symlink() else ""))
            if is_dir and depth < _LISTING_DEPTH:
                walk(Path(entry.path), depth + 1)

    walk(full, 1)
    head = f"{shown}/ (up to {_LISTING_DEPTH} levels deep, hidden entries skipped):"
    return head + ("\n" + "\n".join(entries) if entries else "\n(empty)")


def _view(sandbox: Sandbox, args: dict[str, Any], limits: ToolLimits) -> str:
    full, shown = resolve_path(sandbox, _str_arg(args, "path", allow_empty=False))
    if full.is_dir():
        if args.get("view_range") is not None:
            raise ToolError(f"{shown} is a directory; view_range is for files")
        text = _listing(full, shown)
        return truncate_observation(text, limits.max_observation_chars, "view a subdirectory")
    if not full.exists():
        raise ToolError(f"{shown} does not exist")
    lines = _read_text(full, shown, limits.max_file_bytes).splitlines()
    if not lines:
        return f"{shown} is empty"
    start, end = 1, len(lines)
    if args.get("view_range") is not None:
        start, end = _view_range(args["view_range"], len(lines))
    text = _numbered(lines[start - 1 : end], start)
    return truncate_observation(text, limits.max_observation_chars, "view a smaller line range or grep")


def _match_lines(text: str, needle: str) -> list[int]:
    """1-based line numbers where each (possibly overlapping) occurrence of ``needle`` starts."""
    found, at = [], text.find(needle)
    while at >= 0:
        found.append(text.count("\n", 0, at) + 1)
        at = text.find(needle, at + 1)
    return found


def _str_replace(sandbox: Sandbox, args: dict[str, Any], limits: ToolLimits) -> str:
    full, shown = resolve_path(sandbox, _str_arg(args, "path", allow_empty=False))
    old, new = _str_arg(args, "old_str", allow_empty=False), _str_arg(args, "new_str")
    if not full.exists():
        raise ToolError(f"{shown} does not exist")
    text = _read_text(full, shown, limits.max_file_bytes)
    lines = _match_lines(text, old)
    if not lines:
        raise ToolError(f"old_str does not occur in {shown}; nothing was changed")
    if len(lines) > 1:
        where = ", ".join(map(str, lines[:20])) + (", ..." if len(lines) > 20 else "")
        raise ToolError(
            f"old_str occurs {len(lines)} times in {shown} (at lines {where}); nothing was changed. "
            "Include more surrounding lines to make it unique"
        )
    at = text.index(old)
    edited = text[:at] + new + text[at + len(old) :]
    sandbox.write_file(shown, edited)
    first = lines[0]
    last = first + new.count("\n")
    all_lines = edited.splitlines()
    lo, hi = max(first - _SNIPPET_LINES, 1), min(last + _SNIPPET_LINES, len(all_lines))
    snippet = _numbered(all_lines[lo - 1 : hi], lo)
    text_out = f"edited {shown}; lines {lo}-{hi} now read:\n{snippet}"
    return truncate_observation(text_out, limits.max_observation_chars, "view a line range")


def _create(sandbox: Sandbox, args: dict[str, Any], limits: ToolLimits) -> str:
    full, shown = resolve_path(sandbox, _str_arg(args, "path", allow_empty=False))
    content = _str_arg(args, "file_text")
    if full.is_dir():
        raise ToolError(f"{shown} is a directory")
    existed = full.exists()
    sandbox.write_file(shown, content)
    lines = content.count("\n") + (1 if content and not content.endswith("\n") else 0)
    verb = "overwrote the existing file" if existed else "created"
    return f"{verb} {shown} ({lines} lines, {len(content)} characters)"


_TOOLS = {"bash": _bash, "view": _view, "str_replace": _str_replace, "create": _create}


def disk_usage_bytes(root: Path) -> int:
    """Bytes of disk the tree under ``root`` uses (allocated blocks, as ``du``; a hard-linked file counted
    once; symlinks not followed; unreadable directories skipped)."""
    total, seen = 0, set()
    stack = [os.fspath(root)]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    info = entry.stat(follow_symlinks=False)
                    if info.st_nlink > 1 and not stat.S_ISDIR(info.st_mode):
                        if (info.st_dev, info.st_ino) in seen:
                            continue
                        seen.add((info.st_dev, info.st_ino))
                    total += info.st_blocks * 512
                    if stat.S_ISDIR(info.st_mode):
                        stack.append(entry.path)
        except OSError:
            continue
    return total
