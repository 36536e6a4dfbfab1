"""The protocol's frames: build them and parse them back.

This is the reference codec of ``docs/protocol.md``, packing and unpacking
the headers :mod:`inagg.models.frame` declares: the model switch parses
and emits with it, the host library checks its fast builder against it, and
testbenches use it to read what the RTL emits. Frames are Ethernet frames
without FCS, the ICRC included.

:func:`check_datagram`, :func:`parse` and :func:`check_receiver` are the
frame checks of ``docs/protocol.md`` section 5, in its order, written once:
the model switches and the host's result parser run them, so that every
implementation counts a malformed frame under the same counter.
"""

from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass

from inagg.models import icrc as _icrc
from inagg.models.frame import BTH, CONTRIBUTION, ETHERNET, IMMDT, IPV4, RESULT, RETH, UDP, Layout
from inagg.models.protocol import (
    BTH_LEN, DEFAULT_PKEY, DEFAULT_TTL, ETH_LEN, ETH_TYPE_IPV4, ICRC_LEN, IMM_OPCODES, IMMDT_LEN,
    IP_PROTO_UDP, IPV4_LEN, RETH_LEN, RETH_OPCODES, ROCE_UDP_PORT, UDP_LEN, Counter,
)

__all__ = [
    "mac_bytes", "ip_bytes", "ipv4_checksum", "build", "encapsulate", "parse", "RoceFrame",
    "has_reth", "has_imm", "check_datagram", "check_receiver",
]

# Every header field the checks read, in one struct call (frame.Layout.reader) over a result's
# headers: every RDMA WRITE frame has the contribution's layout up to its RETH, and a check reads
# a field only once the frame's lengths cover it, so a frame shorter than a result's headers is
# read zero-padded (_head).
_read_head = RESULT.reader(
    "ethernet.ether_type", "ipv4.version", "ipv4.ihl", "ipv4.flag_rsvd", "ipv4.flag_mf", "ipv4.frag_offset",
    "ipv4.protocol", "ipv4.total_len", "udp.dport", "udp.len", "udp.sport", "bth.opcode", "bth.migreq", "bth.pad",
    "bth.tver", "bth.pkey", "bth.dqpn", "bth.ackreq", "bth.psn", "reth.va", "reth.rkey", "reth.dma_len", "immdt.imm")
_DATAGRAM = 10  # the fields of checks 1-8 come first
_HEAD = RESULT.size
_BTH_END = CONTRIBUTION.offset("bth") + BTH_LEN
_IP_CSUM = IPV4.slice("checksum")
_VERSION, _IHL, _TVER = IPV4["version"].value, IPV4["ihl"].value, BTH["tver"].value
_ETH_DST, _ETH_SRC = ETHERNET.slice("dst"), ETHERNET.slice("src")
_IP_SRC, _IP_DST = IPV4.slice("src", ETH_LEN), IPV4.slice("dst", ETH_LEN)


def has_reth(opcode: int) -> bool:
    """True for the opcodes whose BTH is followed by a RETH."""
    return opcode in RETH_OPCODES


def has_imm(opcode: int) -> bool:
    """True for the opcodes that carry an ImmDt after the RETH."""
    return opcode in IMM_OPCODES


def mac_bytes(mac: str | bytes) -> bytes:
    """``"02:00:00:00:00:01"`` (or 6 raw bytes) as 6 bytes."""
    if isinstance(mac, (bytes, bytearray)):
        if len(mac) != 6:
            raise ValueError(f"a MAC address has 6 bytes, not {len(mac)}")
        return bytes(mac)
    return _mac_text(mac)


# A switch names its workers' addresses as text and converts them for every result it sends.
@functools.lru_cache(maxsize=4096)
def _mac_text(mac: str) -> bytes:
    parts = mac.split(":")
    if len(parts) != 6:
        raise ValueError(f"not a MAC address: {mac!r}")
    return bytes(int(p, 16) for p in parts)


def ip_bytes(ip: str | bytes) -> bytes:
    """``"10.0.0.1"`` (or 4 raw bytes) as 4 bytes."""
    if isinstance(ip, (bytes, bytearray)):
        if len(ip) != 4:
            raise ValueError(f"an IPv4 address has 4 bytes, not {len(ip)}")
        return bytes(ip)
    return _ip_text(ip)


@functools.lru_cache(maxsize=4096)
def _ip_text(ip: str) -> bytes:
    return ipaddress.IPv4Address(ip).packed


def ipv4_checksum(hdr: bytes) -> int:
    """The ones'-complement header checksum of a 20-byte IPv4 header (checksum field taken as is)."""
    # The ones'-complement sum of 16-bit words is their sum modulo 0xFFFF (2**16 = 1 there), read
    # as 0xFFFF for a nonzero multiple: the header as one integer has that residue too.
    x = int.from_bytes(hdr[:IPV4_LEN], "big")
    return (0xFFFF - x % 0xFFFF) % 0xFFFF if x else 0xFFFF


