"""The gateway's resource limits: their settings, the request-body cap, the in-flight gate, the token cap.

Every limit answers a request it cannot serve with a status and a reason (an OpenAI-style error body) and
leaves every other request and session as it was:

- body size: ``413`` before the body is parsed, Content-Length or chunked (`BodySizeLimit`);
- generation requests in flight through the gateway: ``503`` with ``Retry-After`` beyond ``max_pending``
  (`PendingGate`);
- open sessions: ``429`` with ``Retry-After`` for a *new* session beyond ``max_sessions``
  (`sao.serve.registry`);
- context: ``max_tokens`` is capped by the context left after the prompt; a prompt that leaves no room
  gets ``400`` (`cap_max_tokens`).

Every refusal, of a limit or of a malformed request, reaches the client as an OpenAI error body
(`error_body`, `add_error_handlers`).

Owns: these checks and the shape of error answers. Does not own: sessions, generation, routing.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "BodySizeLimit",
    "GatewayLimits",
    "LimitExceededError",
    "PendingGate",
    "add_error_handlers",
    "cap_max_tokens",
    "engine_context_limit",
    "error_body",
]


@dataclass(frozen=True)
class GatewayLimits:
    """The gateway's bounds (see the module docstring for what exceeding each one returns).

    ``max_sessions``: open (recorded, not yet rewarded) sessions. ``session_idle_timeout_s``: seconds
    without a request after which a session without a reward is closed as abandoned (never emitted).
    ``max_body_bytes``: request body bytes. ``max_pending``: generation requests (chat and completions)
    in flight through the gateway at once, queued in the engine or running. ``retry_after_s``: the
    ``Retry-After`` seconds sent with 429 and 503. ``max_context_tokens``: prompt + generated tokens of
    one request (None: the engine's own limit, if it reports one).
    """

    max_sessions: int = 4096
    session_idle_timeout_s: float = 1800.0
    max_body_bytes: int = 8 * 2**20
    max_pending: int = 256
    retry_after_s: int = 1
    max_context_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_sessions", "max_body_bytes", "max_pending"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not self.session_idle_timeout_s > 0:
            raise ValueError(f"session_idle_timeout_s must be > 0, got {self.session_idle_timeout_s!r}")
        if isinstance(self.retry_after_s, bool) or not isinstance(self.retry_after_s, int):
            raise ValueError(f"retry_after_s must be an int, got {self.retry_after_s!r}")
        if self.retry_after_s < 0:
            raise ValueError(f"retry_after_s must be >= 0, got {self.retry_after_s}")
        if self.max_context_tokens is not None and self.max_context_tokens < 2:
            raise ValueError(f"max_context_tokens must be >= 2 or None, got {self.max_context_tokens}")


class LimitExceededError(Exception):
    """A request over one of the limits: ``status`` (413, 429, 503, 400), ``reason`` (the error message),
    ``kind`` (the OpenAI-style error type) and ``retry_after_s`` (sent as ``Retry-After``; None: none)."""

    def __init__(self, status: int, reason: str, kind: str, retry_after_s: int | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.kind = kind
        self.retry_after_s = retry_after_s

    @property
    def headers(self) -> dict[str, str]:
        return {} if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}


def error_body(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    """The OpenAI error schema: ``{"error": {"message", "type", "code"}}``."""
    return {"error": {"message": message, "type": kind, "code": None}}


def add_error_handlers(app: FastAPI) -> None:
    """Answer errors with `error_body`: a body that fails validation gets 400 naming each field
    (``messages.0.role: ...``), an `HTTPException` its status, detail and headers, a `LimitExceededError`
    its status, reason, kind and ``Retry-After``."""

    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        details = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:])}: {e['msg']}" for e in exc.errors())
        return JSONResponse(status_code=400, content=error_body(details))

    async def http(_: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse(status_code=exc.status_code, content=error_body(exc.detail), headers=exc.headers)

    async def limit(_: Request, exc: LimitExceededError) -> JSONResponse:
        return JSONResponse(
            status_code=exc.status, content=error_body(exc.reason, exc.kind), headers=exc.headers
        )

    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http)
    app.add_exception_handler(LimitExceededError, limit)


class BodySizeLimit:
    """ASGI middleware: answer 413 to an HTTP request whose body exceeds ``max_bytes``, before the app sees
    (or parses) any of it.

    A declared ``Content-Length`` over the limit is refused without reading the body; otherwise the body is
    read chunk by chunk (chunked transfer encoding included) and refused as soon as the running total passes
    the limit, so at most ``max_bytes`` plus one chunk is ever held. A body within the limit is handed to the
    app unchanged, as one message. ``on_reject`` (optional) is called once per refused request.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, on_reject: Callable[[], None] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.on_reject = on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(send, f"declares {int(declared)} bytes")
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before its body arrived: nobody to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._reject(send, f"exceeds it (more than {size} bytes read)")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # after the body: wait for the disconnect, as the server would

        await self.app(scope, replay, send)

    async def _reject(self, send: Send, what: str) -> None:
        if self.on_reject is not None:
            self.on_reject()
        body = json.dumps(
            error_body(
                f"request body too large: the limit is {self.max_bytes} bytes and this request {what}",
                "request_too_large",
            )
        ).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        # Connection: close, since the rest of an unread body would otherwise be parsed as the next request.
        headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class PendingGate:
    """At most ``limit`` generation requests in flight at once; the next one is refused at once (503 with
    ``Retry-After``) instead of queueing without bound. One event loop only (no locking needed).

    ``in_flight``: requests holding a slot now; ``rejected``: requests refused so far.
    """

    def __init__(self, limit: int, retry_after_s: int) -> None:
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.in_flight = 0
        self.rejected = 0

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        """Hold one slot for the ``with`` block; raises `LimitExceededError` (503) when all are taken."""
        if self.in_flight >= self.limit:
            self.rejected += 1
            raise LimitExceededError(
                503,
                f"the gateway is at its limit of {self.limit} generation requests in flight "
                f"(max_pending); retry after {self.retry_after_s} s",
                "overloaded",
                self.retry_after_s,
            )
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1


def engine_context_limit(engine: Any) -> int | None:
    """The engine's context limit in tokens (prompt + generated) if it reports one: ``context_limit``
    (LocalEngine, ProcessEngine) or ``max_model_len`` (the vLLM and SGLang adapters); else None."""
    for name in ("context_limit", "max_model_len"):
        value = getattr(engine, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def cap_max_tokens(requested: int, prompt_tokens: int, context: int | None) -> int:
    """``requested`` new tokens capped by ``context - prompt_tokens`` (no cap when ``context`` is None);
    raises `LimitExceededError` (400) when the prompt leaves no room for one new token."""
    if context is None:
        return requested
    room = context - prompt_tokens
    if room < 1:
        raise LimitExceededError(
            400,
            f"the prompt has {prompt_tokens} tokens and fills the context of {context} tokens: "
            "no room to generate (shorten the conversation or start a new session)",
            "context_length_exceeded",
        )
    return min(requested, room)
