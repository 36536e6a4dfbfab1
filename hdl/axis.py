"""Beat streams, byte-vector helpers and parameter checks shared by every block of the switch.

A frame travels as a stream of *beats*: ``width`` bits of data, one keep bit
per byte, and ``last`` on the frame's final beat. Byte ``k`` of a beat sits in
bits ``8k .. 8k+7`` (AXI-Stream order), so byte 0 of the frame is the least
significant byte of the first beat. Keep is *packed*: every beat but the last
is full, and the last keeps a run of bytes starting at byte 0 -- what a MAC
hands over and what cocotbext-axi sends.

Header fields are big-endian on the wire while the byte vectors here are
little-endian in bit order; :func:`be_get` and :func:`be_bytes` cross over.
"""

from __future__ import annotations

from amaranth import Cat, Const, Value
from amaranth.lib import data, stream

# The parameter checks are the switch geometry's (one place for each limit); the blocks import them from here.
from inagg.models.geometry import WIDTHS, check_chunk_bytes, check_slots, check_width

__all__ = ["WIDTHS", "check_width", "check_chunk_bytes", "check_slots", "beat_layout", "beat_signature", "be_get", "be_bytes", "swap_lanes"]

def beat_layout(width: int) -> data.StructLayout:
    """The payload of a beat stream: ``data`` (width bits), ``keep`` (width/8), ``last``."""
    check_width(width)
    return data.StructLayout({"data": width, "keep": width // 8, "last": 1})


def beat_signature(width: int) -> stream.Signature:
    """A stream of beats (see :func:`beat_layout`)."""
    return stream.Signature(beat_layout(width))


def be_get(vec: Value, offset: int, length: int) -> Value:
    """The big-endian field of ``length`` bytes at byte ``offset`` of byte vector ``vec``."""
    return Cat(*[vec.word_select(offset + length - 1 - i, 8) for i in range(length)])


def be_bytes(value: Value | int, length: int) -> list[Value]:
    """``value`` as ``length`` bytes in wire order (most significant first), for :func:`Cat`."""
    v = Const(value, 8 * length) if isinstance(value, int) else Value.cast(value)
    return [v.word_select(length - 1 - i, 8) for i in range(length)]


def swap_lanes(vec: Value) -> Value:
    """Reverse the byte order of every 32-bit lane: big-endian wire lanes <-> native integers."""
    lanes = len(vec) // 32
    return Cat(*[Cat(*be_bytes(vec.word_select(i, 32), 4)) for i in range(lanes)])
