"""OpenAI-compatible HTTP gateway in front of any `InferenceEngine`, recording sessions as trajectories.

Any agent written against the OpenAI SDK gets trained by pointing it at this server: each request names
its session (``X-Session-Id`` header, or a ``session_id`` field in the body, e.g. the SDK's
``extra_body``), the gateway records the session token-in/token-out (`sao.serve.sessions`), and
``POST /v1/sessions/{id}/reward`` attaches the outcome, closes the session and emits its trajectories.

Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``,
``POST /v1/sessions/{id}/reward``, ``GET /v1/sessions``. Responses follow the OpenAI schema and add
``token_ids``, ``versions`` and per-token log-probs. Malformed requests get a 4xx with a reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Header, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from sao.engine.types import Generation, InferenceEngine, InvalidRequestError, SamplingParams
from sao.types import Trajectory

from .sessions import ChatSession

__all__ = ["create_app"]

_TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | None = None


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")  # OpenAI clients send fields we do not use
    model: str | None = None
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = -1
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = 1
    stream: bool = False
    session_id: str | None = None


class ChatRequest(_Common):
    messages: list[_Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[dict[str, Any]] | None = None


class CompletionRequest(_Common):
    prompt: str | list[int]


class RewardRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reward: float | None = None
    rewards: list[float] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


def _params(req: _Common, max_tokens: int | None, default_max_tokens: int, eos: list[int]) -> SamplingParams:
    if req.n != 1:
        raise HTTPException(400, "only n=1 is supported")
    if req.stream:
        raise HTTPException(400, "streaming is not supported; send stream=false")
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    params = SamplingParams(
        max_new_tokens=max_tokens or default_max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        stop_token_ids=tuple(eos),
        stop=stop,
        seed=req.seed,
    )
    try:
        params.validate()
    except InvalidRequestError as err:
        raise HTTPException(400, str(err)) from None
    return params


def _logprobs_content(tokenizer: Any, gen: Generation) -> list[dict[str, Any]]:
    out = []
    for tok, lp in zip(gen.token_ids, gen.logprobs, strict=True):
        text = tokenizer.decode([tok], skip_special_tokens=False)
        out.append({"token": text, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": []})
    return out


def _split_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]] | None]:
    """Qwen/Hermes ``<tool_call>{json}</tool_call>`` blocks → OpenAI ``tool_calls`` (None if none parse)."""
    calls = []
    for match in _TOOL_CALL.finditer(text):
        try:
            call = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue
        if isinstance(call, dict) and isinstance(call.get("name"), str):
            args = call.get("arguments", {})
            calls.append(
                {
                    "id": f"call_{uuid.uuid4().hex[:12]}",
                    "type": "function",
                    "function": {"name": call["name"], "arguments": json.dumps(args)},
                }
            )
    if not calls:
        return text, None
    content = _TOOL_CALL.sub("", text).strip()
    return content or None, calls


def create_app(
    engine: InferenceEngine,
    tokenizer: Any,
    *,
    model_name: str = "sao",
    default_max_tokens: int = 1024,
    on_trajectory: Callable[[Trajectory], None] | None = None,
    output_path: str | Path | None = None,
    own_engine: bool = False,
) -> FastAPI:
    """Build the gateway app.

    Args:
        engine: any `InferenceEngine` (LocalEngine, vLLM, SGLang).
        tokenizer: the model's tokenizer (chat template, decoding).
        on_trajectory: called with each finished trajectory (e.g. a trainer queue's ``put_nowait``).
        output_path: also append finished trajectories to this JSONL file.
        own_engine: close the engine (and a server it launched) when the app shuts down.
    """

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        if own_engine:
            await engine.close()

    app = FastAPI(title="sao gateway", lifespan=lifespan)
    sessions: dict[str, ChatSession] = {}
    locks: dict[str, asyncio.Lock] = {}
    finished: list[Trajectory] = []
    app.state.sessions, app.state.finished = sessions, finished
    eos = [
        t
        for t in {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
        if isinstance(t, int)
    ]

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        details = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:])}: {e['msg']}" for e in exc.errors())
        return JSONResponse(
            status_code=400, content={"error": {"message": details, "type": "invalid_request"}}
        )

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse(status_code=exc.status_code, content={"error": {"message": exc.detail}})

    async def _generate(prompt_ids: list[int], params: SamplingParams) -> Generation:
        try:
            gen = await engine.generate(prompt_ids, params)
        except InvalidRequestError as err:
            raise HTTPException(400, str(err)) from None
        if gen.finish_reason == "error":
            raise HTTPException(500, f"generation failed: {gen.error}")
        return gen

    def _usage(prompt: int, gen: Generation) -> dict[str, int]:
        return {
            "prompt_tokens": prompt,
            "completion_tokens": len(gen.token_ids),
            "total_tokens": prompt + len(gen.token_ids),
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "sao"}]}

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest, x_session_id: str | None = Header(None)) -> dict[str, Any]:
        params = _params(req, req.max_completion_tokens or req.max_tokens, default_max_tokens, eos)
        named = x_session_id or req.session_id
        sid = named or f"anon-{uuid.uuid4().hex}"  # unnamed requests (e.g. a judge) are not recorded
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        lock = locks.setdefault(sid, asyncio.Lock()) if named else asyncio.Lock()
        async with lock:
            session = (
                sessions.setdefault(sid, ChatSession(tokenizer, sid))
                if named
                else ChatSession(tokenizer, sid)
            )
            try:
                prompt_ids = session.prompt_for(messages, req.tools)
            except Exception as err:  # the template rejected the conversation: the client's input
                raise HTTPException(400, f"cannot render messages with the chat template: {err}") from None
            gen = await _generate(prompt_ids, params)
            text = session.record_generation(gen.token_ids, gen.logprobs, gen.versions, gen.finish_reason)
        eos_text = tokenizer.eos_token or ""
        visible = text[: -len(eos_text)] if eos_text and text.endswith(eos_text) else text
        content, tool_calls = _split_tool_calls(visible) if req.tools else (visible, None)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        finish = (
            "tool_calls" if tool_calls else ("stop" if gen.finish_reason == "stop" else gen.finish_reason)
        )
        return {
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
                    "logprobs": {"content": _logprobs_content(tokenizer, gen)},
                    "token_ids": gen.token_ids,
                    "versions": gen.versions,
                }
            ],
            "prompt_token_ids": prompt_ids,
            "usage": _usage(len(prompt_ids), gen),
        }

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest) -> dict[str, Any]:
        params = _params(req, req.max_tokens, default_max_tokens, [])
        prompt_ids = (
            req.prompt
            if isinstance(req.prompt, list)
            else tokenizer(req.prompt, add_special_tokens=False)["input_ids"]
        )
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
        if (req.reward is None) == (req.rewards is None):
            raise HTTPException(400, "give exactly one of 'reward' (outcome) and 'rewards' (per turn)")
        if session_id not in sessions:
            raise HTTPException(404, f"unknown or already closed session {session_id!r}")
        async with locks[session_id]:
            session = sessions.pop(session_id)
            locks.pop(session_id, None)
        rewards = [req.reward] if req.reward is not None else list(req.rewards or [])
        try:
            trajs = session.trajectories(rewards, {"model": model_name, **req.metadata})
            for traj in trajs:
                traj.validate()
        except ValueError as err:
            sessions[session_id] = session  # keep it: the client can retry with a valid reward
            raise HTTPException(400, f"cannot close session {session_id!r}: {err}") from None
        finished.extend(trajs)
        if output_path is not None:
            existing = Path(output_path)
            _append_jsonl(existing, trajs)
        for traj in trajs:
            if on_trajectory is not None:
                on_trajectory(traj)
        return {
            "session_id": session_id,
            "trajectories": [
                {
                    "traj_id": t.traj_id,
                    "num_tokens": t.num_tokens,
                    "num_turns": t.num_turns,
                    "prefix_mismatch": t.metadata["prefix_mismatch"],
                }
                for t in trajs
            ],
        }

    @app.get("/v1/sessions")
    async def list_sessions() -> dict[str, Any]:
        return {"open": sorted(sessions), "finished": len(finished)}

    return app


def _append_jsonl(path: Path, trajs: list[Trajectory]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        for traj in trajs:
            f.write(json.dumps(traj.to_dict(), ensure_ascii=False) + "\n")
