"""A byte-level BPE tokenizer trained locally on sao's own env conversations (no download).

Where `sao.models.tokenizer`'s byte tokenizer has no merges (every text prefix is a token prefix), this one
behaves like a real model's: Qwen2's pre-tokenizer regex (letters run together, each digit alone,
punctuation with its trailing newlines, runs of newlines), byte-level BPE on top, so ``\\n\\n``, ``"}}\\n``
(the end of a tool call's JSON and a newline) or a word split across two messages tokenize differently in
one piece than in parts.

Training text: a deterministic corpus of episodes in the formats of sao's envs (calculator tool calls with
and without the tool schema, math_tir word problems solved with Python blocks and ``\\boxed`` answers and
its nudge, guess_number, style_shift replies), some with ``<think>`` blocks, rendered with the shipped
``qwen3`` chat template. The text is split at the special and marker tokens (`SPECIAL_TOKENS`), as the
tokenizer splits it at encode time, so no merge spans one. Those envs have only a few hundred distinct
words, so filler text (other scripts, a made-up lexicon; `_filler`) gives the vocabulary the share of
tokens a task never uses that a real tokenizer has.

Vocabulary: the 256 byte symbols (GPT-2's byte-to-unicode alphabet), then the learned merges, then the
`SPECIAL_TOKENS` in Qwen's relative order; `VOCAB_SIZE` ids in all. Training is deterministic (same
vocabulary and merges on every run and machine, for a given sao and `tokenizers` version) and takes 1-2 s;
the trained tokenizer is cached per process and `build_bpe_tokenizer` returns a fresh, independent object
each call.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from transformers import PreTrainedTokenizerFast

from sao.models.tokenizer import EOS_TOKEN, PAD_TOKEN, SPECIAL_TOKENS, add_qwen_tokens

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = ["QWEN2_PATTERN", "VOCAB_SIZE", "build_bpe_tokenizer", "train_bpe", "training_corpus"]

# Qwen2's pre-tokenizer split (as in its tokenizer.json): contractions, letters with one leading non-letter,
# single digits, punctuation runs with their newlines, newline runs, other whitespace.
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
VOCAB_SIZE = 4096  # bytes + merges + SPECIAL_TOKENS, a multiple of 64 (the model's embedding rows)
_CORPUS_SEED = 0
Message = dict[str, Any]
Conversation = tuple[list[Message], bool]  # (messages, whether the calc tool schema is in the prompt)


def _think(rng: random.Random, text: str, thought: str) -> str:
    """``text`` with a ``<think>`` block before it half of the time (as `sao.envs.sft_data.thinking`)."""
    return f"<think>\n{thought}\n</think>\n\n{text}" if rng.random() < 0.5 else text


def _calculator(rng: random.Random, n: int) -> Iterator[Conversation]:
    from sao.envs import calculator

    for task in calculator.make_tasks(n, _CORPUS_SEED):
        a, op, b = task.metadata["a"], task.metadata["op"], task.metadata["b"]
        messages: list[Message] = [{"role": "user", "content": str(task.prompt)}]
        if rng.random() < 0.1:
            messages.insert(0, {"role": "system", "content": calculator.SYSTEM_PROMPT})
        if rng.random() < 0.2:  # a direct answer, sometimes after a reply without a number
            if rng.random() < 0.3:
                messages += [
                    {"role": "assistant", "content": _think(rng, "I am not sure.", "answer now")},
                    {"role": "user", "content": "error: reply answer: <number>"},
                ]
            value = task.answer + rng.choice((0, 0, -1, 1))
            messages.append(
                {"role": "assistant", "content": _think(rng, calculator.answer_text(value), "answer now")}
            )
            yield messages, rng.random() < 0.5
            continue
        exprs = [f"{a}{op}{b}"] + ([f"{b}{op}{a}"] if rng.random() < 0.2 else [])
        if rng.random() < 0.25:  # a structured call, as an OpenAI client sends it back
            calls = [
                {"type": "function", "function": {"name": "calc", "arguments": {"expr": e}}} for e in exprs
            ]
            messages.append({"role": "assistant", "content": "", "tool_calls": calls})
        else:
            text = "".join(calculator.tool_call_text(e) for e in exprs)
            messages.append({"role": "assistant", "content": _think(rng, text, "use the calc tool")})
        messages += [{"role": "tool", "content": str(calculator.evaluate(e))} for e in exprs]
        messages.append(
            {"role": "assistant", "content": _think(rng, calculator.answer_text(task.answer), "answer now")}
        )
        yield messages, rng.random() < 0.5


_NAMES = ("Maya", "Sam", "Lena", "Omar", "Priya", "Tom", "Ana", "Kofi", "Yuki", "Ravi", "Elena", "Jonas")
_ITEMS = ("muffins", "pencils", "apples", "tickets", "notebooks", "cookies", "stamps", "marbles")
# (problem, python code, answer) from drawn integers a, b, c (1..99) and a name / item.
_PROBLEMS: tuple[tuple[str, str, Callable[[int, int, int], object]], ...] = (
    (
        "A shop sells {item} for ${a} each. {name} buys {b} of them. How many dollars does {name} spend?",
        "price = {a}\ncount = {b}\nprint(price * count)",
        lambda a, b, c: a * b,
    ),
    (
        "{name} reads {a} pages a day for {b} days. How many pages has {name} read in total?",
        "pages_per_day = {a}\ndays = {b}\ntotal = pages_per_day * days\nprint(total)",
        lambda a, b, c: a * b,
    ),
    (
        "What is the remainder when {a}^{b} is divided by {c}?",
        "print(pow({a}, {b}, {c}))",
        lambda a, b, c: pow(a, b, c),
    ),
    (
        "How many positive integers less than {c}0 are divisible by {a} or by {b}?",
        "count = sum(1 for k in range(1, {c}0) if k % {a} == 0 or k % {b} == 0)\nprint(count)",
        lambda a, b, c: sum(1 for k in range(1, c * 10) if k % a == 0 or k % b == 0),
    ),
    (
        "A rectangle has a length of {a} cm and a width of {b} cm. What is its area in square centimetres?",
        "length, width = {a}, {b}\narea = length * width\nprint(area)",
        lambda a, b, c: a * b,
    ),
    (
        "What is the greatest common divisor of {a} and {b}?",
        "import math\n\nprint(math.gcd({a}, {b}))",
        lambda a, b, c: math.gcd(a, b),
    ),
    (
        "Find the sum of all even numbers from 1 to {a}.",
        "total = sum(range(2, {a} + 1, 2))\nprint(total)",
        lambda a, b, c: sum(range(2, a + 1, 2)),
    ),
    (
        "In how many ways can {c} people be chosen from a group of {a}?",
        "from math import comb\n\nprint(comb({a}, {c}))",
        lambda a, b, c: math.comb(a, c),
    ),
    (
        "Solve for x: {a}x + {b} = {a}*{c} + {b}.",
        "from sympy import symbols, solve\n\nx = symbols('x')\n"
        "print(solve({a}*x + {b} - ({a}*{c} + {b}), x))",
        lambda a, b, c: f"[{c}]",
    ),
    (
        "The sum of three consecutive integers is {a}*3. What is the largest of them?",
        "for x in range(-1000, 1000):\n    if x + (x + 1) + (x + 2) == {a} * 3:\n        print(x + 2)",
        lambda a, b, c: a + 1,
    ),
)
_TRACEBACK = (
    '[stderr]\nTraceback (most recent call last):\n  File "<string>", line 2, in <module>\n'
    "NameError: name 'total' is not defined\n[exit code 1]"
)


def _math_tir(rng: random.Random, n: int) -> Iterator[Conversation]:
    from sao.envs.math_tir import MATH_TIR_SYSTEM_PROMPT, NUDGE

    for _ in range(n):
        problem, code, solve = rng.choice(_PROBLEMS)
        a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 9)
        fields = {"a": a, "b": b, "c": c, "name": rng.choice(_NAMES), "item": rng.choice(_ITEMS)}
        output = str(solve(a, b, c))
        answer = output.strip("[]")
        messages: list[Message] = [{"role": "user", "content": problem.format(**fields)}]
        if rng.random() < 0.8:
            messages.insert(0, {"role": "system", "content": MATH_TIR_SYSTEM_PROMPT})
        if rng.random() < 0.2:
            messages += [{"role": "assistant", "content": "Let me think about this problem step by step."},
                         {"role": "user", "content": NUDGE}]  # fmt: skip
        block = f"I will compute it with Python.\n\n```python\n{code.format(**fields)}\n```"
        if rng.random() < 0.15:
            messages += [{"role": "assistant", "content": _think(rng, block, "write the code")},
                         {"role": "tool", "content": _TRACEBACK, "name": "python"}]  # fmt: skip
        messages += [
            {"role": "assistant", "content": _think(rng, block, "compute it in Python")},
            {"role": "tool", "content": output, "name": "python"},
            {"role": "assistant", "content": _think(
                rng, f"The code prints {output}, so the answer is \\boxed{{{answer}}}.", "check the output")},
        ]  # fmt: skip
        yield messages, False


def _guess_number(rng: random.Random, n: int) -> Iterator[Conversation]:
    from sao.envs import guess_number

    for task in guess_number.make_tasks(n, _CORPUS_SEED):
        secret, low, high = int(task.answer), 1, int(task.metadata["max_number"])
        messages: list[Message] = [{"role": "user", "content": str(task.prompt)}]
        if rng.random() < 0.3:
            messages.insert(0, {"role": "system", "content": guess_number.SYSTEM_PROMPT})
        while True:
            guess = (low + high) // 2
            messages.append({"role": "assistant", "content": guess_number.guess_text(guess)})
            if guess == secret:
                break
            low, high = (guess + 1, high) if guess < secret else (low, guess - 1)
            messages.append({"role": "user", "content": "higher" if guess < secret else "lower"})
        yield messages, False


def _style_shift(rng: random.Random, n: int) -> Iterator[Conversation]:
    from sao.envs import style_shift
    from sao.envs.sft_data import STYLE_TEMPLATES, style_reply

    styles = sorted(STYLE_TEMPLATES)
    for task in style_shift.make_tasks(n, _CORPUS_SEED):
        reply = style_reply(rng, str(task.metadata["topic"]), rng.choice(styles), bad=rng.random() < 0.1)
        yield [{"role": "user", "content": str(task.prompt)}, {"role": "assistant", "content": reply}], False


# Filler: text in other scripts (merges inside multi-byte UTF-8 characters, as real tokenizers have for
# CJK or emoji) and a made-up English-like lexicon (subword merges of many words).
_SCRIPTS = ((0x00C0, 0x0180), (0x0391, 0x03CA), (0x0410, 0x0450), (0x3041, 0x3097), (0x4E00, 0x5200),
            (0x1F600, 0x1F650))  # fmt: skip
_ONSETS = ("", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "th", "st",
           "pr", "ch", "sh", "tr", "gr", "bl")  # fmt: skip
_VOWELS = ("a", "e", "i", "o", "u", "ou", "ea", "ai", "y")
_CODAS = ("", "", "n", "r", "s", "t", "l", "nd", "st", "ng", "ck", "m")


def _zipf_choices(rng: random.Random, population: list[str], k: int) -> list[str]:
    """``k`` draws from ``population`` with weight 1/rank (ranks in a shuffled order)."""
    order = population[:]
    rng.shuffle(order)
    return rng.choices(order, weights=[1 / (rank + 1) for rank in range(len(order))], k=k)


def _filler(rng: random.Random, words: int) -> Iterator[str]:
    for low, high in _SCRIPTS:
        chars = _zipf_choices(rng, [chr(code) for code in range(low, high)], words // 2)
        yield " ".join("".join(chars[i : i + rng.randint(1, 3)]) for i in range(0, len(chars), 3))
    syllables = [onset + vowel + coda for onset in _ONSETS for vowel in _VOWELS for coda in _CODAS]
    lexicon = sorted({"".join(rng.choices(syllables, k=rng.randint(1, 3))) for _ in range(6000)})
    drawn = _zipf_choices(rng, lexicon, words * 4)
    for start in range(0, len(drawn), 12):
        sentence = " ".join(drawn[start : start + 12])
        yield sentence[:1].upper() + sentence[1:] + rng.choice((".", ",", "!", "?", ".\n", ".\n\n"))


def training_corpus() -> list[str]:
    """The training text: every conversation rendered with the ``qwen3`` template, cut at the special and
    marker tokens (which are dropped). Deterministic."""
    from sao.envs import calculator
    from sao.models.templates import load_chat_template
    from sao.models.tokenizer import build_tokenizer

    rng = random.Random("sao-bpe-corpus")
    conversations = [
        *_calculator(rng, 1500),
        *_math_tir(rng, 1500),
        *_guess_number(rng, 300),
        *_style_shift(rng, 600),
    ]
    renderer = build_tokenizer()  # only its template engine is used
    renderer.chat_template = load_chat_template("qwen3")
    texts: list[str] = []
    for with_tools in (False, True):
        batch = [messages for messages, tools in conversations if tools == with_tools]
        rendered = renderer.apply_chat_template(
            batch, tools=[calculator.TOOL_SCHEMA] if with_tools else None, tokenize=False
        )
        texts.extend(rendered)
    markers = re.compile("|".join(re.escape(content) for content, _ in SPECIAL_TOKENS))
    pieces = [piece for text in texts for piece in markers.split(text) if piece]
    return pieces + list(_filler(rng, 20_000))


def train_bpe() -> Tokenizer:
    """Train the BPE on `training_corpus` and add the `SPECIAL_TOKENS` after the learned vocabulary; the
    ``tokenizers.Tokenizer`` (not cached: each call trains anew)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(SPECIAL_TOKENS),
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    backend.train_from_iterator(training_corpus(), trainer=trainer)
    add_qwen_tokens(backend)
    return backend


@lru_cache(maxsize=1)
def _trained_json() -> str:
    return train_bpe().to_str()


def build_bpe_tokenizer(chat_template: str | None = None) -> PreTrainedTokenizerFast:
    """The BPE tokenizer: pad ``<|endoftext|>``, eos ``<|im_end|>``, no bos; ``chat_template`` (the template
    text; default the shipped ``qwen3``). Trained once per process (`train_bpe`); each call returns a new
    object that shares nothing with earlier ones."""
    from tokenizers import Tokenizer

    from sao.models.templates import load_chat_template

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_trained_json()),
        bos_token=None,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=load_chat_template("qwen3") if chat_template is None else chat_template,
        clean_up_tokenization_spaces=False,
    )


def _summary() -> str:  # `python -m sao.models.bpe`: what was learned
    tokenizer = build_bpe_tokenizer()
    merges = json.loads(_trained_json())["model"]["merges"]
    return f"{len(tokenizer)} tokens, {len(merges)} merges"


if __name__ == "__main__":
    print(_summary())
