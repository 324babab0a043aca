"""Server-sent events (SSE) for the gateway's three APIs, from a finished reply.

The engine returns whole generations, so a streamed request is validated, generated and recorded exactly
as the same request without ``stream`` (every refusal is an HTTP status before the stream starts); the
finished body is then sent as the API's event stream, the text split into several deltas (`text_pieces`:
a word with the whitespace before it). sao's extras ride on the stream so a client can check it:

- Chat Completions (`chat_events`): ``chat.completion.chunk`` objects, ``data: {...}`` lines, then
  ``data: [DONE]``. Per choice: a first delta with the role, ``reasoning_content`` deltas, ``content``
  deltas, each tool call as ``delta.tool_calls`` chunks (index, id and name first, then its arguments in
  pieces), and a last chunk with ``finish_reason`` that carries the choice's ``logprobs`` (every token),
  ``token_ids`` and ``versions``. Every chunk carries ``session_id``; the stream's last choice chunk also
  ``prompt_token_ids`` (and ``session_closed`` when the gateway closed the session). With
  ``stream_options.include_usage`` every chunk has ``usage: null`` and a last chunk with no choices
  carries the usage.
- Anthropic Messages (`message_events`): ``message_start`` (the message without content, with sao's
  extras: ``session_id``, ``prompt_token_ids``, ``token_ids``, ``versions``, ``logprobs``), per block
  ``content_block_start`` / ``content_block_delta`` (``thinking_delta`` then ``signature_delta``,
  ``text_delta``, ``input_json_delta``) / ``content_block_stop``, ``message_delta`` (``stop_reason``,
  output tokens), ``message_stop``.
- Responses (`response_events`): ``response.created``, ``response.in_progress``, per output item
  ``response.output_item.added`` ... ``response.output_item.done`` (a reasoning item's text as
  ``response.reasoning_text.delta``, a message's as ``response.output_text.delta`` inside its content part,
  a function call's arguments as ``response.function_call_arguments.delta``), then ``response.completed``
  (``response.incomplete`` when the output was cut by ``max_output_tokens``) with the whole response and
  its extras; every event has a ``sequence_number``.

Owns: the event shapes. Does not own: generation, recording, the non-streamed bodies.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

from fastapi.responses import StreamingResponse

__all__ = ["chat_events", "message_events", "response_events", "sse_response", "text_pieces"]

_PIECE = re.compile(r"\s*\S+|\s+")
# chat.completion keys with a chunk counterpart; any other top-level key is sao's (sent on the last chunk)
_CHAT_KEYS = frozenset({"id", "object", "created", "model", "choices", "usage", "session_id"})


def text_pieces(text: str) -> list[str]:
    """``text`` as stream deltas: each word with the whitespace before it (``"".join`` gives ``text``)."""
    return _PIECE.findall(text)


def sse_response(events: Iterable[str]) -> StreamingResponse:
    """An SSE response of already encoded ``events``."""
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(iter(events), media_type="text/event-stream", headers=headers)


def _data(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _event(obj: dict[str, Any]) -> str:
    return f"event: {obj['type']}\ndata: {json.dumps(obj, ensure_ascii=False)}\n\n"


# ---- Chat Completions -------------------------------------------------------------------------------


def chat_events(out: dict[str, Any], include_usage: bool = False) -> Iterator[str]:
    """The chunk stream of the chat.completion ``out`` (see the module docstring)."""
    head = {k: out[k] for k in ("id", "created", "model")}
    head.update(object="chat.completion.chunk", session_id=out.get("session_id"))
    if include_usage:
        head["usage"] = None
    extras = {k: v for k, v in out.items() if k not in _CHAT_KEYS}
    last = len(out["choices"]) - 1
    for n, choice in enumerate(out["choices"]):
        for delta in _choice_deltas(choice["message"]):
            yield _data(
                {**head, "choices": [{"index": choice["index"], "delta": delta, "finish_reason": None}]}
            )
        final = {"index": choice["index"], "delta": {}, "finish_reason": choice["finish_reason"]}
        final.update({k: choice[k] for k in ("logprobs", "token_ids", "versions") if k in choice})
        yield _data({**head, "choices": [final], **(extras if n == last else {})})
    if include_usage:
        yield _data({**head, "choices": [], "usage": out["usage"]})
    yield "data: [DONE]\n\n"


def _choice_deltas(message: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The deltas of one assistant message: role, reasoning, content, then each tool call."""
    content = message.get("content")
    yield {"role": "assistant", "content": None if content is None else ""}
    for piece in text_pieces(message.get("reasoning_content") or ""):
        yield {"reasoning_content": piece}
    for piece in text_pieces(content or ""):
        yield {"content": piece}
    for k, call in enumerate(message.get("tool_calls") or ()):
        fn = call["function"]
        opening = {"name": fn["name"], "arguments": ""}
        yield {"tool_calls": [{"index": k, "id": call["id"], "type": "function", "function": opening}]}
        for piece in text_pieces(fn["arguments"]):
            yield {"tool_calls": [{"index": k, "function": {"arguments": piece}}]}


