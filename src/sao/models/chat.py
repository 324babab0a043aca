"""Chat conversations → token ids with the RL trainer's masks (action = what the model generates).

A conversation is rendered turn by turn with the tokenizer's chat template, and the token ids are the
concatenation of the rendered *deltas*: the prompt up to the first assistant turn, then for each assistant
turn its generation prompt, its content plus the end-of-turn token (the **action** tokens, exactly what an
engine samples before stopping), and the template's text after it. This is the token-in/token-out rule
the agent loop follows, so supervised warm-start data and RL trajectories carry the same masks.

A template that rewrites earlier text when a message is appended (some hide earlier reasoning) breaks
this; it is an error that names the offending message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sao.types import Trajectory

__all__ = ["ChatTemplateError", "RenderedChat", "render_chat", "sft_trajectory"]


class ChatTemplateError(ValueError):
    """The chat template is not prefix-stable for this conversation, or the conversation is malformed."""


@dataclass(frozen=True)
class RenderedChat:
    """``token_ids``, ``action_mask`` (1 on assistant content + end-of-turn) and ``turn_ids`` (−1 before
    the first assistant turn, i on assistant turn i and on what follows it), all the same length."""

    token_ids: list[int]
    action_mask: list[int]
    turn_ids: list[int]


def _render(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    generation_prompt: bool,
    tools: Sequence[Any] | None = None,
) -> str:
    return tokenizer.apply_chat_template(
        list(messages), tools=list(tools) if tools else None, tokenize=False,
        add_generation_prompt=generation_prompt,
    )  # fmt: skip


def render_chat(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    end_of_turn: str | None = None,
    tools: Sequence[Any] | None = None,
) -> RenderedChat:
    """Tokenise a conversation with masks; see the module docstring.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        messages: ``[{"role": ..., "content": ...}, ...]`` with at least one assistant message.
        end_of_turn: the token text that ends an assistant turn (default: ``tokenizer.eos_token``).
        tools: OpenAI-style tool schemas the template renders into the prompt (as a gateway request's
            ``tools`` or an env's ``tools`` attribute are).
    """
    eot = end_of_turn or tokenizer.eos_token
    if not eot:
        raise ChatTemplateError("the tokenizer has no eos token; pass end_of_turn")
    for i, msg in enumerate(messages):
        if not isinstance(msg, Mapping) or "role" not in msg or not isinstance(msg.get("content"), str):
            raise ChatTemplateError(f"message {i} must be a mapping with 'role' and string 'content'")
    if not any(m["role"] == "assistant" for m in messages):
        raise ChatTemplateError("the conversation has no assistant message to learn from")

    ids: list[int] = []
    mask: list[int] = []
    turns: list[int] = []
    rendered = ""
    turn = -1

    def append(text: str, action: int) -> None:
        nonlocal rendered
        if not text:
            return
        new = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids.extend(new)
        mask.extend([action] * len(new))
        turns.extend([turn] * len(new))
        rendered += text

    def extend_to(text: str, message: int, action: int) -> None:
        if not text.startswith(rendered):
            raise ChatTemplateError(
                f"chat template rewrites earlier text when message {message} is added; "
                "token-in/token-out training needs a prefix-stable template"
            )
        append(text[len(rendered) :], action)

    for i, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        extend_to(_render(tokenizer, messages[:i], True, tools), i, action=0)
        full = _render(tokenizer, messages[: i + 1], False, tools)
        if not full.startswith(rendered):
            raise ChatTemplateError(f"chat template rewrites the generation prompt of assistant message {i}")
        completion = full[len(rendered) :]
        cut = completion.find(eot)
        if cut < 0:
            raise ChatTemplateError(f"assistant message {i} does not end with {eot!r} in the template")
        turn += 1
        append(completion[: cut + len(eot)], 1)
        append(completion[cut + len(eot) :], 0)
    extend_to(_render(tokenizer, messages, False, tools), len(messages) - 1, action=0)
    return RenderedChat(ids, mask, turns)


def sft_trajectory(rendered: RenderedChat, prompt_id: str, max_tokens: int | None = None) -> Trajectory:
    """A ``Trajectory`` for supervised training: the rendered tokens, version 0, log-probs 0, reward 0.

    ``max_tokens`` truncates from the right (the conversation must keep at least one action token).
    """
    n = len(rendered.token_ids) if max_tokens is None else min(max_tokens, len(rendered.token_ids))
    mask = rendered.action_mask[:n]
    return Trajectory(
        prompt_id=prompt_id,
        token_ids=rendered.token_ids[:n],
        action_mask=mask,
        rollout_logprobs=[0.0] * n,
        versions=[0 if m else -1 for m in mask],
        turn_ids=rendered.turn_ids[:n],
        rewards=[0.0],
        finish_reason="stop" if n == len(rendered.token_ids) else "length",
        metadata={"source": "sft"},
    )
