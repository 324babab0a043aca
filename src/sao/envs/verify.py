"""Math answer verification: is the model's final answer equal to the reference?

`verify_answer` asks math-verify first (``parse`` + ``verify``: symbolic and numeric equivalence, so
``\\frac{1}{2}`` equals ``0.5`` and ``x+1`` equals ``1+x``), then falls back to a normalised string match
(`normalize_answer`) and a plain numeric comparison, which also covers math-verify being unavailable, failing
or timing out. It never raises: unparseable, huge or non-string input is simply not a match.

Timeouts: math-verify bounds its own work with ``signal.alarm``, which only works in the main thread. There
we pass ``timeout_s`` through; in any other thread math-verify runs without a timeout, so inputs are capped
at ``MAX_ANSWER_CHARS`` before they reach sympy.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from fractions import Fraction
from typing import Any

__all__ = ["MAX_ANSWER_CHARS", "normalize_answer", "verify_answer"]

MAX_ANSWER_CHARS = 1000  # longer answers skip math-verify (sympy can take minutes on huge expressions)

_TEXT_WRAPPERS = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?")
_FRACTION = re.compile(r"([+-]?)\\frac\{([^{}]+)\}\{([^{}]+)\}")
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")


def normalize_answer(text: Any) -> str:
    """A canonical string for exact matching: no whitespace, ``$``, ``\\left``/``\\right``, text wrappers,
    degree or percent signs, thousands separators or trailing period; ``\\dfrac``/``\\tfrac`` → ``\\frac``;
    lower case. Conservative on purpose: two answers that normalise equal are the same answer."""
    s = str(text).strip()
    boxed = s.rfind("\\boxed{")
    if boxed >= 0 and s.endswith("}"):
        s = s[boxed + len("\\boxed{") : -1]
    s = s.replace("\\left", "").replace("\\right", "").replace("\\!", "").replace("\\,", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    for _ in range(3):  # nested wrappers
        s = _TEXT_WRAPPERS.sub(r"\1", s)
    s = s.replace("^\\circ", "").replace("^{\\circ}", "").replace("\\%", "").replace("%", "")
    s = s.replace("\\$", "").replace("$", "")
    s = "".join(s.split()).rstrip(".").lower()
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    return s


def _as_number(s: str) -> Fraction | float | None:
    """``s`` (normalised) as a number if it is a plain decimal, ``a/b`` or ``\\frac{a}{b}`` of decimals."""
    if _NUMBER.fullmatch(s):
        return _to_fraction(s)
    frac = _FRACTION.fullmatch(s)
    if frac:
        num, den = _to_fraction(frac.group(2)), _to_fraction(frac.group(3))
        sign = -1 if frac.group(1) == "-" else 1
    else:
        num_den = s.split("/")
        if len(num_den) != 2:
            return None
        num, den = _to_fraction(num_den[0]), _to_fraction(num_den[1])
        sign = 1
    if num is None or den is None or den == 0:
        return None
    return sign * num / den


def _to_fraction(s: str) -> Fraction | None:
    if not _NUMBER.fullmatch(s):
        return None
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError, OverflowError):
        return None


def _fallback_match(prediction: str, reference: str) -> bool:
    pred, ref = normalize_answer(prediction), normalize_answer(reference)
    if not pred:
        return False
    if pred == ref:
        return True
    a, b = _as_number(pred), _as_number(ref)
    if a is None or b is None:
        return False
    return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)


def _math_verify_match(prediction: str, reference: str, timeout_s: int) -> bool:
    try:
        from math_verify import parse, verify
    except ImportError:
        return False
    in_main = threading.current_thread() is threading.main_thread()
    timeout = timeout_s if in_main else None
    gold_text = reference if "\\boxed" in reference else f"${reference}$"
    gold = parse(gold_text, parsing_timeout=timeout)  # type: ignore[arg-type]
    if not gold:
        gold = parse(f"\\boxed{{{reference}}}", parsing_timeout=timeout)  # type: ignore[arg-type]
    pred = parse(f"\\boxed{{{prediction}}}", parsing_timeout=timeout)  # type: ignore[arg-type]
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=timeout))


# math-verify warns once per process that it runs without a timeout (our non-main-thread case, handled above).
logging.getLogger("math_verify").setLevel(logging.ERROR)


def verify_answer(prediction: Any, reference: Any, *, timeout_s: int = 5) -> bool:
    """True when ``prediction`` (the content of the model's ``\\boxed{}``) equals ``reference``.

    math-verify first, then the normalised exact / numeric match (see the module docstring). ``None`` or
    an empty prediction is never correct; no input makes this raise.
    """
    if prediction is None or reference is None:
        return False
    try:
        pred, ref = str(prediction).strip(), str(reference).strip()
        if not pred or not ref:
            return False
        if len(pred) <= MAX_ANSWER_CHARS and len(ref) <= MAX_ANSWER_CHARS:
            try:
                if _math_verify_match(pred, ref, timeout_s):
                    return True
            except Exception:  # math-verify or sympy failing on odd input: fall back below
                pass
        return _fallback_match(pred, ref)
    except Exception:
        return False
