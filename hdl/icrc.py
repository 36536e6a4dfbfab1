"""The RoCEv2 invariant CRC at W bits per cycle: checker and generator.

Both run one CRC-32 register over whole beats, as they come, and reach
exact byte boundaries with two facts of CRC algebra instead of a CRC unit
per byte count:

* **Leading bytes.** The ICRC starts at the IPv4 header (frame byte 14),
  after 8 bytes of ones, while beats start at the Ethernet header. The
  Ethernet bytes are fed as zeros and the CRC register starts from
  :data:`ETH_SKIP_INIT`, the state that 14 zero bytes carry into the state
  after 8 bytes of ones (feeding zero bytes is an invertible linear map of
  the register).
* **Trailing bytes.** The beat that holds the end of the IP datagram is fed
  with the bytes after the end replaced by zeros. ``k`` trailing zeros turn
  the register into a fixed linear function of the true one, so the
  checker compares with the residue carried through ``k`` zeros
  (:data:`RESIDUES`, one constant per ``k``), and the generator, whose
  frames all have the same length, undoes the ``k`` zeros with one constant
  32x32 bit matrix (:func:`unzero_matrix`).

The variant fields (TOS, TTL, IPv4 checksum, UDP checksum, BTH resv8a) are
fed as ones, as ``docs/protocol.md`` section 1.8 and
:mod:`inagg.models.icrc` define.

The register is zlib's (reflected, before the final XOR), stepped by one
GF(2) matrix per beat: the XOR of one 32-bit column per input bit. It is not
:class:`amaranth.lib.crc.Processor`, which computes the same function but
emits every term as its own gate: at 512 bits that made the Verilog of one
CRC about a megabyte and the Verilated build several times slower.
:data:`ALGORITHM` is the lib.crc description the tests check against.
"""

from __future__ import annotations

import zlib

from amaranth import Array, Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import crc, wiring
from amaranth.lib.wiring import In, Out

from inagg.models.icrc import MASKED_OFFSETS
from inagg.models.protocol import ETH_LEN, IPV4_LEN, UDP_LEN
from inagg.hdl.axis import check_width

__all__ = ["ALGORITHM", "ETH_SKIP_INIT", "RESIDUES", "step_matrix", "unzero_matrix", "icrc_mask", "CRC32",
           "ICRCChecker", "ICRCGenerator"]

_ONES = 0xFFFFFFFF
# Frame byte offsets of the fields the ICRC masks to ones.
_MASKED_FF = tuple(ETH_LEN + off for off in MASKED_OFFSETS)


def _zero_map(k: int) -> list[int]:
    """Columns of the linear map that ``k`` zero bytes apply to zlib's raw CRC register."""
    return [zlib.crc32(b"\0" * k, (1 << i) ^ _ONES) ^ _ONES for i in range(32)]


def _gf2_inverse(cols: list[int]) -> list[int]:
    """Columns of the inverse of a 32x32 GF(2) matrix given by its columns."""
    # Gauss-Jordan on rows of the augmented matrix [A | I].
    rows = [sum(((cols[c] >> r) & 1) << c for c in range(32)) | (1 << (32 + r)) for r in range(32)]
    for c in range(32):
        p = next(r for r in range(c, 32) if rows[r] >> c & 1)
        rows[c], rows[p] = rows[p], rows[c]
        for r in range(32):
            if r != c and rows[r] >> c & 1:
                rows[r] ^= rows[c]
    inv_rows = [row >> 32 for row in rows]
    return [sum(((inv_rows[r] >> c) & 1) << r for r in range(32)) for c in range(32)]


def _apply(cols: list[int], x: int) -> int:
    out = 0
    for i in range(32):
        if x >> i & 1:
            out ^= cols[i]
    return out


def unzero_matrix(k: int) -> list[int]:
    """Rows of the matrix that maps (CRC after ``k`` extra zero bytes) ^ ones to (true CRC) ^ ones.

    Row ``j`` is the mask of input bits whose parity is output bit ``j``.
    """
    inv = _gf2_inverse(_zero_map(k))
    return [sum(((inv[i] >> j) & 1) << i for i in range(32)) for j in range(32)]


def _eth_skip_raw() -> int:
    target = zlib.crc32(b"\xff" * 8) ^ _ONES  # raw register after the LRH stand-in
    return _apply(_gf2_inverse(_zero_map(ETH_LEN)), target)


ETH_SKIP_RAW = _eth_skip_raw()
ETH_SKIP_INIT = int(f"{ETH_SKIP_RAW:032b}"[::-1], 2)
"""Initial CRC register (amaranth's unreflected convention) that makes 14 zero bytes equal 8 bytes of ones."""

