"""The locally trained BPE tokenizer: determinism, vocabulary layout, real merges (also across a boundary),
lossless round trip, independent copies, and a tiny checkpoint built with it by `sao init-model`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import PreTrainedTokenizerFast
from typer.testing import CliRunner

from sao.cli import app
from sao.config import ModelConfig
from sao.models.bpe import VOCAB_SIZE, build_bpe_tokenizer, train_bpe, training_corpus
from sao.models.loading import load_policy, load_tokenizer, model_from_config
from sao.models.templates import load_chat_template
from sao.models.tiny import build_named_tokenizer
from sao.models.tokenizer import SPECIAL_TOKENS, build_tokenizer, padded_vocab_size

MARKERS = [content for content, _ in SPECIAL_TOKENS]


@pytest.fixture(scope="module")
def bpe() -> PreTrainedTokenizerFast:
    return build_bpe_tokenizer()


def _ids(tokenizer: PreTrainedTokenizerFast, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_training_twice_gives_the_same_vocabulary_and_merges(bpe: PreTrainedTokenizerFast) -> None:
    first, second = train_bpe().to_str(), train_bpe().to_str()
    assert first == second
    trained, built = json.loads(first), json.loads(bpe.backend_tokenizer.to_str())
    assert (built["model"], built["added_tokens"]) == (trained["model"], trained["added_tokens"])
    assert len(trained["model"]["merges"]) > 3000  # "a few thousand merges"


def test_vocabulary_is_bytes_then_merges_then_special_tokens_in_qwen_order(
    bpe: PreTrainedTokenizerFast,
) -> None:
    assert len(bpe) == VOCAB_SIZE == padded_vocab_size(bpe) == 4096
    learned = VOCAB_SIZE - len(SPECIAL_TOKENS)
    assert bpe.convert_tokens_to_ids(MARKERS) == list(range(learned, VOCAB_SIZE))
    assert (bpe.pad_token, bpe.eos_token, bpe.bos_token) == ("<|endoftext|>", "<|im_end|>", None)
    byte_symbols = build_tokenizer().convert_ids_to_tokens(list(range(256)))
    assert all(bpe.convert_tokens_to_ids(symbol) < learned for symbol in byte_symbols)
    # Training never saw a marker (the corpus is cut at them), so no learned token holds a piece of one.
    assert not any("im_" in token for token in bpe.convert_ids_to_tokens(list(range(learned))))
    assert not any(marker in piece for piece in training_corpus()[:2000] for marker in MARKERS)


def test_frequent_env_text_is_merged_into_few_tokens(bpe: PreTrainedTokenizerFast) -> None:
    for word in ("answer", " answer", "\n\n", "print", " tool", '"}}\n'):
        assert len(_ids(bpe, word)) == 1, word
    assert _ids(bpe, "<tool_call>") == [bpe.convert_tokens_to_ids("<tool_call>")]
    call = '<tool_call>{"name": "calc", "arguments": {"expr": "12*34"}}</tool_call>'
    messages = [
        {"role": "user", "content": "What is 12 * 34?"},
        {"role": "assistant", "content": call},
        {"role": "tool", "content": "408"},
    ]
    text = bpe.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert len(_ids(bpe, text)) < 0.45 * len(text.encode())
    # Qwen's pre-tokenizer keeps every digit its own token.
    assert _ids(bpe, "408") == [_ids(bpe, d)[0] for d in "408"]


@pytest.mark.parametrize(("left", "right"), [("\n", "\n"), ('"}}', "\n"), (".", "\n\n"), ("high", "er")])
def test_a_merge_spans_the_boundary_between_two_pieces(
    bpe: PreTrainedTokenizerFast, left: str, right: str
) -> None:
    """Tokenizing two texts apart differs from tokenizing them together (unlike the byte tokenizer):
    the reason episodes keep the engine's tokens instead of re-tokenizing text."""
    assert _ids(bpe, left) + _ids(bpe, right) != _ids(bpe, left + right)
    assert bpe.decode(_ids(bpe, left + right)) == left + right
    byte = build_tokenizer()
    assert _ids(byte, left) + _ids(byte, right) == _ids(byte, left + right)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.text(), st.sampled_from(MARKERS)), max_size=6).map("".join))
