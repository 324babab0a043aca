"""The environments that need an optional library, and the command that installs it.

The config refuses such an env at load when its library is missing (`missing_library`), naming the install
command, instead of failing when the first episode starts; the adapters import their library through
`require_library`, which says the same when it is missing. Imports only the standard library and `base`.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from .base import EnvError

__all__ = ["OPTIONAL_ENVS", "install_command", "missing_library", "require_library"]

# env name -> (the module it imports, the extra that installs it)
OPTIONAL_ENVS: dict[str, tuple[str, str]] = {
    "reasoning_gym": ("reasoning_gym", "reasoning-gym"),
    "textarena": ("textarena", "textarena"),
    "verifiers": ("verifiers", "verifiers"),
}


def install_command(env: str) -> str:
    """The command that installs ``env``'s library (``env`` a key of `OPTIONAL_ENVS`)."""
    return f"pip install 'sao[{OPTIONAL_ENVS[env][1]}]'"


def _not_installed(env: str) -> str:
    return (
        f"environment {env!r} needs the {OPTIONAL_ENVS[env][0]} package, which is not installed: "
        f"{install_command(env)} (or 'sao[envs]' for every environment library)"
    )


def missing_library(env: str) -> str | None:
    """Why ``env`` cannot run here (its library is not installed, with the install command), or None."""
    if env not in OPTIONAL_ENVS or importlib.util.find_spec(OPTIONAL_ENVS[env][0]) is not None:
        return None
    return _not_installed(env)


def require_library(env: str, module: str | None = None) -> ModuleType:
    """``module`` (default: ``env``'s library, e.g. ``verifiers.v1`` for a submodule of it), imported;
    `EnvError` naming the install command when the library is missing."""
    try:
        return importlib.import_module(module or OPTIONAL_ENVS[env][0])
    except ImportError as err:
        raise EnvError(f"{_not_installed(env)} ({err})") from None
