"""The OpenAI side of the gateway: request bodies (pydantic models that accept the fields OpenAI clients
send and ignore the ones sao does not use), sampling parameters from a request, and the response pieces
sao builds (per-token log-probs, Qwen/Hermes tool calls as OpenAI ``tool_calls``)."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from fastapi import HTTPException
from pydantic import BaseModel, ConfigDict, Field

from sao.engine.types import Generation, InvalidRequestError, SamplingParams

__all__ = ["ChatRequest", "CompletionRequest", "RewardRequest", "logprobs_content", "sampling_params",
           "split_tool_calls"]  # fmt: skip

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


def sampling_params(
    req: _Common, max_tokens: int | None, default_max_tokens: int, eos: list[int]
) -> SamplingParams:
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


def logprobs_content(tokenizer: Any, gen: Generation) -> list[dict[str, Any]]:
    out = []
    for tok, lp in zip(gen.token_ids, gen.logprobs, strict=True):
        text = tokenizer.decode([tok], skip_special_tokens=False)
        out.append({"token": text, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": []})
    return out


def split_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]] | None]:
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
