"""Lane arithmetic against an independent integer reference, bit for bit."""

import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra.numpy import arrays

from inagg.models import arith

I32_MIN, I32_MAX = -(2**31), 2**31 - 1


def rne_f32(n: int) -> float:
    """An integer rounded to the nearest binary32, ties to even, in exact integer arithmetic."""
    m = abs(n)
    shift = max(m.bit_length() - 24, 0)
    q, r = divmod(m, 1 << shift)
    half = (1 << shift) >> 1
    if shift and (r > half or (r == half and q & 1)):
        q += 1
    return float(q << shift) * (1 if n >= 0 else -1)


def reference(rows: np.ndarray) -> np.ndarray:
    """The protocol's arithmetic, lane by lane in Python integers (slow, obviously right)."""
    k, lanes = rows.shape
    out_int, out_fp, promoted = [], [], []
    for lane in range(lanes):
        acc, f, p = 0, 0.0, False
        for x in (int(v) for v in rows[:, lane]):
            if p:
                f = rne_f32(int(f) + int(rne_f32(x)))
            elif I32_MIN <= acc + x <= I32_MAX:
                acc += x
            else:
                p, f = True, rne_f32(acc + x)
        out_int.append(acc)
        out_fp.append(f if p else rne_f32(acc))
        promoted.append(p)
    if any(promoted):
        return np.array(out_fp, np.float32)
    return np.array(out_int, np.int32)


def same(a, b):
    return a.dtype == b.dtype and np.array_equal(a.view(np.uint32), b.view(np.uint32))


extreme = st.one_of(st.integers(I32_MIN, I32_MAX), st.sampled_from([I32_MIN, I32_MAX, -1, 0, 1, 2**30, -(2**30)]))


@given(arrays(np.int32, st.tuples(st.integers(1, 64), st.integers(1, 16)), elements=extreme))
def test_matches_reference(rows):
    assert same(arith.aggregate(rows), reference(rows))


@given(arrays(np.int32, st.tuples(st.integers(2, 64), st.integers(1, 16)),
              elements=st.integers(-(2**24), 2**24)), st.randoms())
def test_order_independent_without_overflow(rows, rnd):
    perm = list(range(rows.shape[0]))
    rnd.shuffle(perm)
    a, b = arith.aggregate(rows), arith.aggregate(rows[perm])
    assert a.dtype == np.int32 and same(a, b)
    assert np.array_equal(a, rows.astype(np.int64).sum(axis=0))


