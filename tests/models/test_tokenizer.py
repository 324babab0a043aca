"""The local byte-level tokenizer: byte ids, special tokens, the Qwen-style chat template and its prefix
stability, determinism, and the save / AutoTokenizer round trip."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from jinja2 import TemplateError
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from sao.models.tokenizer import SPECIAL_TOKENS, build_tokenizer, padded_vocab_size

TOOLS = [{"type": "function", "function": {"name": "python", "parameters": {"type": "object"}}}]
CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 6 × 7? Use the tool."},
    {
        "role": "assistant",
        "content": "Computing.",
        "reasoning_content": "Multiply.",
        "tool_calls": [{"type": "function", "function": {"name": "python", "arguments": {"code": "6*7"}}}],
    },
    {"role": "tool", "content": "42"},
    {"role": "assistant", "content": "", "tool_calls": [{"name": "python", "arguments": '{"code": "7*6"}'}]},
    {"role": "tool", "content": "42"},
    {"role": "tool", "content": "(again) 42"},
    {"role": "assistant", "content": "42 <|im_end|> is the answer."},
    {"role": "user", "content": "Thanks!"},
    {"role": "assistant", "content": "You're welcome."},
]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer()


def _render(tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)


def test_text_ids_are_its_utf8_bytes_and_decode_back(tokenizer: PreTrainedTokenizerFast) -> None:
    text = "héllo, 世界!\n\t 🙂"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids == list(text.encode("utf-8"))
    assert tokenizer.decode(ids) == text


def test_special_tokens_follow_the_bytes_in_qwen_order(tokenizer: PreTrainedTokenizerFast) -> None:
    names = [content for content, _ in SPECIAL_TOKENS]
    assert tokenizer.convert_tokens_to_ids(names) == list(range(256, 256 + len(names)))
    assert len(tokenizer) == 265 and padded_vocab_size(tokenizer) == 320
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.pad_token_id == 256
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 258
    assert tokenizer.bos_token is None


def test_special_tokens_are_single_ids_and_only_im_tokens_are_skipped_on_decode(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    text = "<|im_start|>a<tool_call>b</tool_call><think>c</think><|im_end|>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids == [257, 97, 259, 98, 260, 263, 99, 264, 258]
    assert tokenizer.decode(ids) == text
    # As in Qwen3: tool-call and think markers survive skip_special_tokens, the turn markers do not.
    assert tokenizer.decode(ids, skip_special_tokens=True) == "a<tool_call>b</tool_call><think>c</think>"


def test_build_is_deterministic() -> None:
    first, second = build_tokenizer(), build_tokenizer()
    assert first.backend_tokenizer.to_str() == second.backend_tokenizer.to_str()
    assert first.chat_template == second.chat_template


def test_chat_template_renders_qwen_turns(tokenizer: PreTrainedTokenizerFast) -> None:
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": "A", "reasoning_content": "R"},
        {"role": "tool", "content": "T"},
    ]
    expected = (
        "<|im_start|>system\nS<|im_end|>\n"
        "<|im_start|>user\nU<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nR\n</think>\n\nA<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nT\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert _render(tokenizer, messages, add_generation_prompt=True) == expected
    no_think = _render(tokenizer, messages[:2], add_generation_prompt=True, enable_thinking=False)
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_chat_template_renders_tools_and_tool_calls(tokenizer: PreTrainedTokenizerFast) -> None:
    text = _render(tokenizer, CONVERSATION[:5], tools=TOOLS)
    assert text.startswith("<|im_start|>system\nYou are terse.\n\n# Tools\n")
    assert '\n<tools>\n{"type": "function", "function": {"name": "python"' in text
    assert (
        'Computing.\n<tool_call>{"name": "python", "arguments": {"code": "6*7"}}</tool_call><|im_end|>'
        in text
    )
    # String arguments are inserted verbatim; no newline before the first call of an empty message.
    call = '<tool_call>{"name": "python", "arguments": {"code": "7*6"}}</tool_call>'
    assert f"<|im_start|>assistant\n{call}" in text
    assert _render(tokenizer, CONVERSATION[1:2], tools=TOOLS).count("<|im_start|>system\n# Tools") == 1


def test_unknown_role_or_late_system_message_is_an_error(tokenizer: PreTrainedTokenizerFast) -> None:
    with pytest.raises(TemplateError, match="unknown message role"):
        _render(tokenizer, [{"role": "critic", "content": "x"}])
    with pytest.raises(TemplateError, match="system"):
        _render(tokenizer, [{"role": "user", "content": "x"}, {"role": "system", "content": "y"}])


@pytest.mark.parametrize("tools", [None, TOOLS], ids=["no-tools", "tools"])
def test_rendering_is_prefix_stable_in_tokens(
    tokenizer: PreTrainedTokenizerFast, tools: list[dict[str, Any]] | None
) -> None:
    """messages[:k] renders to a token prefix of messages[:k+1]; with a generation prompt too, when
    message k is the assistant's (the prompt + sampled tokens of an RL turn are the next rendering)."""

    def ids(messages: list[dict[str, Any]], generation_prompt: bool) -> list[int]:
        text = _render(tokenizer, messages, tools=tools, add_generation_prompt=generation_prompt)
        return tokenizer.encode(text, add_special_tokens=False)

    for k in range(1, len(CONVERSATION)):
        longer = ids(CONVERSATION[: k + 1], False)
        shorter = ids(CONVERSATION[:k], False)
        assert longer[: len(shorter)] == shorter, f"messages[:{k}] is not a prefix"
        if CONVERSATION[k]["role"] == "assistant":
            prompt = ids(CONVERSATION[:k], True)
            assert len(prompt) > len(shorter) and longer[: len(prompt)] == prompt, (
                f"prompt before message {k}"
            )


def test_save_and_auto_tokenizer_round_trip(tokenizer: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert loaded.chat_template == tokenizer.chat_template
    assert len(loaded) == len(tokenizer)
    assert (loaded.pad_token_id, loaded.eos_token_id, loaded.bos_token_id) == (256, 258, None)
    text = _render(tokenizer, CONVERSATION, tools=TOOLS)
    assert _render(loaded, CONVERSATION, tools=TOOLS) == text
    assert loaded.encode(text, add_special_tokens=False) == tokenizer.encode(text, add_special_tokens=False)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert loaded.decode(ids, skip_special_tokens=True) == tokenizer.decode(ids, skip_special_tokens=True)
