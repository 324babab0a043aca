"""The shipped chat templates behave like the real ones (qwen3: earlier reasoning stripped, tool results
merged, tools in the system turn, empty think block when thinking is off; hermes: default system prompt,
one turn per tool result), are not prefix-stable, and still work with token-in/token-out
(`sao.models.chat_delta`); loading templates by name or file and binding ``enable_thinking``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import PreTrainedTokenizerFast

from sao.models.bpe import build_bpe_tokenizer
from sao.models.chat_delta import assistant_text, observation_delta
from sao.models.templates import SHIPPED, bind_template_variables, load_chat_template
from sao.models.tokenizer import CHAT_TEMPLATE

EOT = "<|im_end|>"
TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
THINKING_CALL = '<think>\nuse the calc tool\n</think>\n\n<tool_call>{"name": "calc"}</tool_call>'
# A math_tir-like episode: a thinking turn, two tool results, a nudge, a final thinking answer.
EPISODE: list[dict[str, Any]] = [
    {"role": "user", "content": "What is 2+3?"},
    {"role": "assistant", "content": THINKING_CALL},
    {"role": "tool", "content": "5"},
    {"role": "tool", "content": "6"},
    {"role": "assistant", "content": "Done.", "reasoning_content": "both ran"},
    {"role": "user", "content": "Give a final answer."},
    {"role": "assistant", "content": "<think>\nit is 5\n</think>\n\nanswer: 5"},
]


def _tokenizer(name: str) -> PreTrainedTokenizerFast:
    return build_bpe_tokenizer(load_chat_template(name))


@pytest.fixture(scope="module")
def qwen3() -> PreTrainedTokenizerFast:
    return _tokenizer("qwen3")


@pytest.fixture(scope="module")
def hermes() -> PreTrainedTokenizerFast:
    return _tokenizer("hermes")


def _thinking_off(tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """``tokenizer`` with ``enable_thinking = false`` bound into its template (as a run binds it)."""
    return build_bpe_tokenizer(bind_template_variables(tokenizer.chat_template, enable_thinking=False))


def _render(tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)


def test_qwen3_keeps_reasoning_only_after_the_last_user_query(qwen3: PreTrainedTokenizerFast) -> None:
    text = _render(qwen3, EPISODE)
    assert text == (
        "<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>{"name": "calc"}</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n6\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nDone.<|im_end|>\n"
        "<|im_start|>user\nGive a final answer.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nit is 5\n</think>\n\nanswer: 5<|im_end|>\n"
    )
    # Without the nudge, every turn after the question is part of the current query: reasoning kept.
    multi_step = _render(qwen3, EPISODE[:5])
    assert "<think>\nuse the calc tool\n</think>\n\n<tool_call>" in multi_step
    assert "<|im_start|>assistant\n<think>\nboth ran\n</think>\n\nDone.<|im_end|>" in multi_step


def test_qwen3_puts_tools_in_the_system_turn_and_formats_structured_calls(
    qwen3: PreTrainedTokenizerFast,
) -> None:
    call = {"type": "function", "function": {"name": "calc", "arguments": {"expr": "2+3"}}}
    messages = [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Add."},
        {"role": "assistant", "content": "", "tool_calls": [call, call]},
    ]
    text = _render(qwen3, messages, tools=TOOLS)
    system = text[: text.index("<|im_start|>user")]
    assert system.startswith("<|im_start|>system\nBe terse.\n\n# Tools\n")
    assert '\n<tools>\n{"type": "function", "function": {"name": "calc", ' in system
    assert "</tools>" in system and "<tool_call>" in system and system.endswith("<|im_end|>\n")
    json_call = '<tool_call>\n{"name": "calc", "arguments": {"expr": "2+3"}}\n</tool_call>'
    assert text.endswith(
        f"<|im_start|>assistant\n<think>\n\n</think>\n\n{json_call}\n{json_call}<|im_end|>\n"
    )
    assert _render(qwen3, messages[1:2]) == "<|im_start|>user\nAdd.<|im_end|>\n"  # no tools, no system


def test_qwen3_generation_prompt_has_an_empty_think_block_when_thinking_is_off(
    qwen3: PreTrainedTokenizerFast,
) -> None:
    question = EPISODE[:1]
    prompt = "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    assert _render(qwen3, question, add_generation_prompt=True) == prompt
    assert _render(qwen3, question, add_generation_prompt=True, enable_thinking=True) == prompt
    off = prompt + "<think>\n\n</think>\n\n"
    assert _render(qwen3, question, add_generation_prompt=True, enable_thinking=False) == off
    bound = build_bpe_tokenizer(bind_template_variables(qwen3.chat_template, enable_thinking=False))
    # The bound value wins over what a caller passes.
    assert _render(bound, question, add_generation_prompt=True, enable_thinking=True) == off
    rebound = build_bpe_tokenizer(bind_template_variables(bound.chat_template, enable_thinking=True))
    assert _render(rebound, question, add_generation_prompt=True) == prompt


def test_bind_template_variables_prepends_one_binding() -> None:
    bound = bind_template_variables("T", enable_thinking=True)
    assert bound == "{%- set enable_thinking = true -%}\nT"
    assert bind_template_variables(bound, enable_thinking=False) == "{%- set enable_thinking = false -%}\nT"


@pytest.mark.parametrize(
    ("n", "why"),
    [
        (2, "the last turn's empty think block goes"),
        (3, "the tool results merge"),
        (5, "reasoning is stripped"),
    ],
)
def test_qwen3_is_not_prefix_stable(qwen3: PreTrainedTokenizerFast, n: int, why: str) -> None:
    """The rendering of ``messages[:n]`` is not a prefix of the rendering of ``messages[:n+1]``."""
    messages = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}, *EPISODE[2:]]
    shorter, longer = _render(qwen3, messages[:n]), _render(qwen3, messages[: n + 1])
    assert not longer.startswith(shorter), why


def test_observation_delta_with_qwen3_is_the_rendering_of_the_new_messages(
    qwen3: PreTrainedTokenizerFast,
) -> None:
    tools = EPISODE[2:4]
    delta = observation_delta(qwen3, tools, None, EOT, turn_ended=True)
    assert delta == (
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n6\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    nudge = [{"role": "user", "content": "Give a final answer."}]
    cut = observation_delta(_thinking_off(qwen3), nudge, TOOLS, EOT, turn_ended=False)
    assert cut == (
        "<|im_end|>\n<|im_start|>user\nGive a final answer.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    # Token-in/token-out: the episode keeps the generated reasoning a re-rendering would strip.
    prompt = _render(qwen3, EPISODE[:1], add_generation_prompt=True)
    generated = THINKING_CALL + EOT
    episode = prompt + generated + observation_delta(qwen3, nudge, None, EOT, turn_ended=True)
    rerendered = _render(qwen3, [*EPISODE[:2], *nudge], add_generation_prompt=True)
    assert "use the calc tool" in episode and "use the calc tool" not in rerendered
    assert episode.endswith(rerendered[rerendered.index(EOT) + len(EOT) :].split(EOT, 1)[1])


def test_assistant_text_with_qwen3_is_the_turn_as_generated(qwen3: PreTrainedTokenizerFast) -> None:
    thinking = {"role": "assistant", "content": "<think>\nit is 5\n</think>\n\nanswer: 5"}
    assert assistant_text(qwen3, thinking, None, EOT) == thinking["content"] + EOT
    split = {"role": "assistant", "content": "answer: 5", "reasoning_content": "it is 5"}
    assert assistant_text(qwen3, split, None, EOT) == thinking["content"] + EOT
    plain = {"role": "assistant", "content": "answer: 5"}
    assert assistant_text(qwen3, plain, None, EOT) == "<think>\n\n</think>\n\nanswer: 5" + EOT
    assert assistant_text(_thinking_off(qwen3), plain, None, EOT) == "answer: 5" + EOT


def test_hermes_injects_a_default_system_prompt_and_gives_each_tool_result_a_turn(
    hermes: PreTrainedTokenizerFast,
) -> None:
    text = _render(hermes, EPISODE[:4], add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
        f"<|im_start|>assistant\n{THINKING_CALL}<|im_end|>\n"
        "<|im_start|>tool\n<tool_response>\n5\n</tool_response><|im_end|>\n"
        "<|im_start|>tool\n<tool_response>\n6\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    own = _render(hermes, [{"role": "system", "content": "Be terse."}, *EPISODE[:1]], tools=TOOLS)
    assert own.startswith("<|im_start|>system\nBe terse.\n\n") and "You are a helpful" not in own
    assert '<tools>\n{"type": "function"' in own and own.count("<|im_start|>system") == 1
    delta = observation_delta(hermes, EPISODE[2:4], TOOLS, EOT, turn_ended=True)
    assert delta.count("<|im_start|>tool\n") == 2 and delta.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_shipped_template_closes_an_assistant_turn_right_after_its_content(name: str) -> None:
    tokenizer = _tokenizer(name)
    message = {"role": "assistant", "content": '<tool_call>{"name": "calc"}</tool_call>'}
    assert assistant_text(_thinking_off(tokenizer), message, TOOLS, EOT) == message["content"] + EOT
    for new in ([{"role": "tool", "content": "5"}], [{"role": "user", "content": "More?"}], []):
        delta = observation_delta(tokenizer, new, TOOLS, EOT, turn_ended=True)
        assert delta.endswith("<|im_start|>assistant\n")


def test_load_chat_template_by_name_or_file(tmp_path: Path) -> None:
    assert load_chat_template("sao") == CHAT_TEMPLATE
    for name in ("qwen3", "hermes"):
        assert load_chat_template(name) == (Path(__file__).parents[2] / "src/sao/models/chat_templates" /
                                            f"{name}.jinja").read_text()  # fmt: skip
    custom = tmp_path / "mine.jinja"
    custom.write_text("{{ messages[0].content }}")
    assert load_chat_template(str(custom)) == "{{ messages[0].content }}"
    with pytest.raises(ValueError, match=r"'qwen4'.*hermes, qwen3, qwen3_coder, sao"):
        load_chat_template("qwen4")
    with pytest.raises(ValueError, match=r"missing\.jinja"):
        load_chat_template(str(tmp_path / "missing.jinja"))
    (tmp_path / "empty.jinja").write_text("  \n")
    with pytest.raises(ValueError, match="empty"):
        load_chat_template(str(tmp_path / "empty.jinja"))


def test_sao_template_with_thinking_off_renders_turns_as_generated_and_stays_prefix_stable() -> None:
    tokenizer = build_bpe_tokenizer(load_chat_template("sao"))
    off = {"enable_thinking": False}
    messages = [EPISODE[0], {"role": "assistant", "content": "answer: 5"}, EPISODE[2], EPISODE[5]]
    prompt = _render(tokenizer, messages[:1], add_generation_prompt=True, **off)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    for n in range(1, len(messages)):
        assert _render(tokenizer, messages[: n + 1], **off).startswith(
            _render(tokenizer, messages[:n], **off)
        )
    assert _render(tokenizer, messages[:2], **off) == prompt + "answer: 5<|im_end|>\n"
    thinking = {"role": "assistant", "content": "<think>\nhm\n</think>\n\nanswer: 5"}
    assert _render(tokenizer, [EPISODE[0], thinking]).endswith(
        "assistant\n" + thinking["content"] + EOT + "\n"
    )