@pytest.mark.parametrize("rows,expect_fp", [
    ([[I32_MAX], [0]], False),
    ([[I32_MAX], [1]], True),
    ([[I32_MIN], [0]], False),
    ([[I32_MIN], [-1]], True),
    ([[I32_MAX - 5], [3], [2]], False),
    ([[I32_MAX - 5], [3], [3]], True),
])
def test_promotion_exactly_at_the_int32_boundary(rows, expect_fp):
    out = arith.aggregate(np.array(rows, np.int32))
    assert (out.dtype == np.float32) is expect_fp
    assert out[0] == float(np.sum(np.array(rows, np.int64)))


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_overflow_on_first_middle_or_last_worker(where):
    n = 9
    rows = np.full((n, 4), 1000, np.int32)
    i = {"first": 1, "middle": n // 2, "last": n - 1}[where]
    rows[i - 1] = I32_MAX  # the overflow happens at worker i
    out = arith.aggregate(rows)
    assert out.dtype == np.float32 and same(out, reference(rows))


def test_cancellation_back_below_int32_after_promotion():
    rows = np.array([[I32_MAX], [I32_MAX], [-I32_MAX], [-I32_MAX], [7]], np.int32)
    out = arith.aggregate(rows)
    # 2**32 - 2 rounds to 2**32; then -2**31 + 1 -> 2**31; -> 0 (up to rounding); + 7.
    assert out.dtype == np.float32 and same(out, reference(rows)) and out[0] == 7.0


def test_alternating_signs():
    rows = np.array([[I32_MAX, I32_MIN]] + [[1, -1], [-1, 1]] * 20, np.int32)
    assert same(arith.aggregate(rows), reference(rows))


def test_unpromoted_lanes_are_converted_with_rne():
    # lane 1 holds 2**24 + 1, which is not a binary32: it must round to even (2**24).
    rows = np.array([[I32_MAX, 2**24], [1, 1]], np.int32)
    out = arith.aggregate(rows)
    assert out.dtype == np.float32 and out[1] == 2.0**24


@given(arrays(np.int32, st.tuples(st.integers(2, 64), st.integers(1, 8)), elements=extreme))
def test_fp32_error_within_bound(rows):
    """Promoted lanes stay within k * 2**-24 of the exact sum, relative to the largest partial sum."""
    out = arith.aggregate(rows).astype(np.float64)
    exact = rows.astype(np.int64).sum(axis=0).astype(np.float64)
    partial = np.abs(np.cumsum(rows.astype(np.int64), axis=0)).max(axis=0) + np.abs(rows.astype(np.int64)).max(axis=0)
    assert (np.abs(out - exact) <= rows.shape[0] * partial * 2.0**-24).all()


def test_per_step_pieces():
    s, ovf = arith.lane_add(np.array([I32_MAX, 5], np.int32), np.array([1, -5], np.int32))
    assert s.tolist() == [2**31, 0] and ovf.tolist() == [True, False]
    assert arith.int_to_fp32(np.array([2**31 + 128], np.int64))[0] == 2.0**31  # tie to even
    assert arith.int_to_fp32(np.array([2**31 + 384], np.int64))[0] == 2.0**31 + 512
    assert arith.fp32_add(np.float32(2.0**24), np.float32(1.0)) == 2.0**24
    with pytest.raises(TypeError):
        arith.int_to_fp32(np.array([1.0]))


def test_bad_input():
    with pytest.raises(ValueError, match="int32"):
        arith.aggregate(np.zeros((2, 3), np.int64))
    with pytest.raises(ValueError, match="shape"):
        arith.aggregate(np.zeros((0, 3), np.int32))
    with pytest.raises(ValueError, match="lanes"):
        arith.accumulate(arith.LaneState(4), np.zeros(3, np.int32))


@given(st.lists(st.integers(-2**31, 2**31 - 1), min_size=8, max_size=8), st.lists(st.integers(-2**31, 2**31 - 1),
       min_size=8, max_size=8))
def test_merging_an_int32_partial_is_accumulating_it(a, b):
    x, y = np.array(a, np.int32), np.array(b, np.int32)
    s, t = arith.LaneState(8), arith.LaneState(8)
    arith.accumulate(s, x, first=True)
    arith.accumulate(s, y)
    arith.merge(t, x.view(np.uint32), np.zeros(8, bool), first=True)
    arith.merge(t, y.view(np.uint32), np.zeros(8, bool))
    assert np.array_equal(s.words, t.words) and np.array_equal(s.promoted, t.promoted)


def test_merge_adds_promoted_lanes_in_fp32_and_keeps_int32_lanes_exact():
    s = arith.LaneState(4)
    arith.merge(s, np.array([2**24 + 1, 0, 5, 2**31 - 1], np.int32).view(np.uint32), np.zeros(4, bool), first=True)
    other = np.array([1, 0, 0, 1], np.int32).view(np.uint32).copy()
    other[1] = np.float32(0.5).view(np.uint32)          # a promoted lane on the incoming side only
    arith.merge(s, other, np.array([False, True, False, False]))
    assert list(s.promoted) == [False, True, False, True]
    assert s.words.view(np.int32)[0] == 2**24 + 2 and s.words.view(np.int32)[2] == 5
    assert s.words.view(np.float32)[1] == np.float32(0.5) and s.words.view(np.float32)[3] == np.float32(2.0**31)
    with pytest.raises(ValueError, match="partial has 3 lanes and 4 promotion bits, the slot 4"):
        arith.merge(s, np.zeros(3, np.uint32), np.zeros(4, bool))
