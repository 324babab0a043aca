"""Parsing the model's tool use: Qwen/Hermes ``<tool_call>{json}</tool_call>`` blocks, fenced python
blocks (tool-integrated reasoning) and ``\\boxed{}`` final answers. Malformed input never raises out of
the env: `parse_tool_calls` returns the problems so the env can answer with an error observation.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ToolCall",
    "ToolCallParse",
    "extract_boxed",
    "extract_python_blocks",
    "parse_tool_calls",
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
    """The well-formed calls of a turn, and a message per malformed one (for an error observation)."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    unclosed: bool = False  # an opening <tool_call> without its closing tag


def parse_tool_calls(text: str) -> ToolCallParse:
    """Find every ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` block in ``text``."""
    out = ToolCallParse()
    for match in _TOOL_CALL.finditer(text):
        body = match.group(1).strip()
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as err:
            out.errors.append(
                f"tool call is not valid JSON ({err.msg} at column {err.colno}): {body[:200]!r}"
            )
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            out.errors.append(f'tool call must be an object with a string "name": {body[:200]!r}')
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                out.errors.append(f'tool call "arguments" must be an object: {args[:200]!r}')
                continue
        if not isinstance(args, dict):
            out.errors.append(f'tool call "arguments" must be an object, got {type(args).__name__}')
            continue
        out.calls.append(ToolCall(obj["name"], args))
    remainder = _TOOL_CALL.sub("", text)
    out.unclosed = "<tool_call>" in remainder
    if out.unclosed:
        out.errors.append("a <tool_call> block is not closed with </tool_call>")
    return out


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


def tool_message(content: str, name: str | None = None) -> dict[str, Any]:
    """A ``role: tool`` observation message."""
    msg: dict[str, Any] = {"role": "tool", "content": content}
    if name is not None:
        msg["name"] = name
    return msg
