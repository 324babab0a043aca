"""Masked moments and whitening over action tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sao.algos import masked_mean, masked_var, masked_whiten


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


def test_masked_whiten_gives_zero_mean_unit_variance_on_the_mask_and_zero_elsewhere():
    x, mask = _data()
    out = masked_whiten(x, mask)
    assert float(masked_mean(out, mask)) == pytest.approx(0.0, abs=1e-12)
    assert float(masked_var(out, mask)) == pytest.approx(1.0, rel=1e-6)
    assert torch.equal(out[~mask], torch.zeros(2, dtype=torch.float64))


def test_masked_whiten_without_shift_keeps_the_mean():
    x, mask = _data()
    out = masked_whiten(x, mask, shift_mean=False)
    assert float(masked_mean(out, mask)) == pytest.approx(float(masked_mean(x, mask)))
    assert float(masked_var(out, mask)) == pytest.approx(1.0, rel=1e-6)
