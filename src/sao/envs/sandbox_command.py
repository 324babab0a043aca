"""The command line of one sandboxed run: the scratch dir layout, the wrapper per mode (bwrap arguments,
unshare flags), the scrubbed environment, and the in-sandbox launcher.

Every run is ``[bwrap ... | unshare ... --] python -I -S -c LAUNCHER cfg argv``. The launcher sets the
rlimits (inside any user namespace, so RLIMIT_NPROC counts only the sandbox's own processes), switches to the
sandbox's private uid when sao is root, sets no-new-privileges, and execs ``argv``. When it finds itself pid 1
of a fresh pid namespace (unshare mode) it forks instead, so the user code is not an init that ignores
signals, and it exits with 128 + N when a signal N ended the code.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sao.envs.sandbox_proc import MARKER_VAR
from sao.envs.sandbox_root import interpreter, parent_dirs, root_args

__all__ = ["MAX_FILE_BYTES", "MAX_PROCESSES", "Isolation", "Limits", "command", "environment", "make_scratch"]

MAX_PROCESSES = 64  # RLIMIT_NPROC of a run: enough for a process pool, not for a fork bomb
MAX_FILE_BYTES = 64 * 2**20  # RLIMIT_FSIZE: the largest single file a run may write
MAX_OPEN_FILES = 1024
LAUNCHER = r"""
import json, os, resource, sys
cfg, argv = json.loads(sys.argv[1]), sys.argv[2:]
def limit(name, soft, hard):
    res = getattr(resource, name, None)
    if res is None:
        return
    cap = resource.getrlimit(res)[1]
    if cap != resource.RLIM_INFINITY:
        soft, hard = min(soft, cap), min(hard, cap)
    try:
        resource.setrlimit(res, (soft, hard))
    except (ValueError, OSError):
        pass
for name, soft, hard in cfg["limits"]:
    limit(name, soft, hard)
nproc = cfg["nproc"]
if cfg["nproc_relative"] and os.path.isdir("/proc"):
    me = str(os.getuid())
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/status" % pid) as f:
                nproc += any(l.startswith("Uid:") and l.split()[1] == me for l in f)
        except OSError:
            pass
limit("RLIMIT_NPROC", nproc, nproc)
def read_all():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
    data = (ctypes.c_uint32 * 6)(4, 4, 4, 0, 0, 0)  # CAP_DAC_READ_SEARCH: effective, permitted, inheritable
    if libc.capset(ctypes.byref(Header(0x20080522, 0)), data) or libc.prctl(47, 2, 2, 0, 0):
        raise OSError(ctypes.get_errno(), "cannot keep CAP_DAC_READ_SEARCH")
if cfg["uid"] is not None:
    try:
        if cfg["read_all"]:
            import ctypes
            ctypes.CDLL(None).prctl(8, 1, 0, 0, 0)  # PR_SET_KEEPCAPS across setuid
        os.setgroups([])
        os.setgid(cfg["uid"])
        os.setuid(cfg["uid"])
        if cfg["read_all"]:
            read_all()
    except OSError as err:
        sys.stderr.write("sandbox: cannot switch to the sandbox uid: %s\n" % err)
        os._exit(126)
os.umask(0o022)
try:  # setuid binaries and file capabilities grant nothing from here on
    import ctypes
    ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
except (OSError, AttributeError):
    pass
child = os.fork() if os.getpid() == 1 else 0
if child:
    status = 1
    while True:
        try:
            pid, raw = os.wait()
        except ChildProcessError:
            break
        if pid == child:
            status = os.waitstatus_to_exitcode(raw)
            break
    os._exit(status if status >= 0 else 128 - status)
try:
    os.execvp(argv[0], argv)
except OSError as err:
    sys.stderr.write("sandbox: cannot run %r: %s\n" % (argv[0], err.strerror))
    sys.stderr.flush()
    os._exit(127)
