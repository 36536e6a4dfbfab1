"""Operands and expected results for the FP32 units, shared by every simulator.

Operands are bit patterns (``uint32`` for binary32, ``int64`` for integers)
so that signed zeros, subnormals and NaN payloads survive unchanged. The
expected results come from :mod:`inagg.models.arith` and nowhere else.
"""

from __future__ import annotations

import numpy as np

from inagg.models.arith import fp32_add, int_to_fp32

__all__ = [
    "adder_edge_cases", "adder_random", "adder_expected", "adder_mismatches", "adder_report",
    "int_edge_cases", "int_random", "int_expected", "int_report",
    "valid_pattern", "port_values", "expected_valid",
]

_MAX = 0x7F7F_FFFF      # largest finite
_MIN_NORMAL = 0x0080_0000
_MAX_SUB = 0x007F_FFFF
_MIN_SUB = 0x0000_0001
_INF = 0x7F80_0000
_SIGN = 0x8000_0000


def valid_pattern(rng: np.random.Generator, n: int, head: int = 64) -> np.ndarray:
    """The cycles that carry ``n`` operands: ``head`` of them back to back, the rest with idle gaps.

    After the back-to-back run, one operand in eight follows a gap of one
    to three idle cycles, so the pipeline sees every mix of full and empty
    stages.
    """
    head = min(n, head)
    gap = (rng.random(n - head) < 0.125) * rng.integers(1, 4, n - head)
    where = np.concatenate([np.arange(head), head + np.cumsum(1 + gap) - 1])
    valid = np.zeros(where[-1] + 1 if n else 0, bool)
    valid[where] = True
    return valid


def port_values(rng: np.random.Generator, values: np.ndarray, width: int, valid: np.ndarray,
                cycles: int) -> np.ndarray:
    """What a ``width``-bit port carries each of ``cycles`` cycles: ``values`` in order where
    ``valid`` is set, random garbage on the idle cycles (which the unit must ignore)."""
    lanes = rng.integers(0, 1 << min(width, 63), cycles, dtype=np.uint64)
    lanes[np.flatnonzero(valid)] = np.asarray(values).astype(np.uint64) & np.uint64((1 << width) - 1)
    return lanes


