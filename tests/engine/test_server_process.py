"""`ServerProcess(die_with_parent=True)`: a server whose starter is SIGKILLed does not outlive it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

# The starter: launches a tiny HTTP server with die_with_parent, prints its pid, then waits to be killed.
_STARTER = """
import sys, time
from sao.engine.server_process import ServerProcess, free_port
port = free_port()
argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
server = ServerProcess.start(argv, f"http://127.0.0.1:{port}", health_path="/", timeout_s=60,
                             die_with_parent=sys.argv[1] == "1")
print(server.process.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has exited already
        return f.read().split()[2] != "Z"


def _server_after_starter_killed(die_with_parent: bool) -> tuple[int, bool]:
    starter = subprocess.Popen([sys.executable, "-c", _STARTER, "1" if die_with_parent else "0"],
                               stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert starter.stdout is not None
    pid = int(starter.stdout.readline())
    starter.send_signal(signal.SIGKILL)
    starter.wait()
    deadline = time.monotonic() + (10 if die_with_parent else 1)  # SIGTERM lands within ms
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pid, _alive(pid)


def test_a_server_started_with_die_with_parent_exits_when_its_starter_is_killed():
    _, alive = _server_after_starter_killed(True)
    assert not alive


def test_without_it_the_server_outlives_its_starter():  # the behaviour the option changes
    pid, alive = _server_after_starter_killed(False)
    try:
        assert alive
    finally:
        os.killpg(pid, signal.SIGKILL)
