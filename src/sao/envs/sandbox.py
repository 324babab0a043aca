"""Running model-written code: `run_code` (one shot) and `Sandbox` (a scratch dir kept across the turns of
an episode). Nothing the code does raises: timeouts, crashes, memory and output overruns all come back as
a `sao.envs.sandbox_result.SandboxResult`, which `SandboxResult.as_observation` turns into text for the
model. Only bad arguments from the caller raise, and `SandboxUnavailableError` when the sandbox cannot run
here.

The mode is ``bwrap`` (bubblewrap). It never silently falls back to a weaker one: where bwrap is missing
or cannot run, `sandbox_mode`, `Sandbox` and `run_code` raise `SandboxUnavailableError` saying why and how
to fix it, and the environments that run model code (math_tir, code_tests) refuse to be built
(`require_sandbox`), so a run fails at start-up. ``SAO_SANDBOX_MODE=unshare`` or ``=rlimits`` opts into a
weaker mode, for trusted code only. The mode in use is logged once per process (logger
``sao.envs.sandbox``: info for bwrap, a warning for a weaker mode), is each result's ``mode``, and the
code-running envs' ``sandbox_mode`` attribute; ``python -c "from sao.envs.sandbox import sandbox_mode;
print(sandbox_mode())"`` checks a machine.

Every run, in every mode, gets: its own session and process group; a wall-clock timeout after which the
whole run is SIGKILLed; RLIMIT_CPU (timeout + 1 s), RLIMIT_AS (``memory_mb``: virtual memory, so libraries
that reserve large address ranges need more), RLIMIT_FSIZE (64 MiB per file), RLIMIT_CORE 0,
RLIMIT_NOFILE 1024 and RLIMIT_NPROC 64; no-new-privileges (setuid binaries grant nothing); stdout and
stderr read as they come, the run killed once they pass ``output_limit`` bytes together (the caller never
holds more); a scrubbed environment (PATH with sao's interpreter as ``python`` first, HOME = the scratch
dir, TMPDIR, locale, a marker variable; none of the caller's variables, so no tokens); and before the call
returns, every process the run started is killed (found by process group, private uid, pid namespace or
marker), so no background process outlives its run.

When sao runs as root, each sandbox runs as a private, otherwise unused uid: its processes cannot signal or
trace the caller or other sandboxes, cannot write root's files, and RLIMIT_NPROC (which the kernel never
enforces for uid 0) counts exactly the sandbox's own processes. As non-root, bwrap and unshare run in a
user namespace, where RLIMIT_NPROC also counts only the run's own processes.

Modes:

- ``bwrap`` (the default; ``make install`` installs bubblewrap when root): a minimal root
  (`sao.envs.sandbox_root`) holding only read-only binds of /usr, /bin, /sbin, /lib*, a few /etc files
  (no shadow), and sao's interpreter (its prefixes, standard library and site-packages, wherever they are,
  /tmp and /root included); fresh /dev, /proc (of the run's own pid namespace), size-capped /tmp and
  /dev/shm; the scratch dir the only writable host path. The rest of the host does not exist inside: no
  /home, /root, /work, /srv, /var, /mnt, no project checkout, task file, data or checkpoint, no credentials,
  not sao's own source (sandboxed code cannot import sao). New network (loopback only: no host ports, no
  internet, no DNS), pid, ipc and uts namespaces; ``--die-with-parent`` and a new session; capabilities
  dropped. Ending a run ends its pid namespace, so nothing it forked survives.
- ``unshare`` (opt-in; util-linux): a new network namespace (no network) and, where permitted, a pid
  namespace with its own /proc (the code can neither see nor signal host processes, and its processes end
  with the run). No filesystem isolation: the code reads and writes whatever its uid may (the private uid
  of a root sao writes only world-writable places such as /tmp, but reads every file when it keeps
  CAP_DAC_READ_SEARCH, which it does where the interpreter is out of its reach, e.g. a pyenv in /root).
- ``rlimits`` (opt-in): only the resource limits, the kill and the scrubbed environment; no filesystem and
  no network isolation. As non-root the code runs as the caller's own user: it can read and write the
  caller's files, signal the caller's processes and read their environments through /proc, a process that
  clears its environment and daemonises escapes the final kill, and RLIMIT_NPROC counts all the user's
  processes (it is set to their current count + 64). For trusted code, or inside a container that is the
  sandbox.

Not bounded in any mode: the scratch dir's total disk use (each file is capped, their number is not; the
timeout bounds how much a run can write), the CPU share of a run (no cgroups: a run uses up to all cores
until its timeout), memory summed over a run's processes (the cap is per process, for at most 64
processes), and /tmp's tmpfs counts against host memory up to ``memory_mb``. The kernel is shared: a
kernel exploit escapes any mode. What bwrap shows is still readable: the interpreter's installed packages
and the system dirs. As root without a usable private uid (none free in the uid map), RLIMIT_NPROC is not
enforced (a warning says so at start), and in rlimits mode the code can kill the caller.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import signal
import stat
import threading
import uuid
import weakref
from pathlib import Path, PurePosixPath

from sao.envs.base import EnvError
from sao.envs.sandbox_command import Isolation, Limits, make_scratch
from sao.envs.sandbox_exec import execute, isolation_for, probe_failure
from sao.envs.sandbox_proc import allocate_uid, kill_leftovers, release_uid
from sao.envs.sandbox_result import SandboxResult
from sao.envs.sandbox_root import interpreter

__all__ = [
    "MODES",
    "MODE_VAR",
    "Sandbox",
    "SandboxUnavailableError",
    "require_sandbox",
    "run_code",
    "sandbox_mode",
]

MODES = ("bwrap", "unshare", "rlimits")
MODE_VAR = "SAO_SANDBOX_MODE"
_log = logging.getLogger("sao.envs.sandbox")
_announced: set[str] = set()
_announce_lock = threading.Lock()
_OOM_SIGNS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory", "Out of memory")
_PROGRAMS = {  # language: (file the code is written to, command)
    "python": ("main.py", [interpreter(), "-E", "-s", "-u", "main.py"]),
    "bash": ("script.sh", ["bash", "script.sh"]),
}


class SandboxUnavailableError(RuntimeError):
    """The sandbox untrusted code needs (bwrap, or the mode ``SAO_SANDBOX_MODE`` names) does not work on
    this machine; the message says why and how to fix it."""


def sandbox_mode() -> str:
    """The isolation runs get here: ``"bwrap"``, or ``"unshare"`` / ``"rlimits"`` when ``SAO_SANDBOX_MODE``
    asks for them (see the module docstring). Raises `SandboxUnavailableError` when that mode does not
    work here (never falls back to a weaker one) and ValueError for an unknown ``SAO_SANDBOX_MODE``."""
    return _isolation().mode


def require_sandbox(env_name: str) -> str:
    """`sandbox_mode` for an environment that runs model-written code, to call in its constructor: the
    mode, or `sao.envs.base.EnvError` saying why there is no sandbox and how to get one."""
    try:
        return sandbox_mode()
    except (SandboxUnavailableError, ValueError) as err:
        raise EnvError(f"environment {env_name!r} runs model-written code: {err}") from err


def _isolation() -> Isolation:
    forced = os.environ.get(MODE_VAR, "").strip()
    if forced and forced not in MODES:
        raise ValueError(f"{MODE_VAR}={forced!r}: expected one of {', '.join(MODES)}")
    mode = forced or "bwrap"
    iso = isolation_for(mode)
    if iso is None:
        raise SandboxUnavailableError(_unavailable(mode, forced, probe_failure(mode) or "unknown reason"))
    _announce(iso, forced)
    return iso


def _unavailable(mode: str, forced: str, why: str) -> str:
    if mode != "bwrap":
        return f"{MODE_VAR}={forced}, but that mode does not work on this machine: {why}"
    fixes = (
        "install bubblewrap (e.g. `apt-get install bubblewrap`, or `make sandbox-deps` as root)"
        if shutil.which("bwrap") is None
        else "let bubblewrap run: allow unprivileged user namespaces (sysctl"
        " kernel.unprivileged_userns_clone=1; on Ubuntu 24.04+ also"
        " kernel.apparmor_restrict_unprivileged_userns=0), or run the container with them allowed"
    )
    return (
        f"the bubblewrap sandbox that untrusted code needs does not work here: {why}. To fix it, {fixes}."
        f" For trusted code only, {MODE_VAR}=unshare or {MODE_VAR}=rlimits opts into a weaker sandbox"
        " (no filesystem isolation)."
    )


def _announce(iso: Isolation, forced: str) -> None:
    """Log the mode once per process (per mode): info for bwrap, a warning for a weaker, opted-into mode."""
    with _announce_lock:
        if iso.mode in _announced:
            return
        _announced.add(iso.mode)
    uid = "private uid" if iso.drop_uid else f"uid {os.geteuid()}"
    if iso.mode == "bwrap" and os.geteuid() == 0 and not iso.drop_uid:
        _log.warning(
            "sandbox mode: bwrap as uid 0 (no private uid usable): the process limit is not enforced"
        )
    elif iso.mode == "bwrap":
        _log.info("sandbox mode: bwrap (minimal read-only root, no network, own pids, %s)", uid)
    else:
        _log.warning(
            "sandbox mode: %s (%s=%s, as %s): weaker isolation, the host filesystem is not hidden; for"
            " trusted code only", iso.mode, MODE_VAR, forced, uid,
        )  # fmt: skip


def _check_limits(timeout_s: float, memory_mb: int, output_limit: int) -> None:
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    if not isinstance(memory_mb, int) or memory_mb < 16:
        raise ValueError(f"memory_mb must be an integer >= 16, got {memory_mb!r}")
    if not isinstance(output_limit, int) or output_limit < 1:
        raise ValueError(f"output_limit must be a positive integer, got {output_limit!r}")


def _cleanup(base: Path, uid: int | None, marker: str) -> None:
    kill_leftovers(None, uid, marker)
    shutil.rmtree(base, ignore_errors=True)
    if base.exists():  # the code took away its dirs' permissions (only a non-root sao minds)
        for dirpath, dirnames, _ in os.walk(base):
            for name in dirnames:  # before os.walk descends into them
                path = os.path.join(dirpath, name)
                with contextlib.suppress(OSError):
                    if not os.path.islink(path):
                        os.chmod(path, 0o700)
        shutil.rmtree(base, ignore_errors=True)
    release_uid(uid)


class Sandbox:
    """A scratch directory (``root``) kept across runs; each run starts fresh processes in it and none
    outlives its run. /tmp is private per run in bwrap mode: keep state in ``root``. One run at a time:
    share a sandbox between threads only with a lock.

    ``read_file`` raises FileNotFoundError for a missing file and ValueError for a path or symlink that
    leaves ``root``: envs reading files the code produced should catch ``(OSError, ValueError)``. The
    constructor raises `SandboxUnavailableError` where the mode (see `sandbox_mode`) cannot run.
    """

    def __init__(
        self,
        files: dict[str, str | bytes] | None = None,
        timeout_s: float = 10.0,
        memory_mb: int = 512,
        output_limit: int = 65536,
    ):
        _check_limits(timeout_s, memory_mb, output_limit)
        self.timeout_s, self.memory_mb, self.output_limit = timeout_s, memory_mb, output_limit
        self._iso = _isolation()
        self.mode = self._iso.mode
        self._uid = allocate_uid() if self._iso.drop_uid else None
        self._base, self.root, self._tmp = make_scratch(self._uid)
        self._marker = uuid.uuid4().hex
        self._closer = weakref.finalize(self, _cleanup, self._base, self._uid, self._marker)
        try:
            for path, content in (files or {}).items():
                self.write_file(path, content)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return not self._closer.alive

    def close(self) -> None:
        """Kill anything left and remove the scratch dir; idempotent."""
        self._closer()

    def run(
        self, command: str | list[str], timeout_s: float | None = None, stdin: str | None = None
    ) -> SandboxResult:
        """Run ``command`` (a string runs under ``bash -c``) in ``root``; never raises for what it does."""
        if self.closed:
            raise RuntimeError("the sandbox is closed")
        if isinstance(command, str):
            argv = ["bash", "-c", command]
        elif isinstance(command, list) and command and all(isinstance(a, str) for a in command):
            argv = list(command)
        else:
            raise ValueError(f"command must be a string or a non-empty list of strings, got {command!r}")
        timeout = self.timeout_s if timeout_s is None else timeout_s
        _check_limits(timeout, self.memory_mb, self.output_limit)
        stdin_path = None
        if stdin is not None:
            stdin_path = self._base / "stdin"
            stdin_path.write_text(stdin, encoding="utf-8")
        limits = Limits(timeout, self.memory_mb, self.output_limit)
        try:
            out = execute(
                argv, iso=self._iso, work=self.root, tmp=self._tmp, uid=self._uid, limits=limits,
                marker=self._marker, stdin_path=stdin_path,
            )  # fmt: skip
        finally:
            if stdin_path is not None:
                stdin_path.unlink(missing_ok=True)
        stderr = out.stderr.decode("utf-8", "replace")
        if not out.contained:
            stderr += "\nsandbox: some processes of this run could not be killed\n"
        killed_by_sandbox = out.timed_out or out.truncated
        oom = not killed_by_sandbox and (
            any(sign in stderr for sign in _OOM_SIGNS) or out.returncode == -signal.SIGKILL
        )
        return SandboxResult(
            stdout=out.stdout.decode("utf-8", "replace"),
            stderr=stderr,
            exit_code=out.returncode,
            timed_out=out.timed_out or out.returncode == -signal.SIGXCPU,
            oom=oom,
            truncated=out.truncated,
            duration_s=out.duration_s,
            mode=self.mode,
        )

    def _path(self, path: str | os.PathLike[str]) -> Path:
        """``root / path``, refusing absolute paths, ``..`` and symlinks that lead out of ``root``."""
        rel = PurePosixPath(os.fspath(path))
        if rel.is_absolute() or ".." in rel.parts or not rel.parts or rel.parts == (".",):
            raise ValueError(f"path {os.fspath(path)!r} must be relative and stay inside the sandbox")
        full = self.root / rel
        try:
            inside = full.resolve().is_relative_to(self.root.resolve())
        except (OSError, RuntimeError):  # a symlink loop
            inside = False
        if not inside:
            raise ValueError(f"path {os.fspath(path)!r} leads out of the sandbox (through a symlink)")
        return full

    def write_file(self, path: str | os.PathLike[str], content: str | bytes) -> None:
        if self.closed:
            raise RuntimeError("the sandbox is closed")
        if not isinstance(content, (str, bytes)):
            raise ValueError(f"content of {os.fspath(path)!r} must be str or bytes")
        full = self._path(path)
        data = content.encode() if isinstance(content, str) else content
        missing = [p for p in full.parents if not p.exists() and p.is_relative_to(self.root)]
        full.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if self._uid is not None:
            for p in [*missing, full]:
                os.chown(p, self._uid, self._uid, follow_symlinks=False)

    def read_file(self, path: str | os.PathLike[str], max_bytes: int = 65536) -> str:
        """The first ``max_bytes`` of a regular file, decoded as UTF-8 (invalid bytes replaced)."""
        if not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"max_bytes must be a non-negative integer, got {max_bytes!r}")
        full = self._path(path)
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # a FIFO must not block us
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ValueError(f"{os.fspath(path)!r} is not a regular file")
            return f.read(max_bytes).decode("utf-8", "replace")

    def list_files(self) -> list[str]:
        """Every regular file under ``root``, as sorted relative POSIX paths (symlinks not followed)."""
        found = []
        for dirpath, _, filenames in os.walk(self.root):
            for name in filenames:
                full = Path(dirpath, name)
                if full.is_file() and not full.is_symlink():
                    found.append(full.relative_to(self.root).as_posix())
        return sorted(found)


def run_code(
    code: str,
    language: str = "python",
    timeout_s: float = 10.0,
    memory_mb: int = 512,
    files: dict[str, str | bytes] | None = None,
    output_limit: int = 65536,
) -> SandboxResult:
    """Run ``code`` once in a fresh scratch dir holding ``files``: Python as ``main.py`` with the sandbox's
    interpreter, bash as ``script.sh``. The dir and every process are gone when it returns. Raises
    `SandboxUnavailableError` where the mode cannot run."""
    if language not in _PROGRAMS:
        raise ValueError(f"language must be one of {', '.join(_PROGRAMS)}, got {language!r}")
    filename, argv = _PROGRAMS[language]
    if files and filename in files:
        raise ValueError(f"files must not contain {filename!r}: the code is written there")
    with Sandbox(files, timeout_s=timeout_s, memory_mb=memory_mb, output_limit=output_limit) as box:
        box.write_file(filename, code)
        return box.run(argv)
