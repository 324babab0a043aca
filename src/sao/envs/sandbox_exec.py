"""Running one sandboxed command: spawning it (see `sao.envs.sandbox_command`), reading its output as it
comes under a cap and a deadline, killing everything it started, and probing which modes work here.
"""

from __future__ import annotations

import os
import selectors
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sao.envs.sandbox_command import Isolation, Limits, command, environment, make_scratch
from sao.envs.sandbox_proc import allocate_uid, kill_leftovers, release_uid
from sao.envs.sandbox_root import interpreter

__all__ = ["Outcome", "execute", "isolation_for", "probe_failure"]


@dataclass
class Outcome:
    """What happened, before interpretation: raw output (each capped), exit status (None when the
    sandbox killed the run), and whether everything the run started is gone (``contained``)."""

    stdout: bytes
    stderr: bytes
    returncode: int | None
    timed_out: bool
    truncated: bool
    duration_s: float
    contained: bool = True


class _Capture:
    """Reads stdout and stderr as they come, keeping at most ``limit`` bytes in all."""

    def __init__(self, proc: subprocess.Popen, limit: int):
        self.limit, self.total, self.truncated = limit, 0, False
        self.buffers = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
        self.selector = selectors.DefaultSelector()
        for fd in self.buffers:
            os.set_blocking(fd, False)
            self.selector.register(fd, selectors.EVENT_READ)

    @property
    def open(self) -> bool:
        return bool(self.selector.get_map())

    def read(self, timeout: float) -> None:
        for key, _ in self.selector.select(max(timeout, 0.0)):
            try:
                chunk = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                self.selector.unregister(key.fd)
                continue
            room = self.limit - self.total
            self.buffers[key.fd] += chunk[: max(room, 0)]
            self.total += len(chunk)
            if self.total > self.limit:
                self.truncated = True

    def close(self) -> None:
        self.selector.close()


def _pump(proc: subprocess.Popen, capture: _Capture, deadline: float) -> bool:
    """Read until the run ends, overruns its output cap or its deadline; True if the deadline hit."""
    exited_at = None
    while not capture.truncated:
        now = time.monotonic()
        if now >= deadline:
            return True
        if not capture.open:
            try:
                proc.wait(timeout=deadline - now)
                return False
            except subprocess.TimeoutExpired:
                return True
        capture.read(min(deadline - now, 0.05))
        if exited_at is None and proc.poll() is not None:
            exited_at = time.monotonic()
        if exited_at is not None and time.monotonic() - exited_at > 0.1:
            return False  # background processes hold the pipes open; they get killed next
    return False


def execute(
    argv: list[str],
    *,
    iso: Isolation,
    work: Path,
    tmp: Path,
    uid: int | None,
    limits: Limits,
    marker: str,
    stdin_path: Path | None = None,
) -> Outcome:
    """Run ``argv`` in ``work`` under ``iso``; every failure is an `Outcome`, never an exception."""
    start = time.monotonic()
    stdin = open(stdin_path, "rb") if stdin_path is not None else subprocess.DEVNULL  # noqa: SIM115
    try:
        proc = subprocess.Popen(
            command(argv, iso, work, tmp, uid, limits),
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=work,
            env=environment(iso, work, tmp, marker),
            start_new_session=True,
        )
    except OSError as err:
        message = f"sandbox: cannot start the run: {err}\n".encode()
        return Outcome(b"", message, None, False, False, time.monotonic() - start)
    finally:
        if stdin_path is not None:
            stdin.close()
    capture = _Capture(proc, limits.output_limit)
    try:
        timed_out = _pump(proc, capture, start + limits.timeout_s)
    finally:
        contained = kill_leftovers(proc.pid, uid, marker)
        proc.kill()
        proc.wait()
        drain_until = time.monotonic() + 0.5
        while capture.open and not capture.truncated and time.monotonic() < drain_until:
            capture.read(drain_until - time.monotonic())
        capture.close()
        proc.stdout.close()
        proc.stderr.close()
    killed = timed_out or capture.truncated
    returncode = None if killed else proc.returncode
    if returncode is not None and iso.mode != "rlimits" and 128 < returncode < 128 + 65:
        returncode = 128 - returncode  # bwrap and the pid-1 launcher report a signal N as 128 + N
    out, err = capture.buffers.values()
    return Outcome(
        bytes(out), bytes(err), returncode, timed_out, capture.truncated, time.monotonic() - start, contained
    )


