"""Token-in/token-out with any chat template: the text of new messages as a *suffix* of a conversation.

Real chat templates rewrite earlier text when a message is appended (Qwen3's drops the ``<think>`` block
of earlier assistant turns and merges consecutive tool results into one user turn; Hermes and Llama
templates inject default system text), so the rendering of a longer conversation does not in general
start with the rendering of a shorter one. sao never re-renders recorded history: an episode (or a
gateway session) is the exact tokens the engine generated with, between turns, the template's rendering
of the *new* messages only.

That rendering is found with a fixed stand-in conversation (as verl does): ``[user, assistant]`` where
the assistant's content is a unique sentinel, rendered with the new messages after it and the generation
prompt. The text after the end-of-turn token that follows the sentinel is what the template adds for the
new messages and the next turn's generation prompt (`observation_delta`); when the recorded turn was cut
before its end-of-turn token, the delta starts right after the sentinel, so it closes the turn as the
template would. For supervised data, `assistant_text` is an assistant message as the model would have
generated it: its rendering as the *last* message after a stand-in user message, minus the stand-in's
generation prompt, up to and including the end-of-turn token (reasoning and tool calls included, even
where the template strips them from earlier turns).

Pure functions of (tokenizer, messages): used by the agent loop (`sao.rollout.agent_loop`), the gateway's
sessions (`sao.serve.sessions`) and SFT (`sao.models.chat`). Template variables such as
``enable_thinking`` are bound into the template's text (`sao.models.templates.bind_template_variables`),
so every rendering sees them without being passed anything.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "DEFAULT_END_OF_TURN",
    "ChatTemplateError",
    "assistant_text",
    "end_of_turn_token",
    "observation_delta",
    "render",
]

DEFAULT_END_OF_TURN = "<|im_end|>"
# The stand-in assistant turn's content: plain ASCII letters and digits, so no template escapes, trims or
# splits it, and unlikely enough to appear in a real conversation (a second occurrence is an error).
SENTINEL = "SAOstandin7f3c9a1e5b"
_STANDIN_USER = {"role": "user", "content": "Hi."}


class ChatTemplateError(ValueError):
    """The chat template cannot render a conversation the way token-in/token-out needs (it raised, or its
    rendering of the stand-in conversation is unusable), or the conversation is malformed."""


def render(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Any] | None = None,
    *,
    add_generation_prompt: bool,
) -> str:
    """The chat template's rendering of ``messages`` as text. Whatever the template raises propagates.

    An assistant tool call's ``arguments`` given as a JSON string (the OpenAI wire form) reach the template
    as the object it holds, as vLLM and SGLang pass them: templates that write arguments themselves (Qwen3-
    Coder's XML form) need the object, and JSON templates write it back as JSON."""
    return tokenizer.apply_chat_template(
        [_template_message(m) for m in messages],
        tools=list(tools) if tools else None,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
    )


def _template_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """``message`` as the template gets it: tool-call arguments that are a JSON object's text decoded."""
    out = dict(message)
    calls = out.get("tool_calls")
    if not calls or not isinstance(calls, list):
        return out
    decoded = []
    for call in calls:
        fn = call.get("function") if isinstance(call, Mapping) else None
        args = fn.get("arguments") if isinstance(fn, Mapping) else None
        if isinstance(args, str):
            try:
                value = json.loads(args)
            except json.JSONDecodeError:
                value = None
            if isinstance(value, dict):
                call = {**call, "function": {**fn, "arguments": value}}
        decoded.append(call)
    out["tool_calls"] = decoded
    return out


def end_of_turn_token(tokenizer: Any, end_of_turn: str | None = None) -> tuple[str, int]:
    """The token that ends an assistant turn, as (text, id): ``end_of_turn`` if given, else
    ``<|im_end|>`` if the tokenizer has it, else its eos token. Raises ValueError if it has none."""
    candidates = [end_of_turn] if end_of_turn else [DEFAULT_END_OF_TURN, tokenizer.eos_token]
    for text in candidates:
        # A direct lookup, not `text in get_vocab()`: that builds a dict of the whole vocabulary (~20 ms
        # for a 150k-token tokenizer) and this runs once per episode.
        token_id = tokenizer.convert_tokens_to_ids(text) if text else None
        if isinstance(token_id, int) and tokenizer.convert_ids_to_tokens(token_id) == text:
            return text, token_id
    raise ValueError(f"the tokenizer has no end-of-turn token (tried {candidates})")


def _after_sentinel(text: str, end_of_turn: str) -> int:
    """Index in ``text`` (a stand-in rendering) just past the sentinel, checked: the sentinel occurs
    exactly once and the end-of-turn token follows it directly."""
    at = text.find(SENTINEL)
    if at < 0 or text.find(SENTINEL, at + 1) >= 0:
        found = "does not contain" if at < 0 else "contains more than once"
        raise ChatTemplateError(
            f"the chat template's rendering of a stand-in conversation {found} the stand-in assistant "
            f"content {SENTINEL!r}; cannot locate the new messages in it"
        )
    after = at + len(SENTINEL)
    if not text.startswith(end_of_turn, after):
        raise ChatTemplateError(
            f"the chat template does not close an assistant turn with {end_of_turn!r} right after its "
            f"content (it renders ...{text[at : after + 40]!r}); set the end-of-turn token the template uses"
        )
    return after


def observation_delta(
    tokenizer: Any,
    new_messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Any] | None,
    end_of_turn: str,
    turn_ended: bool,
) -> str:
    """The text that follows a recorded assistant turn: the template's rendering of ``new_messages``
    (possibly none) and the next generation prompt.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        new_messages: the messages after the assistant turn (tool results, a user nudge, ...).
        tools: the tool schemas of the conversation (rendered by some templates into the system turn,
            which the delta does not contain, but their presence can change how messages render).
        end_of_turn: the token text that ends an assistant turn (``<|im_end|>``).
        turn_ended: whether the recorded turn ended with ``end_of_turn``; if not (cut by a token limit)
            the delta starts with it.

    Raises `ChatTemplateError` if the template raises or its stand-in rendering is unusable.
    """
    standin = [_STANDIN_USER, {"role": "assistant", "content": SENTINEL}]
    try:
        text = render(
            tokenizer, [*standin, *new_messages], tools,
            add_generation_prompt=True,
        )  # fmt: skip
    except Exception as err:
        raise ChatTemplateError(f"the chat template raised {type(err).__name__}: {err}") from err
    if not isinstance(text, str):
        raise ChatTemplateError(f"the chat template rendered {type(text).__name__}, not text")
    after = _after_sentinel(text, end_of_turn)
    return text[after + len(end_of_turn) :] if turn_ended else text[after:]


