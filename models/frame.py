"""The frames of the protocol, declared once: every header, every field, and the frame layouts.

``docs/protocol.md`` section 1 is the specification; this module is its
machine-readable form, and every other copy of a header layout is derived
from it or checked against it by a test: the reference codec
(:mod:`inagg.models.wire`), the ICRC's masked bytes (:mod:`inagg.models.icrc`,
:mod:`inagg.hdl.icrc`), the gateware's header offsets and result header
(:mod:`inagg.hdl.ingress`, :mod:`inagg.hdl.emitter`), the host's fast path
and scapy layers (:mod:`inagg.host.fastpath`, :mod:`inagg.host.roce`) and the
P4 headers (``p4/common/protocol.p4``, checked by ``tests/p4``).

A :class:`Header` is a sequence of :class:`Field` s, most significant bit
first, as on the wire (field names are the P4 program's). A field has a
fixed ``value`` when every frame the protocol builds carries the same one,
and ``icrc_ones`` when the ICRC covers it as ones. :data:`OPCODE_HEADERS`
says which extension headers follow the BTH of each opcode; :func:`layout`
turns an opcode into the frame's header sequence. A new header is one
:class:`Header` here; a new opcode is one :class:`Opcode` member and one
:data:`OPCODE_HEADERS` entry.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from functools import cached_property

__all__ = [
    "Field", "Header", "Layout", "ETHERNET", "IPV4", "UDP", "BTH", "RETH", "IMMDT", "AETH", "HEADERS",
    "ICRC_LEN", "MGMT_ETHER_TYPE", "MGMT", "MGMT_FRAME", "MGMT_TAGGED", "Opcode", "OPCODE_HEADERS", "SegmentOpcode", "SEGMENT_HEADERS", "layout", "CONTRIBUTION", "RESULT",
]


@dataclass(frozen=True)
class Field:
    """One header field.

    Parameters
    ----------
    name:
        The field's name (the P4 program's).
    bits:
        Its width.
    value:
        The value every frame the protocol builds carries, or None when it varies per frame.
    icrc_ones:
        The ICRC covers the field as all ones (a router may change it on the way).
    """

    name: str
    bits: int
    value: int | None = None
    icrc_ones: bool = False

    def __post_init__(self):
        if not isinstance(self.bits, int) or self.bits <= 0:
            raise ValueError(f"field width must be a positive integer, not {self.bits!r}")
        if self.value is not None and not 0 <= self.value < 1 << self.bits:
            raise ValueError(f"value {self.value!r} of field {self.name} does not fit in {self.bits} bits")


@dataclass(frozen=True)
class Header:
    """A header: its fields, most significant first, filling whole bytes.

    Besides the layout queries below it has two functions compiled from its
    fields (see :func:`_compile`):

    ``pack(**values) -> bytes``
        The header's bytes; a field not given takes its fixed ``value``.
        ValueError when a field without a fixed value is missing or a value
        does not fit its field, TypeError for a name the header lacks.
    ``unpack(buf, offset=0) -> dict[str, int]``
        Every field of the header that starts at byte ``offset`` of ``buf``.
    """

    name: str
    fields: tuple[Field, ...]

    def __post_init__(self):
        bits = sum(f.bits for f in self.fields)
        if bits % 8:
            raise ValueError(f"header {self.name} has {bits} bits, not a whole number of bytes")
        if len({f.name for f in self.fields}) != len(self.fields):
            raise ValueError(f"header {self.name} names a field twice")
        pack, unpack = _compile(self)
        object.__setattr__(self, "pack", pack)
        object.__setattr__(self, "unpack", unpack)

    @cached_property
    def size(self) -> int:
        """Length in bytes."""
        return sum(f.bits for f in self.fields) // 8

    @cached_property
    def _bit_offsets(self) -> dict[str, int]:
        out, pos = {}, 0
        for f in self.fields:
            out[f.name] = pos
            pos += f.bits
        return out

    def __getitem__(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"header {self.name} has no field {name!r}")

    def bit_offset(self, name: str) -> int:
        """Offset of field ``name`` in bits from the header's first bit (the MSB of byte 0)."""
        self[name]
        return self._bit_offsets[name]

    def span(self, name: str) -> tuple[int, int]:
        """(byte offset, length in bytes) of a field that fills whole bytes."""
        off, bits = self.bit_offset(name), self[name].bits
        if off % 8 or bits % 8:
            raise ValueError(f"field {self.name}.{name} does not fill whole bytes")
        return off // 8, bits // 8

    def slice(self, name: str, base: int = 0) -> slice:
        """The bytes of a field that fills whole bytes, in a buffer where the header starts at ``base``."""
        off, n = self.span(name)
        return slice(base + off, base + off + n)

    def icrc_ones_bytes(self) -> tuple[int, ...]:
        """Byte offsets, in the header, that the ICRC covers as ones."""
        out = []
        for f in self.fields:
            if f.icrc_ones:
                off, n = self.span(f.name)
                out += range(off, off + n)
        return tuple(out)


_CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}
_MISSING = object()


def _units(fields: tuple[Field, ...]) -> list[list[Field]]:
    """``fields`` in the runs ``struct`` reads as one item each: a field of 1, 2, 4 or 8 bytes alone,
    sub-byte fields together up to their byte boundary, any other whole-byte field as bytes."""
    units, run, bits = [], [], 0
    for f in fields:
        run.append(f)
        bits += f.bits
        if bits % 8 == 0:
            units.append(run)
            run, bits = [], 0
    return units


def _code(nbytes: int) -> str:
    return _CODES.get(nbytes, f"{nbytes}s")


def _values(unit: list[Field], item: str) -> list[tuple[Field, str]]:
    """Each field of ``unit`` as an expression of ``item``, the struct item that holds the unit."""
    nbytes = sum(f.bits for f in unit) // 8
    word = item if nbytes in _CODES else f"int.from_bytes({item}, 'big')"
    if len(unit) == 1:
        return [(unit[0], word)]
    out, shift = [], 8 * nbytes
    for f in unit:
        shift -= f.bits
        out.append((f, f"({word} >> {shift}) & {(1 << f.bits) - 1}"))
    return out


def _function(name: str, src: str, scope: dict):
    """The function ``name`` that ``src`` defines, built from a frame description (never from input)."""
    exec(src, scope)  # noqa: S102
    return scope[name]


def _packing(header: Header, units: list[list[Field]]) -> tuple[str, list[str], list[str]]:
    """What packs ``units`` (:func:`_units` runs of ``header``'s fields, each a parameter of its name) in one call.

    Returns the ``struct`` format, one item expression per unit, and the
    range checks of the parameters ``struct`` does not check itself (fields
    that share a byte, or fill a number of bytes that is no ``struct`` integer).
    """
    fmt, items, checks = "", [], []
    for unit in units:
        nbytes = sum(f.bits for f in unit) // 8
        fmt += _code(nbytes)
        shift, terms = 8 * nbytes, []
        for f in unit:
            shift -= f.bits
            terms.append(f"({f.name} << {shift})" if shift else f.name)
            if len(unit) > 1 or nbytes not in _CODES:
                checks.append(f"    if not 0 <= {f.name} < {1 << f.bits}:\n        raise ValueError("
                              f"f'{header.name}.{f.name} = {{{f.name}!r}} does not fit in {f.bits} bits')")
        arg = " | ".join(terms)
        items.append(arg if nbytes in _CODES else f"({arg}).to_bytes({nbytes}, 'big')")
    return fmt, items, checks


def _compile(header: Header) -> tuple:
    """A pack and an unpack function for ``header``: one ``struct`` call and a few shifts each.

    They run for every frame the model switch and the hosts handle, so they
    are compiled once from the description, as :mod:`dataclasses` compiles
    ``__init__``: a loop over the fields per frame costs a factor of two or
    more in frame rate. ``struct`` checks the range of a field that is a
    whole item; the code checks the others.
    """
    units = _units(header.fields)
    fmt, items, checks = _packing(header, units)
    params = [f"{f.name}={'_MISSING' if f.value is None else f.value}" for f in header.fields]
    # A missing field is named before any range check would compare the placeholder.
    missing = [f"    if {f.name} is _MISSING:\n        raise ValueError("
               f"'field {header.name}.{f.name} has no fixed value: give it')" for f in header.fields if f.value is None]
    unpack_vals = [f"{f.name!r}: {expr}" for k, unit in enumerate(units) for f, expr in _values(unit, f"u[{k}]")]
    scope = {"_s": struct.Struct("!" + fmt), "_MISSING": _MISSING, "_error": struct.error}
    pack = _function("pack", f"def pack(*, {', '.join(params)}):\n" + "\n".join(missing + checks)
                     + f"\n    try:\n        return _s.pack({', '.join(items)})\n"
                     + f"    except _error as e:\n        raise ValueError(f'header {header.name}: {{e}}') from None\n",
                     scope)
    unpack = _function("unpack", "def unpack(buf, offset=0):\n    u = _s.unpack_from(buf, offset)\n"
                       f"    return {{{', '.join(unpack_vals)}}}\n", scope)
    return pack, unpack


