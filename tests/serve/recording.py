"""Client-side bookkeeping for the gateway tests: play a multi-turn session through the openai SDK, then
check the gateway's recorded trajectory against exactly what the responses returned."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Turn", "check_token_exact", "play_session", "recording_gateway"]


@dataclass
class Turn:
    """One request of a session as the client saw it."""

    messages: list[dict[str, Any]]  # what was sent
    prompt_ids: list[int]  # the response's prompt_token_ids
    token_ids: list[int]  # the response's generated token ids
    logprobs: list[float]  # the response's per-token log-probs


async def play_session(
    client: Any,
    sid: str,
    turns: int,
    *,
    max_tokens: int,
    seed: int,
    between: Callable[[list[dict[str, Any]]], Awaitable[None]] | None = None,
) -> list[Turn]:
    """``turns`` chat requests of session ``sid`` (AsyncOpenAI ``client``), each sending the history back
    with the assistant's reply as returned and a new user message. ``between`` is awaited after each turn
    but the last, with the history so far (ending with the assistant's reply)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"{sid}: what is {seed % 97} + 1?"}]
    played = []
    for k in range(turns):
        out = await client.chat.completions.create(
            model="sao",
            messages=messages,
            max_tokens=max_tokens,
            seed=seed * 10 + k,
            extra_headers={"X-Session-Id": sid},
        )
        choice = out.choices[0]
        played.append(
            Turn(
                messages=[dict(m) for m in messages],
                prompt_ids=out.model_extra["prompt_token_ids"],
                token_ids=choice.model_extra["token_ids"],
                logprobs=[c.logprob for c in choice.logprobs.content],
            )
        )
        assert out.model_extra["session_id"] == sid
        messages.append({"role": "assistant", "content": choice.message.content})
        if between is not None and k < turns - 1:
            await between([dict(m) for m in messages])
        messages.append({"role": "user", "content": f"and turn {k + 2}?"})
    return played


def check_token_exact(traj: Any, turns: list[Turn], tokenizer: Any, reward: float) -> None:
    """Assert ``traj`` is the session, token for token: the first prompt as the template renders it, each
    turn's generated ids as returned (action tokens, their log-probs as returned), and between turns the
    chat-template delta of the new messages (observation tokens) — never a re-rendering."""

    def render(messages: list[dict[str, Any]]) -> str:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def encode(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    assert traj.metadata["prefix_mismatch"] is False and traj.metadata["branch"] == 0
    ids = encode(render(turns[0].messages))
    mask, lps = [0] * len(ids), [0.0] * len(ids)
    recorded_text = render(turns[0].messages)
    for k, turn in enumerate(turns):
        if k > 0:
            rendered = render(turn.messages)
            assert rendered.startswith(recorded_text), f"turn {k} does not extend the recorded text"
            delta = encode(rendered[len(recorded_text) :])
            ids, mask, lps = ids + delta, mask + [0] * len(delta), lps + [0.0] * len(delta)
            recorded_text = rendered
        assert turn.prompt_ids == ids, f"turn {k}: the prompt is not the recorded tokens + the template delta"
        assert len(turn.token_ids) == len(turn.logprobs) >= 1
        ids = ids + turn.token_ids
        mask = mask + [1] * len(turn.token_ids)
        lps = lps + turn.logprobs
        recorded_text += tokenizer.decode(turn.token_ids, skip_special_tokens=False)
    assert traj.token_ids == ids
    assert traj.action_mask == mask
    assert traj.rollout_logprobs == lps
    assert traj.num_turns == len(turns)
    assert traj.rewards == [reward]


def recording_gateway(engine: Any, tokenizer: Any, serve_app: Any, max_tokens: int) -> dict[str, Any]:
    """A served gateway on ``engine`` that keeps every finished trajectory: ``{"url", "received",
    "engine"}`` (``serve_app`` is the conftest fixture)."""
    from sao.serve.gateway import create_app

    received: list[Any] = []
    app = create_app(engine, tokenizer, default_max_tokens=max_tokens, on_trajectory=received.append)
    return {"url": serve_app(app), "received": received, "engine": engine}
