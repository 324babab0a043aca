"""The OpenAI Responses API side of the gateway: ``POST /v1/responses`` bodies converted to the OpenAI
`ChatRequest` the session recorder serves, and the gateway's chat.completion converted to a response.

Requests: ``instructions`` → a first ``system`` message; ``input`` a string (one user message) or items:

- messages (``{"role", "content"}``, ``type`` ``message`` or absent): ``user``, ``assistant``, ``system``,
  ``developer`` (→ ``system``); content a string or ``input_text`` / ``output_text`` parts (joined);
- a run of assistant-side items becomes ONE assistant message, in the order the API returns them: a
  ``reasoning`` item (its ``reasoning_text`` content, else its summary texts, → ``reasoning_content``),
  an assistant message (→ ``content``), ``function_call`` items (``call_id``, ``name``, ``arguments``, a
  JSON object as text → ``tool_calls``); a reasoning item or assistant message after content or calls
  starts the next assistant message;
- ``function_call_output`` (``call_id``, ``output`` text or ``input_text`` parts) → a ``tool`` message.

``tools``: function tools (``{"type": "function", "name", "description", "parameters"}``), others are
refused naming their type. ``max_output_tokens`` → ``max_tokens``; ``temperature``, ``top_p``, sao's
``seed``, ``session_id``, ``group_id``, ``task_id`` and ``stream`` are passed when the client set them
(so the `ChatRequest`'s ``model_fields_set`` is the client's). Ignored: ``store``, ``reasoning`` (effort),
``tool_choice``, ``parallel_tool_calls``, ``include``, ``truncation``, ``metadata`` (echoed), ``user``.
``text.format`` other than plain text (structured output) is refused.

``previous_response_id`` continues a response this gateway returned in the same open session: its
conversation (the input it was given, then its reply) comes first, then this request's input. Each open
session keeps its latest `KEEP_RESPONSES` responses' conversations (`ResponsesMemo`); an unknown id, or
one without a session, is refused.

Responses: ``object: "response"``, ``output`` items: a ``reasoning`` item when the model reasoned
(``content``: one ``reasoning_text``; ``summary`` empty), a ``message`` with one ``output_text`` part
(when there is text or no call), one ``function_call`` per call (``call_id`` = the chat call id, so an
echo yields the same ``tool_calls``); ``status`` ``completed``, or ``incomplete`` when cut by
``max_output_tokens``; ``usage`` (``input_tokens``, ``output_tokens``; ``reasoning_tokens`` is not
counted: 0); sao's extras (``session_id``, ``prompt_token_ids``, ``token_ids``, ``versions``, per-token
``logprobs`` as floats) on the response.

A session's next request usually repeats its input (``store: false`` harnesses): with the session's
`ResponsesMemo`, only the items after the last unchanged one are converted (the assistant run holding
the last unchanged item is converted again, O(1) items). Malformed input raises `ResponsesRequestError`
naming the path, e.g. ``input.2: unsupported item type 'item_reference'``.
"""

from __future__ import annotations

import bisect
import json
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .openai_api import ChatMessage, ChatRequest, common_prefix, sao_extras

__all__ = ["KEEP_RESPONSES", "ResponsesMemo", "ResponsesRequest", "ResponsesRequestError",
           "responses_to_chat", "to_response"]  # fmt: skip

# Responses whose conversation an open session keeps for ``previous_response_id``.
KEEP_RESPONSES = 8
_PASSED = ("model", "temperature", "top_p", "seed", "stream", "session_id", "group_id", "task_id")
_TEXT_PARTS = ("input_text", "output_text", "text")


class ResponsesRequestError(ValueError):
    """A Responses API body sao cannot convert; the message starts with the offending path."""


