"""Masked moments over action tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sao.algos import masked_mean, masked_var


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.tensor([1.0, 2.0, 100.0, 4.0, float("nan"), 7.0], dtype=torch.float64)
    mask = torch.tensor([1, 1, 0, 1, 0, 1], dtype=torch.bool)
    return x, mask


def test_masked_mean_ignores_unmasked_entries_even_nan():
    x, mask = _data()
    assert float(masked_mean(x, mask)) == pytest.approx((1 + 2 + 4 + 7) / 4)


@pytest.mark.parametrize("unbiased", [False, True])
def test_masked_var_matches_numpy(unbiased):
    x, mask = _data()
    expected = np.var([1.0, 2.0, 4.0, 7.0], ddof=1 if unbiased else 0)
    assert float(masked_var(x, mask, unbiased=unbiased)) == pytest.approx(expected)


def test_masked_mean_of_empty_mask_is_zero():
    assert float(masked_mean(torch.ones(3), torch.zeros(3, dtype=torch.bool))) == 0.0
