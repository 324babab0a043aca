"""The Anthropic side of the gateway: ``POST /v1/messages`` bodies converted to the OpenAI `ChatRequest`
the session recorder serves, and the gateway's chat.completion converted back to an Anthropic message.

Requests: ``system`` (a string or text blocks, joined with ``"\\n"``) → a first ``system`` message. A user
message's blocks keep their order: consecutive ``text`` blocks form one ``user`` message, each
``tool_result`` becomes a ``tool`` message (``tool_call_id`` = ``tool_use_id``; an ``is_error`` result's
text is prefixed ``"error: "`` unless it already starts with ``error:``, as OpenAI has no error flag). An
assistant message's ``text`` blocks (joined) → ``content``, its ``tool_use`` blocks → ``tool_calls``
(``arguments`` = ``json.dumps(input)``; ``content`` None when there is no text), its ``thinking`` blocks
(joined with ``"\\n"``, the signature not checked) → ``reasoning_content``: reasoning sent back or dropped,
the reply matches what was generated either way (`sao.serve.sessions.reply_signature`). ``tools`` → OpenAI
function tools, ``stop_sequences`` → ``stop``; sampling fields, ``seed`` and ``session_id`` (sao's
extensions, as on the OpenAI side), ``group_id`` and ``task_id`` are passed only when the client set
them, so the `ChatRequest`'s ``model_fields_set`` is the client's. ``stream`` is passed on (the gateway
streams the message as Anthropic events, `sao.serve.streaming`).

Responses: a ``thinking`` block when the model reasoned (``reasoning_content``; its ``signature`` is a
digest of the text, which sao does not check when it comes back), text, then one ``tool_use`` block per
call, with the OpenAI call id as block id (an agent that echoes the block back produces the same
``tool_calls`` id); ``stop_reason`` ``tool_use``, ``max_tokens`` or ``end_turn`` (a matched stop
sequence is not told apart: ``stop_sequence`` is always None). sao's extras (``session_id``,
``prompt_token_ids``, ``token_ids``, ``versions``, per-token ``logprobs`` as floats, and any non-OpenAI
top-level key) are passed through.

A session's next request repeats its history: with the session's `ConversionMemo`, only the messages its
last request did not have are converted (the others reuse their conversion, recognised by ``==``).

Not supported: images and documents, ``redacted_thinking`` blocks (sao never sends them), server tools.
Ignored: ``tool_choice`` (the model decides), ``thinking`` (the model's template decides), ``metadata``
and unknown top-level fields. A malformed body raises `AnthropicRequestError` naming the path, e.g.
``messages.2.content.0: unknown content block type 'image'``.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .openai_api import ChatRequest, common_prefix, sao_extras

__all__ = ["AnthropicRequestError", "ConversionMemo", "MessagesRequest", "thinking_block", "to_chat_request",
           "to_messages_response"]  # fmt: skip

_SAMPLING = ("model", "temperature", "top_p", "top_k", "seed", "stream", "session_id", "group_id", "task_id")


class AnthropicRequestError(ValueError):
    """A Messages API body sao cannot convert; the message starts with the offending path."""


class MessagesRequest(BaseModel):
    """A ``POST /v1/messages`` body. ``tool_choice`` is accepted and ignored."""

    model_config = ConfigDict(extra="allow")  # Anthropic clients send fields we do not use
    model: str | None = None
    max_tokens: int = Field(ge=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=1)
    stop_sequences: list[str] | None = None
    seed: int | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None
    session_id: str | None = None
    group_id: str | None = None
    task_id: str | None = None
    tool_choice: Any = None


def _text(blocks: Any, path: str) -> str:
    """A string, or a list of ``text`` blocks joined with ``"\\n"``."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise AnthropicRequestError(f"{path}: expected a string or a list of text blocks")
    parts = []
    for i, block in enumerate(blocks):
        kind = _block_type(block, f"{path}.{i}")
        if kind != "text":
            raise AnthropicRequestError(f"{path}.{i}: expected a text block, got {kind!r}")
        parts.append(_block_text(block, f"{path}.{i}"))
    return "\n".join(parts)


def _block_type(block: Any, path: str) -> str:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise AnthropicRequestError(f"{path}: expected a content block (an object with a 'type')")
    if block["type"] == "redacted_thinking":
        raise AnthropicRequestError(
            f"{path}: redacted_thinking blocks are not supported (sao never sends them)"
        )
    return block["type"]


