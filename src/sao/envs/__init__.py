"""Environments: the `Env` protocol and registry, sandboxed tool execution, built-in task families,
reward verifiers and judges. Knows nothing of training."""

from .base import (
    ENV_REGISTRY,
    ENV_TASKS,
    Env,
    EnvError,
    Message,
    StepResult,
    Task,
    TaskSource,
    TrainingProgress,
    load_env_class,
    make_env,
    make_env_tasks,
    notify_training_progress,
    register_env,
)

__all__ = [
    "ENV_REGISTRY",
    "ENV_TASKS",
    "Env",
    "EnvError",
    "Message",
    "StepResult",
    "Task",
    "TaskSource",
    "TrainingProgress",
    "load_env_class",
    "load_tasks",
    "make_env",
    "make_env_tasks",
    "notify_training_progress",
    "register_env",
    "save_tasks_jsonl",
]


def __getattr__(name: str) -> object:
    # Task loading pulls in `datasets`; import it on first use so `import sao.envs` stays light.
    if name in ("load_tasks", "save_tasks_jsonl"):
        from . import tasks

        return getattr(tasks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
