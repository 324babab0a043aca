"""The built-in environments: the modules that define them, imported on demand so that they register
themselves (``@register_env`` in `sao.envs.base`). `sao.envs.factory` calls `load_builtin_envs` before it
looks a name up; nothing here imports `base` or `factory`, so the dependencies run one way."""

from __future__ import annotations

import importlib

__all__ = ["BUILTIN_ENV_MODULES", "load_builtin_envs"]

BUILTIN_ENV_MODULES = (
    "sao.envs.calculator",
    "sao.envs.code_tests",
    "sao.envs.grid_walk",
    "sao.envs.guess_number",
    "sao.envs.long_tail",
    "sao.envs.math_tir",
    "sao.envs.reasoning_gym_env",
    "sao.envs.style_shift",
    "sao.envs.swe_env",
    "sao.envs.textarena_env",
    "sao.envs.tool_latency",
    "sao.envs.verifiers_env",
)


def load_builtin_envs() -> None:
    """Import every built-in env module (each registers its env on first import; later calls are no-ops)."""
    for module in BUILTIN_ENV_MODULES:
        importlib.import_module(module)
