"""Judges for the ``style_shift`` writing task: does a text have *quality*, and is it in a given *style*?

A judge returns a `Verdict`; the env's reward is ``quality × style`` ∈ {0, 1}. Two judges:

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

`LLMJudge` — asks any OpenAI-compatible endpoint (``POST {base_url}/v1/chat/completions``) and parses the
strict answer ``QUALITY: yes|no STYLE: yes|no`` (case-free, an optional comma/semicolon between). A failed
request or an unparseable answer is a zero verdict with ``error`` set — never an exception.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

__all__ = [
    "STYLES",
    "STYLE_MARKERS",
    "Judge",
    "LLMJudge",
    "RuleJudge",
    "Verdict",
    "make_judge",
    "parse_judge_answer",
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

_JUDGE_SYSTEM = "You are a strict grader. Reply exactly: QUALITY: yes|no STYLE: yes|no"
_WORD = re.compile(r"[a-z]+")
_ANSWER = re.compile(r"\s*QUALITY\s*:\s*(yes|no)\s*[,;]?\s*STYLE\s*:\s*(yes|no)\s*\.?\s*", re.IGNORECASE)


@dataclass(frozen=True)
class Verdict:
    """A judge's grade of one text; ``error`` is set when the judge could not grade (reward 0)."""

    quality: bool
    style: bool
    error: str | None = None
    details: str | None = None  # why (rule judge) or the raw answer (LLM judge)

    @property
    def reward(self) -> float:
        return 1.0 if self.quality and self.style and self.error is None else 0.0


class Judge(Protocol):
    async def grade(self, topic: str, style: str, text: str) -> Verdict: ...


def _check_style(style: str) -> None:
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
        _check_style(style)
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


class LLMJudge:
    """An LLM behind an OpenAI-compatible chat endpoint grades quality and style.

    Args:
        base_url: the server, with or without the trailing ``/v1``.
        model: the model name to request.
        api_key: sent as a bearer token (local servers ignore it).
        timeout_s: per request.
        max_tokens: the answer budget (the strict answer is ~23 characters).
        transport: an httpx transport (tests, custom routing); default: the network.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str = "unused",
        timeout_s: float = 30.0,
        max_tokens: int = 32,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        base = base_url.rstrip("/")
        self.url = (base if base.endswith("/v1") else base + "/v1") + "/chat/completions"
        self.model = model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.max_tokens = max_tokens
        self._transport = transport

    def request_body(self, topic: str, style: str, text: str) -> dict[str, Any]:
        prompt = (
            f"Task: write one sentence about {topic}.\n"
            f"Wanted style: {style} ({STYLE_DESCRIPTIONS[style]}).\n"
            f"QUALITY is yes if the text is one fluent, sensible sentence about {topic}.\n"
            "STYLE is yes if it is clearly in the wanted style.\n"
            f"Text: {text}"
        )
        return {
            "model": self.model,
            "messages": [
                {"role": "system", "content": _JUDGE_SYSTEM},
                {"role": "user", "content": prompt},
            ],
            "temperature": 0.0,
            "max_tokens": self.max_tokens,
        }

    async def grade(self, topic: str, style: str, text: str) -> Verdict:
        _check_style(style)
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s, transport=self._transport) as client:
                response = await client.post(
                    self.url,
                    json=self.request_body(topic, style, text),
                    headers={"Authorization": f"Bearer {self.api_key}"},
                )
            response.raise_for_status()
            answer = response.json()["choices"][0]["message"]["content"]
        except Exception as err:  # any failure of the judge is a zero reward, not a crashed rollout
            return Verdict(False, False, error=f"judge request failed: {type(err).__name__}: {err}"[:300])
        parsed = parse_judge_answer(answer)
        if parsed is None:
            return Verdict(
                False, False, error=f"unparseable judge answer: {str(answer)[:200]!r}", details=answer
            )
        return Verdict(*parsed, details=answer)


def make_judge(kind: str = "rule", **kwargs: Any) -> Judge:
    """``"rule"`` → `RuleJudge()`; ``"llm"`` → `LLMJudge(**kwargs)` (``base_url``, ``model``, ...)."""
    if kind == "rule":
        if kwargs:
            raise ValueError(f"the rule judge takes no options, got {sorted(kwargs)}")
        return RuleJudge()
    if kind == "llm":
        return LLMJudge(**kwargs)
    raise ValueError(f"unknown judge {kind!r}; known: rule, llm")