def _block_text(block: dict[str, Any], path: str) -> str:
    if not isinstance(block.get("text"), str):
        raise AnthropicRequestError(f"{path}: a text block needs a string 'text'")
    return block["text"]


def _name(block: dict[str, Any], key: str, path: str) -> str:
    value = block.get(key)
    if not isinstance(value, str) or not value:
        raise AnthropicRequestError(f"{path}: needs a non-empty string {key!r}")
    return value


def _tool_result(block: dict[str, Any], path: str) -> dict[str, Any]:
    call_id = _name(block, "tool_use_id", path)
    content = block.get("content")
    text = "" if content is None else _text(content, f"{path}.content")
    if block.get("is_error") and not text.lower().startswith("error:"):
        text = f"error: {text}" if text else "error"
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _user(content: Any, path: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out: list[dict[str, Any]] = []
    texts: list[str] = []  # the pending run of consecutive text blocks
    for i, block in enumerate(content):
        where = f"{path}.{i}"
        kind = _block_type(block, where)
        if kind == "text":
            texts.append(_block_text(block, where))
        elif kind == "tool_result":
            if texts:
                out.append({"role": "user", "content": "\n".join(texts)})
                texts = []
            out.append(_tool_result(block, where))
        elif kind in ("tool_use", "thinking"):
            raise AnthropicRequestError(f"{where}: a {kind} block belongs in an assistant message")
        else:
            raise AnthropicRequestError(f"{where}: unknown content block type {kind!r}")
    if texts:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _assistant(content: Any, path: str) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, block in enumerate(content):
        where = f"{path}.{i}"
        kind = _block_type(block, where)
        if kind == "text":
            texts.append(_block_text(block, where))
        elif kind == "thinking":
            if not isinstance(block.get("thinking"), str):
                raise AnthropicRequestError(f"{where}: a thinking block needs a string 'thinking'")
            thoughts.append(block["thinking"])
        elif kind == "tool_use":
            call_id, name = _name(block, "id", where), _name(block, "name", where)
            args = block.get("input", {})
            if not isinstance(args, dict):
                raise AnthropicRequestError(f"{where}.input: a tool_use input must be an object")
            fn = {"name": name, "arguments": json.dumps(args)}
            calls.append({"id": call_id, "type": "function", "function": fn})
        elif kind == "tool_result":
            raise AnthropicRequestError(f"{where}: a tool_result block belongs in a user message")
        else:
            raise AnthropicRequestError(f"{where}: unknown content block type {kind!r}")
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) if texts else None}
    if thoughts:
        message["reasoning_content"] = "\n".join(thoughts)
    if calls:
        message["tool_calls"] = calls
    return message


def _tool(tool: dict[str, Any], path: str) -> dict[str, Any]:
    if tool.get("type") not in (None, "custom"):
        raise AnthropicRequestError(f"{path}: server tools ({tool['type']!r}) are not supported")
    name = _name(tool, "name", path)
    schema = tool.get("input_schema")
    if not isinstance(schema, dict):
        raise AnthropicRequestError(f"{path}.input_schema: must be an object (a JSON schema)")
    fn: dict[str, Any] = {"name": name}
    if tool.get("description") is not None:
        fn["description"] = tool["description"]
    fn["parameters"] = schema
    return {"type": "function", "function": fn}


@dataclass
class ConversionMemo:
    """What `to_chat_request` remembers of a session's last request, so the next one (which repeats its
    history and adds k messages) converts only its k new messages: ``sent``, its messages as parsed
    (a repeated one is recognised by ``==``); ``converted[i]``, the OpenAI messages ``sent[i]`` became
    (the request's own objects, passed on as they are, which `sao.serve.openai_api.MessageMemo` then
    recognises by identity)."""

    sent: list[dict[str, Any]] = field(default_factory=list)
    converted: list[list[Any]] = field(default_factory=list)

    def known(self, messages: list[dict[str, Any]]) -> int:
        """How many leading ``messages`` equal the remembered ones."""
        return common_prefix(messages, self.sent)


