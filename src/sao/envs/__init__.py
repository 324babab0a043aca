"""Environments: the `Env` protocol and registry, sandboxed tool execution, built-in task families,
reward verifiers and judges. Knows nothing of training."""

from .base import (
    ENV_REGISTRY,
    Env,
    EnvError,
    Message,
    StepResult,
    Task,
    load_env_class,
    make_env,
    register_env,
)

__all__ = [
    "ENV_REGISTRY",
    "Env",
    "EnvError",
    "Message",
    "StepResult",
    "Task",
    "load_env_class",
    "make_env",
    "register_env",
]
