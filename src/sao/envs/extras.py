"""The environments that need an optional library, and the command that installs it.

The config refuses such an env at load when its library is missing (`missing_library`), naming the install
command, instead of failing when the first episode starts. Imports nothing but the standard library.
"""

from __future__ import annotations

import importlib.util

__all__ = ["OPTIONAL_ENVS", "missing_library"]

# env name -> (the module it imports, the extra that installs it)
OPTIONAL_ENVS: dict[str, tuple[str, str]] = {
    "reasoning_gym": ("reasoning_gym", "reasoning-gym"),
    "textarena": ("textarena", "textarena"),
    "verifiers": ("verifiers", "verifiers"),
}


def missing_library(env: str) -> str | None:
    """Why ``env`` cannot run here (its library is not installed, with the install command), or None."""
    if env not in OPTIONAL_ENVS:
        return None
    module, extra = OPTIONAL_ENVS[env]
    if importlib.util.find_spec(module) is not None:
        return None
    return (
        f"environment {env!r} needs the {module} package, which is not installed: "
        f"pip install 'sao[{extra}]' (or 'sao[envs]' for every environment library)"
    )
