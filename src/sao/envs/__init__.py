"""Environments: what an episode is played against, and the tasks it plays. Knows nothing of training.

- The contract and the name table: `base` (`Env`, `Task`, `StepResult`, `register_env`, the scoring and
  training-progress hooks). Building an env by name or from a user's ``file.py:Class``: `factory`
  (`make_env`, `make_env_tasks`), which finds the built-in ones through `builtin`.
- Task files: `tasks` (`load_tasks`, `save_tasks_jsonl`).
- Built-in environments: `calculator`, `guess_number`, `style_shift` (graded by `judges`), `math_tir`,
  `code_tests`, and the runtime workloads `long_tail` and `tool_latency`; `sft_data` plays SFT warm-start
  conversations in the first three.
- Environment libraries (optional extras, `extras` names them): `reasoning_gym_env` (and its SFT recipe
  `reasoning_gym_sft`), `textarena_env` (`textarena_opponents`), `verifiers_env` (`verifiers_seat`,
  `verifiers_tools`, `verifiers_trace`).
- LLM-judge rewards: `judge_client` (asking and parsing) and `judged` (`JudgedEnv`, any env graded).
- SWE-style coding tasks: `swe_instance` (the instance format), `swe_synth` (synthetic instances, over
  `swe_synth_draw`, `swe_synth_check`, `swe_synth_render`, `swe_synth_repo`, `swe_packages`,
  `swe_mutations` and the `swe_templates` data), `swe_workspace` (an episode's sandboxed repository),
  `swe_tools` and `swe_grading`, played by `swe_env`.
- What they share: `tools` and `tool_formats` (parsing tool calls in each model's format, final answers),
  `verify` (math answers), and the sandbox
  for model-written code (`sandbox`, over `sandbox_command`, `sandbox_exec`, `sandbox_proc`,
  `sandbox_root`).
"""

from .base import (
    ENV_REGISTRY,
    ENV_TASKS,
    Env,
    EnvError,
    JudgeError,
    Message,
    StepResult,
    Task,
    TaskSource,
    TrainingProgress,
    notify_training_progress,
    register_env,
)
from .factory import load_env_class, make_env, make_env_tasks

__all__ = [
    "ENV_REGISTRY",
    "ENV_TASKS",
    "Env",
    "EnvError",
    "JudgeError",
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