ETHERNET = Header("ethernet", (
    Field("dst", 48), Field("src", 48), Field("ether_type", 16, 0x0800),
))
IPV4 = Header("ipv4", (
    Field("version", 4, 4), Field("ihl", 4, 5),  # no options
    Field("tos", 8, 0, icrc_ones=True), Field("total_len", 16), Field("identification", 16, 0),
    Field("flag_rsvd", 1, 0), Field("flag_df", 1, 1), Field("flag_mf", 1, 0), Field("frag_offset", 13, 0),
    Field("ttl", 8, 64, icrc_ones=True), Field("protocol", 8, 17),
    Field("checksum", 16, icrc_ones=True), Field("src", 32), Field("dst", 32),
))
UDP = Header("udp", (
    Field("sport", 16), Field("dport", 16, 4791), Field("len", 16), Field("checksum", 16, 0, icrc_ones=True),
))
BTH = Header("bth", (
    Field("opcode", 8), Field("se", 1, 0), Field("migreq", 1, 1), Field("pad", 2, 0), Field("tver", 4, 0),
    Field("pkey", 16), Field("resv8a", 8, 0, icrc_ones=True), Field("dqpn", 24),
    Field("ackreq", 1, 0), Field("resv7", 7, 0), Field("psn", 24),
))
RETH = Header("reth", (Field("va", 64), Field("rkey", 32), Field("dma_len", 32)))
IMMDT = Header("immdt", (Field("imm", 32),))
AETH = Header("aeth", (Field("syndrome", 8), Field("msn", 24)))
HEADERS = {h.name: h for h in (ETHERNET, IPV4, UDP, BTH, RETH, IMMDT, AETH)}

MGMT_ETHER_TYPE = 0x88B5
"""The EtherType of management frames: IEEE 802's Local Experimental EtherType 1 (``docs/protocol.md`` section 12)."""
MGMT = Header("mgmt", (
    Field("op", 8), Field("status", 8), Field("rsvd", 16, 0), Field("seq", 64), Field("addr", 32), Field("data", 32),
    Field("floor", 64), Field("tag", 64),
))
"""A management request or response after the Ethernet header (``inagg.models.mgmt``): one register operation."""
MGMT_FRAME = ETHERNET.size + MGMT.size
"""Bytes of a management frame; a longer one (padding) is read as its first ``MGMT_FRAME`` bytes."""
MGMT_TAGGED = MGMT.bit_offset("tag") // 8
"""Bytes of :data:`MGMT` that the tag covers: every field before it."""

ICRC_LEN = 4
"""The trailer after the payload: a CRC-32 sent least-significant byte first (not a big-endian field)."""


class Opcode(enum.IntEnum):
    """The BTH opcodes the protocol uses (IBTA vol. 1, table 38)."""

    RC_RDMA_WRITE_ONLY = 0x0A
    RC_RDMA_WRITE_ONLY_IMM = 0x0B
    RC_ACK = 0x11
    UC_RDMA_WRITE_ONLY = 0x2A
    UC_RDMA_WRITE_ONLY_IMM = 0x2B


OPCODE_HEADERS: dict[Opcode, tuple[Header, ...]] = {
    Opcode.RC_RDMA_WRITE_ONLY: (RETH,),
    Opcode.RC_RDMA_WRITE_ONLY_IMM: (RETH, IMMDT),
    Opcode.RC_ACK: (AETH,),
    Opcode.UC_RDMA_WRITE_ONLY: (RETH,),
    Opcode.UC_RDMA_WRITE_ONLY_IMM: (RETH, IMMDT),
}
"""The extension headers between the BTH and the payload, per opcode."""


class SegmentOpcode(enum.IntEnum):
    """The RC RDMA WRITE opcodes of a message of several packets (IBTA vol. 1, table 38).

    Only RC endpoints (:mod:`inagg.models.rc`) send them; a switch that
    aggregates single-packet chunks refuses them as any opcode not its own.
    """

    RC_RDMA_WRITE_FIRST = 0x06
    RC_RDMA_WRITE_MIDDLE = 0x07
    RC_RDMA_WRITE_LAST = 0x08