RESIDUES = tuple(zlib.crc32(b"\0" * k, 0x2144DF1C) for k in range(65))
"""CRC (after the final XOR) of a datagram with a good ICRC followed by ``k`` zero bytes."""

ALGORITHM = crc.Algorithm(crc_width=32, polynomial=0x04C11DB7, initial_crc=ETH_SKIP_INIT,
                          reflect_input=True, reflect_output=True, xor_output=_ONES)
"""The ICRC with its Ethernet-header skip, as an amaranth.lib.crc algorithm (byte 0 in the low bits)."""


def step_matrix(width: int) -> list[int]:
    """Columns of the raw register's update by one ``width``-bit word: the next register is
    the XOR of ``column[i]`` over the set bits ``i`` of ``Cat(register, word)``."""
    nb = width // 8
    cols = [zlib.crc32(bytes(nb), (1 << i) ^ _ONES) ^ _ONES for i in range(32)]
    return cols + [zlib.crc32((1 << i).to_bytes(nb, "little"), _ONES) ^ _ONES for i in range(width)]


def _xor_tree(terms: list) -> Value:
    while len(terms) > 1:
        terms = [terms[i] ^ terms[i + 1] if i + 1 < len(terms) else terms[i] for i in range(0, len(terms), 2)]
    return terms[0]


class CRC32(wiring.Component):
    """zlib's CRC-32 register, ``width`` bits a cycle, starting from the Ethernet-skip state.

    Members
    -------
    start : In(1)
        Restart from :data:`ETH_SKIP_RAW` (with ``valid``: this word is the first).
    valid : In(1)
        Add ``data`` this cycle.
    data : In(width)
        Byte 0 in the low bits.
    crc : Out(32)
        The CRC of the words added since the last start, after the final XOR.
    """

    def __init__(self, width: int):
        self._width = width
        super().__init__({"start": In(1), "valid": In(1), "data": In(width), "crc": Out(32)})

    def elaborate(self, platform):
        m = Module()
        raw = Signal(32, init=ETH_SKIP_RAW)
        source = Cat(Mux(self.start, ETH_SKIP_RAW, raw), self.data)
        with m.If(self.valid):
            # One 32-bit term per input bit: word-wide operations that Verilator handles
            # far better than 32 parities over scattered bits of a 544-bit vector.
            m.d.sync += raw.eq(_xor_tree([Mux(source[i], col, 0) for i, col in
                                          enumerate(step_matrix(self._width)) if col]))
        with m.Elif(self.start):
            m.d.sync += raw.eq(ETH_SKIP_RAW)
        m.d.comb += self.crc.eq(raw ^ _ONES)
        return m


