"""Contributions that drive INT32 lanes into FP32 promotion, for the switch tests of issue 4.

:func:`adversarial` gives one chunk's contributions of ``n`` workers, rows
in sending order, each lane following one of the :data:`PATTERNS`: the
places where a promoting adder goes wrong (the overflow on the first, a
middle or the last addition, alternating signs, sums that cancel back below
2**31 after the promotion, FP32 ties) next to lanes that never overflow, so
one chunk mixes promoted and unpromoted lanes. The switch may take the rows
in another order (ports merge, frames are lost and resent); the tests
compare with the model fed in the RTL's order, so any order is exact.
"""

from __future__ import annotations

import numpy as np

__all__ = ["PATTERNS", "adversarial"]

_MAX = (1 << 31) - 1
_MIN = -(1 << 31)

#: The lane patterns, in the order of their pattern numbers.
PATTERNS = ("small", "first", "middle", "last", "alternating", "cancel", "random", "ties")


def _column(kind: str, rng: np.random.Generator, n: int, lanes: int) -> np.ndarray:
    """``lanes`` lanes of pattern ``kind`` over ``n`` workers, as int64 of shape (n, lanes)."""
    noise = rng.integers(0, 1 << 12, (n, lanes))
    rows = np.arange(n)[:, None]
    if kind == "small":
        return rng.integers(-(1 << 20), 1 << 20, (n, lanes))
    if kind == "first":          # overflows on the first addition (worker 1 of the sending order)
        return np.where(rows == 0, _MAX - noise, np.where(rows == 1, (1 << 30) + noise,
                                                          rng.integers(_MIN, _MAX, (n, lanes), endpoint=True)))
    if kind == "middle":         # each a bit over 2**31 / (n/2): the sum passes 2**31 half way
        share = (1 << 31) // max(1, n // 2) + 1
        return np.minimum(share + noise, _MAX)
    if kind == "last":           # the first n-1 stay just inside INT32, the last one crosses
        share = _MAX // max(1, n - 1)
        return np.where(rows == n - 1, (1 << 30) + noise, share - noise)
    if kind == "alternating":    # two big ones overflow, then signs alternate at full scale
        sign = np.where(rows % 2 == 0, 1, -1)
        return np.where(rows < 2, _MAX - noise, np.where(sign > 0, _MAX - noise, _MIN + noise))
    if kind == "cancel":         # 2**31 + r, then -2**31: back below 2**31, still FP32
        return np.where(rows == 0, _MAX, np.where(rows == 1, 1 + noise, np.where(rows == 2, _MIN, noise - 2048)))
    if kind == "random":
        return rng.integers(_MIN, _MAX, (n, lanes), endpoint=True)
    if kind == "ties":           # 2**31 + 256k + 128, then odd multiples of 128: ties at every addition
        k = rng.integers(0, 1 << 10, (n, lanes))
        odd = 128 * (2 * rng.integers(-64, 64, (n, lanes)) + 1)
        return np.where(rows == 0, _MAX, np.where(rows == 1, 256 * k + 129, odd))
    raise ValueError(f"unknown lane pattern {kind!r}: one of {PATTERNS}")


def adversarial(rng: np.random.Generator, n: int, lanes: int, kinds: tuple[str, ...] = PATTERNS) -> np.ndarray:
    """Contributions of ``n`` workers to one chunk of ``lanes`` lanes, int32 of shape (n, lanes).

    Each lane follows one of ``kinds``, drawn at random per lane; with the
    default every pattern of :data:`PATTERNS` is in the mix.
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"worker count must be a positive integer, not {n!r}")
    pick = rng.integers(0, len(kinds), lanes)
    out = np.zeros((n, lanes), np.int64)
    for i, kind in enumerate(kinds):
        cols = np.flatnonzero(pick == i)
        out[:, cols] = _column(kind, rng, n, cols.size)
    return out.astype(np.int32)
