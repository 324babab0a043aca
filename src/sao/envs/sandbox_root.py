"""The filesystem a bwrap run sees: a minimal root, built from read-only binds of just what the
interpreter and the shell languages need.

`root_args` returns bwrap arguments that bind, read-only and each at its own path:

- the system's program and library dirs (``/usr``, ``/bin``, ``/sbin``, ``/lib*``), as the symlinks they
  are where the host has merged /usr;
- a few files of ``/etc`` that programs read (user and group names, name resolution, the dynamic linker's
  cache, time zone, alternatives, TLS certificates); never ``shadow``, ``sudoers`` or keys;
- sao's interpreter: ``sys.executable`` and its prefixes (``prefix``, ``exec_prefix``, ``base_prefix``,
  ``base_exec_prefix``), the standard library and the site-packages dirs, wherever they are, under /tmp,
  /root or a checkout included (the caller lays a fresh /tmp first; these binds go on top of it).

Nothing else of the host exists inside (beyond those interpreter dirs, wherever they are): no /home, /root,
/work, /srv, /var, /mnt, /opt, /run, /sys; no project checkout, task file, data set or checkpoint. The
prefixes are bound whole, so they should hold no secrets (a venv inside a checkout shows only the venv; a
prefix of / is never bound). Directories that
exist inside only because something below them is bound are fresh, empty and world-traversable
(``--dir``), so an interpreter under an untraversable dir (a pyenv in /root) works for a private uid
while the rest of that dir stays hidden. Import paths that lie outside the interpreter's prefixes (the
caller's own ``PYTHONPATH``, the source dir of an editable install such as sao's) are left out on purpose:
sandboxed code gets the standard library and installed third-party packages, not the caller's code.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
from pathlib import Path

__all__ = ["ETC_ENTRIES", "SYSTEM_DIRS", "interpreter_paths", "parent_dirs", "root_args"]

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_ENTRIES = (
    "passwd", "group", "hosts", "host.conf", "nsswitch.conf", "gai.conf", "protocols", "services",
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "alternatives", "mime.types",
    "os-release", "ssl/certs", "ssl/openssl.cnf", "ca-certificates", "ca-certificates.conf", "pki/tls/certs",
    "pki/ca-trust", "crypto-policies",
)  # fmt: skip
_MAX_LINKS = 40  # like the kernel's limit on symlinks followed while resolving one path


def interpreter() -> str:
    """sao's interpreter as an absolute path without ``..`` (``sys.executable`` may hold one, e.g. a
    ``../.venv/bin/python`` run; only the normalised path exists inside the sandbox's root)."""
    return os.path.abspath(sys.executable)


def interpreter_paths() -> set[str]:
    """What sandboxed Python needs of sao's interpreter: the executable, its prefixes, the standard
    library and the site-packages dirs (not other ``sys.path`` entries)."""
    paths = {interpreter(), sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}
    scheme = sysconfig.get_paths()
    paths |= {scheme[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in scheme}
    paths |= set(getattr(site, "getsitepackages", list)())  # absent in old virtualenvs' site.py
    paths |= {p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")}
    return {p for p in paths if p and os.path.isabs(p)}


def _route(path: str, links: int = 0) -> tuple[list[tuple[str, str]], str | None]:
    """How to make ``path`` resolve inside as on the host: the symlinks on the way ``[(link, target)]``
    and the real path to bind (None when it does not exist)."""
    parts = Path(os.path.abspath(path)).parts[1:]
    here = Path("/")
    for i, name in enumerate(parts):
        step = here / name
        if step.is_symlink():
            if links >= _MAX_LINKS:
                return [], None
            target = os.readlink(step)
            rest = Path(os.path.realpath(step)).joinpath(*parts[i + 1 :])
            symlinks, real = _route(str(rest), links + 1)
            return [(str(step), target), *symlinks], real
        here = step
    return [], str(here) if here.exists() else None


def _covered(path: str, by: set[str]) -> bool:
    """``path`` is one of ``by`` or lies below one of them."""
    return any(path == top or path.startswith(top.rstrip("/") + "/") for top in by)


def parent_dirs(path: str | os.PathLike[str]) -> list[str]:
    """``--dir`` arguments for each ancestor of ``path`` below /, shallowest first: fresh 0755 dirs, where
    bwrap would otherwise create the missing ones for root only."""
    args = []
    for parent in reversed(Path(path).parents[:-1]):
        args += ["--dir", str(parent)]
    return args


def root_args() -> list[str]:
    """bwrap arguments for the minimal root: read-only binds of the system dirs, the /etc entries and
    the interpreter (see `interpreter_paths`), each at its own path, with fresh 0755 dirs on the way.

    Run after the fresh ``/tmp`` is mounted, so binds under /tmp land on top of it.
    """
    wanted = [*SYSTEM_DIRS, *(f"/etc/{name}" for name in ETC_ENTRIES), *sorted(interpreter_paths())]
    links: dict[str, str] = {}
    binds: set[str] = set()
    for path in wanted:
        symlinks, real = _route(path)
        links.update(symlinks)
        if real is not None:
            binds.add(real)
    binds.discard("/")  # never the whole host, whatever a prefix says
    binds = {b for b in binds if not any(b != top and _covered(b, {top}) for top in binds)}
    links = {link: t for link, t in links.items() if not _covered(os.path.dirname(link), binds)}
    args: list[str] = []
    made: set[str] = set()
    for dest in sorted([*binds, *links]):
        for parent in parent_dirs(dest)[1::2]:
            if parent not in made:
                args += ["--dir", parent]
                made.add(parent)
        args += ["--symlink", links[dest], dest] if dest in links else ["--ro-bind", dest, dest]
    return args