# ---- Anthropic Messages -----------------------------------------------------------------------------


def message_events(message: dict[str, Any]) -> Iterator[str]:
    """The Anthropic event stream of the Messages API ``message`` (see the module docstring)."""
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {"input_tokens": usage["input_tokens"], "output_tokens": 0}
    yield _event({"type": "message_start", "message": start})
    for index, block in enumerate(message["content"]):
        yield from _block_events(index, block)
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    yield _event(
        {"type": "message_delta", "delta": delta, "usage": {"output_tokens": usage["output_tokens"]}}
    )
    yield _event({"type": "message_stop"})


def _block_events(index: int, block: dict[str, Any]) -> Iterator[str]:
    kind = block["type"]
    if kind == "thinking":
        opening = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [{"type": "thinking_delta", "thinking": p} for p in text_pieces(block["thinking"])]
        deltas.append({"type": "signature_delta", "signature": block["signature"]})
    elif kind == "text":
        opening = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": p} for p in text_pieces(block["text"])]
    else:  # tool_use
        opening = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        pieces = text_pieces(json.dumps(block["input"], ensure_ascii=False))
        deltas = [{"type": "input_json_delta", "partial_json": p} for p in pieces]
    yield _event({"type": "content_block_start", "index": index, "content_block": opening})
    for delta in deltas:
        yield _event({"type": "content_block_delta", "index": index, "delta": delta})
    yield _event({"type": "content_block_stop", "index": index})


# ---- Responses --------------------------------------------------------------------------------------


def response_events(response: dict[str, Any]) -> Iterator[str]:
    """The Responses API event stream of the ``response`` object (see the module docstring)."""
    seq = itertools.count()

    def event(kind: str, **fields: Any) -> str:
        return _event({"type": kind, "sequence_number": next(seq), **fields})

    opening = {**response, "status": "in_progress", "incomplete_details": None, "output": [], "usage": None}
    yield event("response.created", response=opening)
    yield event("response.in_progress", response=opening)
    for index, item in enumerate(response["output"]):
        for kind, fields in _item_events(index, item):
            yield event(kind, **fields)
    done = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    yield event(done, response=response)


def _item_events(index: int, item: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event type, fields) of one output item, from ``output_item.added`` to ``output_item.done``."""
    at = {"item_id": item["id"], "output_index": index}
    kind = item["type"]
    opening = {**item, "status": "in_progress"}
    if kind == "function_call":
        yield "response.output_item.added", {"output_index": index, "item": {**opening, "arguments": ""}}
        for piece in text_pieces(item["arguments"]):
            yield "response.function_call_arguments.delta", {**at, "delta": piece}
        done = {"name": item["name"], "arguments": item["arguments"]}
        yield "response.function_call_arguments.done", {**at, **done}
    else:  # a message (output_text parts) or reasoning (reasoning_text parts)
        parts = item["content"]
        yield "response.output_item.added", {"output_index": index, "item": {**opening, "content": []}}
        for k, part in enumerate(parts):
            yield from _part_events(at, k, part)
    yield "response.output_item.done", {"output_index": index, "item": item}


def _part_events(at: dict[str, Any], k: int, part: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    text_kind = "output_text" if part["type"] == "output_text" else "reasoning_text"
    extra = {"logprobs": []} if text_kind == "output_text" else {}
    where = {**at, "content_index": k}
    yield "response.content_part.added", {**where, "part": {**part, "text": ""}}
    for piece in text_pieces(part["text"]):
        yield f"response.{text_kind}.delta", {**where, "delta": piece, **extra}
    yield f"response.{text_kind}.done", {**where, "text": part["text"], **extra}
    yield "response.content_part.done", {**where, "part": part}