def build(*, eth_dst: bytes, eth_src: bytes, ip_src: bytes, ip_dst: bytes, udp_sport: int,
          opcode: int, dest_qpn: int, psn: int, va: int, rkey: int, payload: bytes,
          imm: int | None = None, ackreq: bool = False, pkey: int = DEFAULT_PKEY,
          ttl: int = DEFAULT_TTL, tos: int = 0, ip_id: int = 0, migreq: bool = True) -> bytes:
    """One RDMA WRITE ONLY (with ImmDt when ``imm`` is given) frame with its ICRC.

    Addresses are raw bytes (see :func:`mac_bytes`, :func:`ip_bytes`); the
    payload is sent as is and must be a multiple of 4 bytes (pad count 0).
    Every field not named here takes its fixed value of :mod:`inagg.models.frame`.
    The BTH, RETH and ImmDt go to :func:`encapsulate`, which adds the rest.
    """
    n = len(payload)
    if n % 4:
        raise ValueError(f"payload must be a multiple of 4 bytes, not {n}")
    if (imm is not None) != has_imm(opcode):
        raise ValueError(f"opcode 0x{opcode:02x} {'needs' if has_imm(opcode) else 'has no'} ImmDt")
    transport = (BTH.pack(opcode=opcode, migreq=int(migreq), pkey=pkey, dqpn=dest_qpn & 0xFFFFFF, ackreq=int(ackreq),
                          psn=psn & 0xFFFFFF)
                 + RETH.pack(va=va, rkey=rkey, dma_len=n) + (b"" if imm is None else IMMDT.pack(imm=imm)))
    return encapsulate(transport + payload, eth_dst=eth_dst, eth_src=eth_src, ip_src=ip_src, ip_dst=ip_dst,
                       udp_sport=udp_sport, ttl=ttl, tos=tos, ip_id=ip_id)


def encapsulate(transport: bytes, *, eth_dst: bytes, eth_src: bytes, ip_src: bytes, ip_dst: bytes, udp_sport: int,
                ttl: int = DEFAULT_TTL, tos: int = 0, ip_id: int = 0) -> bytes:
    """The frame that carries ``transport`` (a BTH and what follows it up to the ICRC): Ethernet, IPv4 and UDP
    before it, the ICRC after it. Every frame of the protocol is assembled here (:func:`build` too)."""
    udp_len = UDP_LEN + len(transport) + ICRC_LEN
    ip = bytearray(IPV4.pack(tos=tos, total_len=IPV4_LEN + udp_len, identification=ip_id, ttl=ttl, checksum=0,
                             src=int.from_bytes(ip_src, "big"), dst=int.from_bytes(ip_dst, "big")))
    ip[_IP_CSUM] = ipv4_checksum(ip).to_bytes(2, "big")
    f = (ETHERNET.pack(dst=int.from_bytes(eth_dst, "big"), src=int.from_bytes(eth_src, "big")) + ip
         + UDP.pack(sport=udp_sport, len=udp_len) + transport)
    return f + _icrc.icrc(f)


@dataclass(frozen=True, slots=True)
class RoceFrame:
    """The fields of a well-formed RoCEv2 RDMA WRITE frame that the protocol uses."""

    eth_dst: bytes
    eth_src: bytes
    ip_src: bytes
    ip_dst: bytes
    udp_sport: int
    opcode: int
    migreq: bool
    pad: int
    pkey: int
    dest_qpn: int
    ackreq: bool
    psn: int
    va: int | None
    rkey: int | None
    dma_len: int | None
    imm: int | None
    payload: bytes
    zero_icrc: bool = False  # taken with an ICRC field of zero (parse's accept_zero_icrc)


def _head(f: bytes) -> tuple:
    return _read_head(f if len(f) >= _HEAD else f + bytes(_HEAD - len(f)))


def check_datagram(frame: bytes) -> int | Counter:
    """Checks 1-8 of ``docs/protocol.md`` section 5: the IPv4 total length, or the counter of the first failure.

    These are the checks up to the ICRC: framing, IPv4, UDP and the lengths
    that bound the datagram. A :class:`Counter` is an ``int`` too: test the
    result with ``isinstance(r, Counter)``.
    """
    f = frame if type(frame) is bytes else bytes(frame)
    return _datagram(f, _head(f))


