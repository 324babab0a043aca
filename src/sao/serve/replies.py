"""The assistant message a generated turn becomes: what every API of the gateway returns (and what the
session remembers, so an echo of it continues the branch).

`ReplyBuilder` takes the decoded generation, strips the end-of-turn (or eos) token, splits the reasoning
off with the configured reasoning parser (`sao.serve.reasoning`), and, when the request gave tools, splits
the tool calls off the *content* with the configured tool-call format (`sao.envs.tool_formats`, typed by
the request's tool schemas; a ``<tool_call>`` inside the reasoning is thought, not a call). The message is
``{"role": "assistant", "content": ..., maybe "reasoning_content": ..., maybe "tool_calls": [...]}`` in
OpenAI form; the Anthropic and Responses APIs convert it.

Owns: that message. Does not own: recording (`sao.serve.sessions`), the parsers themselves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sao.envs.tool_formats import get_tool_format
from sao.models.chat_delta import end_of_turn_token

from .openai_api import split_tool_calls
from .reasoning import get_reasoning_parser

__all__ = ["ReplyBuilder"]


class ReplyBuilder:
    """``builder(text, tools) -> message``: the assistant message of a turn generated for a request with
    ``tools`` (its tool schemas; calls are split off only when it has some).

    Args:
        tokenizer: the model's tokenizer: its end-of-turn token (``<|im_end|>``, else eos) and its eos
            token are stripped from the end of the text.
        reasoning_parser: a name of `sao.serve.reasoning.REASONING_PARSERS`, or None (no split).
        tool_call_format: a name of the tool-call formats (`sao.envs.tool_formats.get_tool_format`).

    Raises ValueError for an unknown parser or format name.
    """

    def __init__(self, tokenizer: Any, *, reasoning_parser: str | None, tool_call_format: str) -> None:
        self.end_of_turn, _ = end_of_turn_token(tokenizer)
        self.eos = tokenizer.eos_token or self.end_of_turn
        self.split_reasoning = get_reasoning_parser(reasoning_parser)
        self.tool_format = get_tool_format(tool_call_format)

    def __call__(self, text: str, tools: Sequence[Any] | None) -> dict[str, Any]:
        visible = text.removesuffix(self.end_of_turn).removesuffix(self.eos)
        reasoning, content = self.split_reasoning(visible)
        calls = None
        if tools:
            content, calls = split_tool_calls(content, lambda t: self.tool_format.parse(t, tools))
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        if calls:
            message["tool_calls"] = calls
        return message
