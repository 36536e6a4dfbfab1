"""Quantization: the scale rule, rounding, saturation, refusal of non-finite data."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

from inagg.models import quant

amax_st = st.floats(min_value=1e-30, max_value=1e30, allow_nan=False, allow_infinity=False)


@given(amax=amax_st, n=st.integers(1, 64))
def test_exponent_is_the_largest_safe_one(amax, n):
    e = quant.choose_exponent(amax, n)
    assert n * (amax * 2.0**e + 0.5) <= quant.INT32_MAX or e == quant.EXP_MIN
    assert n * (amax * 2.0 ** (e + 1) + 0.5) > quant.INT32_MAX or e == quant.EXP_MAX


@given(amax=st.floats(min_value=1e-6, max_value=1e6), n=st.integers(1, 64), seed=st.integers(0, 2**32 - 1))
def test_sum_at_the_chosen_scale_cannot_overflow(amax, n, seed):
    rng = np.random.default_rng(seed)
    x = (rng.choice([-1.0, 1.0], size=(n, 64)) * amax).astype(np.float32)
    amax32 = float(np.abs(x).max())
    e = quant.choose_exponent(amax32, n)
    total = quant.quantize(x, e).astype(np.int64).sum(axis=0)
    assert (np.abs(total) <= quant.INT32_MAX).all()


def test_round_half_to_even_and_saturation():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 3e9, -3e9, 2.0**31], np.float32)
    assert quant.quantize(x, 0).tolist() == [0, 2, 2, 0, -2, quant.INT32_MAX, quant.INT32_MIN, quant.INT32_MAX]


@given(e=st.integers(-20, 30), seed=st.integers(0, 2**32 - 1))
def test_round_trip_error_is_half_a_grid_step(e, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(256) * 2.0 ** (20 - e)).astype(np.float32)
    back = quant.dequantize(quant.quantize(x, e), e).astype(np.float64)
    assert (np.abs(back - x) <= 2.0 ** -(e + 1) + np.abs(x) * 2.0**-24).all()


def test_error_bound_of_a_sum():
    rng = np.random.default_rng(7)
    n = 8
    x = rng.standard_normal((n, 4096)).astype(np.float32)
    e = quant.choose_exponent(float(np.abs(x).max()), n)
    s = quant.quantize(x, e).astype(np.int64).sum(axis=0)
    approx = s.astype(np.float64) * 2.0**-e
    exact = x.astype(np.float64).sum(axis=0)
    assert np.abs(approx - exact).max() <= quant.error_bound(e, n)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_data_is_refused(bad):
    x = np.ones(10, np.float32)
    x[3] = bad
    with pytest.raises(ValueError, match="flat index 3"):
        quant.quantize(x, 0)


def test_argument_errors():
    with pytest.raises(TypeError, match="float32"):
        quant.quantize(np.ones(3), 0)
    with pytest.raises(ValueError, match="exponent"):
        quant.quantize(np.ones(3, np.float32), 500)
    with pytest.raises(ValueError, match="workers"):
        quant.choose_exponent(1.0, 0)
    with pytest.raises(ValueError, match="amax"):
        quant.choose_exponent(float("nan"), 2)
    with pytest.raises(TypeError, match="int32 or float32"):
        quant.dequantize(np.ones(3, np.int64), 0)
    assert quant.choose_exponent(0.0, 4) == 0


def test_fp32_sums_dequantize():
    s = np.array([2.0**33, -3.0], np.float32)
    assert quant.dequantize(s, 3).tolist() == [2.0**30, -0.375]
