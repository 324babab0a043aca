"""Process bookkeeping for `sao.envs.sandbox`: finding and killing whatever a sandboxed run left behind,
and picking a private user id for each sandbox when sao runs as root.

Leftovers are found by scanning ``/proc`` (no psutil) for processes whose real uid is the sandbox's
private uid, or whose initial environment carries the sandbox's marker variable. A private uid is the
reliable handle (a process cannot shed it); the marker is the fallback when sao is not root, and code
that rewrites its environment before daemonising can hide from it.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import random
import signal
import threading
import time
from pathlib import Path

__all__ = ["MARKER_VAR", "allocate_uid", "find_processes", "kill_leftovers", "release_uid"]

MARKER_VAR = "SAO_SANDBOX_ID"
_PROC = Path("/proc")
# Private uids come from a range no distribution hands out to real users; the top of a smaller
# container uid map otherwise.
_PREFERRED_UIDS = (1_000_000_000, 2_000_000_000)
_uids_in_use: set[int] = set()
_uids_lock = threading.Lock()


def _status_fields(pid: str) -> dict[str, str]:
    fields = {}
    with open(_PROC / pid / "status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("State", "Uid"):
                fields[key] = value.strip()
    return fields


def find_processes(uid: int | None = None, marker: str | None = None) -> list[int]:
    """Live (non-zombie) processes with real uid ``uid`` or ``MARKER_VAR=marker`` in their environment."""
    if not _PROC.is_dir() or (uid is None and marker is None):
        return []
    needle = f"{MARKER_VAR}={marker}".encode() if marker else None
    own = os.getpid()
    found = []
    for entry in os.listdir(_PROC):
        if not entry.isdigit() or int(entry) == own:
            continue
        try:
            fields = _status_fields(entry)
            if fields.get("State", "Z")[:1] in ("Z", "X"):
                continue
            if uid is not None and int(fields.get("Uid", "-1").split()[0]) == uid:
                found.append(int(entry))
                continue
            if needle is not None:
                with open(_PROC / entry / "environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        found.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue  # exited meanwhile, or not ours to read
    return found


def kill_leftovers(pgid: int | None, uid: int | None, marker: str | None, patience_s: float = 2.0) -> bool:
    """SIGKILL the run's process group, then every process found by uid or marker, until none is left.

    Repeats because a fork bomb can fork between scan and kill; returns False if some survived
    ``patience_s`` (the caller reports it, it does not raise).
    """
    if pgid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + patience_s
    while True:
        pids = find_processes(uid, marker)
        if not pids:
            return True
        if time.monotonic() > deadline:
            return False
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)


def _mapped_ranges(path: str) -> list[tuple[int, int]]:
    """[start, stop) id ranges valid in this user namespace (all of them where the map is unreadable)."""
    try:
        with open(path) as f:
            rows = [line.split() for line in f if line.strip()]
        return [(int(inside), int(inside) + int(count)) for inside, _, count in rows]
    except (OSError, ValueError):
        return [(0, 2**32 - 1)]


def _candidate_range() -> tuple[int, int] | None:
    ranges = [
        (max(u0, g0), min(u1, g1))
        for u0, u1 in _mapped_ranges("/proc/self/uid_map")
        for g0, g1 in _mapped_ranges("/proc/self/gid_map")
    ]
    lo, hi = _PREFERRED_UIDS
    for start, stop in ranges:
        if start <= lo and stop >= hi:
            return lo, hi
    best = max(ranges, key=lambda r: r[1], default=None)
    if best is None or best[1] - max(best[0], 20_000) < 1_000:
        return None
    return max(best[0], 20_000), best[1] - 2  # keep clear of nobody/nogroup (65534) at a 65536 map's top


def _id_known(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        pass
    try:
        grp.getgrgid(uid)
        return True
    except KeyError:
        return False


def allocate_uid() -> int | None:
    """A uid (used as gid too) no user, group or live process has, reserved until `release_uid`.

    None unless running as root (only root can switch to it) or when no free id is found.
    """
    if os.geteuid() != 0:
        return None
    bounds = _candidate_range()
    if bounds is None:
        return None
    rng = random.SystemRandom()
    for _ in range(20):
        uid = rng.randrange(*bounds)
        if uid in (65534, 65535):
            continue
        if _id_known(uid):
            continue
        with _uids_lock:
            if uid in _uids_in_use:
                continue
            _uids_in_use.add(uid)
        if find_processes(uid=uid):
            release_uid(uid)
            continue
        return uid
    return None


def release_uid(uid: int | None) -> None:
    if uid is not None:
        with _uids_lock:
            _uids_in_use.discard(uid)
