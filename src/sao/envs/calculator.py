"""``calculator``: two-operand arithmetic that must be solved with a calculator tool.

The user asks ``"What is 37 * 12?"`` (operands 0..99, operator ``+``, ``-`` or ``*``). The exact formats,
kept short because a byte-level tokenizer makes every byte a token:

- tool call:    ``<tool_call>{"name": "calc", "arguments": {"expr": "37*12"}}</tool_call>`` (any JSON
  whitespace is accepted; another `sao.envs.tool_formats` format with ``tool_format``, e.g. ``qwen3_coder``);
  the env answers with a ``tool`` message holding the result, ``444``;
- final answer: ``answer: 444`` — a turn without a tool call is the final answer, and its **last integer**
  is the answer (so ``37*12=444`` is read as 444 too).

Reward (outcome, on the last turn): 1 when the final answer equals the true value **and** an earlier calc
call in the episode returned that value (the answer was read off the tool), else 0 — a correct answer
given without the tool scores 0. ``max_turns`` = 3 (call, answer, one retry). A malformed call, an unknown
tool or a bad expression gets a ``tool`` message starting with ``error:``, and the episode continues
while turns remain; an answer turn without any integer gets a ``user`` message ``error: reply answer:
<number>``. The tool parses its tiny grammar itself (integers, ``+ - *``, parentheses; never ``eval``).
Optimal score: 1.0 (`optimal_policy`: call the tool, then copy its result).

Scoring a conversation the env did not play (`CalculatorEnv.score`, used through
`sao.envs.base.score_conversation`, e.g. for an external agent's episode): the same rule on OpenAI
chat-format messages — 1 when the final assistant message is an answer (no ``tool_calls``, no
``<tool_call>``) whose last integer equals the true value **and** some ``tool`` message of the conversation
holds exactly that integer (the agent's own tool result, e.g. ``444``, also accepted wrapped in one
``<tool_response>...</tool_response>``), else 0. The turn budget is not applied (the agent bounds its own
turns), and tool results are taken as the agent reports them.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

from .base import Message, StepResult, Task, initial_messages, message_text, register_env
from .tool_formats import get_tool_format
from .tools import ToolCallParse, tool_message

__all__ = [
    "OPTIMAL_SCORE",
    "SYSTEM_PROMPT",
    "TOOL_SCHEMA",
    "CalcError",
    "CalculatorEnv",
    "answer_text",
    "evaluate",
    "make_tasks",
    "optimal_policy",
    "score_messages",
    "tool_call_text",
]

OPTIMAL_SCORE = 1.0
TOOL_NAME = "calc"
# The calc tool as an OpenAI function schema (``tool_schema=True``; what an OpenAI-SDK agent passes as
# ``tools``), kept minimal: with a byte-level tokenizer every byte of it is a prompt token.
TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]},
    },
}
SYSTEM_PROMPT = (
    'Use the calc tool: <tool_call>{"name": "calc", "arguments": {"expr": "2*3"}}</tool_call>, '
    "then reply answer: <number>."
)  # optional (``system_prompt=SYSTEM_PROMPT``) for models that were not warm-started on the format

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
_INT = re.compile(r"-?\d+")
_MAX_EXPR_CHARS = 64
_MAX_DIGITS = 12
_MAX_CALLS_PER_TURN = 4  # later calls of a turn are ignored
_TOOL_RESPONSE = re.compile(r"\s*<tool_response>(.*)</tool_response>\s*", re.DOTALL)


def tool_call_text(expr: str) -> str:
    """The canonical tool-call turn for ``expr``."""
    return "<tool_call>" + json.dumps({"name": TOOL_NAME, "arguments": {"expr": expr}}) + "</tool_call>"


def answer_text(value: int) -> str:
    """The canonical final-answer turn."""
    return f"answer: {value}"


class CalcError(ValueError):
    """An expression outside the calculator's grammar."""


def evaluate(expr: str) -> int:
    """Evaluate ``expr`` (integers, ``+ - *``, unary minus, parentheses; ``*`` binds tighter).

    Raises `CalcError` on anything else, on more than 64 characters or on integers over 12 digits.
    """
    if not isinstance(expr, str):
        raise CalcError("expr must be a string")
    if len(expr) > _MAX_EXPR_CHARS:
        raise CalcError(f"expr longer than {_MAX_EXPR_CHARS} characters")
    tokens = re.findall(r"\d+|[-+*()]|\S", expr)
    if not tokens:
        raise CalcError("empty expr")
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        pos += 1
        return tokens[pos - 1]

    def sum_() -> int:
        value = product()
        while peek() in ("+", "-"):
            op = take()
            value = _OPS[op](value, product())
        return value

    def product() -> int:
        value = factor()
        while peek() == "*":
            take()
            value *= factor()
        return value

    def factor() -> int:
        tok = peek()
        if tok is None:
            raise CalcError("expr ends early")
        take()
        if tok == "-":
            return -factor()
        if tok == "(":
            value = sum_()
            if peek() != ")":
                raise CalcError("missing )")
            take()
            return value
        if tok.isdigit():
            if len(tok) > _MAX_DIGITS:
                raise CalcError("number too long")
            return int(tok)
        raise CalcError(f"unexpected {tok!r}")

    value = sum_()
    if pos != len(tokens):
        raise CalcError(f"unexpected {tokens[pos]!r}")
    return value


