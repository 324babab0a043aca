"""The client side of a streaming model server's HTTP API, as the vLLM and SGLang adapters share it.

Request checks (`checked_prompt`), server-sent-event lines (`parse_sse_line`, `SSE_DONE`), error bodies
(`error_message`, `ServerError`) and what one stream chunk adds (`TokenDelta`). No I/O here: `HTTPEngine`
(`sao.engine.http_client`) does the requests.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sao.engine.types import FinishReason, InvalidRequestError, SamplingParams

__all__ = ["SSE_DONE", "ServerError", "TokenDelta", "checked_prompt", "error_message", "parse_sse_line"]

SSE_DONE = object()  # what `parse_sse_line` returns for ``data: [DONE]``


def checked_prompt(
    prompt_token_ids: Sequence[int], params: SamplingParams, max_model_len: int | None
) -> tuple[list[int], int]:
    """``(prompt, max_new_tokens)`` of a request to a server: ``params.max_new_tokens`` capped by the context
    left after the prompt when ``max_model_len`` is known. Raises `InvalidRequestError` for invalid params,
    an empty prompt, a non-integer or negative token id, or a prompt that leaves no room for one new token."""
    params.validate()
    prompt = list(prompt_token_ids)
    if not prompt:
        raise InvalidRequestError("prompt_token_ids is empty")
    if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in prompt):
        raise InvalidRequestError("prompt_token_ids must be non-negative ints")
    if max_model_len is None:
        return prompt, params.max_new_tokens
    room = max_model_len - len(prompt)
    if room < 1:
        raise InvalidRequestError(
            f"prompt has {len(prompt)} tokens; the server's context limit {max_model_len} leaves no room"
        )
    return prompt, min(params.max_new_tokens, room)


def parse_sse_line(line: str) -> Any:
    """One line of a server-sent-event stream: the decoded JSON of a ``data:`` line, `SSE_DONE` for
    ``data: [DONE]``, None for anything else (blank lines, comments, other fields)."""
    if not line.startswith("data:"):
        return None
    payload = line[len("data:") :].strip()
    if payload == "[DONE]":
        return SSE_DONE
    return json.loads(payload)


def error_message(body: str) -> str:
    """The ``message`` (or ``detail``) of a JSON error body, else the body itself (truncated)."""
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        err = json.loads(body)
        err = err.get("error", err)
        if isinstance(err, Mapping):
            for key in ("message", "detail"):
                if key in err:
                    return str(err[key])
    return body[:500]


class ServerError(RuntimeError):
    """A server answered an adapter's control call (pause, load, resume, ...) with an HTTP error."""

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


@dataclass(frozen=True)
class TokenDelta:
    """What one stream chunk adds: new token ids with their log-probs, and the finish (``finish_reason``
    None while running; ``stop_reason`` the matched stop token id or string; ``server_version`` the weight
    version the server reports, if any). An error chunk has ``finish_reason="error"``, the message in
    ``error``, and ``invalid_request`` if the server blamed the request."""

    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    error: str | None = None
    invalid_request: bool = False
    server_version: str | None = None
