"""The blocked discounted cumsum equals the plain time loop for every length, decay and dtype."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sao.algos.scan import BLOCK, discounted_cumsum

from .strategies import reference_discounted_cumsum

MAX_LEN = 2000
DECAYS = (0.0, 1e-13, 1e-5, 0.003, 0.01, 0.5, 0.99, 1.0)
# float32 inputs are solved in float32 only when every non-zero decay is >= 0.01; keep the two kinds of
# rows in separate calls so each path is exercised on its own.
FLOAT32_NATIVE = (0.0, 0.01, 0.5, 0.99, 1.0)
FLOAT32_VIA_FLOAT64 = (1e-13, 1e-5, 0.003)
TOL = {torch.float64: {"rtol": 1e-10, "atol": 1e-10}, torch.float32: {"rtol": 1e-5, "atol": 1e-4}}


def _rows(decays: tuple[float, ...], dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, np.ndarray]:
    x = torch.from_numpy(np.random.default_rng(seed).normal(size=(len(decays), MAX_LEN))).to(dtype)
    return x, reference_discounted_cumsum(x.double().numpy(), np.array(decays))


@pytest.mark.parametrize(
    ("dtype", "decays"),
    [
        (torch.float64, DECAYS),
        (torch.float32, FLOAT32_NATIVE),
        (torch.float32, FLOAT32_VIA_FLOAT64),
    ],
)
def test_discounted_cumsum_matches_loop_for_every_length_up_to_2000(dtype, decays):
    # The forward recursion at t only reads x_{<=t}, so the answer for a prefix of length L is the
    # prefix of the full loop: one reference loop checks all lengths 1..2000.
    x, expected = _rows(decays, dtype)
    decay = torch.tensor(decays, dtype=torch.float64)
    for length in range(1, MAX_LEN + 1):
        got = discounted_cumsum(x[:, :length], decay)
        assert got.dtype == dtype and got.shape == (len(decays), length)
        torch.testing.assert_close(got.double(), torch.from_numpy(expected[:, :length]), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("decay", DECAYS)
@pytest.mark.parametrize("length", [1, BLOCK - 1, BLOCK, BLOCK + 1, BLOCK**2, BLOCK**2 + 1, BLOCK**3 + 3])
def test_scalar_decay_matches_loop_at_block_boundaries(dtype, decay, length):
    x = torch.from_numpy(np.random.default_rng(length).normal(size=(3, length))).to(dtype)
    expected = reference_discounted_cumsum(x.double().numpy(), decay)
    got = discounted_cumsum(x, decay)
    torch.testing.assert_close(got.double(), torch.from_numpy(expected), **TOL[dtype])


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 4),
    length=st.integers(1, 600),
    decays=st.lists(st.sampled_from(DECAYS) | st.floats(0.0, 1.0), min_size=4, max_size=4),
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from([torch.float64, torch.float32]),
)
def test_per_row_decays_match_loop(rows, length, decays, seed, dtype):
    x = torch.from_numpy(np.random.default_rng(seed).normal(size=(rows, length))).to(dtype)
    d = torch.tensor(decays[:rows], dtype=torch.float64)
    expected = reference_discounted_cumsum(x.double().numpy(), d.numpy())
    torch.testing.assert_close(discounted_cumsum(x, d).double(), torch.from_numpy(expected), **TOL[dtype])


def test_zero_decay_returns_input_exactly_and_one_is_a_plain_cumsum():
    x = torch.tensor([[1.5, -2.0, 3.25, 0.5]], dtype=torch.float64)
    assert torch.equal(discounted_cumsum(x, 0.0), x)
    assert torch.equal(
        discounted_cumsum(x, 1.0), torch.tensor([[1.5, -0.5, 2.75, 3.25]], dtype=torch.float64)
    )


def test_hand_computed_half_decay():
    # y = [1, 0 + .5·1, 2 + .5·.5, 0 + .5·2.25] = [1, .5, 2.25, 1.125]
    x = torch.tensor([[1.0, 0.0, 2.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(
        discounted_cumsum(x, 0.5), torch.tensor([[1.0, 0.5, 2.25, 1.125]], dtype=torch.float64)
    )


def test_inputs_are_not_mutated():
    x = torch.randn(2, 40, dtype=torch.float64)
    before = x.clone()
    discounted_cumsum(x, 0.7)
    discounted_cumsum(x, torch.tensor([0.3, 1.0]))
    assert torch.equal(x, before)


@pytest.mark.parametrize("decay", [-0.1, 1.5, float("nan")])
def test_decay_outside_unit_interval_raises(decay):
    with pytest.raises(ValueError, match="decay"):
        discounted_cumsum(torch.ones(1, 4), decay)


def test_non_2d_input_raises():
    with pytest.raises(ValueError, match="B, L"):
        discounted_cumsum(torch.ones(4), 0.5)


@pytest.mark.parametrize("scale", [1e9, -1e9])
def test_large_but_representable_float32_inputs_give_finite_results(scale):
    # The answer is ≈ scale·(1 + d + d² …), far inside the dtype's range, so it must come back finite.
    # Inside a block the scan multiplies x by d^-(BLOCK-1) (1e30 at d = 0.01), which overflows float32
    # for |x| > 3.4e8 although the result does not.
    x = torch.full((1, 3 * BLOCK), scale, dtype=torch.float32)
    expected = reference_discounted_cumsum(x.double().numpy(), 0.01)
    got = discounted_cumsum(x, 0.01)
    non_finite = (~got.isfinite()).nonzero()[:, 1].tolist()
    assert non_finite == [], f"non-finite at positions {non_finite[:4]}… for finite inputs {scale:g}"
    torch.testing.assert_close(got.double(), torch.from_numpy(expected), rtol=1e-5, atol=0.0)
