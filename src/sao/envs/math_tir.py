"""`math_tir`: math word problems with tool-integrated reasoning (a Python interpreter).

Episode. ``reset`` returns a system prompt (how to use the tool, how to answer) and the problem as the user
turn. Each assistant turn is handled by the first rule that applies:

1. it contains ``\\boxed{...}``: the last boxed expression is the final answer; the episode ends with reward
   1 if `verify_answer` accepts it against ``task.answer``, else 0 (code in that same turn is not run);
2. it contains fenced ```python blocks: each block (at most ``max_code_blocks``) runs in a fresh sandbox
   process (`sao.envs.sandbox.run_code`, ``code_timeout_s``, ``memory_mb``) and the outputs come back as
   **one ``role: tool`` message** (stdout, stderr, exit code, timeouts); blocks do not share state, so
   each must print what it wants to see;
3. otherwise a short ``role: user`` nudge asks for code or a boxed answer.

The turn that reaches ``max_turns`` without a boxed answer ends the episode with reward 0
(``info["max_turns"] = True``). A crashing, hanging or memory-hungry block is an observation, never an
error of the env.

Scoring a conversation the env did not play (`MathTIREnv.score`, used through
`sao.envs.base.score_conversation`, e.g. for an external agent's episode): rule 1 applied to the final
assistant message's content — 1 if it holds a ``\\boxed{...}`` answer that `verify_answer` accepts against
``task.answer``, else 0 (no boxed answer, e.g. a final message that only calls a tool, scores 0). The code
the agent ran and its tool results are not checked.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sao.envs.base import Message, StepResult, Task, initial_messages, message_text, register_env
from sao.envs.sandbox import require_sandbox, run_code
from sao.envs.tools import extract_boxed, extract_python_blocks, tool_message
from sao.envs.verify import verify_answer

__all__ = ["MATH_TIR_SYSTEM_PROMPT", "NUDGE", "MathTIREnv"]

MATH_TIR_SYSTEM_PROMPT = (
    "Solve the math problem. You may run Python: write code in a fenced ```python block and it is executed; "
    "its printed output comes back to you. Each block runs in a fresh interpreter, so print what you need. "
    "When you are sure, give the final answer as \\boxed{ANSWER}; this ends the conversation."
)
NUDGE = (
    "Your message has neither a ```python block nor a final answer. Write Python code to compute, "
    "or give the final answer as \\boxed{ANSWER}."
)


@register_env("math_tir")
class MathTIREnv:
    """Math with a Python tool; see the module docstring. ``system_prompt=None`` sends no system turn.

    Construction raises `sao.envs.base.EnvError` when no sandbox works here (see `require_sandbox`);
    ``sandbox_mode`` is the mode the code runs in."""

    def __init__(
        self,
        max_turns: int = 50,
        code_timeout_s: float = 5.0,
        memory_mb: int = 512,
        max_output_chars: int = 2000,
        max_code_blocks: int = 4,
        system_prompt: str | None = MATH_TIR_SYSTEM_PROMPT,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if max_code_blocks < 1:
            raise ValueError(f"max_code_blocks must be >= 1, got {max_code_blocks}")
        self.max_turns = max_turns
        self.code_timeout_s = code_timeout_s
        self.memory_mb = memory_mb
        self.max_output_chars = max_output_chars
        self.max_code_blocks = max_code_blocks
        self.system_prompt = system_prompt
        self.sandbox_mode: str = require_sandbox("math_tir")
        self._task: Task | None = None
        self._turns = 0

    async def reset(self, task: Task) -> list[Message]:
        self._task, self._turns = task, 0
        return initial_messages(task, self.system_prompt)

    async def step(self, assistant_text: str) -> StepResult:
        if self._task is None:
            raise RuntimeError("step() before reset()")
        self._turns += 1
        text = assistant_text if isinstance(assistant_text, str) else str(assistant_text)
        info: dict[str, Any] = {"turn": self._turns}

        answer = extract_boxed(text)
        if answer is not None:
            correct = verify_answer(answer, self._task.answer)
            info.update(answer=answer, correct=correct)
            return StepResult([], reward=1.0 if correct else 0.0, done=True, info=info)

        blocks = extract_python_blocks(text)
        if blocks:
            observation = [tool_message(await self._run_blocks(blocks, info), name="python")]
        else:
            info["nudge"] = True
            observation = [{"role": "user", "content": NUDGE}]

        if self._turns >= self.max_turns:
            info.update(max_turns=True, correct=False)
            return StepResult([], reward=0.0, done=True, info=info)
        return StepResult(observation, info=info)

    def score(self, task: Task, messages: list[Message]) -> float:
        """The outcome reward of a conversation this env did not play: the final assistant message's
        last boxed answer checked as ``step`` checks it (see the module docstring). No code is run and the
        episode in progress, if any, is not touched."""
        final = messages[-1] if isinstance(messages, list) and messages else None
        if not isinstance(final, dict) or final.get("role") != "assistant":
            return 0.0
        answer = extract_boxed(message_text(final))
        if answer is None:
            return 0.0
        return 1.0 if verify_answer(answer, task.answer) else 0.0

    async def close(self) -> None:
        self._task = None

    async def _run_blocks(self, blocks: list[str], info: dict[str, Any]) -> str:
        """Run the turn's code blocks one after the other; the tool message text for all of them."""
        run = blocks[: self.max_code_blocks]
        parts: list[str] = []
        errors = 0
        for i, code in enumerate(run):
            try:
                result = await asyncio.to_thread(
                    run_code, code, timeout_s=self.code_timeout_s, memory_mb=self.memory_mb
                )
                out = result.as_observation(max_chars=self.max_output_chars)
                errors += int(result.exit_code != 0 or result.timed_out or result.oom)
            except Exception as err:  # a sandbox failure is reported to the model, not raised into the loop
                out = f"error: the code could not be run ({type(err).__name__}: {err})"
                errors += 1
            parts.append(out if len(run) == 1 else f"[block {i + 1}]\n{out}")
        if len(blocks) > len(run):
            parts.append(f"(only the first {len(run)} python blocks of a message are run)")
        info.update(code_blocks=len(run), code_errors=errors)
        return "\n\n".join(parts)