SEGMENT_HEADERS: dict[SegmentOpcode, tuple[Header, ...]] = {
    SegmentOpcode.RC_RDMA_WRITE_FIRST: (RETH,),
    SegmentOpcode.RC_RDMA_WRITE_MIDDLE: (),
    SegmentOpcode.RC_RDMA_WRITE_LAST: (),
}
"""The extension headers of each :class:`SegmentOpcode`, as :data:`OPCODE_HEADERS` for :class:`Opcode`."""


@dataclass(frozen=True)
class Layout:
    """The headers of one kind of frame, Ethernet first, up to the payload."""

    opcode: Opcode
    headers: tuple[Header, ...]

    @cached_property
    def size(self) -> int:
        """Bytes before the payload."""
        return sum(h.size for h in self.headers)

    def offset(self, header: str) -> int:
        """Byte offset of header ``header`` in the frame."""
        pos = 0
        for h in self.headers:
            if h.name == header:
                return pos
            pos += h.size
        raise KeyError(f"a frame of opcode {self.opcode.name} has no {header!r} header")

    def _split(self, path: str) -> tuple[Header, str]:
        header, _, name = path.partition(".")
        return HEADERS[header], name

    def field(self, path: str) -> Field:
        """The field ``"header.field"``."""
        h, name = self._split(path)
        self.offset(h.name)
        return h[name]

    def span(self, path: str) -> tuple[int, int]:
        """(byte offset in the frame, length in bytes) of ``"header.field"`` (whole bytes only)."""
        h, name = self._split(path)
        off, n = h.span(name)
        return self.offset(h.name) + off, n

    def reader(self, *paths: str):
        """A function that reads the fields ``paths`` (``"header.field"``) from a frame of this layout.

        It returns their values as a tuple, in the order of ``paths``, with
        one ``struct`` call over the bytes that hold them (compiled as
        :class:`Header`'s ``unpack`` is): the frame checks read a few fields
        of every frame.
        """
        wanted = {(p.partition(".")[0], p.partition(".")[2]) for p in paths}
        fmt, exprs, item, at = "!", {}, 0, 0
        for off, h, unit in self._placed_units:
            if not any((h.name, f.name) in wanted for f in unit):
                continue
            fmt += "x" * (off - at) + _code(sum(f.bits for f in unit) // 8)
            at = off + sum(f.bits for f in unit) // 8
            exprs.update({f"{h.name}.{f.name}": e for f, e in _values(unit, f"u[{item}]")})
            item += 1
        missing = set(paths) - set(exprs)
        if missing:
            raise KeyError(f"a frame of opcode {self.opcode.name} has no field {sorted(missing)[0]!r}")
        src = (f"def read(buf):\n    u = _s.unpack_from(buf)\n"
               f"    return ({''.join(exprs[p] + ', ' for p in paths)})\n")
        read = _function("read", src, {"_s": struct.Struct(fmt)})
        read.__doc__ = f"({', '.join(paths)}) of a frame of opcode {self.opcode.name}"
        return read

    @cached_property
    def _placed_units(self) -> list[tuple[int, Header, list[Field]]]:
        """(byte offset in the frame, header, unit) of each :func:`_units` run of the headers' fields."""
        out, pos = [], 0
        for h in self.headers:
            for unit in _units(h.fields):
                out.append((pos, h, unit))
                pos += sum(f.bits for f in unit) // 8
        return out

    def bit_span(self, path: str) -> tuple[int, int]:
        """(offset in bits from the frame's first bit, width) of ``"header.field"``, MSB first."""
        h, name = self._split(path)
        return 8 * self.offset(h.name) + h.bit_offset(name), h[name].bits


def layout(opcode: int) -> Layout:
    """The layout of a frame with BTH opcode ``opcode``."""
    op = Opcode(opcode)
    return Layout(op, (ETHERNET, IPV4, UDP, BTH) + OPCODE_HEADERS[op])


CONTRIBUTION = layout(Opcode.UC_RDMA_WRITE_ONLY)
"""A Mode II contribution: ``Eth / IPv4 / UDP / BTH / RETH`` before its payload."""
RESULT = layout(Opcode.UC_RDMA_WRITE_ONLY_IMM)
"""A Mode II result: ``Eth / IPv4 / UDP / BTH / RETH / ImmDt`` before its payload."""
