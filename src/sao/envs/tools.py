"""Parsing the model's tool use: Qwen/Hermes ``<tool_call>{json}</tool_call>`` blocks, fenced python
blocks (tool-integrated reasoning) and ``\\boxed{}`` final answers. Malformed input never raises out of
the env: `parse_tool_calls` returns the problems so the env can answer with an error observation.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ToolCall",
    "ToolCallParse",
    "extract_boxed",
    "extract_python_blocks",
    "function_tool",
    "parse_tool_call_blocks",
    "parse_tool_calls",
    "submit_turn",
    "tool_message",
]

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_PYTHON_BLOCK = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class ToolCallParse:
    """The well-formed calls of a turn, and a message per malformed one (for an error observation).

    ``spans[i]`` is the ``(start, end)`` character range in the parsed text of the block ``calls[i]`` came
    from (what a caller removes to keep the text that is not a call)."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    unclosed: bool = False  # an opening <tool_call> without its closing tag
    spans: list[tuple[int, int]] = field(default_factory=list)


def parse_tool_calls(text: str) -> ToolCallParse:
    """Find every ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` block in ``text``.

    ``arguments`` may be an object or a string holding a JSON object (decoded); a block that is not
    JSON, has no string ``name`` or whose arguments are not an object is reported in ``errors`` and
    skipped, and so is an unclosed ``<tool_call>``. This is the Hermes/Qwen parser (the ``hermes`` entry of
    `sao.envs.tool_formats`): the envs answer ``errors`` with an error observation, the gateway
    (`sao.serve.openai_api.split_tool_calls`) turns ``calls`` into OpenAI ``tool_calls``."""
    return parse_tool_call_blocks(text, _parse_block)


def parse_tool_call_blocks(text: str, parse_body: Callable[[str], ToolCall | str]) -> ToolCallParse:
    """Every ``<tool_call>BODY</tool_call>`` block of ``text``, each ``BODY`` (whitespace stripped) read by
    ``parse_body``: a `ToolCall`, or a string saying why the block makes no call (then it is in ``errors``
    and not in ``spans``). An opening ``<tool_call>`` left without its closing tag sets ``unclosed`` and
    adds an error. The block scan every ``<tool_call>``-delimited format shares (`sao.envs.tool_formats`)."""
    out = ToolCallParse()
    for match in _TOOL_CALL.finditer(text):
        call = parse_body(match.group(1).strip())
        if isinstance(call, str):
            out.errors.append(call)
        else:
            out.calls.append(call)
            out.spans.append(match.span())
    remainder = _TOOL_CALL.sub("", text)
    out.unclosed = "<tool_call>" in remainder
    if out.unclosed:
        out.errors.append("a <tool_call> block is not closed with </tool_call>")
    return out


def _parse_block(body: str) -> ToolCall | str:
    """The call one block's ``body`` makes, or the reason it makes none."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as err:
        return f"tool call is not valid JSON ({err.msg} at column {err.colno}): {body[:200]!r}"
    except RecursionError:  # nesting deeper than the interpreter's stack: no call, never a crash
        return f"tool call JSON is nested too deeply: {body[:200]!r}"
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return f'tool call must be an object with a string "name": {body[:200]!r}'
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (json.JSONDecodeError, RecursionError):
            return f'tool call "arguments" must be an object: {args[:200]!r}'
    if not isinstance(args, dict):
        return f'tool call "arguments" must be an object, got {type(args).__name__}'
    return ToolCall(obj["name"], args)


def extract_python_blocks(text: str) -> list[str]:
    """The code of every fenced ```python block, in order."""
    return [m.group(1) for m in _PYTHON_BLOCK.finditer(text)]


def extract_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (balanced braces), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j].strip()
    return None


def function_tool(
    name: str, description: str, properties: dict[str, Any], required: list[str]
) -> dict[str, Any]:
    """An OpenAI/Qwen-style function schema (what an env's ``tools`` holds and chat templates render):
    ``properties`` are the JSON-schema parameters, ``required`` the names that must be given."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def tool_message(content: str, name: str | None = None) -> dict[str, Any]:
    """A ``role: tool`` observation message."""
    msg: dict[str, Any] = {"role": "tool", "content": content}
    if name is not None:
        msg["name"] = name
    return msg


def submit_turn(
    parsed: ToolCallParse, turn: int, submit: str = "submit"
) -> tuple[list[dict[str, Any]], dict[str, Any], list[ToolCall], bool]:
    """The start of a turn of an env whose episode ends with a ``submit`` tool call: ``(observation,
    info, calls, submitted)``: an ``error: ...`` tool message per malformed block, the turn's info
    (``turn``, ``tool_calls``, ``tool_errors`` when some), the calls to run (those before the first
    ``submit``; later ones are ignored) and whether the turn submitted."""
    observation = [tool_message(f"error: {err}") for err in parsed.errors]
    info: dict[str, Any] = {"turn": turn, "tool_calls": len(parsed.calls)}
    if parsed.errors:
        info["tool_errors"] = len(parsed.errors)
    names = [call.name for call in parsed.calls]
    submitted = submit in names
    calls = parsed.calls[: names.index(submit)] if submitted else list(parsed.calls)
    return observation, info, calls, submitted
