"""Judges for the ``style_shift`` writing task (does a text have *quality*, and is it in a given *style*?)
and the parsers of LLM judges' answers.

A style judge returns a `Verdict`; the env's reward is ``quality × style`` ∈ {0, 1}. The judges are
`RuleJudge` (here) and `sao.envs.style_shift.LLMJudge` (an LLM behind `sao.envs.judge_client`).

`RuleJudge` — deterministic and satisfiable by a tiny model. Words are the runs of ASCII letters of the
lower-cased text (``"Thy cat's fur~"`` → ``thy, cat, s, fur``).

- quality: all of
  (1) 3 to 30 words; (2) the topic appears as a word, or with a plural ``s``/``es``; (3) no word occurs
  more than 3 times; (4) the stripped text ends with one of ``. ! ? ~ ♡``.
- style: the text carries at least one marker of the wanted style **and none of the other styles** (so
  one text cannot satisfy every style at once and a style shift really changes what earns reward):

  ============  ==========================================================================
  cute          the characters ``~`` or ``♡``, or a word in uwu nya kawaii cute fluffy teehee
  chuunibyou    a word in darkness power destiny fate abyss cursed sealed eternal
  classical     a word in thee thou thy thine hath doth ere
  ============  ==========================================================================

Reading an LLM judge's answer: `parse_score` (a number on a scale, the `sao.envs.judge_client` parser)
and `parse_judge_answer` (the strict ``QUALITY: yes|no STYLE: yes|no`` of style_shift's
`sao.envs.style_shift.LLMJudge`), both pure functions.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "STYLES",
    "STYLE_MARKERS",
    "Judge",
    "RuleJudge",
    "Verdict",
    "check_style",
    "parse_judge_answer",
    "parse_score",
    "strip_think",
]

STYLES = ("cute", "chuunibyou", "classical")
# (marker characters, marker words) per style; the sets are disjoint.
STYLE_MARKERS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "cute": (frozenset("~♡"), frozenset({"uwu", "nya", "kawaii", "cute", "fluffy", "teehee"})),
    "chuunibyou": (
        frozenset(),
        frozenset({"darkness", "power", "destiny", "fate", "abyss", "cursed", "sealed", "eternal"}),
    ),
    "classical": (frozenset(), frozenset({"thee", "thou", "thy", "thine", "hath", "doth", "ere"})),
}
STYLE_DESCRIPTIONS = {
    "cute": "cute and playful, e.g. ~, uwu, nya, fluffy",
    "chuunibyou": "dramatic chuunibyou, e.g. darkness, my power, destiny",
    "classical": "classical archaic English, e.g. thee, thou, thy, hath",
}
MIN_WORDS, MAX_WORDS, MAX_REPEATS = 3, 30, 3
END_PUNCTUATION = frozenset(".!?~♡")

_WORD = re.compile(r"[a-z]+")
_ANSWER = re.compile(r"\s*QUALITY\s*:\s*(yes|no)\s*[,;]?\s*STYLE\s*:\s*(yes|no)\s*\.?\s*", re.IGNORECASE)


@dataclass(frozen=True)
class Verdict:
    """A judge's grade of one text; ``error`` is set when the judge could not grade (`StyleShiftEnv` then
    raises `sao.envs.base.JudgeError`: no reward)."""

    quality: bool
    style: bool
    error: str | None = None
    details: str | None = None  # why (rule judge) or the raw answer (LLM judge)

    @property
    def reward(self) -> float:
        return 1.0 if self.quality and self.style and self.error is None else 0.0


class Judge(Protocol):
    async def grade(self, topic: str, style: str, text: str) -> Verdict: ...


def check_style(style: str) -> None:
    if style not in STYLE_MARKERS:
        raise ValueError(f"unknown style {style!r}; known: {', '.join(STYLES)}")


class RuleJudge:
    """The deterministic rules of the module docstring."""

    def quality_problems(self, topic: str, text: str) -> list[str]:
        """Why ``text`` fails the quality rules (empty: it passes)."""
        words = _WORD.findall(text.lower())
        problems = []
        if not MIN_WORDS <= len(words) <= MAX_WORDS:
            problems.append(f"{len(words)} words, want {MIN_WORDS}-{MAX_WORDS}")
        t = topic.lower()
        if not {t, t + "s", t + "es"} & set(words):
            problems.append(f"topic {topic!r} not mentioned")
        if words:
            word, count = Counter(words).most_common(1)[0]
            if count > MAX_REPEATS:
                problems.append(f"{word!r} repeated {count} times")
        stripped = text.strip()
        if not stripped or stripped[-1] not in END_PUNCTUATION:
            problems.append("does not end with punctuation")
        return problems

    def styles_of(self, text: str) -> set[str]:
        """Every style whose markers occur in ``text``."""
        words = set(_WORD.findall(text.lower()))
        return {
            style
            for style, (chars, marker_words) in STYLE_MARKERS.items()
            if words & marker_words or any(c in text for c in chars)
        }

    def grade_sync(self, topic: str, style: str, text: str) -> Verdict:
        check_style(style)
        problems = self.quality_problems(topic, text)
        found = self.styles_of(text)
        notes = list(problems)
        if found != {style}:
            notes.append(f"styles {sorted(found)}, want only {style!r}")
        return Verdict(not problems, found == {style}, details="; ".join(notes) or None)

    async def grade(self, topic: str, style: str, text: str) -> Verdict:
        return self.grade_sync(topic, style, text)


def parse_judge_answer(answer: str | None) -> tuple[bool, bool] | None:
    """``(quality, style)`` from ``"QUALITY: yes STYLE: no"``; None when the answer is not exactly that."""
    if not isinstance(answer, str):
        return None
    match = _ANSWER.fullmatch(answer)
    if match is None:
        return None
    return match.group(1).lower() == "yes", match.group(2).lower() == "yes"


_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_MARKER = re.compile(
    rf"\b(?:scores?|rating|grade)\b[\"'*_\s]*(?:[:=]|\bis\b|\bof\b)?[\"'*_\s]*({_NUM})"
    rf"(?:\s*(?:/|\bout\s+of\b)\s*({_NUM}))?",
    re.IGNORECASE,
)
_FRACTION = re.compile(rf"(?<![\w.])({_NUM})\s*/\s*({_NUM})")
_BOLD = re.compile(rf"\*\*\s*({_NUM})\s*\*\*")
_BARE = re.compile(rf"[\s*]*({_NUM})\.?[\s*]*")
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


def strip_think(text: str) -> str:
    """``text`` without its ``<think>...</think>`` blocks; a lone ``</think>`` (the template opened it)
    drops what precedes it, an unclosed ``<think>`` what follows it (unfinished thinking is no answer)."""
    text = _THINK.sub("", text)
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    return text.split("<think>", 1)[0]


def _as_float(raw: Any) -> float | None:
    try:
        return float(raw) if isinstance(raw, int | float | str) and not isinstance(raw, bool) else None
    except ValueError:
        return None


def _json_score(text: str) -> tuple[bool, float | None]:
    """(found, value) when the braces of ``text`` (fences and prose around them aside) hold a JSON object
    with a ``score`` key (any case)."""
    try:
        obj = json.loads(text[text.index("{") : text.rindex("}") + 1])
    except (ValueError, RecursionError):
        return False, None
    key = next((k for k in obj if k.lower() == "score"), None) if isinstance(obj, dict) else None
    return key is not None, None if key is None else _as_float(obj[key])


def parse_score(text: str | None, lo: float, hi: float) -> float | None:
    """The score a judge's answer gives on the scale [lo, hi], or None when it gives none.

    After dropping ``<think>`` blocks (`strip_think`), the first rule that finds something decides:
    (1) a JSON object with a ``"score"`` key; (2) the last explicit marker, ``score``/``rating``/``grade``
    then an optional ``:``, ``=``, ``is`` or ``of`` and a number, optionally ``/ hi`` or ``out of hi``
    (``Score: 7``, ``**Score:** 7``, ``score = 7/10``, ``a score of 7``); (3) the last fraction ``n/hi``;
    (4) the last bold number ``**8**``; (5) an answer that is only a number. A value outside [lo, hi],
    non-finite, or over a denominator other than ``hi`` gives None, never a fallback to another number.
    """
    if not isinstance(text, str):
        return None
    text = strip_think(text)
    found, value = _json_score(text)
    if not found:
        fractions = [m for m in _FRACTION.finditer(text) if _as_float(m.group(2)) == hi]
        match = (
            [*_MARKER.finditer(text)] or fractions or [*_BOLD.finditer(text)] or [_BARE.fullmatch(text)]
        )[-1]
        if match is None:
            return None
        if match.re is _MARKER and match.group(2) is not None and _as_float(match.group(2)) != hi:
            return None
        value = _as_float(match.group(1))
    return value if value is not None and math.isfinite(value) and lo <= value <= hi else None
