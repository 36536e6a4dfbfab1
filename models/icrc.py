"""The RoCEv2 invariant CRC (ICRC) over IPv4.

IBTA's RoCEv2 annex defines the ICRC as CRC-32 (the Ethernet polynomial,
reflected, initial value and final XOR all ones -- exactly :func:`zlib.crc32`)
over 8 bytes of 0xFF standing in for the LRH of InfiniBand, followed by the
IP header, the UDP header, the BTH and everything after it up to the ICRC.
The fields a router may change on the way are masked to ones first: IPv4
TOS (DSCP/ECN), TTL and header checksum, the UDP checksum, and the BTH
``resv8a`` byte (BTH byte 4, the F/B ECN bits of some NICs). The 32-bit CRC
goes on the wire least-significant byte first.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

from inagg.models.frame import BTH, IPV4, UDP
from inagg.models.protocol import ETH_LEN, ETH_TYPE_IPV4, ICRC_LEN, IPV4_VERSION_IHL

__all__ = ["icrc", "icrc_value", "check", "matches", "values", "masked_header", "MASKED_LEN", "MASKED_OFFSETS"]

MASKED_LEN = IPV4.size + UDP.size + BTH.size
"""Bytes after the Ethernet header that hold variant fields: IPv4, UDP and BTH."""
MASKED_OFFSETS = tuple(
    base + off for base, h in ((0, IPV4), (IPV4.size, UDP), (IPV4.size + UDP.size, BTH)) for off in h.icrc_ones_bytes()
)
"""The bytes the ICRC covers as ones, counted from the start of the IPv4 header (``Field.icrc_ones``)."""
_PREFIX_CRC = zlib.crc32(b"\xff" * 8)
_ONES = sum(0xFF << 8 * (MASKED_LEN - 1 - off) for off in MASKED_OFFSETS)


def masked_header(ip_hdr: bytes) -> bytes:
    """The first 40 bytes after the Ethernet header (IPv4 + UDP + BTH) with the variant fields set to ones."""
    return (int.from_bytes(ip_hdr[:MASKED_LEN], "big") | _ONES).to_bytes(MASKED_LEN, "big")


def _validate(frame: bytes) -> None:
    if len(frame) < ETH_LEN + MASKED_LEN:
        raise ValueError(f"a RoCEv2 frame has at least {ETH_LEN + MASKED_LEN} bytes before its ICRC, not {len(frame)}")
    if struct.unpack_from("!H", frame, 12)[0] != ETH_TYPE_IPV4:
        raise ValueError("the ICRC is defined here for RoCEv2 over IPv4 (EtherType 0x0800) only")
    if frame[ETH_LEN] != IPV4_VERSION_IHL:
        raise ValueError(f"IPv4 header must be version 4 with IHL 5, not byte 0x{frame[ETH_LEN]:02x}")


def _value(frame: memoryview) -> int:
    crc = zlib.crc32(masked_header(frame[ETH_LEN:]), _PREFIX_CRC)
    return zlib.crc32(frame[ETH_LEN + MASKED_LEN:], crc)


def icrc_value(frame: bytes | bytearray | memoryview) -> int:
    """The ICRC as a 32-bit integer for ``frame`` (Ethernet header up to the last pad byte, no ICRC, no FCS)."""
    frame = memoryview(frame)  # the payload is read in place, not copied
    _validate(frame)
    return _value(frame)


def values(frames: np.ndarray, end: int) -> np.ndarray:
    """:func:`icrc_value` of ``row[:end]`` for each row of ``frames`` (uint8, one frame per row), as uint32.

    For frames whose framing a caller has checked, as for :func:`matches`: the variant fields of every
    row are masked in one numpy pass; the CRC is then one ``zlib.crc32`` pair per row.
    """
    n, width = frames.shape
    if not n:
        return np.zeros(0, np.uint32)
    masked = frames[:, ETH_LEN:ETH_LEN + MASKED_LEN].copy()
    masked[:, list(MASKED_OFFSETS)] = 0xFF
    heads = memoryview(masked).cast("B")
    flat = memoryview(np.ascontiguousarray(frames)).cast("B")
    body, crc32 = ETH_LEN + MASKED_LEN, zlib.crc32
    return np.array([crc32(flat[o + body:o + end], crc32(heads[h:h + MASKED_LEN], _PREFIX_CRC))
                     for h, o in zip(range(0, n * MASKED_LEN, MASKED_LEN), range(0, n * width, width))], np.uint32)


def icrc(frame: bytes | bytearray | memoryview) -> bytes:
    """The 4 ICRC bytes as they go on the wire after ``frame`` (LSB first)."""
    return struct.pack("<I", icrc_value(frame))


def check(frame_with_icrc: bytes | bytearray | memoryview) -> bool:
    """True when the ICRC at the end of the IP datagram matches; False for anything malformed.

    The datagram's end comes from the IPv4 total length, so Ethernet padding
    after it is ignored, as a NIC ignores it.
    """
    frame = memoryview(frame_with_icrc)
    try:
        _validate(frame)
    except ValueError:
        return False
    total = struct.unpack_from("!H", frame, ETH_LEN + 2)[0]
    end = ETH_LEN + total
    if total < MASKED_LEN + ICRC_LEN or end > len(frame):
        return False
    return matches(frame, end)


def matches(frame: bytes | memoryview, end: int) -> bool:
    """True when the 4 bytes before ``end`` are the ICRC of the datagram they close.

    For a frame whose framing a caller has checked already (EtherType, IPv4
    version and IHL, ``end`` from the IPv4 total length within the frame, as
    :func:`inagg.models.wire.check_datagram` does): :func:`check` without its
    checks again, on the per-frame path of every receiver.
    """
    return _value(memoryview(frame)[:end - ICRC_LEN]) == int.from_bytes(frame[end - ICRC_LEN:end], "little")