_probed: dict[str, Isolation | None] = {}
_failures: dict[str, str] = {}  # mode: why its probe failed
_probe_lock = threading.RLock()


def _works(iso: Isolation) -> str | None:
    """None if a trivial Python run works under ``iso``, else what went wrong (exit status and stderr)."""
    uid = allocate_uid() if iso.drop_uid else None
    if iso.drop_uid and uid is None:
        return "no free uid in this user namespace's map for the sandbox's private uid"
    base, work, tmp = make_scratch(uid)
    try:
        argv = [interpreter(), "-E", "-s", "-c", "print('sandbox-ok')"]
        limits = Limits(timeout_s=20.0, memory_mb=512, output_limit=4096)
        out = execute(argv, iso=iso, work=work, tmp=tmp, uid=uid, limits=limits, marker=base.name)
        if out.returncode == 0 and out.stdout.strip() == b"sandbox-ok":
            return None
        status = "timed out" if out.timed_out else f"exit status {out.returncode}"
        stderr = out.stderr.decode("utf-8", "replace").strip()[-2000:] or "(no stderr)"
        how = f"{iso.mode}, private uid" if uid is not None else iso.mode
        return f"a test run ({how}) failed, {status}: {stderr}"
    finally:
        shutil.rmtree(base, ignore_errors=True)
        release_uid(uid)


def _first_working(mode: str, candidates: list[Isolation]) -> Isolation | None:
    """The first candidate that works; else None, with the candidates' failures kept for `probe_failure`."""
    failures = []
    for iso in candidates:
        failure = _works(iso)
        if failure is None:
            return iso
        failures.append(failure)
    _failures[mode] = "; ".join(failures)
    return None


def _detect(mode: str) -> Isolation | None:
    if mode == "rlimits":
        # Root switches to a private uid; where that uid cannot reach the interpreter (a pyenv under /root)
        # it keeps the right to read and traverse everything, which a root run has anyway.
        drop_modes = [Isolation("rlimits", True), Isolation("rlimits", True, read_all=True)]
        works = (iso for iso in drop_modes if os.geteuid() == 0 and _works(iso) is None)
        return next(works, Isolation("rlimits"))
    if mode == "bwrap":
        program = shutil.which("bwrap")
        if program is None:
            _failures[mode] = "bubblewrap is not installed (no `bwrap` on PATH)"
            return None
        help_text = subprocess.run([program, "--help"], capture_output=True, text=True).stdout
        sized = "--size" in help_text and "--perms" in help_text
        # as root, each sandbox runs as a private uid (see sao.envs.sandbox_proc)
        drops = [True, False] if os.geteuid() == 0 else [False]
        candidates = [Isolation("bwrap", drop, sized_tmpfs=sized, program=program) for drop in drops]
    elif mode == "unshare":
        program = shutil.which("unshare")
        if program is None:
            _failures[mode] = "util-linux `unshare` is not installed (no `unshare` on PATH)"
            return None
        fallback = isolation_for("rlimits")
        user = () if os.geteuid() == 0 else ("--map-root-user",)
        full = (*user, "--net", "--pid", "--fork", "--kill-child", "--mount-proc")
        candidates = [
            Isolation("unshare", fallback.drop_uid, flags, read_all=fallback.read_all, program=program)
            for flags in (full, (*user, "--net"))
        ]
    else:
        raise ValueError(f"unknown sandbox mode {mode!r}; expected 'bwrap', 'unshare' or 'rlimits'")
    return _first_working(mode, candidates)


def isolation_for(mode: str) -> Isolation | None:
    """The working isolation for ``mode`` here (probed once per process), or None if it does not work."""
    with _probe_lock:
        if mode not in _probed:
            _probed[mode] = _detect(mode)
        return _probed[mode]


def probe_failure(mode: str) -> str | None:
    """Why ``mode`` does not work here (after `isolation_for` returned None for it), else None."""
    with _probe_lock:
        return _failures.get(mode) if isolation_for(mode) is None else None