def make_tasks(n: int, seed: int = 0) -> list[Task]:
    """``n`` deterministic tasks (ids ``calculator-<seed>-<i>``); a longer list extends a shorter one."""
    rng = random.Random(f"calculator-{seed}")
    tasks = []
    for i in range(n):
        a, b, op = rng.randint(0, 99), rng.randint(0, 99), rng.choice("+-*")
        tasks.append(
            Task(
                id=f"calculator-{seed}-{i}",
                prompt=f"What is {a} {op} {b}?",
                answer=_OPS[op](a, b),
                metadata={"a": a, "op": op, "b": b},
            )
        )
    return tasks


def _as_int(text: str) -> int | None:
    """``text`` as an integer, or None (also for integers too long for ``int``)."""
    try:
        return int(text)
    except ValueError:
        return None


def _tool_result(message: Message) -> int | None:
    """The integer a ``tool`` message holds (its whole content, optionally in ``<tool_response>``)."""
    text = message_text(message)
    wrapped = _TOOL_RESPONSE.fullmatch(text)
    text = (wrapped.group(1) if wrapped else text).strip()
    return _as_int(text) if _INT.fullmatch(text) else None


def score_messages(task: Task, messages: list[Message]) -> float:
    """The outcome reward of a finished OpenAI-format conversation (see the module docstring)."""
    final = messages[-1] if isinstance(messages, list) and messages else None
    if not isinstance(final, dict) or final.get("role") != "assistant" or final.get("tool_calls"):
        return 0.0
    text = message_text(final)
    found = _INT.findall(text)
    if "<tool_call>" in text or not found or _as_int(found[-1]) != task.answer:
        return 0.0
    results = [_tool_result(m) for m in messages[:-1] if isinstance(m, dict) and m.get("role") == "tool"]
    return 1.0 if task.answer in results else 0.0


def optimal_policy(task: Task, messages: list[Message]) -> str:
    """The next assistant turn of the optimal policy: call the tool, then answer with its last result."""
    results = [m["content"] for m in messages if m.get("role") == "tool" and _INT.fullmatch(m["content"])]
    if results:
        return answer_text(int(results[-1]))
    meta = task.metadata
    return tool_call_text(f"{meta['a']}{meta['op']}{meta['b']}")


@register_env("calculator", tasks=make_tasks)
class CalculatorEnv:
    """See the module docstring. One episode at a time."""

    def __init__(
        self,
        max_turns: int = 3,
        system_prompt: str | None = None,
        tool_schema: bool = False,
        tool_format: str = "hermes",
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.max_turns = max_turns
        self.system_prompt = system_prompt
        # With tool_schema the prompt carries the tool's schema, rendered by the chat template, exactly as
        # for an OpenAI-SDK agent that sends ``tools=[TOOL_SCHEMA]`` through the gateway.
        self.tools = [TOOL_SCHEMA] if tool_schema else None
        self.tool_format = get_tool_format(tool_format)  # how calls are read; ValueError naming the formats
        self._task: Task | None = None
        self._turns = 0
        self._done = True
        self._tool_results: list[int] = []

    async def reset(self, task: Task) -> list[Message]:
        self._task, self._turns, self._done, self._tool_results = task, 0, False, []
        return initial_messages(task, self.system_prompt)

    async def step(self, assistant_text: str) -> StepResult:
        if self._done or self._task is None:
            return StepResult([], 0.0, True, {"error": "step() called outside an episode"})
        self._turns += 1
        last_turn = self._turns >= self.max_turns
        info: dict[str, Any] = {"turn": self._turns}
        parsed = self.tool_format.parse(assistant_text, [TOOL_SCHEMA])
        if parsed.calls or parsed.errors:  # a tool turn, well formed or not
            observation = self._run_tools(parsed, info)
            return self._continue_or_stop(observation, last_turn, info)
        found = _INT.findall(assistant_text)
        if not found:
            info["error"] = "no integer in the answer"
            observation = [{"role": "user", "content": "error: reply answer: <number>"}]
            return self._continue_or_stop(observation, last_turn, info)
        answer = int(found[-1])
        correct = answer == self._task.answer
        used_tool = self._task.answer in self._tool_results
        info.update(answer=answer, correct=correct, used_tool=used_tool, tool_calls=len(self._tool_results))
        self._done = True
        return StepResult([], 1.0 if correct and used_tool else 0.0, True, info)

    def score(self, task: Task, messages: list[Message]) -> float:
        """The outcome reward of a conversation this env did not play (`score_messages`); the episode in
        progress, if any, is not touched."""
        return score_messages(task, messages)

    async def close(self) -> None:
        self._done = True

    def _run_tools(self, parsed: ToolCallParse, info: dict[str, Any]) -> list[Message]:
        out = [tool_message(f"error: {e}"[:120]) for e in parsed.errors]
        for call in parsed.calls[:_MAX_CALLS_PER_TURN]:
            if call.name != TOOL_NAME:
                out.append(tool_message(f"error: unknown tool {call.name[:40]!r}, use {TOOL_NAME!r}"))
                continue
            try:
                value = evaluate(call.arguments.get("expr"))
            except CalcError as err:
                out.append(tool_message(f"error: {err}"))
                continue
            self._tool_results.append(value)
            out.append(tool_message(str(value)))
        errors = [m["content"] for m in out if m["content"].startswith("error:")]
        if errors:
            info["error"] = "; ".join(errors)
        return out

    def _continue_or_stop(
        self, observation: list[Message], last_turn: bool, info: dict[str, Any]
    ) -> StepResult:
        if not last_turn:
            return StepResult(observation, 0.0, False, info)
        self._done = True
        info["truncated"] = True
        return StepResult([], 0.0, True, info)