def to_chat_request(req: MessagesRequest, memo: ConversionMemo | None = None) -> ChatRequest:
    """The OpenAI `ChatRequest` equivalent to ``req``, carrying only the fields the client set.

    With ``memo`` (the session's), the leading messages equal to its last request's reuse their
    conversion and only the rest are converted; the memo then holds this request (unless it raised).
    Raises `AnthropicRequestError` (naming the path) for a shape sao does not convert.
    """
    messages: list[Any] = []
    if req.system is not None:
        messages.append({"role": "system", "content": _text(req.system, "system")})
    known = memo.known(req.messages) if memo is not None else 0
    reused = memo.converted[:known] if memo is not None else []
    for chunk in reused:
        messages.extend(chunk)
    spans = []  # where each new message's conversion lies in ``messages``
    for i in range(known, len(req.messages)):
        msg, path, start = req.messages[i], f"messages.{i}", len(messages)
        role, content = msg.get("role"), msg.get("content")
        if role == "system":
            raise AnthropicRequestError(
                f"{path}.role: 'system' is not a message role; put the system prompt in 'system'"
            )
        if role not in ("user", "assistant"):
            raise AnthropicRequestError(f"{path}.role: must be 'user' or 'assistant', got {role!r}")
        if not isinstance(content, (str, list)):
            raise AnthropicRequestError(f"{path}.content: expected a string or a list of content blocks")
        if not content and isinstance(content, list):
            raise AnthropicRequestError(f"{path}.content: must not be an empty list")
        if role == "user":
            messages.extend(_user(content, f"{path}.content"))
        else:
            messages.append(_assistant(content, f"{path}.content"))
        spans.append((start, len(messages)))
    fields: dict[str, Any] = {"messages": messages, "max_tokens": req.max_tokens}
    given = req.model_fields_set
    fields.update({k: getattr(req, k) for k in _SAMPLING if k in given and getattr(req, k) is not None})
    if "stop_sequences" in given and req.stop_sequences is not None:
        fields["stop"] = req.stop_sequences
    if "tools" in given and req.tools is not None:
        fields["tools"] = [_tool(t, f"tools.{i}") for i, t in enumerate(req.tools)]
    chat = ChatRequest(**fields)
    if memo is not None:
        memo.sent = list(req.messages)
        memo.converted = [*reused, *(chat.messages[start:end] for start, end in spans)]
    return chat


def thinking_block(thinking: str) -> dict[str, Any]:
    """An Anthropic ``thinking`` block; its ``signature`` is a digest of the text (never checked)."""
    signature = "sao-" + hashlib.sha256(thinking.encode()).hexdigest()[:32]
    return {"type": "thinking", "thinking": thinking, "signature": signature}


def _tool_input(arguments: str) -> dict[str, Any]:
    """An OpenAI call's ``arguments`` as an Anthropic ``input`` (a non-object is wrapped as ``arguments``)."""
    try:
        value = json.loads(arguments)
    except (TypeError, json.JSONDecodeError):
        value = arguments
    return value if isinstance(value, dict) else {"arguments": value}


def to_messages_response(chat: dict[str, Any]) -> dict[str, Any]:
    """The Anthropic message for the gateway's chat.completion ``chat``, with sao's extras passed through."""
    choice = chat["choices"][0]
    message = choice["message"]
    content: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        content.append(thinking_block(message["reasoning_content"]))
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    calls = message.get("tool_calls") or []
    for call in calls:
        fn = call["function"]
        content.append(
            {"type": "tool_use", "id": call["id"], "name": fn["name"], "input": _tool_input(fn["arguments"])}
        )
    if calls:
        stop_reason = "tool_use"
    elif choice.get("finish_reason") == "length":
        stop_reason = "max_tokens"
    else:
        stop_reason = "end_turn"
    chat_id = str(chat.get("id", ""))
    suffix = chat_id.removeprefix("chatcmpl-") if chat_id.startswith("chatcmpl-") else uuid.uuid4().hex
    usage = chat.get("usage") or {}
    out: dict[str, Any] = {
        "id": f"msg_{suffix}",
        "type": "message",
        "role": "assistant",
        "model": chat["model"],
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": usage.get("prompt_tokens", 0),
            "output_tokens": usage.get("completion_tokens", 0),
        },
    }
    for key, value in sao_extras(chat).items():  # token ids, log-probs, session_id, ...
        out.setdefault(key, value)
    return out
