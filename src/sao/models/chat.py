"""Chat conversations → token ids with the RL trainer's masks (action = what the model generates).

A conversation is tokenised at exactly the boundaries an agent-loop rollout of it has, each piece on its
own (no BPE merge crosses a boundary), so supervised warm-start data and RL trajectories are the same
tokens with the same masks, whatever the chat template does to earlier turns:

1. the prompt: the full rendering of the messages before the first assistant message, with the
   generation prompt (observation tokens);
2. each assistant message as the model would have generated it (`sao.models.chat_delta.assistant_text`:
   reasoning and tool calls included, ending with the end-of-turn token; the **action** tokens);
3. between two assistant messages, the template's suffix for the messages in between and the next
   generation prompt (`sao.models.chat_delta.observation_delta`; observation tokens).

The tokens end with the last assistant turn (a rollout's trajectory ends at its last action token).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sao.types import Trajectory

from .chat_delta import ChatTemplateError, assistant_text, end_of_turn_token, observation_delta, render

__all__ = ["ChatTemplateError", "RenderedChat", "render_chat", "sft_trajectory"]


@dataclass(frozen=True)
class RenderedChat:
    """``token_ids``, ``action_mask`` (1 on assistant turns, end-of-turn included) and ``turn_ids`` (−1
    before the first assistant turn, i on assistant turn i and on what follows it), all the same length."""

    token_ids: list[int]
    action_mask: list[int]
    turn_ids: list[int]


def _check(messages: Sequence[Mapping[str, Any]]) -> None:
    for i, msg in enumerate(messages):
        if not isinstance(msg, Mapping) or not isinstance(msg.get("role"), str):
            raise ChatTemplateError(f"message {i} must be a mapping with a string 'role'")
        content = msg.get("content")
        if not (isinstance(content, str) or (content is None and msg.get("tool_calls"))):
            raise ChatTemplateError(
                f"message {i} must have string 'content' (or None with 'tool_calls'), got {content!r:.80}"
            )
    if not any(m["role"] == "assistant" for m in messages):
        raise ChatTemplateError("the conversation has no assistant message to learn from")


def render_chat(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    end_of_turn: str | None = None,
    tools: Sequence[Any] | None = None,
) -> RenderedChat:
    """Tokenise a conversation with masks at a rollout's boundaries; see the module docstring.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        messages: ``[{"role": ..., "content": ...}, ...]`` with at least one assistant message.
        end_of_turn: the token text that ends an assistant turn (default ``<|im_end|>`` if the tokenizer
            has it, else its eos token: as the agent loop).
        tools: OpenAI-style tool schemas the template renders into the prompt (as a gateway request's
            ``tools`` or an env's ``tools`` attribute are).

    Raises `ChatTemplateError` for a malformed conversation or a template that cannot render it so.
    """
    _check(messages)
    try:
        eot, _ = end_of_turn_token(tokenizer, end_of_turn)
    except ValueError as err:
        raise ChatTemplateError(f"{err}; pass end_of_turn") from None
    ids: list[int] = []
    mask: list[int] = []
    turns: list[int] = []

    def append(text: str, action: int, turn: int) -> None:
        new = tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
        ids.extend(new)
        mask.extend([action] * len(new))
        turns.extend([turn] * len(new))

    assistants = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    first = assistants[0]
    try:
        prompt = render(tokenizer, messages[:first], tools, add_generation_prompt=True,
                        )  # fmt: skip
    except Exception as err:
        raise ChatTemplateError(f"rendering the prompt: {type(err).__name__}: {err}") from err
    append(prompt, 0, -1)
    for turn, i in enumerate(assistants):
        try:
            if turn > 0:
                between = messages[assistants[turn - 1] + 1 : i]
                delta = observation_delta(tokenizer, between, tools, eot, True)
                append(delta, 0, turn - 1)
            append(assistant_text(tokenizer, messages[i], tools, eot), 1, turn)
        except ChatTemplateError as err:
            raise ChatTemplateError(f"assistant message {i}: {err}") from err
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
