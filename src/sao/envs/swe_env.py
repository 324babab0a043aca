"""`swe`: the repository environment. The model fixes an issue in a repository with a shell and an editor;
the instance's hidden tests grade the result (SWE-bench style, see `sao.envs.swe_instance`).

Task. A row of a SWE-bench-style JSONL file loaded as a `Task` (``data.id_field: instance_id``,
``data.prompt_field: problem_statement``; the other fields in ``task.metadata``), read with
`sao.envs.swe_instance.instance_from_task` (``repos_dir`` resolves relative ``repo_path`` values).

Episode. ``reset`` creates the episode's own `sao.envs.sandbox.Sandbox` holding the repository tree at
``base_commit``, made a one-commit git repository inside it (`sao.envs.swe_workspace.open_workspace`: the
model can ``git diff`` / ``git status`` / commit), and returns a system prompt and the problem statement
with short instructions. The tools (`sao.envs.swe_tools.SWE_TOOLS`: ``bash``, ``view``, ``str_replace``,
``create``, ``submit``) are the env's ``tools`` attribute, which the agent loop hands to the chat template.
Several calls in one turn run in order, each answered by one ``role: tool`` message; calls after
``submit`` are ignored; a turn without a call gets a ``role: user`` nudge; every failure is an ``error:
...`` tool message. The hidden tests (``test_patch``) enter the sandbox only when grading starts.

End. After ``submit``, or on the turn that reaches ``max_turns``, `swe_grading.grade` runs the hidden tests;
the reward is 1.0 when every FAIL_TO_PASS and PASS_TO_PASS test passes, else 0.0. After each ``bash``,
``str_replace`` and ``create`` call the workspace's disk use is measured; past ``max_disk_mb`` the
episode ends at once with reward 0 and ``info["limit"] = "disk"``. A command that times out or runs out
of memory is an observation and the episode goes on. The last turn's ``info``: ``resolved``,
``submitted``, ``max_turns``, ``limit`` (None or ``"disk"``), ``fail_to_pass_passed`` /
``fail_to_pass_failed`` / ``pass_to_pass_passed`` / ``pass_to_pass_failed``, ``grade_error``,
``test_output`` (its last 4000 characters).
"""

from __future__ import annotations

import asyncio
from typing import Any

from sao.envs.base import Message, StepResult, Task, initial_messages, register_env
from sao.envs.sandbox import require_sandbox
from sao.envs.swe_grading import GradeResult
from sao.envs.swe_instance import instance_from_task
from sao.envs.swe_tools import (
    MUTATING_TOOLS,
    SWE_TOOLS,
    ToolLimits,
    disk_usage_bytes,
    run_tool,
)
from sao.envs.swe_workspace import Workspace, open_workspace
from sao.envs.tool_formats import get_tool_format
from sao.envs.tools import submit_turn, tool_message

__all__ = ["SWE_SYSTEM_PROMPT", "SWEEnv"]

SWE_SYSTEM_PROMPT = (
    "You are a software engineer fixing an issue in a git repository. Use the tools to explore the code, "
    "reproduce the problem, edit the source and check your fix; one message may hold several tool calls. "
    "When the fix is done, call submit: hidden tests then check the repository."
)
INSTRUCTIONS = (
    "The repository is checked out at the commit where this issue was reported; it is the current "
    "directory of the bash tool, and the paths you give view, str_replace and create are relative to it. "
    "There is no network. Change the source code so that the issue is resolved (the existing tests must "
    "keep passing), then call submit."
)
NUDGE = "No tool call found: use the tools (bash, view, str_replace, create), and submit when you are done. "
TEST_OUTPUT_TAIL_CHARS = 4000


def synthetic_tasks(
    n: int,
    seed: int,
    repos_dir: str | None = None,
    files: Any = None,
    depth: Any = None,
    kinds: list[str] | None = None,
) -> list[Task]:
    """The env's own task source: ``n`` synthetic instances (`sao.envs.swe_synth.make_tasks`; the knobs are
    the env's ``files``, ``depth`` and ``kinds``), so ``sao train`` / ``sao eval`` need no instance file."""
    from sao.envs.swe_synth import make_tasks

    return make_tasks(n, seed, repos_dir=repos_dir, files=files, depth=depth, kinds=kinds)


