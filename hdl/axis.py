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

from inagg.models.protocol import CHUNK_BYTES_ALLOWED

__all__ = ["WIDTHS", "check_width", "check_chunk_bytes", "check_slots", "beat_layout", "beat_signature", "be_get", "be_bytes", "swap_lanes"]

WIDTHS = (64, 256, 512)


def check_width(width: object) -> int:
    """Validate a stream data width; return it."""
    if not isinstance(width, int) or isinstance(width, bool) or width not in WIDTHS:
        raise ValueError(f"Data width must be one of {WIDTHS}, not {width!r}")
    return width


def check_chunk_bytes(chunk_bytes: object) -> int:
    """Validate a chunk size (``protocol.CHUNK_BYTES_ALLOWED``); return it."""
    if not isinstance(chunk_bytes, int) or chunk_bytes not in CHUNK_BYTES_ALLOWED:
        raise ValueError(f"Chunk size must be one of {CHUNK_BYTES_ALLOWED}, not {chunk_bytes!r}")
    return chunk_bytes


def check_slots(slots: object) -> int:
    """Validate a slot count (a power of two up to 65536); return it."""
    if not isinstance(slots, int) or slots < 2 or slots & (slots - 1) or slots > 1 << 16:
        raise ValueError(f"Slot count must be a power of two from 2 to 65536, not {slots!r}")
    return slots


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
