"""Chat rendering with the RL masks: action tokens are exactly what the model generates."""

from __future__ import annotations

import pytest

from sao.models.chat import ChatTemplateError, render_chat, sft_trajectory

CONVERSATION = [
    {"role": "system", "content": "You add numbers."},
    {"role": "user", "content": "2+3?"},
    {"role": "assistant", "content": "<tool_call>2+3</tool_call>"},
    {"role": "tool", "content": "5"},
    {"role": "assistant", "content": "The answer is 5."},
]


def test_action_tokens_are_the_assistant_contents_plus_end_of_turn(tiny_tokenizer):
    out = render_chat(tiny_tokenizer, CONVERSATION)
    spans, current = [], []
    for tok, m in zip(out.token_ids, out.action_mask, strict=True):
        if m:
            current.append(tok)
        elif current:
            spans.append(current)
            current = []
    if current:
        spans.append(current)
    eot = tiny_tokenizer.eos_token
    assert [tiny_tokenizer.decode(s) for s in spans] == [
        "<tool_call>2+3</tool_call>" + eot,
        "The answer is 5." + eot,
    ]


def test_token_ids_are_the_tokenisation_of_the_full_rendered_conversation(tiny_tokenizer):
    out = render_chat(tiny_tokenizer, CONVERSATION)
    text = tiny_tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    assert out.token_ids == tiny_tokenizer(text, add_special_tokens=False)["input_ids"]


def test_turn_ids_mark_the_prompt_and_each_assistant_turn(tiny_tokenizer):
    out = render_chat(tiny_tokenizer, CONVERSATION)
    first_action = out.action_mask.index(1)
    assert set(out.turn_ids[:first_action]) == {-1}
    action_turns = [t for t, m in zip(out.turn_ids, out.action_mask, strict=True) if m]
    assert sorted(set(action_turns)) == [0, 1]
    traj = sft_trajectory(out, "p0")
    traj.validate()
    assert traj.num_turns == 2


def test_template_that_rewrites_history_is_rejected(tiny_tokenizer):
    # A template that only ever shows the last assistant message rewrites earlier text.
    tok = tiny_tokenizer
    original = tok.chat_template
    tok.chat_template = (
        "{% for m in messages %}{% if m.role != 'assistant' or loop.last %}"
        "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    try:
        with pytest.raises(ChatTemplateError, match="rewrites"):
            render_chat(tok, CONVERSATION)
    finally:
        tok.chat_template = original


def test_conversation_without_assistant_is_rejected(tiny_tokenizer):
    with pytest.raises(ChatTemplateError, match="no assistant"):
        render_chat(tiny_tokenizer, CONVERSATION[:2])


def test_truncation_keeps_a_valid_trajectory(tiny_tokenizer):
    out = render_chat(tiny_tokenizer, CONVERSATION)
    first_action = out.action_mask.index(1)
    traj = sft_trajectory(out, "p0", max_tokens=first_action + 3)
    traj.validate()
    assert traj.num_tokens == first_action + 3
    assert traj.finish_reason == "length"
