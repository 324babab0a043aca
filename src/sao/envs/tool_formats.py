"""Tool-call formats by name: how a model writes its tool calls, how they are read back, and how a prompt
tells a model to write them. One format per chat template family; an env or the gateway picks one by name
(`get_tool_format`) so its parser reads what the model's template taught it to write.

Shipped formats (`TOOL_FORMATS`):

- ``hermes`` — Hermes / Qwen2.5 / Qwen3: ``<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>``
  (`sao.envs.tools.parse_tool_calls`; the shipped ``qwen3`` and ``hermes`` templates).
- ``qwen3_coder`` — Qwen3-Coder's XML form (the shipped ``qwen3_coder`` template)::

      <tool_call>
      <function=NAME>
      <parameter=ARG>
      VALUE
      </parameter>
      </function>
      </tool_call>

  A value is the text between the tags less one leading and one trailing newline. Without the tool's
  schema a value stays a string, except ``null`` (any case), which is None — as vLLM's and SGLang's
  ``qwen3_coder`` parsers do. With ``tools`` (OpenAI tool schemas) a value is converted by its parameter's
  declared ``type``: integer, number, boolean, object/array (JSON, else a Python literal); a value that
  does not convert stays a string (vLLM turns a bad boolean into false instead).

Every format keeps the semantics of the Hermes parser: a malformed block makes no call, is reported in
``errors`` and has no span; an unclosed block sets ``unclosed``; ``parse`` never raises. ``render`` writes
what a model of the format generates for some calls (what its chat template writes for an assistant's
``tool_calls``), so ``parse(render(calls)) == calls``; it raises ValueError for calls the format cannot
write (a name with ``<``, ``>`` or whitespace in the XML form, a value holding a closing tag).
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from .tools import ToolCall, ToolCallParse, parse_tool_call_blocks, parse_tool_calls

__all__ = [
    "TOOL_FORMATS",
    "HermesFormat",
    "Qwen3CoderFormat",
    "ToolFormat",
    "get_tool_format",
    "register_tool_format",
]

Schemas = Sequence[Mapping[str, Any]] | None  # OpenAI tool schemas, as a request's ``tools``


@runtime_checkable
class ToolFormat(Protocol):
    """A tool-call format: ``name`` (its registry key), ``instructions`` (how to call tools in it, for the
    system prompt of a template that does not render tools), ``parse`` and ``render``."""

    name: str
    instructions: str

    def parse(self, text: str, tools: Schemas = None) -> ToolCallParse:
        """The calls ``text`` makes (``tools``: the request's tool schemas, for formats whose values are
        typed by them); never raises."""
        ...

    def render(self, calls: Sequence[ToolCall]) -> str:
        """The text a model of this format writes to make ``calls`` (blocks joined by ``\\n``)."""
        ...


class HermesFormat:
    """``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` (Hermes, Qwen2.5, Qwen3)."""

    name = "hermes"
    instructions = (
        "To call a function, write a JSON object with its name and arguments inside <tool_call></tool_call> "
        'tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )

    def parse(self, text: str, tools: Schemas = None) -> ToolCallParse:
        return parse_tool_calls(text)

    def render(self, calls: Sequence[ToolCall]) -> str:
        blocks = []
        for call in calls:
            try:
                body = json.dumps(
                    {"name": call.name, "arguments": call.arguments}, ensure_ascii=False, allow_nan=False
                )
            except (TypeError, ValueError) as err:
                raise ValueError(f"tool call {call.name!r}: arguments are not JSON ({err})") from None
            # "<\/" is JSON for "</": a string holding the closing tag must not end the block early.
            body = body.replace("</tool_call>", "<\\/tool_call>")
            blocks.append(f"<tool_call>\n{body}\n</tool_call>")
        return "\n".join(blocks)


_XML_NAME = re.compile(r"[^\s<>]+")  # a function or parameter name the XML tags can hold
_FUNCTION_OPEN, _FUNCTION_CLOSE = "<function=", "</function>"
_PARAM_OPEN, _PARAM_CLOSE = "<parameter=", "</parameter>"
_STRING_TYPES = frozenset({"string", "str", "text", "varchar", "char", "enum"})
_INT_PREFIXES = ("int", "uint", "long", "short", "unsigned")
_CONTAINER_PREFIXES = ("object", "array", "arr", "dict", "list")


class Qwen3CoderFormat:
    """Qwen3-Coder's ``<tool_call><function=NAME><parameter=ARG>VALUE</parameter></function></tool_call>``
    (see the module docstring for how values are read)."""

    name = "qwen3_coder"
    instructions = (
        "To call a function, reply in this format and write nothing after it:\n\n"
        "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"
        "</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\n"
        "that can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n"
        "Rules:\n- The <function=...></function> block goes inside <tool_call></tool_call> tags.\n"
        "- Give every required parameter.\n"
        "- Any reasoning goes before the function call, never after it."
    )

    def parse(self, text: str, tools: Schemas = None) -> ToolCallParse:
        return parse_tool_call_blocks(text, lambda body: _parse_function(body, tools))

    def render(self, calls: Sequence[ToolCall]) -> str:
        return "\n".join(_render_function(call) for call in calls)


def _render_function(call: ToolCall) -> str:
    if not _XML_NAME.fullmatch(call.name):
        raise ValueError(
            f"qwen3_coder cannot write function name {call.name!r} (empty, or has <, > or space)"
        )
    parts = [f"<tool_call>\n{_FUNCTION_OPEN}{call.name}>\n"]
    for key, value in call.arguments.items():
        if not _XML_NAME.fullmatch(key):
            raise ValueError(f"qwen3_coder cannot write parameter name {key!r} of {call.name!r}")
        try:
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as err:
            raise ValueError(f"parameter {key!r} of {call.name!r} is not JSON ({err})") from None
        if _PARAM_CLOSE in text or "</tool_call>" in text:
            raise ValueError(
                f"qwen3_coder cannot write parameter {key!r} of {call.name!r}: it holds a closing tag"
            )
        parts.append(f"{_PARAM_OPEN}{key}>\n{text}\n{_PARAM_CLOSE}\n")
    parts.append(f"{_FUNCTION_CLOSE}\n</tool_call>")
    return "".join(parts)


def _parse_function(body: str, tools: Schemas) -> ToolCall | str:
    """The call one ``<tool_call>`` block's (stripped) ``body`` makes, or the reason it makes none."""
    head = body[:200]
    if not body.startswith(_FUNCTION_OPEN):
        return f"a <tool_call> block must hold one <function=NAME>...</function>: {head!r}"
    close = body.find(">")
    name = body[len(_FUNCTION_OPEN) : close].strip() if close >= 0 else ""
    if not _XML_NAME.fullmatch(name):
        return f"<function=NAME> needs a name without spaces or angle brackets: {head!r}"
    if not body.endswith(_FUNCTION_CLOSE):
        return f"<function={name}> is not closed with </function> at the end of its <tool_call> block"
    inner, pos = body[close + 1 : -len(_FUNCTION_CLOSE)], 0
    raw: dict[str, str] = {}
    while (pos := _skip_space(inner, pos)) < len(inner):
        if not inner.startswith(_PARAM_OPEN, pos):
            stray = inner[pos : pos + 200]
            return f"<function={name}> holds text that is not a <parameter=...> block: {stray!r}"
        gt = inner.find(">", pos)
        key = inner[pos + len(_PARAM_OPEN) : gt].strip() if gt >= 0 else ""
        if not _XML_NAME.fullmatch(key):
            return f"<parameter=NAME> of {name!r} needs a name without spaces or angle brackets"
        end = inner.find(_PARAM_CLOSE, gt + 1)
        if end < 0:
            return f"parameter {key!r} of {name!r} is not closed with </parameter>"
        if key in raw:
            return f"parameter {key!r} of {name!r} is given twice"
        value = inner[gt + 1 : end]
        value = value[1:] if value.startswith("\n") else value
        raw[key] = value[:-1] if value.endswith("\n") else value
        pos = end + len(_PARAM_CLOSE)
    properties = _properties(name, tools)
    return ToolCall(name, {key: _convert(value, properties.get(key)) for key, value in raw.items()})


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _properties(name: str, tools: Schemas) -> Mapping[str, Any]:
    """The declared parameters (``parameters.properties``) of tool ``name`` in ``tools``; {} when unknown."""
    for tool in tools or ():
        fn = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if isinstance(fn, Mapping) and fn.get("name") == name:
            params = fn.get("parameters")
            props = params.get("properties") if isinstance(params, Mapping) else None
            return props if isinstance(props, Mapping) else {}
    return {}


def _declared_type(schema: Any) -> str:
    """A parameter schema's ``type``, lower-cased (the first non-null one of a list); "string" when absent."""
    kind = schema.get("type") if isinstance(schema, Mapping) else None
    if isinstance(kind, list):
        kind = next((k for k in kind if isinstance(k, str) and k != "null"), None)
    return kind.strip().lower() if isinstance(kind, str) else "string"


def _convert(value: str, schema: Any) -> Any:
    """A parameter's text as the value its schema declares (vLLM/SGLang qwen3_coder rules); the text itself
    when it does not convert or nothing is declared, None for ``null``."""
    if value.lower() == "null":
        return None
    if schema is None:
        return value
    kind = _declared_type(schema)
    if kind in _STRING_TYPES:
        return value
    if kind.startswith(_INT_PREFIXES):
        parsers: tuple[Any, ...] = (int,)
    elif kind.startswith(("num", "float")):
        parsers = (int, _finite_float)
    elif kind in ("boolean", "bool", "binary"):
        return {"true": True, "false": False}.get(value.strip().lower(), value)
    elif kind.startswith(_CONTAINER_PREFIXES):
        parsers = (_json_container, _literal_container)
    else:
        parsers = (json.loads,)
    for parse in parsers:
        try:
            return parse(value)
        except Exception:  # a value that does not convert stays text (deep nesting included)
            continue
    return value


def _finite_float(value: str) -> float:
    number = float(value)
    if not math.isfinite(number):  # JSON has no inf/nan: such a value stays text
        raise ValueError("not a finite number")
    return number


def _json_container(value: str) -> dict[str, Any] | list[Any]:
    decoded = json.loads(value)
    if not isinstance(decoded, dict | list):
        raise ValueError("not an object or array")
    return decoded


def _literal_container(value: str) -> dict[str, Any] | list[Any]:
    """A Python-literal dict or list (``{'a': True}``) that JSON can hold; ValueError otherwise."""
    decoded = ast.literal_eval(value)
    if not isinstance(decoded, dict | list):
        raise ValueError("not a dict or list")
    return json.loads(json.dumps(decoded, allow_nan=False))  # TypeError for sets, bytes, tuples as keys


TOOL_FORMATS: dict[str, ToolFormat] = {}


def register_tool_format(fmt: ToolFormat, *, replace: bool = False) -> ToolFormat:
    """Add ``fmt`` under ``fmt.name`` (ValueError when that name is taken, unless ``replace``); returns it."""
    if not isinstance(fmt, ToolFormat) or not isinstance(fmt.name, str) or not fmt.name:
        raise ValueError(f"a tool format needs a non-empty name, instructions, parse and render: {fmt!r}")
    if fmt.name in TOOL_FORMATS and not replace:
        raise ValueError(f"tool format {fmt.name!r} is already registered (pass replace=True to replace it)")
    TOOL_FORMATS[fmt.name] = fmt
    return fmt


def get_tool_format(name: str) -> ToolFormat:
    """The registered format ``name``; ValueError listing the known ones when there is none."""
    try:
        return TOOL_FORMATS[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(TOOL_FORMATS))
        raise ValueError(f"unknown tool-call format {name!r}; the formats are: {known}") from None


register_tool_format(HermesFormat())
register_tool_format(Qwen3CoderFormat())