"""


@dataclass(frozen=True)
class Isolation:
    """How runs are wrapped: the mode, whether to switch to a private uid (root only), the unshare flags
    that worked here, whether bwrap supports size-capped tmpfs mounts (``--size``, bwrap >= 0.8), and the
    wrapper program's path as found on the caller's PATH (runs get a scrubbed PATH)."""

    mode: str
    drop_uid: bool = False
    unshare_flags: tuple[str, ...] = ()
    sized_tmpfs: bool = False
    read_all: bool = False  # the private uid keeps CAP_DAC_READ_SEARCH (see _detect)
    program: str = ""  # bwrap or unshare

    @property
    def fresh_userns(self) -> bool:
        """Runs get their own user namespace, where RLIMIT_NPROC counts only their own processes."""
        unprivileged = os.geteuid() != 0
        return unprivileged and (self.mode == "bwrap" or "--map-root-user" in self.unshare_flags)


@dataclass(frozen=True)
class Limits:
    timeout_s: float
    memory_mb: int
    output_limit: int


def make_scratch(uid: int | None) -> tuple[Path, Path, Path]:
    """A fresh ``base`` dir (traversable, not listable) holding ``work`` (the scratch dir, owned by ``uid``
    when given), ``tmp`` (the runs' /tmp where bwrap has no sized tmpfs) and ``bin`` (``python``)."""
    base = Path(tempfile.mkdtemp(prefix="sao-sandbox-"))
    work, tmp, bin_dir = base / "work", base / "tmp", base / "bin"
    work.mkdir()
    tmp.mkdir()
    tmp.chmod(0o1777)  # like /tmp: base (0711, random name) already keeps other users out
    bin_dir.mkdir()
    for name in ("python", "python3"):  # first on PATH: `python` is sao's interpreter, even where
        (bin_dir / name).symlink_to(interpreter())  # its own dir has only python3.X
    if uid is not None:
        base.chmod(0o711)
        os.chown(work, uid, uid)
    return base, work, tmp


def _bwrap_prefix(iso: Isolation, work: Path, tmp: Path, uid: int | None, limits: Limits) -> list[str]:
    """The bwrap wrapper: a minimal read-only root (`sao.envs.sandbox_root`), fresh /dev, /proc, /tmp and
    /dev/shm, the scratch dir the only writable host path, and new namespaces for everything but users."""
    args = [iso.program or "bwrap", "--dev", "/dev"]
    if iso.sized_tmpfs:
        shm = min(64, limits.memory_mb) * 2**20
        args += ["--perms", "1777", "--size", str(shm), "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
        args += ["--perms", "1777", "--size", str(limits.memory_mb * 2**20), "--tmpfs", "/tmp"]
    else:
        args += ["--bind", str(tmp), "/tmp"]
    args += ["--proc", "/proc", *root_args(), *parent_dirs(work)]
    args += ["--ro-bind", str(work.parent / "bin"), str(work.parent / "bin")]
    args += ["--bind", str(work), str(work), "--chdir", str(work), "--remount-ro", "/"]
    args += ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    args += ["--die-with-parent", "--new-session"]
    if os.geteuid() == 0:  # a root bwrap keeps every capability unless told otherwise
        args += ["--cap-drop", "ALL"]
        if uid is not None:  # the launcher needs these two to switch uid, which then clears them
            args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    return [*args, "--"]


def command(
    argv: list[str], iso: Isolation, work: Path, tmp: Path, uid: int | None, limits: Limits
) -> list[str]:
    """The full command line: wrapper, launcher with its limits, then ``argv``."""
    cpu_s = math.ceil(limits.timeout_s) + 1
    mem = limits.memory_mb * 2**20
    cfg = {
        "limits": [
            ("RLIMIT_CPU", cpu_s, cpu_s + 1),
            ("RLIMIT_AS", mem, mem),
            ("RLIMIT_FSIZE", MAX_FILE_BYTES, MAX_FILE_BYTES),
            ("RLIMIT_CORE", 0, 0),
            ("RLIMIT_NOFILE", MAX_OPEN_FILES, MAX_OPEN_FILES),
        ],
        "nproc": MAX_PROCESSES,
        "nproc_relative": uid is None and not iso.fresh_userns,
        "uid": uid,
        "read_all": iso.read_all and uid is not None,
    }
    launcher = [interpreter(), "-I", "-S", "-c", LAUNCHER, json.dumps(cfg)]
    if iso.mode == "bwrap":
        return [*_bwrap_prefix(iso, work, tmp, uid, limits), *launcher, *argv]
    if iso.mode == "unshare":
        return [iso.program or "unshare", *iso.unshare_flags, "--", *launcher, *argv]
    return [*launcher, *argv]


def environment(iso: Isolation, work: Path, tmp: Path, marker: str) -> dict[str, str]:
    system = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return {
        "PATH": f"{work.parent / 'bin'}:{os.path.dirname(interpreter())}:{system}",
        "HOME": str(work),
        "TMPDIR": "/tmp" if iso.mode == "bwrap" else str(tmp),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TERM": "dumb",
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",  # BLAS thread pools reserve address space the memory cap counts
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        MARKER_VAR: marker,
    }
