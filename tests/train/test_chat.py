"""Chat rendering with the RL masks: action tokens are exactly what the model generates."""

from __future__ import annotations

import copy

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


def test_with_a_prefix_stable_template_the_tokens_are_the_full_rendering_up_to_the_last_turn(tiny_tokenizer):
    out = render_chat(tiny_tokenizer, CONVERSATION)
    text = tiny_tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    full = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert (
        out.token_ids == full[: len(out.token_ids)]
        and tiny_tokenizer.decode(full[len(out.token_ids) :]) == "\n"
    )
    # Trailing messages after the last assistant turn are not part of it (a rollout ends there too).
    assert render_chat(tiny_tokenizer, [*CONVERSATION, {"role": "user", "content": "thanks"}]) == out


def test_turn_ids_mark_the_prompt_and_each_assistant_turn(tiny_tokenizer):
    out = render_chat(tiny_tokenizer, CONVERSATION)
    first_action = out.action_mask.index(1)
    assert set(out.turn_ids[:first_action]) == {-1}
    action_turns = [t for t, m in zip(out.turn_ids, out.action_mask, strict=True) if m]
    assert sorted(set(action_turns)) == [0, 1]
    traj = sft_trajectory(out, "p0")
    traj.validate()
    assert traj.num_turns == 2


def with_template(tok, template):
    other = copy.deepcopy(tok)
    other.chat_template = template
    return other


def test_a_template_that_rewrites_earlier_turns_keeps_each_assistant_turn_as_generated(tiny_tokenizer):
    # Earlier assistant turns lose their reasoning (as Qwen3's template does).
    strip = with_template(
        tiny_tokenizer,
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.role == 'assistant' and not loop.last %}{{ m.content.split('</think>')[-1] }}"
        "{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    )
    conversation = [
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": "<think>add</think>5"},
        {"role": "user", "content": "and 2+4?"},
        {"role": "assistant", "content": "<think>add again</think>6"},
    ]
    out = render_chat(strip, conversation)
    text = tiny_tokenizer.decode(out.token_ids)
    assert text.count("<think>") == 2 and "<think>add</think>5<|im_end|>\n<|im_start|>user" in text
    assert "<think>add</think>" not in strip.apply_chat_template(conversation, tokenize=False)


def test_a_template_that_hides_the_stand_in_turn_is_a_clear_error(tiny_tokenizer):
    # Only the last assistant message is shown: the suffix of the messages after a turn cannot be found.
    hides = with_template(
        tiny_tokenizer,
        "{% for m in messages %}{% if m.role != 'assistant' or loop.last %}"
        "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    )
    with pytest.raises(ChatTemplateError, match=r"assistant message 4: .*does not contain the stand-in"):
        render_chat(hides, CONVERSATION)


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
