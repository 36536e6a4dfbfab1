"""FP32 <-> INT32 quantization with a power-of-two scale.

A worker sends ``q = round_half_even(x * 2**e)`` saturated to INT32; the
switch adds INT32 lanes; the worker divides the sum by ``2**e``. Because the
scale is a power of two, multiplying by it is exact in binary floating point
(barring underflow), so the only quantization error is the rounding to an
integer: at most 1/2 unit of the grid ``2**-e`` per worker and element.

Scale rule (:func:`choose_exponent`): the largest ``e`` such that ``n``
workers' values of magnitude up to ``amax`` cannot overflow INT32 when added:
``n * amax * 2**e <= 2**31 - 1`` (with rounding accounted for). All workers
of an all-reduce must use the same ``e``; the host library agrees on it
before sending (``docs/protocol.md``, "Quantization").

Error bound of a dequantized sum of ``n`` contributions that did not
overflow: ``|sum_dq - sum_exact| <= n * 2**-(e+1)`` (:func:`error_bound`).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["INT32_MIN", "INT32_MAX", "EXP_MIN", "EXP_MAX", "choose_exponent", "quantize",
           "dequantize", "error_bound"]

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1
# Exponents outside this range would make 2**e or 2**-e overflow or go
# subnormal in float32 for the values a gradient can hold.
EXP_MIN = -126
EXP_MAX = 126


def choose_exponent(amax: float, workers: int) -> int:
    """The scale exponent ``e`` for values of magnitude at most ``amax`` summed over ``workers``.

    ``amax == 0`` (all-zero data, where any scale is exact) gets 0.
    """
    if not isinstance(workers, (int, np.integer)) or workers < 1:
        raise ValueError(f"workers must be a positive integer, not {workers!r}")
    amax = float(amax)
    if not math.isfinite(amax) or amax < 0:
        raise ValueError(f"amax must be a finite non-negative number, not {amax!r}")
    if amax == 0.0:
        return 0
    # Each worker may round up by 1/2 after scaling, so require
    # workers * (amax * 2**e + 1/2) <= INT32_MAX.
    limit = (INT32_MAX / workers - 0.5) / amax
    if limit <= 2.0 ** EXP_MIN:
        return EXP_MIN
    e = math.floor(math.log2(limit))
    # log2 can round the wrong way right at a power of two; settle it exactly.
    while e > EXP_MIN and workers * (amax * 2.0**e + 0.5) > INT32_MAX:
        e -= 1
    while e < EXP_MAX and workers * (amax * 2.0 ** (e + 1) + 0.5) <= INT32_MAX:
        e += 1
    return int(max(EXP_MIN, min(EXP_MAX, e)))


def _check_exponent(e: int) -> None:
    if not isinstance(e, (int, np.integer)) or not EXP_MIN <= e <= EXP_MAX:
        raise ValueError(f"scale exponent must be an integer in {EXP_MIN}..{EXP_MAX}, not {e!r}")


def quantize(x: np.ndarray, e: int) -> np.ndarray:
    """``round_half_even(x * 2**e)`` saturated to INT32, as int32.

    Raises ``TypeError`` for a non-float32 array and ``ValueError`` for NaN or
    infinity: a non-finite gradient would poison the sum of every worker.
    """
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise TypeError(f"quantize takes float32 data, not {x.dtype}")
    _check_exponent(e)
    if not np.isfinite(x).all():
        bad = int(np.flatnonzero(~np.isfinite(x.ravel()))[0])
        raise ValueError(f"data holds NaN or infinity (first at flat index {bad}); refusing to send it")
    # float64 holds x * 2**e exactly (24-bit significand, |e| <= 126), and
    # np.rint rounds half to even.
    scaled = np.rint(x.astype(np.float64) * np.float64(2.0) ** e)
    return np.clip(scaled, INT32_MIN, INT32_MAX).astype(np.int32)


def dequantize(q: np.ndarray, e: int) -> np.ndarray:
    """The float32 value of an INT32 (or FP32-promoted) sum on the grid ``2**-e``.

    Both go through float64, where the value and the power-of-two scale
    are exact, and are rounded once to float32.
    """
    q = np.asarray(q)
    _check_exponent(e)
    if q.dtype not in (np.int32, np.float32):
        raise TypeError(f"dequantize takes int32 or float32 sums, not {q.dtype}")
    return (q.astype(np.float64) * np.float64(2.0) ** -e).astype(np.float32)


def error_bound(e: int, workers: int) -> float:
    """Bound on ``|dequantized sum - exact sum|`` from rounding to the grid, before the final float32 rounding."""
    _check_exponent(e)
    return workers * 2.0 ** -(e + 1)
