"""Pipelined IEEE-754 binary32 units of the promoted lanes: an adder and an integer converter.

A lane whose INT32 sum overflows is promoted to binary32 (`docs/protocol.md`
section 2): its exact 33-bit sum goes through :class:`IntToFP32`, and every
later contribution goes through :class:`IntToFP32` and then
:class:`FP32Adder`. Both units round to nearest, ties to even, and are bit
for bit equal to :func:`inagg.models.arith.int_to_fp32` and
:func:`inagg.models.arith.fp32_add` (numpy).

Both are fully pipelined, free-running data paths: they take a new operand
every cycle and give its result ``latency`` cycles later, with a valid bit
that travels beside the data. They have no stall input: a user that must
stall holds its operands before the unit or queues results after it. Only
the valid bits are reset; the data registers are not (they carry no state
from one operand to the next), so ``o`` means something only while
``o_valid`` is high.

The ``latency`` constructor argument chooses which of the unit's step
boundaries get a register (the table of each class says which); the output
is always registered. The default is the deepest pipeline: no step holds
more than one carry chain of at most 33 bits or one barrel shifter, with a
few LUT levels around it. ``docs/fp32.md`` gives the clock this reaches
(measured on ECP5 by ``bench/fp32_resources.py``) and the resources; a
slot pipeline that must read a sum back within fewer cycles picks a smaller
latency and a slower clock.
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["FP32Adder", "IntToFP32"]

# Encodings of the special results (sign bit 0).
_INF = 0x7F80_0000
_QNAN = 0x7FC0_0000  # the canonical quiet NaN (RISC-V's default NaN)


def _check_latency(latency, table):
    if not isinstance(latency, int) or isinstance(latency, bool) or latency not in table:
        raise ValueError(f"Latency must be an integer from 1 to {max(table)}, not {latency!r}")


class _Pipeline:
    """Places a register, or a wire, at each named step boundary of a data path.

    A boundary in ``cuts`` gets registers (data without reset, the valid bit
    with reset); any other boundary joins its two steps combinationally, so
    one description of the data path serves every latency.
    """

    def __init__(self, m: Module, cuts: tuple[str, ...], valid: Value):
        self._m = m
        self._cuts = cuts
        self.valid = valid

    def cut(self, step: str, **values: Value) -> SimpleNamespace:
        """The ``values`` after the boundary that follows ``step``, as attributes of that name."""
        registered = step in self._cuts
        domain = self._m.d.sync if registered else self._m.d.comb
        out = {}
        for name, value in values.items():
            value = Value.cast(value)
            out[name] = Signal(value.shape(), name=f"{step}_{name}", reset_less=True)
            domain += out[name].eq(value)
        valid = Signal(name=f"{step}_valid")
        domain += valid.eq(self.valid)
        self.valid = valid
        return SimpleNamespace(**out)


def _leading_zeros(value: Value) -> tuple[Value, Value]:
    """Count the leading zeros of ``value`` with a balanced tree (depth log2 of its width).

    Returns ``(count, nonzero)``; ``count`` is meaningless when ``nonzero``
    is low. The width is padded with zeros at the bottom to a power of two,
    which leaves the count of a nonzero value unchanged. A priority chain
    would be a long serial path; the tree halves the width per level.
    """
    width = len(value)
    levels = max(1, (width - 1).bit_length())
    padded = Cat(Const(0, (1 << levels) - width), value)

    def count(bits: Value) -> tuple[Value, Value]:
        if len(bits) == 1:
            return Const(0, 0), bits[0]
        half = len(bits) // 2
        lo_count, lo_any = count(bits[:half])
        hi_count, hi_any = count(bits[half:])
        # Bit "hi is all zero" is the new most significant bit of the count.
        return Mux(hi_any, Cat(hi_count, Const(0, 1)), Cat(lo_count, Const(1, 1))), hi_any | lo_any

    return count(padded)


class FP32Adder(wiring.Component):
    """IEEE-754 binary32 adder, round to nearest even, one addition per cycle.

    ``o`` equals numpy's ``np.float32(a) + np.float32(b)`` bit for bit for
    every pair of finite inputs, subnormals included (no flush to zero),
    with IEEE's signed zeros: ``x + (-x)`` is ``+0``, ``(-0) + (-0)`` is
    ``-0``. A sum beyond the largest finite value rounds to infinity, as
    round-to-nearest requires. Special inputs follow IEEE 754 as well:
    infinity plus a finite value is that infinity, two infinities of the same
    sign give that infinity, and ``inf + (-inf)`` or any NaN input gives the
    canonical quiet NaN ``0x7FC00000`` (the payload of an input NaN is not
    propagated; numpy's NaN payload depends on the CPU, so a result is
    checked with ``isnan`` there). The switch only ever adds integer-valued
    floats (converted INT32 contributions and their sums), all finite.

    Parameters
    ----------
    latency : int
        Cycles from ``i_valid`` to ``o_valid``, 1 to 6 (default 6). The data
        path has six steps; ``latency`` chooses which boundaries after them
        are registered:

        =======  ===================================================
        latency  registered after
        =======  ===================================================
        6        compare, align, add, lzc, normalize, round
        5        compare, align, add, lzc, round
        4        compare, add, lzc, round
        3        align, lzc, round
        2        add, round
        1        round
        =======  ===================================================

        The steps:

        * **compare** -- order the operands by magnitude (one 31-bit
          compare), so the difference of the mantissas is never negative;
          take the alignment shift from the sign of an 8-bit exponent
          difference, beside the compare. A subnormal enters as twice its
          mantissa at exponent 0, which puts it on the scale of the
          normals without a special case. Infinity and NaN operands are
          classified here, from the operands themselves.
        * **align** -- swap, and shift the smaller mantissa right by the
          exponent difference, extended by guard and round bits; the bits
          shifted out are ORed into a sticky bit in the least significant
          place, which keeps every rounding decision exact.
        * **add** -- one 28-bit addition or subtraction of the mantissas.
        * **lzc** -- count the leading zeros of the sum (balanced tree),
          capped so the exponent stays at least 1, which makes a tiny result
          subnormal instead of normal.
        * **normalize** -- shift the sum left by that count, take the 24
          result bits, the guard bit and the sticky bit, and form the
          exponent; a sum that carries into exponent 255 is an overflow.
        * **round** -- add the round-to-nearest-even increment to the packed
          exponent and mantissa (a carry out of the mantissa moves the
          exponent up, and out of exponent 254 gives infinity), then
          substitute zero, infinity or NaN where they apply.

    Members
    -------
    a, b : In(32)
        The operands, binary32 bit patterns.
    i_valid : In(1)
        ``a`` and ``b`` hold an operand pair this cycle.
    o : Out(32)
        The sum of the pair given ``latency`` cycles earlier.
    o_valid : Out(1)
        ``o`` holds a sum this cycle.

    Example
    -------
    ``m.submodules.add = add = FP32Adder()``; drive ``add.a``, ``add.b`` and
    ``add.i_valid`` each cycle and take ``add.o`` when ``add.o_valid`` is
    high, ``add.latency`` cycles later.
    """

    _CUTS = {
        1: ("round",),
        2: ("add", "round"),
        3: ("align", "lzc", "round"),
        4: ("compare", "add", "lzc", "round"),
        5: ("compare", "align", "add", "lzc", "round"),
        6: ("compare", "align", "add", "lzc", "normalize", "round"),
    }

    def __init__(self, latency: int = 6):
        _check_latency(latency, self._CUTS)
        self.latency = latency
        super().__init__({
            "a": In(32),
            "b": In(32),
            "i_valid": In(1),
            "o": Out(32),
            "o_valid": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        p = _Pipeline(m, self._CUTS[self.latency], self.i_valid)

        # compare
        a, b = self.a, self.b
        exp_a, exp_b = a[23:31], b[23:31]

        # A subnormal m * 2**-149 is taken as the mantissa 2m at exponent field 0, which
        # is the scale of a normal mantissa there, so exponent differences need no
        # subnormal case on their path.
        def mantissa(x, exp):
            return Mux(exp == 0, Cat(Const(0, 1), x[:23]), Cat(x[:23], Const(1, 1)))

        # The alignment shift is the exponent difference capped at 31 (any shift of 27 or
        # more moves every bit into the sticky bit). It needs the sign of an 8-bit difference,
        # not the 31-bit compare: with equal exponents either order shifts by 0.
        def capped(d):
            return Mux(d[5:8].any(), 31, d[:5])

        diff_ab, diff_ba = exp_a - exp_b, exp_b - exp_a
        a_big = a[:31] >= b[:31]
        inf_a, inf_b = (exp_a == 0xFF) & (a[:23] == 0), (exp_b == 0xFF) & (b[:23] == 0)
        nan_a, nan_b = (exp_a == 0xFF) & (a[:23] != 0), (exp_b == 0xFF) & (b[:23] != 0)
        c = p.cut(
            "compare",
            a_big=a_big,
            man_a=mantissa(a, exp_a), man_b=mantissa(b, exp_b),
            exp_a=exp_a, exp_b=exp_b, sign_a=a[31], sign_b=b[31],
            shift=Mux(diff_ab[8], capped(diff_ba), capped(diff_ab)),
            # Decided from the operands themselves, not after the compare.
            special=(exp_a == 0xFF) | (exp_b == 0xFF),
            nan=nan_a | nan_b | (inf_a & inf_b & (a[31] ^ b[31])),
        )

        # align: swap, then extend the mantissas by guard, round and sticky bits (27 bits).
        # The sticky bit comes from a mask of the bits the shift drops, beside the shifter,
        # not after it.
        small = Cat(Const(0, 3), Mux(c.a_big, c.man_b, c.man_a))
        dropped = ~(Const((1 << 27) - 1, 27) << c.shift)[:27]
        sticky = (small & dropped).any()
        aligned = (small >> c.shift)[:27]
        al = p.cut(
            "align",
            sign=Mux(c.a_big, c.sign_a, c.sign_b), exp=Mux(c.a_big, c.exp_a, c.exp_b),
            sub=c.sign_a ^ c.sign_b,
            # The sign of an exact zero sum under RNE: -0 only for (-0) + (-0) and the like.
            zero_sign=c.sign_a & c.sign_b,
            special=c.special, nan=c.nan,
            big=Cat(Const(0, 3), Mux(c.a_big, c.man_a, c.man_b)),
            small=aligned | sticky,
        )

        # add: subtraction as big + ~small + 1, the carry-in riding in an extra low bit
        # so it stays one carry chain.
        invert = al.sub.replicate(28)
        total = (Cat(al.sub, al.big, Const(0, 1)) + Cat(al.sub, al.small ^ invert))[1:29]
        # The bits of the sum whose leading 1 can move up to bit 27 with the exponent staying
        # at least 1, bits 27 - min(exp, 27) and up: a decoder of the exponent beside the adder.
        cap = Mux(al.exp >= 27, 27, al.exp[:5])
        # Bits 0 .. cap; shifting by `cap` rather than `cap + 1` keeps an adder off the path.
        up_to_cap = Cat(Const(1, 1), ~(Const((1 << 27) - 1, 27) << cap)[:27])
        ad = p.cut(
            "add",
            sign=al.sign, exp=al.exp, zero_sign=al.zero_sign, special=al.special, nan=al.nan,
            sum=total,
            reach=Cat(*reversed(list(up_to_cap))),
        )

        # lzc: bit 26 of the sum is the implicit 1 at exponent `exp`, bit 27 a carry. A 1
        # ORed in at the lowest bit of `reach` caps the count at `exp` without a compare
        # after the counter: the capped shift leaves the exponent field 0, a subnormal.
        floor = ad.reach & ~Cat(Const(0, 1), ad.reach[:27])
        zeros, _ = _leading_zeros(ad.sum | floor)
        nonzero = ad.sum.any()
        lz = p.cut(
            "lzc",
            sign=Mux(nonzero | ad.special, ad.sign, ad.zero_sign),
            exp_plus1=ad.exp + 1, special=ad.special, nan=ad.nan,
            sum=ad.sum, shift=zeros,
            normal=(ad.sum & ad.reach).any(),
            # Only a carry out of exponent 254 passes 254: decided here, off the shifter's path.
            overflow=(ad.exp == 0xFE) & ad.sum[27],
        )

        # normalize: after the shift, bit 27 is the implicit 1 of a normal result.
        norm = (lz.sum << lz.shift)[:28]
        exp = Mux(lz.normal, lz.exp_plus1 - lz.shift, 0)[:8]
        nm = p.cut(
            "normalize",
            sign=lz.sign, special=lz.special, nan=lz.nan, overflow=lz.overflow,
            packed=Cat(norm[4:27], exp),
            round_up=norm[3] & (norm[:3].any() | norm[4]),
        )

        # round: the increment carries from the mantissa into the exponent, and from
        # the largest finite value (exponent 254, mantissa all ones) into infinity.
        rounded = (nm.packed + nm.round_up)[:31]
        inf = Const(_INF, 31)
        result = Mux(nm.special, Mux(nm.nan, Const(_QNAN, 31), inf), Mux(nm.overflow, inf, rounded))
        sign = nm.sign & ~(nm.special & nm.nan)
        out = p.cut("round", o=Cat(result, sign))
        m.d.comb += [self.o.eq(out.o), self.o_valid.eq(p.valid)]
        return m


class IntToFP32(wiring.Component):
    """Signed integer to IEEE-754 binary32, round to nearest even, one conversion per cycle.

    ``o`` equals numpy's ``np.int64(x).astype(np.float32)`` bit for bit for
    every ``x`` of the input width (numpy rounds once, in the CPU's RNE
    mode). Zero gives ``+0``; no input of 64 bits or fewer can overflow
    binary32, so the result is always finite.

    Parameters
    ----------
    width : int
        Width of the two's-complement input, 33 to 64 (the exact sum of two
        INT32 values needs 33 bits; the golden model takes int64). An INT32
        contribution is sign-extended into the same unit.
    latency : int
        Cycles from ``i_valid`` to ``o_valid``, 1 to 4 (default 4); the
        registered boundaries:

        =======  ============================
        latency  registered after
        =======  ============================
        4        abs, lzc, normalize, round
        3        abs, lzc, round
        2        lzc, round
        1        round
        =======  ============================

        The steps: **abs** takes sign and magnitude (one ``width``-bit carry
        chain); **lzc** counts the magnitude's leading zeros (balanced tree);
        **normalize** shifts the leading 1 to the top and takes 24 result
        bits, guard and sticky bits and the exponent; **round** adds the
        round-to-nearest-even increment, which carries into the exponent
        when the mantissa is all ones.

    Members
    -------
    i : In(width)
        The integer, two's complement.
    i_valid : In(1)
        ``i`` holds an integer this cycle.
    o : Out(32)
        The binary32 value of the integer given ``latency`` cycles earlier.
    o_valid : Out(1)
        ``o`` holds a value this cycle.
    """

    _CUTS = {
        1: ("round",),
        2: ("lzc", "round"),
        3: ("abs", "lzc", "round"),
        4: ("abs", "lzc", "normalize", "round"),
    }

    def __init__(self, width: int = 33, latency: int = 4):
        if not isinstance(width, int) or isinstance(width, bool) or not 33 <= width <= 64:
            raise ValueError(f"Integer width must be an integer from 33 to 64, not {width!r}")
        _check_latency(latency, self._CUTS)
        self.width = width
        self.latency = latency
        super().__init__({
            "i": In(width),
            "i_valid": In(1),
            "o": Out(32),
            "o_valid": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        p = _Pipeline(m, self._CUTS[self.latency], self.i_valid)
        w = self.width

        # abs: |x| = (x ^ sign) + sign; the most negative input becomes 2**(w-1), which fits.
        sign = self.i[w - 1]
        ab = p.cut("abs", sign=sign, mag=((self.i ^ sign.replicate(w)) + sign)[:w])

        zeros, nonzero = _leading_zeros(ab.mag)
        lz = p.cut("lzc", sign=ab.sign, mag=ab.mag, zeros=zeros, nonzero=nonzero)

        # normalize: the leading 1 moves to bit w-1; its value is 2**(w-1-zeros).
        norm = (lz.mag << lz.zeros)[:w]
        exp = Mux(lz.nonzero, (127 + w - 1) - lz.zeros, 0)[:8]
        nm = p.cut(
            "normalize",
            sign=lz.sign,
            packed=Cat(norm[w - 24:w - 1], exp),
            round_up=norm[w - 25] & (norm[:w - 25].any() | norm[w - 24]),
        )

        rounded = (nm.packed + nm.round_up)[:31]
        out = p.cut("round", o=Cat(rounded, nm.sign))
        m.d.comb += [self.o.eq(out.o), self.o_valid.eq(p.valid)]
        return m
