"""OpenAI-compatible HTTP gateway in front of any `InferenceEngine`, recording sessions as trajectories.

Any agent written against the OpenAI SDK gets trained by pointing it at this server: each request names
its session (``X-Session-Id`` header, or a ``session_id`` field in the body, e.g. the SDK's
``extra_body``), the gateway records the session token-in/token-out (`sao.serve.sessions`), and
``POST /v1/sessions/{id}/reward`` attaches the outcome, closes the session and emits its trajectories.

Endpoints, one `Gateway` method each (`create_app` returns a gateway's FastAPI app): ``GET /v1/models``,
``POST /v1/chat/completions``, ``POST /v1/messages`` (the Anthropic Messages API on the same recorder,
`sao.serve.anthropic_api`), ``POST /v1/responses`` (the OpenAI Responses API, `sao.serve.responses_api`),
``POST /v1/completions``, ``POST /v1/sessions/{id}/reward``, ``GET /v1/sessions``, ``GET /v1/stats``.
Responses follow the OpenAI schema and add ``token_ids``, ``versions`` and per-token log-probs (request and
response shapes: `sao.serve.openai_api`). ``stream: true`` is served as server-sent events after the turn
was generated and recorded like any other (`sao.serve.streaming`); the reply's reasoning and tool calls are
split off by the configured parsers (`sao.serve.replies`). ``n > 1`` is served for unrecorded requests
only. Malformed requests get a 4xx with a reason and record nothing. Resources are bounded
(`sao.serve.limits`, `sao.serve.registry`): open sessions (429), idle sessions (dropped as abandoned, never
emitted), body size (413), requests in flight (503), the context (``max_tokens`` capped, a full prompt 400;
`sao.serve.generation`); 429 and 503 carry ``Retry-After``. A training run passes its
`SessionHooks` (admission under the staleness rule, the trainer's queue), `SessionRules` (token budget, turn
limit, fixed sampling) and a verifier (`sao.serve.hooks`); the per-session logic is `sao.serve.turns`.

A request that extends its session by k messages costs O(k) in conversion, checks, rendering and
tokenizing: the open session keeps what its last request became (`MessageMemo`, `ConversionMemo`,
`ResponsesMemo` in ``ChatSession.request_memos``) and its recorded tokens (`sao.serve.sessions`); what grows
with the history is the JSON the client sends (parsed once), one ``==`` per earlier message, and
``prompt_token_ids`` in the response.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Header, HTTPException
from fastapi.responses import StreamingResponse

from sao.engine.types import InferenceEngine
from sao.types import Trajectory

from .anthropic_api import (
    AnthropicRequestError,
    ConversionMemo,
    MessagesRequest,
    to_chat_request,
    to_messages_response,
)
from .generation import GatewayEngine
from .hooks import RecordingHooks, SessionHooks, SessionRules, Verifier
from .limits import BodySizeLimit, GatewayLimits, PendingGate, add_error_handlers
from .openai_api import (
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    MessageMemo,
    RewardRequest,
    chat_completion,
    normalize_messages,
    reward_response,
    sampling_params,
    text_completion,
)
from .registry import SessionRegistry
from .replies import ReplyBuilder
from .responses_api import (
    ResponsesMemo,
    ResponsesRequest,
    ResponsesRequestError,
    responses_to_chat,
    to_response,
)
from .streaming import chat_events, message_events, response_events, sse_response
from .turns import SessionTurns

__all__ = ["Gateway", "create_app"]

# The latest finished trajectories kept in ``app.state.finished``, so a long-running gateway stays bounded.
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
    tool_call_format: str = "hermes",
    reasoning_parser: str | None = "think",
) -> FastAPI:
    """Build the gateway app (a `Gateway`'s ``app``).

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
        tool_call_format: how the model writes tool calls (`sao.envs.tool_formats`: hermes, qwen3_coder).
        reasoning_parser: how its reasoning is split off its text (`sao.serve.reasoning`; None: never).

    Raises ValueError for an invalid limit, an unknown tool-call format or reasoning parser.
    """
    limits = GatewayLimits(
        max_sessions=max_sessions,
        session_idle_timeout_s=session_idle_timeout_s,
        max_body_bytes=max_body_bytes,
        max_pending=max_pending,
        retry_after_s=retry_after_s,
        max_context_tokens=max_context_tokens,
    )
    hooks, rules = hooks or RecordingHooks(on_trajectory), rules or SessionRules()
    reply = ReplyBuilder(tokenizer, reasoning_parser=reasoning_parser, tool_call_format=tool_call_format)
    gateway = Gateway(engine, tokenizer, limits, hooks, rules, verifier, reply, model_name=model_name,
                      default_max_tokens=default_max_tokens, output_path=output_path,
                      own_engine=own_engine)  # fmt: skip
    return gateway.app


class Gateway:
    """One gateway: the open sessions (``registry``), their logic (``turns``), the in-flight gate and the
    FastAPI ``app`` whose routes are this object's public methods (arguments as `create_app` describes).
    ``app.state`` holds ``gateway`` (this object), ``registry``, ``finished`` (the latest trajectories) and
    ``limits``."""

    def __init__(
        self,
        engine: InferenceEngine,
        tokenizer: Any,
        limits: GatewayLimits,
        hooks: SessionHooks,
        rules: SessionRules,
        verifier: Verifier | None,
        reply: ReplyBuilder,
        *,
        model_name: str,
        default_max_tokens: int,
        output_path: str | Path | None,
        own_engine: bool,
    ) -> None:
        self.tokenizer, self.limits, self.rules = tokenizer, limits, rules
        self.model_name, self.default_max_tokens = model_name, default_max_tokens
        self.output_path = None if output_path is None else Path(output_path)
        self.own_engine, self.reply = own_engine, reply
        self.gate = PendingGate(limits.max_pending, limits.retry_after_s)
        self.engine = GatewayEngine(engine, tokenizer, limits, self.gate)
        self.finished: deque[Trajectory] = deque(maxlen=_KEEP_FINISHED)
        self.trajectories = 0  # emitted since the start
        self.rejected_too_large = 0  # bodies refused by max_body_bytes
        self.registry = SessionRegistry(
            self.engine.new_session,
            max_sessions=limits.max_sessions,
            idle_timeout_s=limits.session_idle_timeout_s,
            retry_after_s=limits.retry_after_s,
            on_abandoned=lambda entry: self.turns.abandoned(entry),
            on_discard=lambda entry: self.turns.discard(entry),
        )
        self.turns = SessionTurns(
            self.registry, self.gate, self.engine.generate, hooks, rules, verifier, self._emit, model_name
        )
        self.app = self._build_app()

    def _build_app(self) -> FastAPI:
        app = FastAPI(title="sao gateway", lifespan=self._lifespan)
        app.add_middleware(BodySizeLimit, max_bytes=self.limits.max_body_bytes, on_reject=self._too_large)
        add_error_handlers(app)
        app.get("/v1/models")(self.models)
        app.post("/v1/chat/completions", response_model=None)(self.chat)
        app.post("/v1/messages", response_model=None)(self.messages)
        app.post("/v1/responses", response_model=None)(self.responses)
        app.post("/v1/completions")(self.completions)
        app.post("/v1/sessions/{session_id}/reward")(self.reward)
        app.get("/v1/sessions")(self.list_sessions)
        app.get("/v1/stats")(self.stats)
        app.state.gateway, app.state.registry = self, self.registry
        app.state.finished, app.state.limits = self.finished, self.limits
        return app

    # ---- routes -------------------------------------------------------------------------------------

    async def models(self) -> dict[str, Any]:
        """``GET /v1/models``: the one model served, with its context length."""
        context = self.engine.context
        data = {"id": self.model_name, "object": "model", "owned_by": "sao", "max_model_len": context}
        return {"object": "list", "data": [data]}

    async def chat(
        self,
        req: ChatRequest,
        x_session_id: str | None = Header(None),
        x_group_id: str | None = Header(None),
        x_task_id: str | None = Header(None),
    ) -> dict[str, Any] | StreamingResponse:
        """``POST /v1/chat/completions``: one turn, recorded when a session is named."""
        named = x_session_id or req.session_id
        out = await self._chat(req, named, x_group_id or req.group_id, x_task_id or req.task_id)
        if not req.stream:
            return out
        return sse_response(chat_events(out, bool((req.stream_options or {}).get("include_usage"))))

    async def messages(
        self,
        req: MessagesRequest,
        x_session_id: str | None = Header(None),
        x_group_id: str | None = Header(None),
        x_task_id: str | None = Header(None),
    ) -> dict[str, Any] | StreamingResponse:
        """``POST /v1/messages``: the Anthropic Messages API, served as a chat turn."""
        named = x_session_id or req.session_id
        try:
            chat_req = to_chat_request(req, self._memo(named, "anthropic", ConversionMemo))
        except AnthropicRequestError as err:
            raise HTTPException(400, str(err)) from None
        group, task = x_group_id or chat_req.group_id, x_task_id or chat_req.task_id
        out = await self._chat(chat_req, named, group, task, token_texts=False)
        message = to_messages_response(out)
        return sse_response(message_events(message)) if req.stream else message

    async def responses(
        self,
        req: ResponsesRequest,
        x_session_id: str | None = Header(None),
        x_group_id: str | None = Header(None),
        x_task_id: str | None = Header(None),
    ) -> dict[str, Any] | StreamingResponse:
        """``POST /v1/responses``: the OpenAI Responses API, served as a chat turn; the session keeps the
        conversation of each response for a later ``previous_response_id``."""
        named = x_session_id or req.session_id
        try:
            chat_req, conversation = responses_to_chat(req, self._memo(named, "responses", ResponsesMemo))
        except ResponsesRequestError as err:
            raise HTTPException(400, str(err)) from None
        group, task = x_group_id or req.group_id, x_task_id or req.task_id
        out = await self._chat(chat_req, named, group, task, token_texts=False)
        response = to_response(out, req)
        memo = self._memo(named, "responses", ResponsesMemo)  # the session exists now, unless it closed
        if memo is not None:
            memo.keep(response["id"], [*conversation, ChatMessage(**out["choices"][0]["message"])])
        return sse_response(response_events(response)) if req.stream else response

    async def completions(self, req: CompletionRequest) -> dict[str, Any]:
        """``POST /v1/completions``: a raw completion of a text or token prompt, never recorded."""
        if req.stream or req.n != 1:
            raise HTTPException(400, "/v1/completions serves n=1 without streaming; use /v1/chat/completions")
        params = sampling_params(req, req.max_tokens, self.default_max_tokens, [])
        prompt_ids = (
            req.prompt
            if isinstance(req.prompt, list)
            else self.tokenizer(req.prompt, add_special_tokens=False)["input_ids"]
        )
        with self.gate.slot():
            gen = await self.engine.generate(list(prompt_ids), params)
        return text_completion(self.tokenizer, req.model or self.model_name, list(prompt_ids), gen)

    async def reward(self, session_id: str, req: RewardRequest) -> dict[str, Any]:
        """``POST /v1/sessions/{id}/reward``: close the session with its reward(s) and emit it."""
        if req.reward is not None and req.rewards is not None:
            raise HTTPException(400, "give at most one of 'reward' (outcome) and 'rewards' (per turn)")
        given = [req.reward] if req.reward is not None else req.rewards
        trajs = await self.turns.reward(session_id, given, req.task_id, req.metadata)
        return reward_response(session_id, trajs)

    async def list_sessions(self) -> dict[str, Any]:
        """``GET /v1/sessions``: the open session ids and the finished and abandoned counts."""
        self.registry.sweep()
        return {
            "open": self.registry.ids(),
            "finished": self.trajectories,
            "abandoned": self.registry.abandoned,
        }

    async def stats(self) -> dict[str, Any]:
        """``GET /v1/stats``: session and request counters, and the limits in force."""
        self.registry.sweep()
        return {
            "sessions": self.registry.counters(),
            "requests": {
                "in_flight": self.gate.in_flight,
                "max_pending": self.limits.max_pending,
                "rejected_overloaded": self.gate.rejected,
                "rejected_too_large": self.rejected_too_large,
            },
            "trajectories": self.trajectories,
            "limits": {
                "max_body_bytes": self.limits.max_body_bytes,
                "retry_after_s": self.limits.retry_after_s,
                "max_context_tokens": self.engine.context,
                "default_max_tokens": self.default_max_tokens,
                "max_session_tokens": self.rules.max_session_tokens,
                "max_turns": self.rules.max_turns,
            },
        }

    # ---- a chat turn ---------------------------------------------------------------------------------

    async def _chat(
        self,
        req: ChatRequest,
        named: str | None,
        group_id: str | None,
        task_id: str | None,
        token_texts: bool = True,
    ) -> dict[str, Any]:
        """Serve a chat request: recorded in session ``named``, or unrecorded when it is None;
        ``token_texts``: as `chat_completion`'s (False for the APIs that keep only the log-probs)."""
        if named is not None and req.n != 1:
            why = "a recorded session records one reply per request; n>1 is served without a session id"
            raise HTTPException(400, f"n={req.n}: {why} (unrecorded)")
        messages = normalize_messages(req.messages, self._memo(named, "openai", MessageMemo))
        max_tokens = req.max_completion_tokens or req.max_tokens
        closed = None
        if named is None:  # unnamed requests (e.g. a judge) are served but not recorded, under no rules
            params = sampling_params(req, max_tokens, self.default_max_tokens, self.engine.eos)
            prompt_ids, gens = await self.engine.unrecorded(messages, req.tools, params, req.n)
            decode = self.tokenizer.decode
            choices = [
                (g, self.reply(decode(g.token_ids, skip_special_tokens=False), req.tools)) for g in gens
            ]
        else:
            params = sampling_params(req, max_tokens, self.default_max_tokens, self.engine.eos, self.rules)
            result = await self.turns.chat(
                named, messages, req.tools, params, group_id=group_id, task_id=task_id,
                reply=lambda text: self.reply(text, req.tools),
            )  # fmt: skip
            prompt_ids, choices, closed = result.prompt_ids, [(result.gen, result.message)], result.closed
        model = req.model or self.model_name
        out = chat_completion(self.tokenizer, model, named, prompt_ids, choices, token_texts)
        if closed is not None:
            out["session_closed"] = closed
        return out

    def _memo(self, named: str | None, api: str, make: Callable[[], Any]) -> Any:
        """The open session ``named``'s memo of its last request for ``api`` (None: no such session yet)."""
        entry = self.registry.get(named) if named is not None else None
        if entry is None:
            return None
        memos = entry.session.request_memos
        if api not in memos:
            memos[api] = make()
        return memos[api]

    # ---- lifetime ------------------------------------------------------------------------------------

    def _emit(self, trajs: list[Trajectory]) -> None:
        """Keep, count and (with ``output_path``) append the trajectories of a closed session."""
        self.finished.extend(trajs)
        self.trajectories += len(trajs)
        if self.output_path is not None:
            _append_jsonl(self.output_path, trajs)

    def _too_large(self) -> None:
        self.rejected_too_large += 1

    @contextlib.asynccontextmanager
    async def _lifespan(self, _: FastAPI) -> AsyncIterator[None]:
        """Sweep idle sessions while the app runs; close the engine at shutdown when it is ours."""
        sweeper = asyncio.create_task(self.registry.sweep_forever())
        try:
            yield
        finally:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            if self.own_engine:
                await self.engine.engine.close()


def _append_jsonl(path: Path, trajs: list[Trajectory]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        for traj in trajs:
            f.write(json.dumps(traj.to_dict(), ensure_ascii=False) + "\n")
