"""Running a model server as a child process: `free_port` and `ServerProcess`.

`ServerProcess` runs a model server in its own process group (``start_new_session``; vLLM and SGLang fork
engine and worker processes, and `ServerProcess.stop` signals the whole group) with output in a log file
whose tail is quoted when it fails. Its calls block: async code runs them in a thread.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

__all__ = ["ServerProcess", "free_port"]


def _term_with_parent() -> Any:
    """A ``preexec_fn`` for the child, before exec: SIGTERM when the parent thread dies
    (``prctl(PR_SET_PDEATHSIG)``). libc is looked up here, in the parent: the child only calls it."""
    import ctypes
    import functools

    pr_set_pdeathsig = 1
    return functools.partial(ctypes.CDLL(None).prctl, pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class ServerProcess:
    """A running server child process and where to reach it. Build with `ServerProcess.start`."""

    process: subprocess.Popen
    base_url: str
    log_path: Path
    _log_file: Any = field(default=None, repr=False)

    @classmethod
    def start(
        cls,
        argv: Sequence[str],
        base_url: str,
        *,
        env: Mapping[str, str] | None = None,
        health_path: str = "/health",
        timeout_s: float = 600.0,
        log_path: str | Path | None = None,
        die_with_parent: bool = False,
    ) -> ServerProcess:
        """Run ``argv`` and block until ``GET base_url + health_path`` answers 200.

        ``die_with_parent`` (Linux): the server gets SIGTERM when the thread that started it ends, e.g. the
        Ray actor holding it is killed (its own workers follow it as on any stop); call it from a thread
        that lives as long as the server. Raises RuntimeError (with the log's tail) if the process exits
        first, TimeoutError (after stopping it) if it is not healthy within ``timeout_s``.
        """
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="sao-server-", suffix=".log")
            os.close(fd)
            log_path = name
        path = Path(log_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        log_file = path.open("ab")
        process = subprocess.Popen(
            list(argv),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=None if env is None else dict(env),
            start_new_session=True,
            preexec_fn=_term_with_parent() if die_with_parent else None,
        )
        server = cls(process=process, base_url=base_url.rstrip("/"), log_path=path, _log_file=log_file)
        try:
            server._wait_healthy(health_path, timeout_s)
        except BaseException:
            server.stop()
            raise
        return server

    def _wait_healthy(self, health_path: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=5.0) as client:
            while True:
                code = self.process.poll()
                if code is not None:
                    raise RuntimeError(
                        f"server exited with code {code} before it was healthy: {self.process.args}\n"
                        f"--- last lines of {self.log_path} ---\n{self.log_tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(self.base_url + health_path).status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"server not healthy after {timeout_s:.0f} s at {self.base_url}{health_path}\n"
                        f"--- last lines of {self.log_path} ---\n{self.log_tail()}"
                    )
                time.sleep(0.5)

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server's log ("" if unreadable)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the server's process group, SIGKILL it after ``timeout_s``. Idempotent."""
        if self.process.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.process.wait(timeout=timeout_s)
            # Workers may outlive their leader for a moment: make sure the group is gone.
            self._signal_group(signal.SIGKILL)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def _signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)