def test_decode_inverts_encode_for_any_text(bpe: PreTrainedTokenizerFast, text: str) -> None:
    assert bpe.decode(_ids(bpe, text)) == text


def test_each_build_is_an_independent_copy_with_the_qwen3_template() -> None:
    first = build_bpe_tokenizer()
    assert first.chat_template == load_chat_template("qwen3")
    first.chat_template = "changed"
    first.add_tokens(["<extra>"])
    second = build_bpe_tokenizer()
    assert second.chat_template == load_chat_template("qwen3") and len(second) == VOCAB_SIZE
    assert build_bpe_tokenizer("{{ 'T' }}").chat_template == "{{ 'T' }}"


def test_named_tokenizers() -> None:
    assert len(build_named_tokenizer("byte")) == 265
    assert build_named_tokenizer("byte", "{{ 'T' }}").chat_template == "{{ 'T' }}"
    assert len(build_named_tokenizer("bpe")) == VOCAB_SIZE
    with pytest.raises(ValueError, match="sentencepiece"):
        build_named_tokenizer("sentencepiece")  # type: ignore[arg-type]


def test_init_model_with_bpe_writes_a_loadable_checkpoint(tmp_path: Path) -> None:
    """The Makefile's ``demo-bpe`` invocation: the checkpoint's tokenizer is the BPE one with the qwen3
    template, its model covers every token id, and a bad option writes nothing."""
    out = tmp_path / "base"
    args = ["init-model", "--arch", "qwen3_moe", "--size", "small", "--tokenizer", "bpe"]
    result = CliRunner().invoke(app, [*args, "--chat-template", "qwen3", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "bpe tokenizer" in result.output
    tokenizer = load_tokenizer(out)
    assert len(tokenizer) == VOCAB_SIZE
    assert tokenizer.chat_template == load_chat_template("qwen3")
    assert _ids(tokenizer, "\n\n") == _ids(build_bpe_tokenizer(), "\n\n")
    assert load_tokenizer(out, chat_template="hermes").chat_template == load_chat_template("hermes")
    model = load_policy(out, dtype="float32", device="cpu")
    assert model.config.vocab_size >= len(tokenizer) and model.config.vocab_size % 64 == 0
    assert (model.config.pad_token_id, model.config.eos_token_id) == (
        tokenizer.pad_token_id,
        tokenizer.eos_token_id,
    )
    with torch.no_grad():
        logits = model(torch.tensor([[0, len(tokenizer) - 1]])).logits
    assert logits.shape == (1, 2, model.config.vocab_size)
    for bad, named in ((["--tokenizer", "wordpiece"], "wordpiece"), (["--chat-template", "nope"], "nope")):
        result = CliRunner().invoke(app, ["init-model", *bad, "--out", str(tmp_path / "bad")])
        assert result.exit_code == 2 and named in result.output
        assert not (tmp_path / "bad").exists()


def test_model_from_config_keeps_one_cached_checkpoint_per_tokenizer(tmp_path: Path) -> None:
    byte = model_from_config(ModelConfig(tiny_arch="qwen3", tiny_size="test"), tmp_path)
    bpe = model_from_config(ModelConfig(tiny_arch="qwen3", tiny_size="test", tiny_tokenizer="bpe"), tmp_path)
    assert byte != bpe and "-bpe-" in bpe.name
    assert len(load_tokenizer(byte)) == 265 and len(load_tokenizer(bpe)) == VOCAB_SIZE
    assert json.loads((bpe / "config.json").read_text())["vocab_size"] == VOCAB_SIZE
