"""The OpenAI side of the gateway: request bodies (pydantic models that accept the fields OpenAI clients
send and ignore the ones sao does not use), the checks and normal form of a conversation
(`normalize_messages`: text content parts joined, tool calls and tool results checked; with a session's
`MessageMemo`, only the messages its last request did not have), sampling parameters from a request, and
the response bodies sao builds (chat and text completions with one choice per generation, a reward's
summary; per-token log-probs, tool calls as OpenAI ``tool_calls``, parsed by the gateway's tool-call format,
Qwen/Hermes ``<tool_call>`` by default). An assistant message may carry ``reasoning_content`` (a string:
the reasoning the gateway returned, sent back or not)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import HTTPException
from pydantic import BaseModel, ConfigDict, Field

from sao.engine.types import Generation, InvalidRequestError, SamplingParams
from sao.envs.tools import ToolCallParse, parse_tool_calls
from sao.types import Trajectory

from .hooks import SessionRules

__all__ = ["CHAT_KEYS", "MAX_CHOICES", "ChatMessage", "ChatRequest", "CompletionRequest", "MessageMemo",
           "RewardRequest", "chat_completion", "common_prefix", "logprobs_content", "normalize_messages",
           "reward_response", "sampling_params", "sao_extras", "split_tool_calls",
           "text_completion"]  # fmt: skip


class ChatMessage(BaseModel):
    """One message of a chat request, as parsed (extra keys such as ``tool_calls`` are kept)."""

    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[Any] | None = None


# Choices of one unrecorded request at most (each is a generation).
MAX_CHOICES = 16


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")  # OpenAI clients send fields we do not use
    model: str | None = None
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = -1
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    stream: bool = False
    session_id: str | None = None
    group_id: str | None = None  # sessions of one GRPO-style group (first request of a session)
    task_id: str | None = None  # the task the session plays, for a verifier reward


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[dict[str, Any]] | None = None
    stream_options: dict[str, Any] | None = None  # {"include_usage": bool}


class CompletionRequest(_Common):
    prompt: str | list[int]


class RewardRequest(BaseModel):
    """``reward`` (the outcome) or ``rewards`` (one per turn); with neither, the run's verifier scores the
    conversation of task ``task_id`` (given here or by the session's requests)."""

    model_config = ConfigDict(extra="forbid")
    reward: float | None = Field(None, allow_inf_nan=False)
    rewards: list[Annotated[float, Field(allow_inf_nan=False)]] | None = None
    task_id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


_ROLES = ("system", "user", "assistant", "tool")


def _text(content: Any, where: str) -> str | None:
    """Message content as text: a string, or a list of text parts (joined); other parts are refused."""
    if content is None or isinstance(content, str):
        return content
    parts = []
    for i, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise HTTPException(400, f"{where}.content.{i}: only text parts are supported, not {kind!r}")
        parts.append(part["text"])
    return "".join(parts)


def _check_tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise HTTPException(400, f"{where}.tool_calls: must be a list, got {type(calls).__name__}")
    out = []
    for i, call in enumerate(calls):
        at = f"{where}.tool_calls.{i}"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise HTTPException(400, f"{at}: must be {{'type': 'function', 'function': {{'name': ...}}}}")
        args = fn.get("arguments", "{}")
        parsed = args
        if isinstance(args, str):
            try:
                parsed = json.loads(args)
            except json.JSONDecodeError as err:
                why = f"{at}.function.arguments: not valid JSON ({err.msg}): {args[:200]!r}"
                raise HTTPException(400, why) from None
        if not isinstance(parsed, dict):
            raise HTTPException(400, f"{at}.function.arguments: must be a JSON object: {str(args)[:200]!r}")
        out.append({**call, "function": {**fn, "arguments": args}})
    return out


def common_prefix(items: Sequence[Any], seen: Sequence[Any]) -> int:
    """How many leading ``items`` equal ``seen``'s (the same object, or ``==``): what a session's memo of
    its last request may reuse of the next one, which repeats the history."""
    n = 0
    for item, old in zip(items, seen, strict=False):
        if item is not old and item != old:
            break
        n += 1
    return n


@dataclass
class MessageMemo:
    """What `normalize_messages` remembers of a session's last request, so the next one (which repeats its
    history and adds k messages) is checked and converted in O(k): ``sent``, the request's messages as
    parsed (a repeated message is recognised by ``==``, no conversion); ``normal``, their normal form;
    ``call_at``, the index of the first message that made each tool call id."""

    sent: list[ChatMessage] = field(default_factory=list)
    normal: list[dict[str, Any]] = field(default_factory=list)
    call_at: dict[str, int] = field(default_factory=dict)

    def known(self, messages: list[ChatMessage]) -> int:
        """How many leading ``messages`` equal the remembered ones."""
        return common_prefix(messages, self.sent)

    def remember(
        self, messages: list[ChatMessage], normal: list[dict[str, Any]], known: int, new_calls: dict[str, int]
    ) -> None:
        """Replace the remembered request by ``messages`` (their first ``known`` as remembered)."""
        for i in range(known, len(self.normal)):  # the calls of the messages it no longer has
            for call_id in _call_ids(self.normal[i]):
                if self.call_at.get(call_id) == i:
                    del self.call_at[call_id]
        for call_id, i in new_calls.items():
            self.call_at.setdefault(call_id, i)
        self.sent, self.normal = list(messages), normal


def _call_ids(message: dict[str, Any]) -> list[str]:
    return [str(c["id"]) for c in message.get("tool_calls") or () if c.get("id") is not None]


def normalize_messages(messages: list[ChatMessage], memo: MessageMemo | None = None) -> list[dict[str, Any]]:
    """The request's conversation as plain dicts: roles checked, text parts joined, assistant
    ``tool_calls`` well formed (a function name, arguments a JSON object) and every tool message's
    ``tool_call_id`` (when given) one of an earlier assistant message's calls. Raises HTTPException(400)
    naming the message (``messages.3.tool_calls.0.function.arguments: ...``).

    With ``memo`` (the session's), the leading messages equal to its last request's reuse their normal
    form (checked then, with the same earlier messages) and only the rest are converted; the memo then
    holds this request (unless it raised). Do not modify the returned dicts: later requests share them.
    """
    known = memo.known(messages) if memo is not None else 0
    out = memo.normal[:known] if memo is not None else []
    new_calls: dict[str, int] = {}  # call id -> index, made by the messages from ``known`` on

    def made_before(ref: str) -> bool:
        at = memo.call_at.get(ref) if memo is not None else None
        return ref in new_calls or (at is not None and at < known)

    for i in range(known, len(messages)):
        where = f"messages.{i}"
        m = messages[i].model_dump(exclude_none=True)
        if m["role"] not in _ROLES:
            raise HTTPException(400, f"{where}.role: must be one of {', '.join(_ROLES)}, got {m['role']!r}")
        if "content" in m:
            m["content"] = _text(m["content"], where)
        reasoning = m.get("reasoning_content")
        if reasoning is not None and (m["role"] != "assistant" or not isinstance(reasoning, str)):
            raise HTTPException(400, f"{where}.reasoning_content: only assistant messages carry it, as text")
        if m["role"] == "assistant" and m.get("tool_calls") is not None:
            m["tool_calls"] = _check_tool_calls(m["tool_calls"], where)
            for call_id in _call_ids(m):
                new_calls.setdefault(call_id, i)
        elif "tool_calls" in m:
            raise HTTPException(400, f"{where}.tool_calls: only assistant messages carry tool calls")
        if m["role"] == "tool":
            if not isinstance(m.get("content"), str):
                raise HTTPException(400, f"{where}.content: a tool message needs its result as text")
            ref = m.get("tool_call_id")
            if ref is not None and not made_before(str(ref)):
                raise HTTPException(
                    400, f"{where}.tool_call_id: {ref!r} answers no tool call of an earlier assistant message"
                )
        out.append(m)
    if memo is not None:
        memo.remember(messages, out, known, new_calls)
    return list(out)


def sampling_params(
    req: _Common,
    max_tokens: int | None,
    default_max_tokens: int,
    eos: list[int],
    rules: SessionRules | None = None,
) -> SamplingParams:
    """The engine's sampling parameters for a request. With ``rules`` (a recorded session of a training
    run): its fixed temperature/top-p/top-k replace the ones the request omits, a different value given is
    refused (400), and ``max_tokens`` is capped by ``rules.max_tokens_per_turn``."""
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    sampling = {"temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k}
    new_tokens = max_tokens or default_max_tokens
    if rules is not None:
        for name in sampling:
            fixed = getattr(rules, name)
            if fixed is None:
                continue
            if name in req.model_fields_set and sampling[name] != fixed:
                raise HTTPException(
                    400,
                    f"{name}={sampling[name]!r}: this run records sessions at {name}={fixed!r} "
                    f"(engine.{name}: the trainer scores the distribution the engine samples from); omit "
                    "it or send that value",
                )
            sampling[name] = fixed
        if rules.max_tokens_per_turn is not None:
            new_tokens = min(new_tokens, rules.max_tokens_per_turn)
    params = SamplingParams(
        max_new_tokens=new_tokens,
        temperature=sampling["temperature"],
        top_p=sampling["top_p"],
        top_k=sampling["top_k"],
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
    """A chat choice's ``logprobs.content``: one entry per generated token (its text, log-prob, bytes)."""
    out = []
    for tok, lp in zip(gen.token_ids, gen.logprobs, strict=True):
        text = tokenizer.decode([tok], skip_special_tokens=False)
        out.append({"token": text, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": []})
    return out


def split_tool_calls(
    text: str, parse: Callable[[str], ToolCallParse] = parse_tool_calls
) -> tuple[str | None, list[dict[str, Any]] | None]:
    """Tool calls in ``text`` → OpenAI ``tool_calls``, found by ``parse`` (a tool-call format's parser;
    default the envs' Qwen/Hermes ``<tool_call>{json}</tool_call>`` one, `sao.envs.tools.parse_tool_calls`):
    ``(content, tool_calls)``, the content being ``text`` without the spans that became calls (stripped;
    None when nothing is left). A malformed block makes no call and stays in the content; with no
    well-formed call, ``(text, None)``."""
    parsed = parse(text)
    if not parsed.calls:
        return text, None
    kept, at = [], 0
    for start, end in parsed.spans:
        kept.append(text[at:start])
        at = end
    content = ("".join(kept) + text[at:]).strip()
    calls = [
        {
            "id": f"call_{uuid.uuid4().hex[:12]}",
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
        }
        for call in parsed.calls
    ]
    return content or None, calls


# The chat.completion body's own keys; any other top-level key is sao's (session_id, prompt_token_ids, ...).
CHAT_KEYS = frozenset(
    {"id", "object", "created", "model", "choices", "usage", "system_fingerprint", "service_tier"}
)


def sao_extras(chat: dict[str, Any]) -> dict[str, Any]:
    """What sao adds to a `chat_completion` body, for the APIs built from it (Anthropic, Responses): the
    first choice's ``token_ids``, ``versions`` and ``logprobs`` (as floats), and every top-level key that
    is not OpenAI's (``session_id``, ``prompt_token_ids``, ``session_closed``, ...)."""
    choice = chat["choices"][0]
    out = {key: choice[key] for key in ("token_ids", "versions") if key in choice}
    logprobs = (choice.get("logprobs") or {}).get("content")
    if logprobs is not None:
        out["logprobs"] = [entry["logprob"] for entry in logprobs]
    out.update({key: value for key, value in chat.items() if key not in CHAT_KEYS})
    return out


def chat_completion(
    tokenizer: Any,
    model: str,
    session_id: str | None,
    prompt_ids: Sequence[int],
    choices: Sequence[tuple[Generation, dict[str, Any]]],
    token_texts: bool = True,
) -> dict[str, Any]:
    """The ``chat.completion`` body of the generations of one prompt (``choices``: each generation and its
    assistant message), with sao's ``session_id`` (None: not recorded), ``prompt_token_ids`` and, per
    choice, ``token_ids`` and ``versions``. ``token_texts=False`` leaves each token's text out of
    ``logprobs.content`` (only ``logprob``): for the APIs that keep only the log-probs, which saves a
    decode per generated token."""
    out = [
        {
            "index": i,
            "message": message,
            "finish_reason": "tool_calls" if message.get("tool_calls") else gen.finish_reason,
            "logprobs": {
                "content": logprobs_content(tokenizer, gen)
                if token_texts
                else [{"logprob": lp} for lp in gen.logprobs]
            },
            "token_ids": gen.token_ids,
            "versions": gen.versions,
        }
        for i, (gen, message) in enumerate(choices)
    ]
    generated = sum(len(gen.token_ids) for gen, _ in choices)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "session_id": session_id,
        "choices": out,
        "prompt_token_ids": prompt_ids,
        "usage": _usage(len(prompt_ids), generated),
    }


def text_completion(tokenizer: Any, model: str, prompt_ids: list[int], gen: Generation) -> dict[str, Any]:
    """The ``text_completion`` body of one generation, with ``token_ids``, ``versions`` and
    ``prompt_token_ids``."""
    tokens = [tokenizer.decode([t], skip_special_tokens=False) for t in gen.token_ids]
    choice = {
        "index": 0,
        "text": tokenizer.decode(gen.token_ids, skip_special_tokens=False),
        "finish_reason": gen.finish_reason,
        "logprobs": {"tokens": tokens, "token_logprobs": gen.logprobs},
        "token_ids": gen.token_ids,
        "versions": gen.versions,
    }
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "prompt_token_ids": prompt_ids,
        "usage": _usage(len(prompt_ids), len(gen.token_ids)),
    }


def reward_response(session_id: str, trajs: list[Trajectory]) -> dict[str, Any]:
    """The answer to ``POST /v1/sessions/{id}/reward``: a summary of each trajectory the session became."""
    summaries = [
        {
            "traj_id": t.traj_id,
            "num_tokens": t.num_tokens,
            "num_turns": t.num_turns,
            "prefix_mismatch": t.metadata["prefix_mismatch"],
            "rewards": t.rewards,
        }
        for t in trajs
    ]
    return {"session_id": session_id, "trajectories": summaries}


def _usage(prompt: int, generated: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated}
