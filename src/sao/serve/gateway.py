"""OpenAI-compatible HTTP gateway in front of any `InferenceEngine`, recording sessions as trajectories.

Any agent written against the OpenAI SDK gets trained by pointing it at this server: each request names
its session (``X-Session-Id`` header, or a ``session_id`` field in the body, e.g. the SDK's
``extra_body``), the gateway records the session token-in/token-out (`sao.serve.sessions`), and
``POST /v1/sessions/{id}/reward`` attaches the outcome, closes the session and emits its trajectories.

Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/messages`` (the Anthropic
Messages API on the same recorder, `sao.serve.anthropic_api`), ``POST /v1/completions``,
``POST /v1/sessions/{id}/reward``, ``GET /v1/sessions``, ``GET /v1/stats``. Responses follow the OpenAI
schema and add ``token_ids``, ``versions`` and per-token log-probs (request and response shapes:
`sao.serve.openai_api`). Malformed requests get a 4xx with a reason and record nothing. Resources are
bounded (`sao.serve.limits`, `sao.serve.registry`): open sessions (429), idle sessions (dropped as
abandoned, never emitted), body size (413), requests in flight (503), the context (``max_tokens`` capped,
a full prompt 400); 429 and 503 carry ``Retry-After``. A training run passes its `SessionHooks`
(admission under the staleness rule, the trainer's queue), `SessionRules` (token budget, turn limit, fixed
sampling) and a verifier (`sao.serve.hooks`); the per-session logic is `sao.serve.turns`.

A request that extends its session by k messages costs O(k) in conversion, checks, rendering and
tokenizing: the open session keeps what its last request became (`MessageMemo`, `ConversionMemo` in
``ChatSession.request_memos``) and its recorded tokens (`sao.serve.sessions`); what grows with the history
is the JSON the client sends (parsed once), one ``==`` per earlier message, and ``prompt_token_ids`` in the
response.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Header, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from sao.engine.types import (
    EngineCrashedError,
    Generation,
    InferenceEngine,
    InvalidRequestError,
    SamplingParams,
)
from sao.models.chat_delta import end_of_turn_token
from sao.types import Trajectory

from .anthropic_api import (
    AnthropicRequestError,
    ConversionMemo,
    MessagesRequest,
    to_chat_request,
    to_messages_response,
)
from .hooks import RecordingHooks, SessionHooks, SessionRules, Verifier
from .limits import (
    BodySizeLimit,
    GatewayLimits,
    LimitExceededError,
    PendingGate,
    cap_max_tokens,
    engine_context_limit,
    error_body,
)
from .openai_api import (
    ChatRequest,
    CompletionRequest,
    MessageMemo,
    RewardRequest,
    logprobs_content,
    normalize_messages,
    sampling_params,
    split_tool_calls,
)
from .registry import SessionRegistry
from .sessions import ChatSession
from .turns import SessionTurns

__all__ = ["create_app"]

# Finished trajectories kept in ``app.state.finished`` for inspection (the sinks are on_trajectory and
# output_path): the most recent ones only, so a long-running gateway's memory stays bounded.
_KEEP_FINISHED = 10_000


def create_app(
    engine: InferenceEngine,
    tokenizer: Any,
    *,
    model_name: str = "sao",
    default_max_tokens: int = 1024,
    on_trajectory: Callable[[Trajectory], None] | None = None,
    output_path: str | Path | None = None,
    own_engine: bool = False,
    max_sessions: int = GatewayLimits.max_sessions,
    session_idle_timeout_s: float = GatewayLimits.session_idle_timeout_s,
    max_body_bytes: int = GatewayLimits.max_body_bytes,
    max_pending: int = GatewayLimits.max_pending,
    retry_after_s: int = GatewayLimits.retry_after_s,
    max_context_tokens: int | None = GatewayLimits.max_context_tokens,
    hooks: SessionHooks | None = None,
    rules: SessionRules | None = None,
    verifier: Verifier | None = None,
) -> FastAPI:
    """Build the gateway app.

    Args:
        engine: any `InferenceEngine` (LocalEngine, vLLM, SGLang, a Ray engine pool).
        tokenizer: the model's tokenizer (chat template, decoding).
        default_max_tokens: ``max_tokens`` of a request that gives none (capped by the context like any).
        on_trajectory: called with each finished trajectory (``sao serve``; ignored when ``hooks`` is given).
        output_path: also append finished trajectories to this JSONL file.
        own_engine: close the engine (and a server it launched) when the app shuts down.
        max_sessions: open sessions at most; a new one beyond gets 429 with ``Retry-After``.
        session_idle_timeout_s: seconds without a request after which an unrewarded session is closed as
            abandoned (counted, never emitted as a trajectory).
        max_body_bytes: request body size limit; larger bodies get 413 before they are parsed.
        max_pending: chat/completions requests in flight at once; the next gets 503 with ``Retry-After``.
        retry_after_s: the ``Retry-After`` seconds of 429 and 503 answers.
        max_context_tokens: prompt + generated tokens of one request (default: the engine's context
            limit); ``max_tokens`` is capped by what the prompt leaves, a prompt filling it gets 400.
        hooks: admission and the destination of closed sessions (default: admit all, ``on_trajectory``).
        rules: what recorded sessions must respect (default: nothing beyond the limits).
        verifier: scores a session whose reward request names only a task (default: none).

    Raises ValueError for an invalid limit.
    """
    limits = GatewayLimits(
        max_sessions=max_sessions,
        session_idle_timeout_s=session_idle_timeout_s,
        max_body_bytes=max_body_bytes,
        max_pending=max_pending,
        retry_after_s=retry_after_s,
        max_context_tokens=max_context_tokens,
    )
    rules = rules or SessionRules()
    known = [c for c in (limits.max_context_tokens, engine_context_limit(engine)) if c is not None]
    context = min(known) if known else None
    gate = PendingGate(limits.max_pending, limits.retry_after_s)
    counts = {"trajectories": 0, "rejected_too_large": 0}
    finished: deque[Trajectory] = deque(maxlen=_KEEP_FINISHED)
    end_of_turn, end_of_turn_id = end_of_turn_token(tokenizer)
    eos = [t for t in {tokenizer.eos_token_id, end_of_turn_id} if isinstance(t, int)]

    def _session(sid: str) -> ChatSession:
        return ChatSession(tokenizer, sid, end_of_turn=end_of_turn)

    async def _generate(prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        max_new = cap_max_tokens(params.max_new_tokens, len(prompt_ids), context)
        try:
            gen = await engine.generate(prompt_ids, dataclasses.replace(params, max_new_tokens=max_new))
        except InvalidRequestError as err:
            raise HTTPException(400, str(err)) from None
        except EngineCrashedError as err:  # a supervised engine is restarting: try again shortly
            retry = {"Retry-After": str(limits.retry_after_s)}
            raise HTTPException(503, f"the engine is restarting: {err}", headers=retry) from None
        if gen.finish_reason == "error":
            raise HTTPException(500, f"generation failed: {gen.error}")
        return gen

    def _emit(trajs: list[Trajectory]) -> None:
        finished.extend(trajs)
        counts["trajectories"] += len(trajs)
        if output_path is not None:
            _append_jsonl(Path(output_path), trajs)

    turns: SessionTurns
    registry = SessionRegistry(
        _session,
        max_sessions=limits.max_sessions,
        idle_timeout_s=limits.session_idle_timeout_s,
        retry_after_s=limits.retry_after_s,
        on_abandoned=lambda entry: turns.abandoned(entry),
        on_discard=lambda entry: turns.discard(entry),
    )
    turns = SessionTurns(
        registry, gate, _generate, hooks or RecordingHooks(on_trajectory), rules, verifier, _emit, model_name
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        sweeper = asyncio.create_task(_sweep_forever(registry, limits.session_idle_timeout_s))
        try:
            yield
        finally:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            if own_engine:
                await engine.close()

    app = FastAPI(title="sao gateway", lifespan=lifespan)
    app.add_middleware(
        BodySizeLimit,
        max_bytes=limits.max_body_bytes,
        on_reject=lambda: counts.__setitem__("rejected_too_large", counts["rejected_too_large"] + 1),
    )
    app.state.registry, app.state.finished, app.state.limits = registry, finished, limits

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        details = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:])}: {e['msg']}" for e in exc.errors())
        return JSONResponse(status_code=400, content=error_body(details))

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse(status_code=exc.status_code, content=error_body(exc.detail), headers=exc.headers)

    @app.exception_handler(LimitExceededError)
    async def _limit(_: Request, exc: LimitExceededError) -> JSONResponse:
        body = error_body(exc.reason, exc.kind)
        return JSONResponse(status_code=exc.status, content=body, headers=exc.headers)

    def _usage(prompt: int, gen: Generation) -> dict[str, int]:
        return {
            "prompt_tokens": prompt,
            "completion_tokens": len(gen.token_ids),
            "total_tokens": prompt + len(gen.token_ids),
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        data = {"id": model_name, "object": "model", "owned_by": "sao", "max_model_len": context}
        return {"object": "list", "data": [data]}

    def _reply(text: str, with_tools: bool) -> dict[str, Any]:
        """The assistant message of a generation: end of turn (or eos) stripped, tool calls split off when
        tools were given."""
        visible = text.removesuffix(end_of_turn).removesuffix(tokenizer.eos_token or end_of_turn)
        content, tool_calls = split_tool_calls(visible) if with_tools else (visible, None)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        return message

    def _memo(named: str | None, api: str, make: Callable[[], Any]) -> Any:
        """The open session ``named``'s memo of its last request for ``api`` (None: no such session yet)."""
        entry = registry.get(named) if named is not None else None
        if entry is None:
            return None
        memos = entry.session.request_memos
        if api not in memos:
            memos[api] = make()
        return memos[api]

    async def _chat(req: ChatRequest, named: str | None, group_id: str | None, task_id: str | None) -> dict:
        messages = normalize_messages(req.messages, _memo(named, "openai", MessageMemo))
        max_tokens = req.max_completion_tokens or req.max_tokens
        closed = None
        if named is None:  # unnamed requests (e.g. a judge) are served but not recorded, under no rules
            params = sampling_params(req, max_tokens, default_max_tokens, eos)
            session = _session(f"anon-{uuid.uuid4().hex}")
            try:
                prompt_ids = session.plan(messages, req.tools).prompt_ids
            except Exception as err:  # the template rejected the conversation: the client's input
                raise HTTPException(400, f"cannot render messages with the chat template: {err}") from None
            with gate.slot():
                gen = await _generate(prompt_ids, params)
            message = _reply(tokenizer.decode(gen.token_ids, skip_special_tokens=False), bool(req.tools))
        else:
            params = sampling_params(req, max_tokens, default_max_tokens, eos, rules)
            result = await turns.chat(
                named, messages, req.tools, params, group_id=group_id, task_id=task_id,
                reply=lambda text: _reply(text, bool(req.tools)),
            )  # fmt: skip
            prompt_ids, gen, message, closed = result.prompt_ids, result.gen, result.message, result.closed
        finish = "tool_calls" if message.get("tool_calls") else gen.finish_reason
        out: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.model or model_name,
            "session_id": named,  # None: not recorded
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": finish,
                    "logprobs": {"content": logprobs_content(tokenizer, gen)},
                    "token_ids": gen.token_ids,
                    "versions": gen.versions,
                }
            ],
            "prompt_token_ids": prompt_ids,
            "usage": _usage(len(prompt_ids), gen),
        }
        if closed is not None:
            out["session_closed"] = closed
        return out

    @app.post("/v1/chat/completions")
    async def chat(
        req: ChatRequest,
        x_session_id: str | None = Header(None),
        x_group_id: str | None = Header(None),
        x_task_id: str | None = Header(None),
    ) -> dict[str, Any]:
        named = x_session_id or req.session_id
        return await _chat(req, named, x_group_id or req.group_id, x_task_id or req.task_id)

    @app.post("/v1/messages")
    async def messages(
        req: MessagesRequest,
        x_session_id: str | None = Header(None),
        x_group_id: str | None = Header(None),
        x_task_id: str | None = Header(None),
    ) -> dict[str, Any]:
        named = x_session_id or req.session_id
        try:
            chat_req = to_chat_request(req, _memo(named, "anthropic", ConversionMemo))
        except AnthropicRequestError as err:
            raise HTTPException(400, str(err)) from None
        out = await _chat(chat_req, named, x_group_id or chat_req.group_id, x_task_id or chat_req.task_id)
        return to_messages_response(out)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest) -> dict[str, Any]:
        params = sampling_params(req, req.max_tokens, default_max_tokens, [])
        prompt_ids = (
            req.prompt
            if isinstance(req.prompt, list)
            else tokenizer(req.prompt, add_special_tokens=False)["input_ids"]
        )
        with gate.slot():
            gen = await _generate(list(prompt_ids), params)
        text = tokenizer.decode(gen.token_ids, skip_special_tokens=False)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": req.model or model_name,
            "choices": [
                {
                    "index": 0,
                    "text": text,
                    "finish_reason": gen.finish_reason,
                    "logprobs": {
                        "tokens": [tokenizer.decode([t], skip_special_tokens=False) for t in gen.token_ids],
                        "token_logprobs": gen.logprobs,
                    },
                    "token_ids": gen.token_ids,
                    "versions": gen.versions,
                }
            ],
            "prompt_token_ids": list(prompt_ids),
            "usage": _usage(len(prompt_ids), gen),
        }

    @app.post("/v1/sessions/{session_id}/reward")
    async def reward(session_id: str, req: RewardRequest) -> dict[str, Any]:
        if req.reward is not None and req.rewards is not None:
            raise HTTPException(400, "give at most one of 'reward' (outcome) and 'rewards' (per turn)")
        given = [req.reward] if req.reward is not None else req.rewards
        trajs = await turns.reward(session_id, given, req.task_id, req.metadata)
        return {
            "session_id": session_id,
            "trajectories": [
                {
                    "traj_id": t.traj_id,
                    "num_tokens": t.num_tokens,
                    "num_turns": t.num_turns,
                    "prefix_mismatch": t.metadata["prefix_mismatch"],
                    "rewards": t.rewards,
                }
                for t in trajs
            ],
        }

    @app.get("/v1/sessions")
    async def list_sessions() -> dict[str, Any]:
        registry.sweep()
        return {"open": registry.ids(), "finished": counts["trajectories"], "abandoned": registry.abandoned}

    @app.get("/v1/stats")
    async def stats() -> dict[str, Any]:
        registry.sweep()
        return {
            "sessions": registry.counters(),
            "requests": {
                "in_flight": gate.in_flight,
                "max_pending": limits.max_pending,
                "rejected_overloaded": gate.rejected,
                "rejected_too_large": counts["rejected_too_large"],
            },
            "trajectories": counts["trajectories"],
            "limits": {
                "max_body_bytes": limits.max_body_bytes,
                "retry_after_s": limits.retry_after_s,
                "max_context_tokens": context,
                "default_max_tokens": default_max_tokens,
                "max_session_tokens": rules.max_session_tokens,
                "max_turns": rules.max_turns,
            },
        }

    return app


async def _sweep_forever(registry: SessionRegistry, idle_timeout_s: float) -> None:
    """Sweep abandoned sessions every ``idle_timeout_s / 4`` seconds (between 10 ms and 60 s), so an idle
    gateway frees them too; requests sweep as well, which makes the counts exact when read."""
    interval = min(max(idle_timeout_s / 4, 0.01), 60.0)
    while True:
        await asyncio.sleep(interval)
        registry.sweep()


def _append_jsonl(path: Path, trajs: list[Trajectory]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        for traj in trajs:
            f.write(json.dumps(traj.to_dict(), ensure_ascii=False) + "\n")
