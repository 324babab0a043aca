"""Reasoning parsers: a generated turn's text split into its reasoning and its content.

A parser is ``parse(text) -> (reasoning, content)``: ``reasoning`` is None when the text has none. The
gateway returns the reasoning beside the content (OpenAI ``reasoning_content``, Anthropic ``thinking``
blocks, Responses ``reasoning`` items) and parses tool calls from the content only. The split changes
only what the client is shown: the recorded tokens are always the generated ones.

Parsers, by name (`REASONING_PARSERS`, chosen by `get_reasoning_parser`):

- ``"think"``: Qwen3 / DeepSeek-R1 style. A ``<think>...</think>`` block at the start of the text (after
  whitespace) is the reasoning; when the chat template already put ``<think>`` in the prompt, the
  generation starts inside the block and the text before the first ``</think>`` is the reasoning. A block
  that is never closed (the turn was cut by ``max_tokens``) is all reasoning. Text without ``</think>``
  (and not opening with ``<think>``) is all content. Newlines around the reasoning and before the content
  are dropped, as Qwen3's template writes them (``<think>\\nR\\n</think>\\n\\nC``).
- ``"none"`` (or None): no split, the whole text is content.

Owns: this registry. Does not own: tool calls (`sao.serve.openai_api.split_tool_calls`), HTTP.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["REASONING_PARSERS", "ReasoningParser", "get_reasoning_parser", "no_reasoning", "split_think"]

# ``parse(text) -> (reasoning or None, content)``
ReasoningParser = Callable[[str], tuple[str | None, str]]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def split_think(text: str) -> tuple[str | None, str]:
    """``text``'s ``<think>`` reasoning (None when it has none, or an empty block) and its content (see
    the module docstring)."""
    stripped = text.lstrip()
    if stripped.startswith(THINK_OPEN):
        body = stripped[len(THINK_OPEN) :]
        end = body.find(THINK_CLOSE)
        if end < 0:  # cut inside the block
            return body.strip("\n") or None, ""
    else:
        body, end = text, text.find(THINK_CLOSE)
        if end < 0:
            return None, text
    reasoning = body[:end].strip("\n")
    return reasoning or None, body[end + len(THINK_CLOSE) :].lstrip("\n")


def no_reasoning(text: str) -> tuple[str | None, str]:
    """No reasoning: the whole ``text`` is content."""
    return None, text


REASONING_PARSERS: dict[str, ReasoningParser] = {"think": split_think, "none": no_reasoning}


def get_reasoning_parser(name: str | None) -> ReasoningParser:
    """The parser called ``name`` (None is ``"none"``). Raises ValueError naming the allowed values."""
    parser = REASONING_PARSERS.get("none" if name is None else name)
    if parser is None:
        allowed = ", ".join(repr(n) for n in REASONING_PARSERS)
        raise ValueError(f"unknown reasoning_parser {name!r}: use one of {allowed} (or None)")
    return parser