class ResponsesRequest(BaseModel):
    """A ``POST /v1/responses`` body (fields sao does not use are accepted and ignored)."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    input: str | list[Any]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = None
    stream: bool = False
    previous_response_id: str | None = None
    store: bool | None = None
    text: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    session_id: str | None = None
    group_id: str | None = None
    task_id: str | None = None


@dataclass
class ResponsesMemo:
    """What an open session remembers for the Responses API: its last request's ``items`` and the chat
    messages they became (``messages``; ``starts``: (item index, message index) where each item's or
    assistant run's conversion starts), and ``conversations``: response id → the conversation it
    continues (chat messages, without the instructions), its latest `KEEP_RESPONSES`."""

    items: list[Any] = field(default_factory=list)
    messages: list[ChatMessage] = field(default_factory=list)
    starts: list[tuple[int, int]] = field(default_factory=list)
    conversations: OrderedDict[str, list[ChatMessage]] = field(default_factory=OrderedDict)

    def reusable(self, items: list[Any]) -> tuple[int, int]:
        """(items, messages) of the remembered conversion ``items`` may reuse: everything before the
        conversion holding the last item equal to the remembered one."""
        known = common_prefix(items, self.items)
        at = bisect.bisect_left(self.starts, (known, -1)) - 1
        return self.starts[at] if at >= 0 else (0, 0)

    def keep(self, response_id: str, conversation: list[ChatMessage]) -> None:
        """Remember ``conversation`` (ending with the reply) as response ``response_id``'s."""
        self.conversations[response_id] = conversation
        while len(self.conversations) > KEEP_RESPONSES:
            self.conversations.popitem(last=False)


def _text(content: Any, path: str, kinds: tuple[str, ...] = _TEXT_PARTS) -> str:
    """A string, or text parts (``input_text``/``output_text``) joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ResponsesRequestError(f"{path}: expected a string or a list of text parts")
    parts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind not in kinds or not isinstance(part.get("text"), str):
            raise ResponsesRequestError(f"{path}.{i}: only text parts are supported, not {kind!r}")
        parts.append(part["text"])
    return "".join(parts)


def _string(item: dict[str, Any], key: str, path: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise ResponsesRequestError(f"{path}: needs a non-empty string {key!r}")
    return value


def _item_kind(item: Any, path: str) -> str:
    """``message``, ``function_call``, ``function_call_output`` or ``reasoning``."""
    if not isinstance(item, dict):
        raise ResponsesRequestError(f"{path}: expected an input item (an object)")
    kind = item.get("type", "message" if "role" in item else None)
    if kind not in ("message", "function_call", "function_call_output", "reasoning"):
        raise ResponsesRequestError(f"{path}: unsupported item type {kind!r}")
    return kind


def _reasoning_text(item: dict[str, Any], path: str) -> str:
    if item.get("content"):
        return "\n".join(_text([p], f"{path}.content", ("reasoning_text",)) for p in item["content"])
    return "\n\n".join(_text([p], f"{path}.summary", ("summary_text",)) for p in item.get("summary") or ())


def _function_call(item: dict[str, Any], path: str) -> dict[str, Any]:
    call_id, name = _string(item, "call_id", path), _string(item, "name", path)
    args = item.get("arguments")
    try:
        parsed = json.loads(args) if isinstance(args, str) else None
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise ResponsesRequestError(
            f"{path}.arguments: must be a JSON object as text, got {str(args)[:200]!r}"
        )
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def _add_to_reply(reply: dict[str, Any] | None, kind: str, item: dict[str, Any], path: str) -> bool:
    """Add an assistant-side item to ``reply`` (the assistant message being assembled); False when it
    must start the next assistant message instead."""
    if reply is None:
        return False
    if kind != "function_call" and (reply["content"] is not None or reply.get("tool_calls")):
        return False
    if kind == "reasoning":
        text = _reasoning_text(item, path)
        if text:
            before = reply.get("reasoning_content")
            reply["reasoning_content"] = text if before is None else f"{before}\n{text}"
    elif kind == "message":
        reply["content"] = _text(item.get("content"), f"{path}.content")
    else:
        reply.setdefault("tool_calls", []).append(_function_call(item, path))
    return True


def _other(kind: str, item: dict[str, Any], path: str) -> dict[str, Any]:
    """The chat message of a user/system/developer message or a function call's output."""
    if kind == "function_call_output":
        output = _text(item.get("output"), f"{path}.output")
        return {"role": "tool", "tool_call_id": _string(item, "call_id", path), "content": output}
    role = item.get("role")
    if role not in ("user", "system", "developer"):
        raise ResponsesRequestError(
            f"{path}.role: must be user, assistant, system or developer, got {role!r}"
        )
    return {
        "role": "system" if role == "developer" else role,
        "content": _text(item.get("content"), f"{path}.content"),
    }


def _convert(items: list[Any], first: int, offset: int) -> tuple[list[dict[str, Any]], list[tuple[int, int]]]:
    """The chat messages of ``items[first:]`` and where each conversion starts (item index, message index
    counted from ``offset``)."""
    messages: list[dict[str, Any]] = []
    starts: list[tuple[int, int]] = []
    reply: dict[str, Any] | None = None  # the assistant message being assembled
    for i in range(first, len(items)):
        path = f"input.{i}"
        kind = _item_kind(items[i], path)
        assistant_side = kind in ("reasoning", "function_call") or items[i].get("role") == "assistant"
        if assistant_side and _add_to_reply(reply, kind, items[i], path):
            continue
        starts.append((i, offset + len(messages)))
        if assistant_side:
            reply = {"role": "assistant", "content": None}
            _add_to_reply(reply, kind, items[i], path)
            messages.append(reply)
        else:
            reply = None
            messages.append(_other(kind, items[i], path))
    return messages, starts


def _tool(tool: Any, path: str) -> dict[str, Any]:
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind != "function":
        raise ResponsesRequestError(f"{path}: only function tools are supported, not {kind!r}")
    fn = {"name": _string(tool, "name", path), "parameters": tool.get("parameters") or {"type": "object"}}
    if tool.get("description") is not None:
        fn["description"] = tool["description"]
    return {"type": "function", "function": fn}


def responses_to_chat(
    req: ResponsesRequest, memo: ResponsesMemo | None
) -> tuple[ChatRequest, list[ChatMessage]]:
    """The `ChatRequest` equivalent to ``req`` and the conversation it continues (its messages without the
    instructions: what `ResponsesMemo.keep` stores once the reply is known). ``memo`` is the session's
    (None: no open session). Raises `ResponsesRequestError` naming the path."""
    fmt = (req.text or {}).get("format") or {"type": "text"}
    if fmt.get("type") != "text":
        raise ResponsesRequestError(f"text.format: only plain text is supported, not {fmt.get('type')!r}")
    base: list[ChatMessage] = []
    if req.previous_response_id is not None:
        found = memo.conversations.get(req.previous_response_id) if memo is not None else None
        if found is None:
            raise ResponsesRequestError(
                f"previous_response_id: {req.previous_response_id!r} is not one of the latest "
                f"{KEEP_RESPONSES} responses of this open session (name the session with X-Session-Id or "
                "session_id)"
            )
        base = found
    items = [{"role": "user", "content": req.input}] if isinstance(req.input, str) else req.input
    first, reused = memo.reusable(items) if memo is not None else (0, 0)
    messages, starts = _convert(items, first, reused)
    head: list[Any] = [] if req.instructions is None else [{"role": "system", "content": req.instructions}]
    old = memo.messages[:reused] if memo is not None else []
    fields: dict[str, Any] = {"messages": [*head, *base, *old, *messages]}
    given = req.model_fields_set
    fields.update({k: getattr(req, k) for k in _PASSED if k in given and getattr(req, k) is not None})
    if req.max_output_tokens is not None:
        fields["max_tokens"] = req.max_output_tokens
    if req.tools:
        fields["tools"] = [_tool(t, f"tools.{i}") for i, t in enumerate(req.tools)]
    chat = ChatRequest(**fields)
    converted = chat.messages[len(head) + len(base) :]
    if memo is not None:
        memo.items, memo.messages = list(items), converted
        memo.starts = [*(s for s in memo.starts if s[0] < first), *starts]
    return chat, [*base, *converted]


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _output(message: dict[str, Any], status: str) -> list[dict[str, Any]]:
    """The output items of an assistant message: reasoning, text, function calls (the last one has
    ``status``: ``incomplete`` when the output was cut)."""
    out: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        part = {"type": "reasoning_text", "text": message["reasoning_content"]}
        out.append(
            {
                "type": "reasoning",
                "id": _new_id("rs"),
                "summary": [],
                "content": [part],
                "status": "completed",
            }
        )
    calls = message.get("tool_calls") or []
    if message.get("content") or not calls:
        part = {
            "type": "output_text",
            "text": message.get("content") or "",
            "annotations": [],
            "logprobs": [],
        }
        item = {
            "type": "message",
            "id": _new_id("msg"),
            "role": "assistant",
            "status": "completed",
            "content": [part],
        }
        out.append(item)
    for call in calls:
        fn = call["function"]
        out.append(
            {"type": "function_call", "id": _new_id("fc"), "call_id": call["id"], "name": fn["name"],
             "arguments": fn["arguments"], "status": "completed"}
        )  # fmt: skip
    out[-1]["status"] = status
    return out


def to_response(chat: dict[str, Any], req: ResponsesRequest) -> dict[str, Any]:
    """The ``response`` object for the gateway's chat.completion ``chat`` of request ``req``, with sao's
    extras."""
    choice = chat["choices"][0]
    cut = choice.get("finish_reason") == "length"
    usage = chat.get("usage") or {}
    used_in, used_out = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    out: dict[str, Any] = {
        "id": _new_id("resp"), "object": "response", "created_at": chat["created"], "model": chat["model"],
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None, "error": None,
        "instructions": req.instructions, "metadata": req.metadata or {},
        "output": _output(choice["message"], "incomplete" if cut else "completed"),
        "parallel_tool_calls": True, "tool_choice": req.tool_choice or "auto", "tools": req.tools or [],
        "temperature": req.temperature, "top_p": req.top_p, "max_output_tokens": req.max_output_tokens,
        "previous_response_id": req.previous_response_id, "text": {"format": {"type": "text"}},
        "usage": {
            "input_tokens": used_in, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": used_out,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": used_in + used_out,
        },
    }  # fmt: skip
    for key, value in sao_extras(chat).items():  # token ids, log-probs, session_id, ...
        out.setdefault(key, value)
    return out
