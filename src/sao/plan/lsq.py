"""Small least-squares fits in pure Python: normal equations for a handful of columns, and non-negative
least squares by trying every subset of columns (exact for the 2–4 columns the calibration fits).

Columns are scaled to unit norm before solving, so counters of very different magnitudes (decode steps
vs. context tokens) do not make the normal equations ill-conditioned. A column that is (nearly) a linear
combination of the others is reported as not identifiable: `collinear_columns`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Fit", "collinear_columns", "nnls"]

_RANK_TOL = 1e-6  # relative residual norm under which a column counts as spanned by the others


@dataclass(frozen=True)
class Fit:
    coef: tuple[float, ...]  # one per column (0 for a column left out)
    r2: float  # 1 − SS_res / SS_tot (SS_tot about the mean of y)
    rmse: float  # root-mean-square residual, in y's unit
    n: int


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when singular."""
    n = len(b)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for k in range(col, n + 1):
                m[r][k] -= f * m[col][k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][k] * x[k] for k in range(r + 1, n))) / m[r][r]
    return x


def _lstsq(cols: Sequence[Sequence[float]], y: Sequence[float]) -> list[float] | None:
    norms = [math.sqrt(sum(v * v for v in c)) or 1.0 for c in cols]
    scaled = [[v / norm for v in c] for c, norm in zip(cols, norms, strict=True)]
    gram = [[sum(u * v for u, v in zip(ci, cj, strict=True)) for cj in scaled] for ci in scaled]
    rhs = [sum(u * v for u, v in zip(ci, y, strict=True)) for ci in scaled]
    x = _solve(gram, rhs)
    return None if x is None else [xi / norm for xi, norm in zip(x, norms, strict=True)]


def _residual_ss(cols: Sequence[Sequence[float]], coef: Sequence[float], y: Sequence[float]) -> float:
    return sum((yi - sum(c[i] * k for c, k in zip(cols, coef, strict=True))) ** 2 for i, yi in enumerate(y))


def collinear_columns(cols: Sequence[Sequence[float]]) -> list[int]:
    """Indices of columns that are zero or (nearly) spanned by the columns before them (Gram–Schmidt)."""
    basis: list[list[float]] = []
    out = []
    for j, col in enumerate(cols):
        norm = math.sqrt(sum(v * v for v in col))
        if norm == 0:
            out.append(j)
            continue
        r = [v / norm for v in col]
        for q in basis:
            d = sum(a * b for a, b in zip(r, q, strict=True))
            r = [a - d * b for a, b in zip(r, q, strict=True)]
        rn = math.sqrt(sum(v * v for v in r))
        if rn < _RANK_TOL:
            out.append(j)
        else:
            basis.append([v / rn for v in r])
    return out


def nnls(cols: Sequence[Sequence[float]], y: Sequence[float]) -> Fit:
    """Minimise ``‖y − Σ_j coef_j·cols[j]‖²`` with every ``coef_j >= 0`` (all subsets; ≤ ~6 columns)."""
    n = len(y)
    best: tuple[float, list[float]] = (_residual_ss(cols, [0.0] * len(cols), y), [0.0] * len(cols))
    for size in range(1, len(cols) + 1):
        for subset in itertools.combinations(range(len(cols)), size):
            x = _lstsq([cols[j] for j in subset], y)
            if x is None or min(x) < 0:
                continue
            coef = [0.0] * len(cols)
            for j, v in zip(subset, x, strict=True):
                coef[j] = v
            ss = _residual_ss(cols, coef, y)
            if ss < best[0] - 1e-15 * (1 + best[0]):
                best = (ss, coef)
    ss, coef = best
    mean = sum(y) / n
    ss_tot = sum((v - mean) ** 2 for v in y)
    r2 = 1.0 - ss / ss_tot if ss_tot > 0 else (1.0 if ss <= 1e-18 else 0.0)
    return Fit(tuple(coef), r2, math.sqrt(ss / n), n)
