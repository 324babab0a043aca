"""`SandboxResult`: how one sandboxed run ended (`sao.envs.sandbox`), and its text for the model."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SandboxResult", "excerpt"]


@dataclass
class SandboxResult:
    """One run. ``exit_code`` is None when the sandbox killed the run (timeout, output cap) or it never
    started, and -N when a signal N ended it; ``oom`` is inferred (a MemoryError-like message on stderr,
    or a SIGKILL the sandbox did not send)."""

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    oom: bool
    truncated: bool
    duration_s: float
    mode: str

    def status_line(self) -> str | None:
        """One line on how the run ended, or None for a clean exit 0."""
        notes = []
        if self.timed_out:
            notes.append(f"timed out after {self.duration_s:.1f} s")
        if self.oom:
            notes.append("out of memory")
        if self.truncated:
            notes.append("output truncated")
        if self.exit_code is not None and self.exit_code < 0:
            notes.append(f"killed by signal {-self.exit_code}")
        elif self.exit_code:
            notes.append(f"exit code {self.exit_code}")
        elif self.exit_code is None and not notes:
            notes.append("did not run")
        return "[" + "; ".join(notes) + "]" if notes else None

    def as_observation(self, max_chars: int = 2000) -> str:
        """Compact text for the model: stdout, then ``[stderr]`` and stderr, then the status line; long
        streams keep their head and tail. At most ``max_chars`` characters."""
        if max_chars < 1:
            raise ValueError(f"max_chars must be >= 1, got {max_chars}")
        status = self.status_line()
        budget = max(max_chars - (len(status) + 1 if status else 0) - len("\n[stderr]\n"), 0)
        out, err = self.stdout.rstrip("\n"), self.stderr.rstrip("\n")
        err_budget = min(len(err), max(budget // 2, budget - len(out)))
        parts = [excerpt(out, budget - err_budget)] if out else []
        if err:
            parts.append("[stderr]\n" + excerpt(err, err_budget))
        if status:
            parts.append(status)
        return ("\n".join(parts) or "(no output)")[:max_chars]


def excerpt(
    text: str, limit: int, marker: str = "\n... [{} characters omitted] ...\n", min_room: int = 20
) -> str:
    """``text`` if it has at most ``limit`` characters, else its head and tail around ``marker`` (its
    ``{}`` is the number of characters cut); with less than ``min_room`` characters left beside the
    marker, only the first ``limit``. The result has at most ``limit`` characters."""
    if len(text) <= limit:
        return text
    room = limit - len(marker.format(len(text)))
    if room < min_room:
        return text[: max(limit, 0)]
    head = room // 2
    tail = room - head
    return text[:head] + marker.format(len(text) - room) + text[len(text) - tail :]