def icrc_mask(data: Value, beat: Value, width: int) -> Value:
    """``data``, beat number ``beat`` of a frame, as the ICRC sees it: Ethernet bytes zero, variant fields ones."""
    nbytes = width // 8
    out = []
    for j in range(nbytes):
        b = data.word_select(j, 8)
        # Absolute offsets that can fall on byte j: one per beat that holds them.
        for off in range(j, ETH_LEN, nbytes):
            b = Mux(beat == off // nbytes, 0, b)
        for off in _MASKED_FF:
            if off % nbytes == j:
                b = Mux(beat == off // nbytes, 0xFF, b)
        out.append(b)
    return Cat(*out)


def _tail_zero(data: Value, nbytes: int, valid_bytes: Value) -> Value:
    return Cat(*[Mux(j < valid_bytes, data.word_select(j, 8), 0) for j in range(nbytes)])


class ICRCChecker(wiring.Component):
    """Checks the ICRC of one frame at a time, beat by beat.

    Parameters
    ----------
    width:
        Beat width in bits (64, 256 or 512).

    Members
    -------
    valid : In(1)
        A beat is accepted this cycle.
    beat : In(16)
        Its number within the frame (0 for the first).
    data : In(width)
        Its data.
    end : In(16)
        Frame byte offset just after the IP datagram (14 + IPv4 total length),
        needed from the beat that holds it onwards; any value on earlier beats.
    ok : Out(1)
        Two cycles after the beat that holds ``end - 1`` was accepted, and
        until the next frame's first beat is two cycles old: the ICRC (the
        datagram's last 4 bytes) is right.
    """

    def __init__(self, width: int):
        self._width = check_width(width)
        super().__init__({"valid": In(1), "beat": In(16), "data": In(width), "end": In(16), "ok": Out(1)})

    def elaborate(self, platform):
        m = Module()
        nbytes = self._width // 8
        m.submodules.crc = proc = CRC32(self._width)
        # Where the end falls, as (beat, byte in it): the masks then take compares of the
        # beat number and of a byte index, not a subtraction in front of them.
        lg = nbytes.bit_length() - 1
        end_beat, end_byte = self.end[lg:], self.end[:lg]
        before = self.beat < end_beat
        at = self.beat == end_beat
        inside = before | (at & (end_byte != 0))
        # Signals, not expressions, wherever a value is sliced: Amaranth would rebuild
        # the whole expression for every slice of it.
        masked = Signal(self._width)
        m.d.comb += masked.eq(icrc_mask(self.data, self.beat, self._width))
        # The masks and the CRC step (an XOR tree of width + 32 inputs) are a cycle of logic
        # each: a register between them. Its data needs no reset (``valid`` has one), which
        # leaves the flip-flops' set/reset input to the trailing-zero compare alone.
        data = Signal(self._width, reset_less=True)
        start, valid = Signal(), Signal()
        tail_zeros, zeros = Signal(range(nbytes), reset_less=True), Signal(range(nbytes))
        m.d.sync += [
            # The beat's last byte lies before the end only in an earlier beat (``end_byte`` < nbytes).
            data.eq(Cat(*[Mux(before | (at & (j < end_byte)) if j < nbytes - 1 else before, masked.word_select(j, 8), 0)
                          for j in range(nbytes)])),
            start.eq(self.valid & (self.beat == 0)),
            valid.eq(self.valid & inside),
            tail_zeros.eq(Mux(at, nbytes - end_byte, 0)),
        ]
        with m.If(valid):
            m.d.sync += zeros.eq(tail_zeros)
        m.d.comb += [
            proc.start.eq(start), proc.valid.eq(valid), proc.data.eq(data),
            self.ok.eq(proc.crc == Array(Const(r, 32) for r in RESIDUES[:nbytes])[zeros]),
        ]
        return m


class ICRCGenerator(wiring.Component):
    """Computes the ICRC of frames of one fixed length, beat by beat.

    Parameters
    ----------
    width:
        Beat width in bits (64, 256 or 512).
    end:
        Frame byte offset where the ICRC goes (14 + IPv4 total length - 4).
    beats:
        Most beats a frame has, when the caller's frames end in the beat of byte ``end - 1`` (then no later
        beat needs to be told apart); None: any.
    masked:
        ``data`` comes as the ICRC sees it (:func:`icrc_mask` applied, bytes at and after ``end``
        zero), so nothing but the CRC step's XOR tree sits between ``data`` and the register: a
        caller that masks a beat before its own register gives the step a cycle of its own.

    Members
    -------
    valid, beat, data : In
        As for :class:`ICRCChecker`; bytes at and after ``end`` are ignored (zero if ``masked``).
    value : Out(32)
        After the beat holding byte ``end - 1`` was accepted: the ICRC as a
        32-bit integer (sent least significant byte first).
    """

    def __init__(self, width: int, end: int, beats: int | None = None, masked: bool = False):
        self._width = check_width(width)
        if not isinstance(end, int) or end <= ETH_LEN + IPV4_LEN + UDP_LEN:
            raise ValueError(f"ICRC offset must be an integer above {ETH_LEN + IPV4_LEN + UDP_LEN}, not {end!r}")
        self._end, self._beats, self._masked = end, beats, masked
        super().__init__({"valid": In(1), "beat": In(16), "data": In(width), "value": Out(32)})

    def elaborate(self, platform):
        m = Module()
        nbytes = self._width // 8
        m.submodules.crc = proc = CRC32(self._width)
        last_beat, tail = divmod(self._end - 1, nbytes)
        zeros = nbytes - 1 - tail
        data = Signal(self._width)
        if self._masked:
            m.d.comb += data.eq(self.data)
        else:
            m.d.comb += data.eq(icrc_mask(self.data, self.beat, self._width))
            data = Mux(self.beat == last_beat, _tail_zero(data, nbytes, tail + 1), data)
        # Without a beat after the end, the check would compare a counter with a bound it cannot pass.
        covered = self.valid if self._beats is not None and self._beats <= last_beat + 1 else \
            self.valid & (self.beat <= last_beat)
        m.d.comb += [proc.start.eq(self.valid & (self.beat == 0)), proc.valid.eq(covered), proc.data.eq(data)]
        raw = proc.crc ^ _ONES
        rows = unzero_matrix(zeros)
        m.d.comb += self.value.eq(Cat(*[(raw & row).xor() for row in rows]) ^ _ONES)
        return m
