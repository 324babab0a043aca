"""The multi-turn tool job of `benchmarks/trl_arm.py`: sao's built-in ``calculator`` env, for TRL.

Standard library only, so TRL's virtualenv (which has no sao) imports it. It restates, for a peer trainer,
what `sao.envs.calculator` does when sao plays ``data.env=calculator`` with its default arguments:

- tasks: `make_prompts(n, seed)` gives the questions and answers of ``make_env_tasks("calculator", n,
  seed)`` (``"What is 37 * 12?"``, operands 0..99, ``+ - *``), the same for the same seed;
- first prompt: one user message with the question; no system prompt and no tool schema in it (sao's
  default ``system_prompt=None, tool_schema=False``; the model learned the call format in SFT);
- tool: `calc(expr)` evaluates sao's grammar (integers, ``+ - *``, unary minus, parentheses; never
  ``eval``) and returns what sao's ``tool`` message holds: the integer as text, or ``"error: <why>"``;
- reward: `calculator_reward` is sao's outcome rule (`score_messages`): 1.0 when the final assistant
  message is an answer (no tool call) whose last integer is the true value *and* a ``tool`` message of
  the conversation holds exactly that value, else 0.0.

Run in sao's virtualenv, ``python benchmarks/calculator_job.py`` checks all three against sao's own env
(tasks for 3 seeds, the tool on a set of expressions, the reward on a set of conversations) and exits
non-zero on a mismatch.
"""

from __future__ import annotations

import random
import re
from typing import Any

__all__ = ["MAX_TURNS", "CalcError", "calc", "calculator_reward", "evaluate", "make_prompts"]

MAX_TURNS = 3  # sao's CalculatorEnv default: call, answer, one retry
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
_INT = re.compile(r"-?\d+")
_MAX_EXPR_CHARS = 64
_MAX_DIGITS = 12
_TOOL_RESPONSE = re.compile(r"\s*<tool_response>(.*)</tool_response>\s*", re.DOTALL)


def make_prompts(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` deterministic tasks ``{"id", "text", "answer"}`` (``answer`` an int); sao's ``make_tasks``
    draws the same ones from the same seed, and a longer list extends a shorter one."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"the number of prompts must be a non-negative integer, got {n!r}")
    rng = random.Random(f"calculator-{seed}")
    prompts = []
    for i in range(n):
        a, b, op = rng.randint(0, 99), rng.randint(0, 99), rng.choice("+-*")
        prompts.append(
            {"id": f"calculator-{seed}-{i}", "text": f"What is {a} {op} {b}?", "answer": _OPS[op](a, b)}
        )
    return prompts


class CalcError(ValueError):
    """An expression outside the calculator's grammar."""


def evaluate(expr: Any) -> int:
    """``expr`` evaluated by sao's calculator grammar (``*`` binds tighter than ``+ -``).

    Raises `CalcError` (with sao's message) on anything else, on more than 64 characters or on integers
    over 12 digits.
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


def calc(expr: str) -> str:
    """Evaluate an arithmetic expression with integers, +, -, * and parentheses.

    Args:
        expr: The expression, e.g. "37*12".
    """
    try:
        return str(evaluate(expr))
    except CalcError as err:
        return f"error: {err}"


def _as_int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _tool_result(message: dict[str, Any]) -> int | None:
    """The integer a ``tool`` message holds (its whole content, optionally in ``<tool_response>``)."""
    text = _text(message)
    wrapped = _TOOL_RESPONSE.fullmatch(text)
    text = (wrapped.group(1) if wrapped else text).strip()
    return _as_int(text) if _INT.fullmatch(text) else None


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type", "text") == "text"
        )
    return str(content)


def calculator_reward(answer: int, messages: list[dict[str, Any]]) -> float:
    """sao's outcome reward of a finished conversation (OpenAI-format ``messages``, the last one the final
    assistant turn): 1.0 for a correct answer read off an earlier ``tool`` result, else 0.0."""
    final = messages[-1] if isinstance(messages, list) and messages else None
    if not isinstance(final, dict) or final.get("role") != "assistant" or final.get("tool_calls"):
        return 0.0
    text = _text(final)
    found = _INT.findall(text)
    if "<tool_call>" in text or not found or _as_int(found[-1]) != answer:
        return 0.0
    results = [_tool_result(m) for m in messages[:-1] if isinstance(m, dict) and m.get("role") == "tool"]
    return 1.0 if answer in results else 0.0


def _check_against_sao() -> int:
    """Compare tasks, tool and reward with sao's `calculator` env; print what differs; 0 when nothing."""
    from sao.envs import make_env_tasks
    from sao.envs.calculator import CalcError as SaoCalcError
    from sao.envs.calculator import evaluate as sao_evaluate
    from sao.envs.calculator import score_messages
    from sao.envs.tools import tool_message

    bad = 0
    for seed in (0, 1, 123):
        ours = make_prompts(2048, seed)
        theirs = make_env_tasks("calculator", 2048, seed)
        same = [(p["id"], p["text"], p["answer"]) for p in ours] == [
            (t.id, t.prompt, t.answer) for t in theirs
        ]
        bad += not same
        print(f"tasks seed {seed}: {'same' if same else 'DIFFERENT'}")
    exprs = ["37*12", " 2 + 3 * 4 ", "-(5-7)*3", "((1)", "2 3", "x", "", "9" * 13, "1+" * 40, "7--3", 12]
    for expr in exprs:
        try:
            sao_content = tool_message(str(sao_evaluate(expr)))["content"]
        except SaoCalcError as err:
            sao_content = tool_message(f"error: {err}")["content"]
        if calc(expr) != sao_content:
            bad += 1
            print(f"tool on {expr!r}: ours {calc(expr)!r}, sao {sao_content!r}")
    task = make_env_tasks("calculator", 1, 0)[0]
    v = task.answer
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {}}]}
    convs = [
        [call, {"role": "tool", "content": str(v)}, {"role": "assistant", "content": f"answer: {v}"}],
        [call, {"role": "tool", "content": str(v)}, {"role": "assistant", "content": f"answer: {v + 1}"}],
        [{"role": "assistant", "content": f"answer: {v}"}],
        [call, {"role": "tool", "content": str(v)}, call],
        [
            call,
            {"role": "tool", "content": f"<tool_response>{v}</tool_response>"},
            {"role": "assistant", "content": f"x={v}"},
        ],
        [call, {"role": "tool", "content": "error: x"}, {"role": "assistant", "content": f"answer: {v}"}],
    ]
    for conv in convs:
        if calculator_reward(task.answer, conv) != score_messages(task, conv):
            bad += 1
            print(f"reward differs on {conv}")
    print("tool and reward:", "same" if not bad else f"{bad} differences")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(_check_against_sao())