def expected_valid(valid: np.ndarray, latency: int, cycles: int,
                   reset: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``o_valid`` after each of ``cycles`` clock edges, and the operand each valid output carries.

    ``valid[t]`` (and ``reset[t]``) hold at edge ``t``; an operand taken at
    edge ``t`` comes out after edge ``t + latency - 1``. A reset edge clears
    every stage, so an operand comes out only if none of the ``latency``
    edges from the one that took it onwards is a reset edge. The operands
    are numbered in the order they entered.
    """
    taken = np.zeros(cycles, bool)
    taken[:len(valid)] = valid
    operand = np.cumsum(taken) - 1
    if reset is not None:
        r = np.zeros(cycles + latency, np.int64)
        r[:len(reset)] = reset
        c = np.concatenate([[0], np.cumsum(r)])
        taken &= (c[latency:latency + cycles] - c[:cycles]) == 0
    o_valid = np.zeros(cycles, bool)
    o_valid[latency - 1:] = taken[:cycles - latency + 1]
    return o_valid, operand[np.flatnonzero(taken[:cycles - latency + 1])]


def _bits(*values: float) -> list[int]:
    return [int(np.float32(v).view(np.uint32)) for v in values]


def adder_edge_cases() -> tuple[np.ndarray, np.ndarray]:
    """The named corner cases of binary32 addition, each pair in both operand orders."""
    one = _bits(1.0)[0]
    pairs = [
        # Signed zeros: only (-0) + (-0) is -0.
        (0, 0), (0, _SIGN), (_SIGN, _SIGN),
        # Exact cancellation gives +0.
        *[(x, x ^ _SIGN) for x in (one, *_bits(2.0**31, 2.0**37, 3e7, -5.0), _MAX, _MIN_NORMAL, _MAX_SUB, _MIN_SUB)],
        # Adding zero keeps the other operand.
        *[(x, z) for x in (one, _MIN_SUB, _MAX, _bits(-7.0)[0]) for z in (0, _SIGN)],
        # Carries into a new exponent.
        *[tuple(_bits(x, y)) for x, y in (
            (1.5, 1.5), (2.0**24 - 1, 1.0), (2.0**24 - 1, 2.0**24 - 1), (1.75, 0.25),
            (2.0**31 - 128, 128.0), (2.0**37 - 2.0**13, 2.0**13), (-(2.0**24 - 1), -1.0))],
        (_MAX, _MAX),                              # overflow to infinity
        (_MAX, _bits(2.0**103)[0]),                # tie above the largest finite: rounds to infinity
        (_MAX, _bits(2.0**102)[0]),                # below the tie: stays finite
        (_MAX ^ _SIGN, _bits(-(2.0**103))[0]),
        # Ties to even and their neighbours.
        *[tuple(_bits(x, y)) for x, y in (
            (2.0**24, 1.0), (2.0**24, 3.0), (2.0**24 + 2, 1.0), (1.0, 2.0**-24), (1.0, 3 * 2.0**-24),
            (1.0, 2.0**-24 * (1 + 2.0**-23)), (1.0, -(2.0**-25)), (1.0, -(2.0**-25) * (1 + 2.0**-23)),
            (2.0**25, -1.0), (2.0**25 + 4, -1.0), (2.0**31, 64.0), (2.0**31, 192.0),
            (2.0**37, 2.0**13), (2.0**37, 3 * 2.0**13), (-(2.0**37), -(2.0**13)), (2.0**37, -(2.0**12)))],
        # Borrows that cancel many leading bits.
        *[tuple(_bits(x, y)) for x, y in (
            (2.0**24, -1.0), (1.0, -(1.0 - 2.0**-24)), (2.0**31, -(2.0**31 - 128)),
            (1.0000001, -1.0), (2.0**37 - 2.0**13, -(2.0**37 - 2.0**14)), (3.0, -2.0))],
        # Large exponent differences: all of the smaller operand goes into the sticky bit.
        *[tuple(_bits(x, y)) for x, y in (
            (1.0, 2.0**-30), (1.0, -(2.0**-30)), (1e30, 1.0), (-1e30, 1.0), (2.0**37, 1.0),
            (2.0**37, -1.0), (2.0**-100, 2.0**100))],
        (_MAX, _MIN_SUB), (_MAX, _MIN_SUB | _SIGN), (one, _MIN_SUB), (one | _SIGN, _MIN_SUB),
        # Subnormals.
        (_MIN_SUB, _MIN_SUB), (_MAX_SUB, _MIN_SUB), (_MIN_NORMAL, _MIN_SUB | _SIGN),
        (_MAX_SUB, _MAX_SUB), (_MIN_NORMAL | _SIGN, _MAX_SUB), (0x0040_0000, 0x0040_0000),
        (_bits(1.5 * 2.0**-126)[0], _MIN_NORMAL | _SIGN), (_MIN_NORMAL + 1, _MIN_NORMAL | _SIGN),
        # Infinities and NaNs.
        (_INF, one), (_INF, _INF), (_INF, _INF | _SIGN), (_INF | _SIGN, _INF | _SIGN),
        (_INF, _MAX | _SIGN), (0x7FC0_0000, one), (0x7F80_0001, one), (0xFFC0_0000, _INF),
        (0x7FC0_0000, 0x7FC0_0001), (0xFFFF_FFFF, 0),
    ]
    a = np.array([p[0] for p in pairs] + [p[1] for p in pairs], np.uint32)
    b = np.array([p[1] for p in pairs] + [p[0] for p in pairs], np.uint32)
    return a, b


def _integer_floats(rng: np.random.Generator, n: int) -> np.ndarray:
    """Values a promoted lane holds: converted INT32s and sums of up to 64 of them."""
    x = rng.integers(-(1 << 31), 1 << 31, n, dtype=np.int64)
    x *= rng.integers(1, 65, n)
    x >>= rng.integers(0, 40, n)
    return int_to_fp32(x).view(np.uint32)


def adder_random(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` seeded operand pairs mixing the regimes where adders go wrong.

    One fifth each: uniform bit patterns (mostly large exponent gaps, and
    every special encoding); operands within 0-31 binades of each other;
    near-cancellation (the second operand the negated first, a few ulps
    off); integer-valued floats as a promoted lane sees them; subnormals
    and tiny normals.
    """
    k = n // 5
    parts = []
    u = rng.integers(0, 1 << 32, (2, k), dtype=np.uint64).astype(np.uint32)
    parts.append(u)

    exp = rng.integers(32, 255, k)
    exps = np.stack([exp, exp - rng.integers(0, 32, k)]).astype(np.uint32)
    signs = rng.integers(0, 2, (2, k)).astype(np.uint32)
    parts.append((signs << np.uint32(31)) | (exps << np.uint32(23)) | rng.integers(0, 1 << 23, (2, k)).astype(np.uint32))

    a = rng.integers(0, 1 << 32, k, dtype=np.uint64).astype(np.uint32) & np.uint32(0xBFFF_FFFF)
    ulps = rng.integers(-4, 5, k).astype(np.int64)
    b = ((a.astype(np.int64) + ulps) & 0xFFFF_FFFF).astype(np.uint32) ^ np.uint32(_SIGN)
    parts.append(np.stack([a, b]))

    parts.append(np.stack([_integer_floats(rng, k), _integer_floats(rng, k)]))

    m = n - 4 * k
    tiny = rng.integers(0, 1 << 25, (2, m), dtype=np.uint64).astype(np.uint32)
    tiny |= rng.integers(0, 2, (2, m)).astype(np.uint32) << np.uint32(31)
    parts.append(tiny)

    both = np.concatenate(parts, axis=1)
    order = rng.permutation(n)
    return both[0][order], both[1][order]


def adder_expected(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The model's sums as bit patterns (overflow to infinity and NaNs are not errors here)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return fp32_add(a.view(np.float32), b.view(np.float32)).view(np.uint32)


def adder_mismatches(a: np.ndarray, b: np.ndarray, got: np.ndarray) -> np.ndarray:
    """Indices where the adder's output ``got`` differs from the model.

    Equal bits are required everywhere except where the model gives a NaN:
    there the adder must give its canonical quiet NaN, ``0x7FC00000``
    (numpy's NaN payload depends on the CPU).
    """
    want = adder_expected(a, b)
    nan = np.isnan(want.view(np.float32))
    ok = np.where(nan, got == np.uint32(0x7FC0_0000), got == want)
    return np.flatnonzero(~ok)


def adder_report(a: np.ndarray, b: np.ndarray, got: np.ndarray, limit: int = 10) -> str:
    """Empty when ``got`` is the model's sums of ``a`` and ``b``; else the count and the first mismatches."""
    bad = adder_mismatches(a, b, got)
    want = adder_expected(a, b)
    if not len(bad):
        return ""
    return "\n".join([f"{len(bad)} of {len(a)} sums differ from numpy:"] + [
        f"  {a[i]:#010x} + {b[i]:#010x} = {got[i]:#010x}, numpy {want[i]:#010x}" for i in bad[:limit]])


def int_edge_cases(width: int) -> np.ndarray:
    """The named corner cases of integer to binary32 conversion for a ``width``-bit input."""
    top = 1 << (width - 1)
    xs = [0, 1, -1, 2, -2, 3, 7, (1 << 24) - 1, 1 << 24, (1 << 24) + 1, (1 << 24) + 2, (1 << 24) + 3,
          (1 << 25) + 2, (1 << 25) + 6, (1 << 25) - 1, (1 << 31) - 1, -(1 << 31), (1 << 31) - 64,
          (1 << 31) - 65, (1 << 31) - 192, (1 << 32) - 1, -(1 << 32), (1 << 32) - 128, (1 << 32) - 129,
          top - 1, -top, -top + 1, top - (top >> 24), top - (top >> 24) - 1, top - (top >> 23),
          (top >> 1) + (top >> 25), (top >> 1) + 3 * (top >> 25), 0x5555_5555 << (width - 33)]
    xs += [-x for x in xs if -top <= -x < top]
    return np.array(sorted(set(xs)), np.int64)


def int_random(rng: np.random.Generator, n: int, width: int) -> np.ndarray:
    """``n`` seeded ``width``-bit integers: half uniform, half of random bit length with ties.

    Uniform integers almost always have the full length; the other half
    spread the leading 1 over every position, and a quarter of those set the
    bits below the rounding point to exactly half an ulp (a tie).
    """
    lo, hi = -(1 << (width - 1)), 1 << (width - 1)
    half = n // 2
    uniform = rng.integers(lo, hi, half, dtype=np.int64, endpoint=False) if width < 64 else \
        rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, half, dtype=np.int64, endpoint=True)
    m = n - half
    length = rng.integers(1, width, m)  # magnitude bits, so -2**length .. 2**length - 1 fits
    mag = rng.integers(0, 1 << 62, m, dtype=np.int64) >> (62 - np.minimum(length, 62))
    mag |= np.int64(1) << (length - 1)
    cut = np.maximum(length - 24, 0)  # bits below the last place of the 24-bit mantissa
    tie = (rng.random(m) < 0.5) & (cut > 0)
    mag[tie] = (mag[tie] >> cut[tie] << cut[tie]) | (np.int64(1) << (cut[tie] - 1))
    signed = np.where(rng.random(m) < 0.5, -mag, mag)
    return np.concatenate([uniform, signed])[rng.permutation(n)]


def int_expected(x: np.ndarray) -> np.ndarray:
    """The model's conversions of ``x`` (int64) as binary32 bit patterns."""
    return int_to_fp32(np.asarray(x, np.int64)).view(np.uint32)


def int_report(x: np.ndarray, got: np.ndarray, limit: int = 10) -> str:
    """Empty when ``got`` is the model's conversions of ``x``; else the count and the first mismatches."""
    want = int_expected(x)
    bad = np.flatnonzero(got != want)
    if not len(bad):
        return ""
    return "\n".join([f"{len(bad)} of {len(x)} conversions differ from numpy:"] + [
        f"  {x[i]} -> {got[i]:#010x}, numpy {want[i]:#010x}" for i in bad[:limit]])
