"""The byte-level tokenizer with Qwen-style special tokens and its chat template, built locally (no download);
`build_named_tokenizer` picks it or the BPE one (`sao.models.bpe`) by name.

The byte tokenizer is the default of tiny models (``model.tiny_tokenizer: byte``). Its vocabulary is the 256
bytes (token id == byte value, GPT-2's byte-to-unicode alphabet, no merges), then the special tokens in
Qwen's relative order from id 256. With no merges, the ids of a text are its UTF-8 bytes, so any text
prefix is a token prefix (until a special token straddles the cut) and building the tokenizer is
deterministic: identical on every run and machine. ``tiny_tokenizer: bpe`` is the realistic alternative,
where a merge can span two messages.

Its chat template (`CHAT_TEMPLATE`, shipped as ``sao`` by `sao.models.templates`) follows Qwen3's turn
format (``<|im_start|>role\\n…<|im_end|>\\n``, tools in the system turn, tool calls as ``<tool_call>`` JSON,
tool results as user turns wrapped in ``<tool_response>``). The tools block is only the signatures
(``# Tools`` and one JSON line per tool inside ``<tools>``), without Qwen3's English instructions on how to
call them: with a byte-level tokenizer every byte is a prompt token, and the tiny models learn the call
format from their warm start. A structured tool call (an assistant message's ``tool_calls``) renders as
``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, without Qwen3's newlines inside the tags: the
format sao's tiny models generate (`sao.envs.calculator`). It is also *prefix-stable* (the rendering of
``messages[:k]`` is a prefix of the rendering of ``messages[:k+1]``): earlier ``reasoning_content`` is never
stripped and each tool message is its own user turn. With ``enable_thinking`` false, every assistant turn
without reasoning opens with the empty think block the generation prompt ends with (as Qwen3 renders its
last turn), so a turn renders as it was generated. Token-in/token-out no longer needs that
(`sao.models.chat_delta` renders only the new messages, as a suffix), so any template works, such as the
shipped ``qwen3`` one that strips earlier reasoning and merges tool results.
"""

from __future__ import annotations

from typing import Any, Literal

from transformers import PreTrainedTokenizerFast

__all__ = [
    "EOS_TOKEN",
    "PAD_TOKEN",
    "SPECIAL_TOKENS",
    "TOKENIZER_KINDS",
    "TokenizerKind",
    "add_qwen_tokens",
    "build_tokenizer",
    "padded_vocab_size",
]

PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
# (content, special): special tokens are dropped by ``decode(skip_special_tokens=True)``; the tool and
# think markers are not, as in Qwen3, so decoded text still shows tool calls and reasoning.
SPECIAL_TOKENS: tuple[tuple[str, bool], ...] = (
    (PAD_TOKEN, True),
    ("<|im_start|>", True),
    (EOS_TOKEN, True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)

CHAT_TEMPLATE = """\
{%- if messages and messages[0].role == 'system' -%}
  {%- set system_text = messages[0].content or '' -%}
{%- else -%}
  {%- set system_text = none -%}
{%- endif -%}
{%- if tools -%}
  {{- '<|im_start|>system\\n' -}}
  {%- if system_text is not none -%}{{- system_text + '\\n\\n' -}}{%- endif -%}
  {{- '# Tools\\n<tools>' -}}
  {%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}
  {{- '\\n</tools><|im_end|>\\n' -}}
{%- elif system_text is not none -%}
  {{- '<|im_start|>system\\n' + system_text + '<|im_end|>\\n' -}}
{%- endif -%}
{%- for message in messages -%}
  {%- if message.role == 'system' -%}
    {%- if not loop.first -%}
      {{- raise_exception('only the first message may have role system') -}}
    {%- endif -%}
  {%- elif message.role == 'user' -%}
    {{- '<|im_start|>user\\n' + (message.content or '') + '<|im_end|>\\n' -}}
  {%- elif message.role == 'tool' -%}
    {{- '<|im_start|>user\\n<tool_response>\\n' + (message.content or '')
        + '\\n</tool_response><|im_end|>\\n' -}}
  {%- elif message.role == 'assistant' -%}
    {{- '<|im_start|>assistant\\n' -}}
    {%- if message.reasoning_content is defined and message.reasoning_content is not none -%}
      {{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' -}}
    {%- elif enable_thinking is defined and enable_thinking is false
             and not (message.content or '').startswith('<think>') -%}
      {{- '<think>\\n\\n</think>\\n\\n' -}}
    {%- endif -%}
    {{- message.content or '' -}}
    {%- if message.tool_calls is defined and message.tool_calls -%}
      {%- for call in message.tool_calls -%}
        {%- if call.function is defined -%}{%- set call = call.function -%}{%- endif -%}
        {%- if message.content or not loop.first -%}{{- '\\n' -}}{%- endif -%}
        {{- '<tool_call>{"name": "' + call.name + '", "arguments": ' -}}
        {%- if call.arguments is string -%}{{- call.arguments -}}
        {%- else -%}{{- call.arguments | tojson -}}{%- endif -%}
        {{- '}</tool_call>' -}}
      {%- endfor -%}
    {%- endif -%}
    {{- '<|im_end|>\\n' -}}
  {%- else -%}
    {{- raise_exception('unknown message role: ' + message.role) -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\\n' -}}
  {%- if enable_thinking is defined and enable_thinking is false -%}
    {{- '<think>\\n\\n</think>\\n\\n' -}}
  {%- endif -%}
{%- endif -%}
"""


def _byte_alphabet() -> list[str]:
    """GPT-2's byte-to-unicode map as a list: entry b is the printable character that stands for byte b."""
    printable = {
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    }
    alphabet, shifted = [], 0
    for byte in range(256):
        if byte in printable:
            alphabet.append(chr(byte))
        else:
            alphabet.append(chr(256 + shifted))
            shifted += 1
    return alphabet


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The byte-level tokenizer: ids 0..255 are bytes, 256.. the `SPECIAL_TOKENS`; pad ``<|endoftext|>``,
    eos ``<|im_end|>``, no bos; `CHAT_TEMPLATE` as its chat template. Deterministic, built offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: byte for byte, char in enumerate(_byte_alphabet())}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    # No merges, so splitting words first would not change any id: skip the regex.
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    add_qwen_tokens(backend)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=None,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


TokenizerKind = Literal["byte", "bpe"]
TOKENIZER_KINDS: tuple[str, ...] = ("byte", "bpe")


def padded_vocab_size(tokenizer: PreTrainedTokenizerFast, multiple: int = 64) -> int:
    """``len(tokenizer)`` rounded up to a multiple of ``multiple`` (the model's embedding rows)."""
    return -(-len(tokenizer) // multiple) * multiple


def add_qwen_tokens(backend: Any) -> None:
    """Add `SPECIAL_TOKENS` to a `tokenizers.Tokenizer` after its vocabulary, in order: special ones as
    special tokens (skipped by ``decode(skip_special_tokens=True)``), the markers as plain added tokens."""
    from tokenizers import AddedToken

    for content, special in SPECIAL_TOKENS:
        token = AddedToken(content, special=special, normalized=False)
        if special:
            backend.add_special_tokens([token])
        else:
            backend.add_tokens([token])