def assistant_text(
    tokenizer: Any,
    message: Mapping[str, Any],
    tools: Sequence[Any] | None,
    end_of_turn: str,
) -> str:
    """An assistant ``message`` as the model generates it after the generation prompt: its rendering as
    the last message after a stand-in user message, minus the stand-in's rendering with the generation
    prompt, up to and including the first ``end_of_turn``.

    Raises `ChatTemplateError` if the template raises, renders the turn without the generation prompt
    before it (e.g. reasoning given while ``enable_thinking`` is false), or without ``end_of_turn``.
    """
    try:
        prompt = render(tokenizer, [_STANDIN_USER], tools, add_generation_prompt=True)
        full = render(
            tokenizer, [_STANDIN_USER, message], tools,
            add_generation_prompt=False,
        )  # fmt: skip
    except Exception as err:
        raise ChatTemplateError(f"the chat template raised {type(err).__name__}: {err}") from err
    if not full.startswith(prompt):
        raise ChatTemplateError(
            "the chat template renders the assistant turn without its generation prompt "
            f"{prompt[-40:]!r} before it (rendered ...{full[max(0, len(prompt) - 40) : len(prompt) + 40]!r})"
        )
    completion = full[len(prompt) :]
    cut = completion.find(end_of_turn)
    if cut < 0:
        raise ChatTemplateError(f"the chat template does not end the assistant turn with {end_of_turn!r}")
    return completion[: cut + len(end_of_turn)]
