"""Seeded scalar distributions for parametric workloads, and their one-line text form for the CLI.

Three families, each a frozen dataclass with ``sample(rng) -> float`` (the caller rounds token counts):

* ``fixed:V`` — always ``V``;
* ``lognormal:median=M,sigma=S[,min=A][,max=B]`` — ``M·exp(S·N(0,1))``, clipped to ``[A, B]``;
* ``power:alpha=A[,min=L][,max=H]`` — a truncated discrete power law, ``P(n) ∝ n^-A`` for integers
  ``n`` in ``[L, H]`` (a heavy tail of long episodes; ``H`` must be finite).

``parse_dist("lognormal:median=800,sigma=0.7,max=4096")`` builds one; a bare number is ``fixed``.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["Distribution", "Fixed", "LogNormal", "PowerLaw", "parse_dist"]


class Distribution(Protocol):
    def sample(self, rng: random.Random) -> float: ...

    def mean(self) -> float: ...


@dataclass(frozen=True)
class Fixed:
    value: float

    def sample(self, rng: random.Random) -> float:
        return self.value

    def mean(self) -> float:
        return self.value

    def __str__(self) -> str:
        return f"fixed:{self.value:g}"


@dataclass(frozen=True)
class LogNormal:
    """``median·exp(sigma·Z)`` clipped to ``[lo, hi]``."""

    median: float
    sigma: float
    lo: float = 0.0
    hi: float = math.inf

    def __post_init__(self) -> None:
        if self.median <= 0 or self.sigma < 0 or self.lo > self.hi:
            raise ValueError(f"lognormal needs median > 0, sigma >= 0 and min <= max: {self}")

    def sample(self, rng: random.Random) -> float:
        return min(self.hi, max(self.lo, self.median * math.exp(self.sigma * rng.gauss(0.0, 1.0))))

    def mean(self) -> float:
        """The unclipped mean (clipping lowers it a little for a heavy tail)."""
        return self.median * math.exp(self.sigma**2 / 2)

    def __str__(self) -> str:
        hi = "" if math.isinf(self.hi) else f",max={self.hi:g}"
        return f"lognormal:median={self.median:g},sigma={self.sigma:g},min={self.lo:g}{hi}"


@dataclass(frozen=True)
class PowerLaw:
    """Integers ``n`` in ``[lo, hi]`` with ``P(n) ∝ n^-alpha`` (inverse-CDF sampling on a table)."""

    alpha: float
    lo: int = 1
    hi: int = 100
    _cdf: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 1 <= self.lo <= self.hi:
            raise ValueError(f"power needs 1 <= min <= max: {self}")
        weights = [n**-self.alpha for n in range(self.lo, self.hi + 1)]
        total = sum(weights)
        object.__setattr__(self, "_cdf", tuple(w / total for w in itertools.accumulate(weights)))

    def sample(self, rng: random.Random) -> float:
        index = bisect.bisect_left(self._cdf, rng.random())
        return float(self.lo + min(index, self.hi - self.lo))

    def mean(self) -> float:
        ns = range(self.lo, self.hi + 1)
        weights = [n**-self.alpha for n in ns]
        return sum(n * w for n, w in zip(ns, weights, strict=True)) / sum(weights)

    def __str__(self) -> str:
        return f"power:alpha={self.alpha:g},min={self.lo},max={self.hi}"


_KEYS = {"lognormal": {"median", "sigma", "min", "max"}, "power": {"alpha", "min", "max"}}


def parse_dist(text: str) -> Distribution:
    """A distribution from its text form (module docstring); ValueError naming the bad part."""
    text = text.strip()
    family, _, args = text.partition(":")
    if not args:
        try:
            return Fixed(float(family))
        except ValueError:
            raise ValueError(f"bad distribution {text!r}: expected a number or FAMILY:ARGS") from None
    if family == "fixed":
        return Fixed(float(args))
    if family not in _KEYS:
        raise ValueError(f"bad distribution {text!r}: unknown family {family!r} (fixed, lognormal, power)")
    values: dict[str, float] = {}
    for part in args.split(","):
        key, _, value = part.partition("=")
        if key.strip() not in _KEYS[family] or not value:
            raise ValueError(f"bad distribution {text!r}: {part!r} (keys: {sorted(_KEYS[family])})")
        values[key.strip()] = float(value)
    if family == "lognormal":
        if "median" not in values or "sigma" not in values:
            raise ValueError(f"bad distribution {text!r}: lognormal needs median= and sigma=")
        return LogNormal(
            values["median"], values["sigma"], values.get("min", 0.0), values.get("max", math.inf)
        )
    if "alpha" not in values or "max" not in values:
        raise ValueError(f"bad distribution {text!r}: power needs alpha= and max=")
    return PowerLaw(values["alpha"], int(values.get("min", 1)), int(values["max"]))