@register_env("swe", tasks=synthetic_tasks)
class SWEEnv:
    """A SWE-style repository task; see the module docstring. Construction raises
    `sao.envs.base.EnvError` when no sandbox works here (see `require_sandbox`).

    Args:
        repos_dir: where relative ``repo_path`` values (and rows without one) find their repository.
        max_turns: assistant turns before the episode is graded as it stands.
        command_timeout_s: seconds one ``bash`` call may run (then it is killed; the episode goes on).
        test_timeout_s: seconds the hidden test run may take (past it the episode scores 0).
        memory_mb: address-space limit of every sandboxed process, in MiB.
        max_disk_mb: the workspace (repository and its ``.git``) may use at most this many MiB of disk,
            measured after each mutating call; past it the episode ends with reward 0.
        max_observation_chars: longest tool answer in characters; a longer one keeps its head and tail
            around a note saying how much was cut and how to see the rest.
        tool_format: how the model writes tool calls, a `sao.envs.tool_formats` name (``"hermes"``:
            ``<tool_call>{json}</tool_call>``; ``"qwen3_coder"``: the XML form); match the chat template.
        system_prompt: the system message (None: none).
        files, depth, kinds: knobs of the env's own synthetic tasks (`synthetic_tasks`, used when no task
            file is given): modules per package, calls between the tested function and the bug, mutation
            kinds. Episodes do not use them.
    """

    def __init__(
        self,
        repos_dir: str | None = None,
        max_turns: int = 300,
        command_timeout_s: float = 60.0,
        test_timeout_s: float = 600.0,
        memory_mb: int = 4096,
        max_disk_mb: int = 2048,
        max_observation_chars: int = 10000,
        tool_format: str = "hermes",
        system_prompt: str | None = SWE_SYSTEM_PROMPT,
        files: Any = None,
        depth: Any = None,
        kinds: list[str] | None = None,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if not test_timeout_s > 0:
            raise ValueError(f"test_timeout_s must be > 0, got {test_timeout_s}")
        if not isinstance(memory_mb, int) or memory_mb < 16:
            raise ValueError(f"memory_mb must be an integer >= 16, got {memory_mb!r}")
        if isinstance(max_disk_mb, bool) or not isinstance(max_disk_mb, (int, float)) or not max_disk_mb > 0:
            raise ValueError(f"max_disk_mb must be a number > 0, got {max_disk_mb!r}")
        self.repos_dir = repos_dir
        self.max_turns = max_turns
        self.test_timeout_s = test_timeout_s
        self.memory_mb = memory_mb
        self.max_disk_mb = max_disk_mb
        self._max_disk_bytes = int(max_disk_mb * (1 << 20))
        self.limits = ToolLimits(command_timeout_s, max_observation_chars)
        self.tool_format = get_tool_format(tool_format)  # ValueError naming the known formats
        if (files, depth, kinds) != (None, None, None):
            from sao.envs.swe_synth import Knobs

            Knobs.of(files, depth, kinds)  # ValueError naming the knob
        self.nudge = NUDGE + self.tool_format.instructions
        self.system_prompt = system_prompt
        self.tools = SWE_TOOLS  # the agent loop hands them to the chat template
        self.sandbox_mode: str = require_sandbox("swe")
        self._workspace: Workspace | None = None
        self._turns = 0

    async def reset(self, task: Task) -> list[Message]:
        await self.close()
        inst = instance_from_task(task, self.repos_dir)
        self._turns = 0
        self._workspace = await asyncio.to_thread(
            open_workspace, inst, timeout_s=self.limits.command_timeout_s, memory_mb=self.memory_mb
        )
        used = await asyncio.to_thread(disk_usage_bytes, self._workspace.sandbox.root)
        if used > self._max_disk_bytes:
            raise ValueError(
                f"swe env: the repository of {inst.instance_id!r} alone uses {used >> 20} MiB of disk, more"
                f" than max_disk_mb ({self.max_disk_mb})"
            )
        user_text = f"{inst.problem_statement.rstrip()}\n\n---\n{INSTRUCTIONS}"
        return initial_messages(task, self.system_prompt, user_text)

    async def step(self, assistant_text: str) -> StepResult:
        if self._workspace is None:
            raise RuntimeError("step() before reset()")
        self._turns += 1
        text = assistant_text if isinstance(assistant_text, str) else str(assistant_text)
        parsed = self.tool_format.parse(text, self.tools)
        observation, info, calls, submitted = submit_turn(parsed, self._turns)
        for call in calls:
            answer = await asyncio.to_thread(run_tool, self._workspace.sandbox, call, self.limits)
            observation.append(tool_message(answer, name=call.name))
            if call.name in MUTATING_TOOLS and await self._over_disk_limit(info):
                info.update(submitted=False, max_turns=False, limit="disk", resolved=False)
                return StepResult([], reward=0.0, done=True, info=info)
        if not parsed.calls and not parsed.errors:
            observation.append({"role": "user", "content": self.nudge})
        if submitted or self._turns >= self.max_turns:
            result = await asyncio.to_thread(self._grade)
            info.update(submitted=submitted, max_turns=not submitted, limit=None, **_grade_info(result))
            return StepResult([], reward=1.0 if result.resolved else 0.0, done=True, info=info)
        return StepResult(observation, info=info)

    async def close(self) -> None:
        workspace, self._workspace = self._workspace, None
        if workspace is not None:
            await asyncio.to_thread(workspace.close)

    async def _over_disk_limit(self, info: dict[str, Any]) -> bool:
        assert self._workspace is not None
        used = await asyncio.to_thread(disk_usage_bytes, self._workspace.sandbox.root)
        info["disk_mb"] = round(used / (1 << 20), 1)
        return used > self._max_disk_bytes

    def _grade(self) -> GradeResult:
        assert self._workspace is not None
        return self._workspace.grade(self.test_timeout_s)


def _grade_info(result: GradeResult) -> dict[str, Any]:
    return {
        "resolved": result.resolved,
        **result.counts(),
        "grade_error": result.error,
        "test_output": result.output[-TEST_OUTPUT_TAIL_CHARS:],
    }
