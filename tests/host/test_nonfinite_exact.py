"""The all-reduce's non-finite round and the exact int32 sum, on threads over the in-process fabric."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inagg import host
from inagg.host.api import run
from inagg.host.controller import plan
from inagg.host.exact import ExactSum, SumOverflowError
from inagg.host.link import Faults
from inagg.host.worker import AllReduce

PLAN = plan([3], window=4, chunk_bytes=256)
FAST = host.Timing(timeout=0.02, max_timeout=0.1, tries=20)


def run_ops(on_threads, make, arrays, faults=None):
    """``make(worker, array)`` on each rank, driven to its end; the ops, or the errors they raised, by rank."""
    ops, errors = on_threads(PLAN, FAST, lambda r, g: run(make(g.worker, arrays[r]), g), faults=faults, seed=3)
    return {**ops, **errors}


def propagating(worker, data):
    return AllReduce(worker, data, propagate_nonfinite=True)


SPECIALS = st.sampled_from([np.inf, -np.inf, np.nan])


@settings(max_examples=8, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 199), SPECIALS), max_size=12))
def test_nonfinite_values_land_where_an_ieee_sum_puts_them(on_threads, placed):
    rng = np.random.default_rng(len(placed))
    arrays = [rng.standard_normal(200).astype(np.float32) for _ in range(3)]
    for r, i, v in placed:
        arrays[r][i] = v
    want = arrays[0] + arrays[1] + arrays[2]  # float32, IEEE: inf + -inf is NaN, NaN wins
    out = run_ops(on_threads, propagating, arrays, Faults(loss=0.05, dup=0.05))
    odd = ~np.isfinite(want)
    for r in range(3):
        op = out[r]
        assert op.nonfinite == bool(placed)
        got = op.result()
        assert np.array_equal(np.isnan(got), np.isnan(want))
        assert np.array_equal(got[odd & ~np.isnan(want)], want[odd & ~np.isnan(want)])
        exact = sum(np.where(np.isfinite(a), a, 0).astype(np.float64) for a in arrays)
        assert np.allclose(got[~odd], exact[~odd], rtol=2**-22, atol=op.error_bound())


def test_without_propagation_a_nonfinite_value_is_refused_before_sending():
    data = np.array([1, -np.inf], np.float32)
    with pytest.raises(ValueError, match=r"data holds NaN or infinity \(first at index 1\); refusing to send it"):
        AllReduce(None, data)


def test_exact_sum_is_the_int32_sum(on_threads):
    rng = np.random.default_rng(1)
    arrays = [rng.integers(-2**28, 2**28, 300, dtype=np.int32) for _ in range(3)]
    out = run_ops(on_threads, ExactSum, arrays)
    for r in range(3):
        assert out[r].result().dtype == np.int32
        assert np.array_equal(out[r].result(), arrays[0] + arrays[1] + arrays[2])


def test_exact_sum_out_of_int32_range_fails_every_rank(on_threads):
    arrays = [np.array([2**30, 1], np.int32)] * 3
    out = run_ops(on_threads, ExactSum, arrays)
    for r in range(3):
        assert isinstance(out[r], SumOverflowError)
        assert str(out[r]) == (f"job 1 worker {r}: an int32 sum overflowed (the switch promoted it to float32); "
                               "gloo would wrap it around, inagg refuses it")


def test_exact_sum_takes_int32_only():
    with pytest.raises(TypeError, match="^allreduce takes a int32 array, not float32$"):
        ExactSum(None, np.ones(2, np.float32))
