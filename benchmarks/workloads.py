"""Workload helpers shared by the benchmark scripts (imported as a sibling module)."""

from __future__ import annotations

from statistics import NormalDist

import torch

__all__ = ["long_tailed_lengths"]


def long_tailed_lengths(n: int, median: int, tail: float, seed: int, minimum: int = 1) -> list[int]:
    """``n`` lognormal quantiles with the given median and max/median = ``tail``, shuffled, >= ``minimum``."""
    z_max = NormalDist().inv_cdf((n - 0.5) / n)
    sigma = torch.tensor(tail).log().item() / z_max
    lengths = [
        max(minimum, round(median * torch.tensor(sigma * NormalDist().inv_cdf((i + 0.5) / n)).exp().item()))
        for i in range(n)
    ]
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    return [lengths[i] for i in order]