def _datagram(f: bytes, head: tuple) -> int | Counter:
    n = len(f)
    if n < ETH_LEN:
        return Counter.DROP_BAD_LENGTH
    ether_type, version, ihl, rsvd, mf, frag, protocol, total, dport, udp_len = head[:_DATAGRAM]
    if ether_type != ETH_TYPE_IPV4:
        return Counter.DROP_NON_ROCE
    if n < ETH_LEN + IPV4_LEN:
        return Counter.DROP_BAD_LENGTH
    if version != _VERSION or ihl != _IHL or rsvd or mf or frag or ipv4_checksum(f[ETH_LEN:ETH_LEN + IPV4_LEN]) != 0:
        return Counter.DROP_BAD_HEADER
    if protocol != IP_PROTO_UDP:
        return Counter.DROP_NON_ROCE
    if total < IPV4_LEN + UDP_LEN or ETH_LEN + total > n:
        return Counter.DROP_BAD_LENGTH
    if dport != ROCE_UDP_PORT:
        return Counter.DROP_NON_ROCE
    if udp_len != total - IPV4_LEN or total < IPV4_LEN + UDP_LEN + BTH_LEN + ICRC_LEN:
        return Counter.DROP_BAD_LENGTH
    return total


def parse(frame: bytes | bytearray | memoryview, pkey: int = DEFAULT_PKEY, *,
          accept_zero_icrc: bool = False) -> RoceFrame | Counter:
    """Check ``frame`` in the protocol's order; return its fields or the counter of the first failed check.

    This covers every check that needs no switch state (checks 1-11 of
    ``docs/protocol.md`` section 5): framing, IPv4 and UDP, lengths, ICRC,
    BTH version and P_Key, and the extension headers of RDMA WRITE opcodes.
    Opcode policy, QPN, R_Key and address checks belong to the receiver
    (:func:`check_receiver`). ``accept_zero_icrc`` takes an ICRC field of
    zero as good (a Tofino's results, ``docs/protocol.md`` section 8) and
    marks the frame ``zero_icrc``.
    """
    f = frame if type(frame) is bytes else bytes(frame)
    head = _head(f)
    total = _datagram(f, head)
    if isinstance(total, Counter):
        return total
    end = ETH_LEN + total
    zero_icrc = False
    if not _icrc.matches(f, end):
        if not (accept_zero_icrc and f[end - ICRC_LEN:end] == bytes(ICRC_LEN)):
            return Counter.DROP_BAD_ICRC
        zero_icrc = True
    sport, opcode, migreq, pad, tver, bth_pkey, dqpn, ackreq, psn, va, rkey, dma_len, imm = head[_DATAGRAM:]
    if tver != _TVER or bth_pkey != pkey:
        return Counter.DROP_BAD_HEADER
    off = _BTH_END
    if has_reth(opcode):
        if off + RETH_LEN > end - ICRC_LEN:
            return Counter.DROP_BAD_LENGTH
        off += RETH_LEN
        if has_imm(opcode):
            if off + IMMDT_LEN > end - ICRC_LEN:
                return Counter.DROP_BAD_LENGTH
            off += IMMDT_LEN
        else:
            imm = None
        if dma_len != end - ICRC_LEN - off - pad:
            return Counter.DROP_BAD_LENGTH
    else:
        va = rkey = dma_len = imm = None
    return RoceFrame(
        eth_dst=f[_ETH_DST], eth_src=f[_ETH_SRC], ip_src=f[_IP_SRC], ip_dst=f[_IP_DST], udp_sport=sport,
        opcode=opcode, migreq=bool(migreq), pad=pad, pkey=bth_pkey, dest_qpn=dqpn, ackreq=bool(ackreq), psn=psn,
        va=va, rkey=rkey, dma_len=dma_len, imm=imm, payload=f[off:end - ICRC_LEN - pad], zero_icrc=zero_icrc,
    )


def check_receiver(r: RoceFrame, kind: Layout, chunk_bytes: int, *, qpn_ok: bool, rkey_ok: bool,
                   va_ok: bool) -> Counter | None:
    """Checks 12-16 of ``docs/protocol.md`` section 5 on a parsed frame of ``kind``; the counter of the first failure.

    ``kind`` is the frame the receiver takes (:data:`~inagg.models.frame.CONTRIBUTION`
    at a switch, :data:`~inagg.models.frame.RESULT` at a worker): its opcode
    is the only one accepted. The receiver's own state answers the last
    three checks: the destination QPN is one it serves (``qpn_ok``), the
    R_Key is that QPN's (``rkey_ok``), the virtual address is where the
    chunk goes (``va_ok``). None when every check passes.
    """
    if r.opcode != kind.opcode:
        return Counter.DROP_BAD_OPCODE
    if r.dma_len != chunk_bytes or r.pad:
        return Counter.DROP_BAD_LENGTH
    if not qpn_ok:
        return Counter.DROP_UNKNOWN_QPN
    if not rkey_ok:
        return Counter.DROP_BAD_RKEY
    if not va_ok:
        return Counter.DROP_BAD_ADDRESS
    return None

