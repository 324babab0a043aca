"""`code_tests`: a coding task in a small repository, graded by hidden unit tests.

Task. ``prompt``: what to implement. ``metadata["files"]``: the starting repository ``{path: content}``.
``tests``: the hidden tests ``{path: content}`` (or ``{"files": {...}, "command": "..."}``).
``metadata["test_command"]`` (or ``tests["command"]``): the shell command that runs them, exit code 0 =
pass (default `DEFAULT_TEST_COMMAND`). The JSONL format is in docs/builtin-envs.md.

Episode. ``reset`` creates the episode's persistent `sao.envs.sandbox.Sandbox` holding the starting files and
returns a short system prompt plus the task (with the file list) as the user turn; the tool schemas are the
env's ``tools`` attribute (`CODE_TOOLS`), which the agent loop hands to the chat template (Qwen-style
templates list them in the system turn). The model calls tools with
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (several per turn run in order; each answer is
one ``role: tool`` message), or in another format of `sao.envs.tool_formats` (``tool_format``, e.g.
``qwen3_coder`` for a Qwen3-Coder template; it must match the chat template):

- ``read_file {path}``: the file's text;
- ``write_file {path, content}``: create or overwrite a file;
- ``run {command}``: a shell command in the repository (``command_timeout_s``), its output and exit code;
- ``submit {}``: end the episode (calls after it in the same turn are ignored).

A malformed call, an unknown tool, a bad argument or a failing tool is an ``error: ...`` tool message; a
turn without any call gets a ``role: user`` nudge. After ``submit``, or on the turn that reaches
``max_turns``, the hidden tests are copied into the sandbox (overwriting same-named files) and run with
``test_command``; the reward is 1 if it exits 0 within ``test_timeout_s``, else 0. The hidden tests never
exist in the sandbox before that final run, and the task file is outside the sandbox's minimal root (see
`sao.envs.sandbox`), so the model cannot read them.

Limitation: the tests run next to the model's code, so code that sabotages the test runner (for example a
module shadowing ``unittest``) could pass them; use a runner that checks its own output if that matters.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from sao.envs.base import Message, StepResult, Task, initial_messages, register_env
from sao.envs.sandbox import Sandbox, require_sandbox
from sao.envs.tool_formats import get_tool_format
from sao.envs.tools import ToolCall, function_tool, submit_turn, tool_message

__all__ = ["CODE_TESTS_SYSTEM_PROMPT", "CODE_TOOLS", "DEFAULT_TEST_COMMAND", "CodeTestsEnv"]

DEFAULT_TEST_COMMAND = "python -m unittest discover -s . -p 'test*.py'"


def _tool(name: str, description: str, **params: str) -> dict[str, Any]:
    """An OpenAI/Qwen-style function schema with string parameters ``{name: description}``."""
    properties = {key: {"type": "string", "description": text} for key, text in params.items()}
    return function_tool(name, description, properties, list(params))


CODE_TOOLS = [
    _tool("read_file", "Read a text file of the repository.", path="path relative to the repository"),
    _tool(
        "write_file",
        "Create or overwrite a text file.",
        path="path relative to the repository",
        content="the full new content",
    ),
    _tool(
        "run", "Run a shell command in the repository; returns its output and exit code.", command="command"
    ),
    _tool("submit", "Finish the task; hidden unit tests then grade the repository."),
]

CODE_TESTS_SYSTEM_PROMPT = (
    "You are a software engineer working in a small repository (the current directory). Use the tools to "
    "inspect, change and test it; one message may hold several tool calls. When the task is done, call "
    "submit: hidden unit tests then check your work."
)
NUDGE = (
    'No tool call found. Call a tool as <tool_call>{"name": NAME, "arguments": {...}}</tool_call>, '
    'or <tool_call>{"name": "submit", "arguments": {}}</tool_call> when you are done.'
)


def _nudge(instructions: str) -> str:
    """The no-call nudge of a format other than hermes (`NUDGE` is hermes's): its instructions, and submit."""
    return f"No tool call found. {instructions}\n\nCall the submit tool when you are done."


def _file_map(value: Any, what: str, task_id: str) -> dict[str, str]:
    """``{path: content}`` from a mapping (``None`` entries, as table loaders fill them, dropped)."""
    if not isinstance(value, Mapping):
        raise ValueError(f"code task {task_id!r}: {what} must be a {{path: content}} object")
    return {str(path): str(content) for path, content in value.items() if content is not None}


def _task_parts(task: Task) -> tuple[dict[str, str], dict[str, str], str]:
    """``(starting files, hidden test files, test command)`` of a code task."""
    tests: Any = task.tests or {}
    command = task.metadata.get("test_command")
    if isinstance(tests, Mapping) and isinstance(tests.get("files"), Mapping):
        command = command or tests.get("command")
        tests = tests["files"]
    files = _file_map(task.metadata.get("files") or {}, "files", task.id)
    hidden = _file_map(tests, "tests", task.id)
    if not hidden:
        raise ValueError(f"code task {task.id!r} has no hidden tests")
    return files, hidden, str(command or DEFAULT_TEST_COMMAND)


@register_env("code_tests")
class CodeTestsEnv:
    """A coding task graded by hidden tests; see the module docstring.

    Construction raises `sao.envs.base.EnvError` when no sandbox works here (see `require_sandbox`);
    ``sandbox_mode`` is the mode the code runs in."""

    def __init__(
        self,
        max_turns: int = 300,
        command_timeout_s: float = 30.0,
        test_timeout_s: float = 120.0,
        memory_mb: int = 1024,
        max_output_chars: int = 4000,
        max_read_bytes: int = 65536,
        system_prompt: str | None = CODE_TESTS_SYSTEM_PROMPT,
        tool_format: str = "hermes",
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.max_turns = max_turns
        self.command_timeout_s = command_timeout_s
        self.test_timeout_s = test_timeout_s
        self.memory_mb = memory_mb
        self.max_output_chars = max_output_chars
        self.max_read_bytes = max_read_bytes
        self.system_prompt = system_prompt
        self.tools = CODE_TOOLS  # the agent loop hands them to the chat template
        self.tool_format = get_tool_format(tool_format)  # ValueError naming the known formats
        self.nudge = NUDGE if tool_format == "hermes" else _nudge(self.tool_format.instructions)
        self.sandbox_mode: str = require_sandbox("code_tests")
        self._sandbox: Sandbox | None = None
        self._tests: dict[str, str] = {}
        self._test_command = DEFAULT_TEST_COMMAND
        self._turns = 0

    async def reset(self, task: Task) -> list[Message]:
        await self.close()
        files, self._tests, self._test_command = _task_parts(task)
        self._turns = 0
        self._sandbox = await asyncio.to_thread(
            Sandbox, files=files, timeout_s=self.command_timeout_s, memory_mb=self.memory_mb
        )
        listing = "\n".join(f"- {path}" for path in sorted(files)) or "(empty)"
        user_text = f"{task.prompt}\n\nFiles in the repository:\n{listing}"
        return initial_messages(task, self.system_prompt, user_text)

    async def step(self, assistant_text: str) -> StepResult:
        if self._sandbox is None:
            raise RuntimeError("step() before reset()")
        self._turns += 1
        text = assistant_text if isinstance(assistant_text, str) else str(assistant_text)
        parsed = self.tool_format.parse(text, self.tools)
        observation, info, calls, submitted = submit_turn(parsed, self._turns)
        for call in calls:
            observation.append(tool_message(await self._call_tool(call), name=call.name))
        if not parsed.calls and not parsed.errors:
            observation.append({"role": "user", "content": self.nudge})
        if submitted or self._turns >= self.max_turns:
            passed, output = await self._run_hidden_tests()
            info.update(submitted=submitted, max_turns=not submitted, tests_passed=passed, test_output=output)
            return StepResult([], reward=1.0 if passed else 0.0, done=True, info=info)
        return StepResult(observation, info=info)

    async def close(self) -> None:
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            await asyncio.to_thread(sandbox.close)

    async def _call_tool(self, call: ToolCall) -> str:
        """Run one tool call; the text of its tool message (``error: ...`` when it fails)."""
        assert self._sandbox is not None
        sandbox, args = self._sandbox, call.arguments
        required = {"read_file": ("path",), "write_file": ("path", "content"), "run": ("command",)}
        if call.name not in required:
            known = ", ".join([*required, "submit"])
            return f"error: unknown tool {call.name!r}; the tools are {known}"
        for key in required[call.name]:
            if not isinstance(args.get(key), str):
                return f'error: {call.name} needs a string "{key}" argument'
        try:
            if call.name == "read_file":
                return await asyncio.to_thread(sandbox.read_file, args["path"], self.max_read_bytes)
            if call.name == "write_file":
                await asyncio.to_thread(sandbox.write_file, args["path"], args["content"])
                return f"wrote {len(args['content'])} characters to {args['path']}"
            result = await asyncio.to_thread(sandbox.run, args["command"], self.command_timeout_s)
            return result.as_observation(max_chars=self.max_output_chars)
        except Exception as err:  # missing file, path outside the repository, ...: the model's problem
            return f"error: {call.name} failed: {type(err).__name__}: {err}"

    async def _run_hidden_tests(self) -> tuple[bool, str]:
        """Copy the hidden tests in and run ``test_command``: ``(passed, output)``."""
        assert self._sandbox is not None
        sandbox = self._sandbox
        try:
            for path, content in self._tests.items():
                await asyncio.to_thread(sandbox.write_file, path, content)
            result = await asyncio.to_thread(sandbox.run, self._test_command, self.test_timeout_s)
        except Exception as err:
            return False, f"error: the hidden tests could not be run: {type(err).__name__}: {err}"
        passed = result.exit_code == 0 and not result.timed_out and not result.oom
        return passed, result.as_observation(max_chars=self.max_output_chars)
