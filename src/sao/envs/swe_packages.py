"""The small Python packages `sao.envs.swe_synth` plants bugs in: six families of plain-function modules.

A `Family` is a package name, a one-line summary (the repository's README), its modules in dependency
order (a module imports only from modules before it, so the first ``k`` modules form a package on their
own: the ``files`` knob) and, per public function, a drawer of random arguments (``"module.function"`` →
``rng → args tuple``). Expected values are never written here: the generator calls the correct code.

The modules' sources are data files, ``swe_templates/<package>/<module>.py.tmpl`` beside this module
(valid Python, read byte for byte: the suffix keeps linters and formatters from rewriting them, which
would change every generated instance). Functions call each other across modules with
``from <package>.<module> import <function>`` and bare-name calls, which is what
`sao.envs.swe_synth_draw.call_graph` reads. Nothing in the templates depends on set or hash order.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

__all__ = ["FAMILIES", "Family", "template_source"]

Draw = Callable[[random.Random], tuple[Any, ...]]


@dataclass(frozen=True)
class Family:
    """A package template: ``modules`` are ``(name, source)`` in dependency order; ``inputs`` draws the
    arguments of each public function (``"module.function"``)."""

    package: str
    summary: str
    modules: tuple[tuple[str, str], ...]
    inputs: Mapping[str, Draw]


def template_source(package: str, module: str) -> str:
    """The source of ``<package>.<module>``: the UTF-8 text of ``swe_templates/<package>/<module>.py.tmpl``.

    Raises FileNotFoundError naming the missing template."""
    path = resources.files("sao.envs") / "swe_templates" / package / f"{module}.py.tmpl"
    if not path.is_file():
        raise FileNotFoundError(f"no template {package}/{module}.py.tmpl in sao.envs/swe_templates")
    return path.read_text(encoding="utf-8")


def _modules(package: str, names: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    return tuple((name, template_source(package, name)) for name in names)


# ---------------------------------------------------------------- textkit: string utilities and text stats
_VOCAB = ("apple", "level", "noon", "sky", "rhythm", "banana", "tree", "queue", "a", "io", "Anna", "radar")


def _text(r: random.Random, most: int = 7) -> str:
    words = [r.choice(_VOCAB) for _ in range(r.randint(0, most))]
    out = ""
    for i, word in enumerate(words):
        out += (r.choice([" ", " ", " ", ", ", ". ", "! ", "  "]) if i else "") + word
    return out + r.choice(["", "", ".", "!"]) if out else out


def _text_and_word(r: random.Random) -> tuple[str, str]:
    """A text and one of its words as written (punctuation stripped) or, one time in five, any word."""
    text = _text(r)
    words = [w.strip(",.!") for w in text.split()]
    return text, r.choice(words) if words and r.random() < 0.8 else r.choice(_VOCAB)


def _palindrome_text(r: random.Random) -> str:
    return r.choice(["Never odd or even", "A man, a plan", "Step on no pets!", "noon", "Radar"]) + r.choice(
        ["", "", "x", " s"]
    )


TEXTKIT = Family(
    package="textkit",
    summary="Small string utilities: normalizing, splitting, searching, counting and laying out text.",
    modules=_modules("textkit", ("chars", "words", "search", "stats", "format", "report")),
    inputs={
        "chars.is_vowel": lambda r: (r.choice("aEiOubxYz"),),
        "chars.count_vowels": lambda r: (_text(r),),
        "chars.normalize": lambda r: (_text(r),),
        "chars.is_palindrome": lambda r: (_palindrome_text(r) if r.random() < 0.7 else _text(r, 2),),
        "words.split_words": lambda r: (_text(r),),
        "words.longest_word": lambda r: (_text(r),),
        "words.words_with_vowels": lambda r: (_text(r), r.randint(0, 3)),
        "words.initials": lambda r: (_text(r), r.randint(0, 5)),
        "search.find_all": lambda r: (_text(r), r.choice(["a", "an", "e", "noon", "oo", "q"])),
        "search.count_word": lambda r: _text_and_word(r),
        "search.context": lambda r: (*_text_and_word(r), r.randint(0, 6)),
        "stats.average_word_length": lambda r: (_text(r),),
        "stats.word_frequencies": lambda r: (_text(r),),
        "stats.top_words": lambda r: (_text(r), r.randint(0, 4)),
        "stats.vowel_share": lambda r: (_text(r),),
        "format.truncate": lambda r: (_text(r), r.randint(3, 20)),
        "format.wrap": lambda r: (_text(r), r.randint(4, 16)),
        "format.headline": lambda r: (_text(r), r.randint(1, 3)),
        "report.describe": lambda r: (_text(r), r.randint(4, 16)),
    },
)


# ---------------------------------------------------------------- intervals: closed integer intervals
def _interval(r: random.Random) -> tuple[int, int]:
    low = r.randint(0, 14)
    return (low, low + r.randint(0, 6))


def _intervals(r: random.Random) -> list[tuple[int, int]]:
    return [_interval(r) for _ in range(r.randint(0, 5))]


INTERVALS = Family(
    package="intervals",
    summary="Closed integer intervals: intersections, merging, gaps and schedule queries.",
    modules=_modules("intervals", ("bounds", "ops", "sets", "query")),
    inputs={
        "bounds.make": lambda r: (r.randint(-5, 9), r.randint(-5, 9)),
        "bounds.length": lambda r: (_interval(r),),
        "bounds.contains": lambda r: (lambda iv: (iv, r.randint(iv[0] - 2, iv[1] + 2)))(_interval(r)),
        "bounds.overlaps": lambda r: (_interval(r), _interval(r)),
        "ops.intersect": lambda r: (_interval(r), _interval(r)),
        "ops.overlap_length": lambda r: (_interval(r), _interval(r)),
        "ops.clamp": lambda r: (r.randint(-2, 22), _interval(r)),
        "ops.split_at": lambda r: (lambda iv: (iv, r.randint(iv[0] - 1, iv[1] + 1)))(_interval(r)),
        "sets.merge": lambda r: (_intervals(r),),
        "sets.total_length": lambda r: (_intervals(r),),
        "sets.gaps": lambda r: (_intervals(r),),
        "sets.common": lambda r: (_intervals(r), _intervals(r)),
        "query.covering": lambda r: (_intervals(r), r.randint(0, 18)),
        "query.max_depth": lambda r: (_intervals(r),),
        "query.free_slots": lambda r: (_intervals(r), (r.randint(0, 8), r.randint(12, 26)), r.randint(1, 4)),
        "query.coverage_percent": lambda r: (_intervals(r), (r.randint(0, 8), r.randint(9, 26))),
    },
)


# ---------------------------------------------------------------- ledger: a bank ledger in cents
_ACCOUNTS = ("alice", "bob", "carol")


def _entry(r: random.Random) -> tuple[str, str, int]:
    kinds = ("deposit", "deposit", "withdrawal", "withdrawal", "fee")
    return (r.choice(_ACCOUNTS), r.choice(kinds), r.randint(1, 5000))


def _entries(r: random.Random, most: int = 6) -> list[tuple[str, str, int]]:
    return [_entry(r) for _ in range(r.randint(0, most))]


def _amount_text(r: random.Random) -> str:
    whole = str(r.randint(0, 250)) if r.random() < 0.8 else ""
    frac = r.choice(["", "." + str(r.randint(0, 9)), "." + str(r.randint(10, 99)), ".05"])
    return r.choice(["", "", "-", " "]) + (whole + frac or "0") + r.choice(["", " "])


LEDGER = Family(
    package="ledger",
    summary="A small bank ledger: amounts in cents, entries, balances, interest and statements.",
    modules=_modules("ledger", ("money", "entries", "accounts", "interest", "statement")),
    inputs={
        "money.parse_amount": lambda r: (_amount_text(r),),
        "money.format_cents": lambda r: (r.randint(-2500, 25000),),
        "money.percent_of": lambda r: (r.randint(0, 9000), r.randint(0, 30)),
        "entries.signed_amount": lambda r: (_entry(r) if r.random() < 0.9 else ("bob", "loan", 5),),
        "entries.for_account": lambda r: (_entries(r), r.choice(_ACCOUNTS)),
        "entries.with_fees": lambda r: (_entries(r, 4), r.randint(0, 5)),
        "accounts.balance": lambda r: (_entries(r), r.choice(_ACCOUNTS)),
        "accounts.balances": lambda r: (_entries(r),),
        "accounts.overdrawn": lambda r: (_entries(r), r.randint(0, 3000)),
        "accounts.running_balance": lambda r: (_entries(r), r.choice(_ACCOUNTS)),
        "interest.monthly_interest": lambda r: (r.randint(-3000, 90000), r.randint(0, 24)),
        "interest.project": lambda r: (r.randint(-3000, 90000), r.randint(0, 24), r.randint(0, 12)),
        "interest.projected_balance": lambda r: (
            _entries(r),
            r.choice(_ACCOUNTS),
            r.randint(0, 24),
            r.randint(0, 12),
        ),
        "statement.statement": lambda r: (_entries(r, 4), r.choice(_ACCOUNTS)),
        "statement.largest_withdrawal": lambda r: (_entries(r), r.choice(_ACCOUNTS)),
    },
)


# ---------------------------------------------------------------- inventory: stock, orders, prices
_PARTS = ("bolt", "nut", "gear", "pipe", "valve")
_PRICES = {"bolt": 120, "nut": 45, "gear": 890, "pipe": 375, "valve": 1250}


def _stock(r: random.Random) -> dict[str, int]:
    return {name: r.randint(0, 60) for name in sorted(r.sample(_PARTS, r.randint(1, 4)))}


def _stock_and_part(r: random.Random) -> tuple[dict[str, int], str, int]:
    """A stock, one of its names (or, one time in five, any name) and a count near what is there."""
    stock = _stock(r)
    name = r.choice(sorted(stock)) if r.random() < 0.8 else r.choice(_PARTS)
    have = stock.get(name, 0)
    return stock, name, max(0, r.randint(have - 6, have + 2))


def _stock_and_order(r: random.Random) -> tuple[dict[str, int], list[tuple[str, int]]]:
    """A stock and an order mostly of names it has, in amounts near what is there."""
    stock = _stock(r)
    lines = [_stock_and_part(r)[1:] if r.random() < 0.2 else None for _ in range(r.randint(1, 3))]
    order = []
    for line in lines:
        name = r.choice(sorted(stock)) if line is None else line[0]
        order.append((name, max(1, r.randint(stock.get(name, 0) // 2 - 3, stock.get(name, 0) // 2 + 2))))
    return stock, order


def _order(r: random.Random) -> list[tuple[str, int]]:
    return [
        (r.choice(_PARTS), r.choice([1, 2, 5, 9, 10, 12, 25, 49, 50, 60])) for _ in range(r.randint(1, 3))
    ]


INVENTORY = Family(
    package="inventory",
    summary="Stock keeping for a small shop: stock levels, orders, bulk pricing and reports.",
    modules=_modules("inventory", ("items", "stock", "orders", "pricing", "reports")),
    inputs={
        "items.line_total": lambda r: (r.randint(0, 60), r.randint(1, 2000)),
        "items.needs_restock": lambda r: (lambda t: (r.randint(t - 2, t + 2), t))(r.randint(2, 20)),
        "items.bulk_price": lambda r: (r.randint(1, 2000), r.choice([1, 9, 10, 11, 49, 50, 51, 80])),
        "stock.add_stock": lambda r: (_stock(r), r.choice(_PARTS), r.randint(1, 20)),
        "stock.remove_stock": lambda r: _stock_and_part(r),
        "stock.total_units": lambda r: (_stock(r),),
        "stock.low_stock": lambda r: (_stock(r), r.randint(0, 30)),
        "orders.wanted": lambda r: (_order(r),),
        "orders.missing": lambda r: _stock_and_order(r),
        "orders.can_fulfil": lambda r: _stock_and_order(r),
        "orders.fulfil": lambda r: _stock_and_order(r),
        "pricing.order_total": lambda r: (_order(r), _PRICES),
        "pricing.with_shipping": lambda r: (_order(r), _PRICES, r.choice([1000, 5000, 20000])),
        "pricing.stock_value": lambda r: (_stock(r), _PRICES),
        "reports.restock_plan": lambda r: (_stock(r), r.randint(0, 30), r.randint(30, 80)),
        "reports.checkout": lambda r: (*_stock_and_order(r), _PRICES),
    },
)


# ---------------------------------------------------------------- daycount: calendar arithmetic
def _year(r: random.Random) -> int:
    return r.choice([1900, 2000, 2100, 2023, 2024]) if r.random() < 0.4 else r.randint(1990, 2030)


def _date(r: random.Random) -> tuple[int, int, int]:
    import calendar

    year, month = _year(r), r.randint(1, 12)
    last = calendar.monthrange(year, month)[1]
    return (year, month, r.choice([1, last, r.randint(1, last)]))


DAYCOUNT = Family(
    package="daycount",
    summary="Calendar arithmetic without the datetime module: leap years, day numbers, weekdays.",
    modules=_modules("daycount", ("leap", "ordinal", "span", "weekday")),
    inputs={
        "leap.is_leap": lambda r: (_year(r),),
        "leap.days_in_year": lambda r: (_year(r),),
        "leap.days_in_month": lambda r: (_year(r), r.choice([1, 2, 2, 4, 7, 9, 11, 12])),
        "ordinal.day_of_year": lambda r: _date(r),
        "ordinal.from_day_of_year": lambda r: (
            _year(r),
            r.choice([1, 31, 59, 60, 61, 200, 365, r.randint(1, 365)]),
        ),
        "ordinal.days_left": lambda r: _date(r),
        "span.days_before_year": lambda r: (_year(r),),
        "span.to_ordinal": lambda r: _date(r),
        "span.from_ordinal": lambda r: (r.randint(693000, 740000),),
        "span.days_between": lambda r: (_date(r), _date(r)),
        "span.add_days": lambda r: (_date(r), r.randint(-400, 400)),
        "weekday.weekday": lambda r: _date(r),
        "weekday.weekday_name": lambda r: _date(r),
        "weekday.is_weekend": lambda r: _date(r),
        "weekday.business_days_after": lambda r: (_date(r), r.randint(0, 12)),
    },
)


# ---------------------------------------------------------------- gridmath: vectors and small matrices
def _vector(r: random.Random, n: int) -> list[int]:
    return [r.randint(-5, 9) for _ in range(n)]


def _matrix(r: random.Random, rows: int, cols: int) -> list[list[int]]:
    return [_vector(r, cols) for _ in range(rows)]


def _square(r: random.Random) -> list[list[int]]:
    n = r.randint(1, 4)
    m = _matrix(r, n, n)
    if r.random() < 0.3:  # symmetric
        m = [[m[min(i, j)][max(i, j)] for j in range(n)] for i in range(n)]
    return m


def _pair(r: random.Random, fit: bool) -> tuple[list[list[int]], list[list[int]]]:
    n, k, m = r.randint(1, 3), r.randint(1, 3), r.randint(1, 3)
    return _matrix(r, n, k), _matrix(r, k if fit else k + 1, m)


GRIDMATH = Family(
    package="gridmath",
    summary="Vectors and small integer matrices: products, powers, transposes, determinants.",
    modules=_modules("gridmath", ("vectors", "matrices", "products", "analysis")),
    inputs={
        "vectors.dot": lambda r: (lambda n: (_vector(r, n), _vector(r, n)))(r.randint(0, 4)),
        "vectors.add": lambda r: (lambda n: (_vector(r, n), _vector(r, n)))(r.randint(0, 4)),
        "vectors.scale": lambda r: (_vector(r, r.randint(0, 4)), r.randint(-3, 3)),
        "vectors.subtract": lambda r: (lambda n: (_vector(r, n), _vector(r, n)))(r.randint(0, 4)),
        "matrices.shape": lambda r: (_matrix(r, r.randint(0, 3), r.randint(1, 3)),),
        "matrices.column": lambda r: (lambda c: (_matrix(r, r.randint(1, 3), c), r.randrange(c)))(
            r.randint(1, 3)
        ),
        "matrices.transpose": lambda r: (_matrix(r, r.randint(0, 3), r.randint(1, 3)),),
        "matrices.identity": lambda r: (r.randint(0, 4),),
        "matrices.mat_add": lambda r: (lambda n, c: (_matrix(r, n, c), _matrix(r, n, c)))(
            r.randint(1, 3), r.randint(1, 3)
        ),
        "products.matmul": lambda r: _pair(r, r.random() < 0.85),
        "products.mat_vec": lambda r: (lambda c: (_matrix(r, r.randint(1, 3), c), _vector(r, c)))(
            r.randint(1, 3)
        ),
        "products.power": lambda r: (_square(r), r.randint(0, 4)),
        "analysis.trace": lambda r: (_square(r),),
        "analysis.minor": lambda r: (lambda m: (m, r.randrange(len(m)), r.randrange(len(m))))(_square(r)),
        "analysis.determinant": lambda r: (_square(r),),
        "analysis.is_symmetric": lambda r: (_square(r),),
    },
)

FAMILIES: tuple[Family, ...] = (TEXTKIT, INTERVALS, LEDGER, INVENTORY, DAYCOUNT, GRIDMATH)
