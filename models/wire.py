"""Header layouts of the protocol: build frames and parse them back.

This is the reference codec of ``docs/protocol.md``: the model switch parses
and emits with it, the host library checks its fast builder against it, and
testbenches use it to read what the RTL emits. Frames are Ethernet frames
without FCS, the ICRC included.

:func:`parse` applies the frame checks in the order the protocol fixes
(``docs/protocol.md``, "Error handling"), so that every implementation
counts a malformed frame under the same counter.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

from inagg.models import icrc as _icrc
from inagg.models.protocol import (
    BTH_LEN, DEFAULT_PKEY, DEFAULT_TTL, ETH_LEN, ETH_TYPE_IPV4, ICRC_LEN, IMMDT_LEN,
    IP_PROTO_UDP, IPV4_LEN, RETH_LEN, ROCE_UDP_PORT, UDP_LEN, Counter, Opcode,
)

__all__ = [
    "mac_bytes", "ip_bytes", "ipv4_checksum", "build", "parse", "RoceFrame",
    "has_reth", "has_imm",
]

_RETH_OPCODES = frozenset({Opcode.RC_RDMA_WRITE_ONLY, Opcode.RC_RDMA_WRITE_ONLY_IMM,
                           Opcode.UC_RDMA_WRITE_ONLY, Opcode.UC_RDMA_WRITE_ONLY_IMM})
_IMM_OPCODES = frozenset({Opcode.RC_RDMA_WRITE_ONLY_IMM, Opcode.UC_RDMA_WRITE_ONLY_IMM})
_IP_DF = 0x4000


def has_reth(opcode: int) -> bool:
    """True for the opcodes whose BTH is followed by a RETH."""
    return opcode in _RETH_OPCODES


def has_imm(opcode: int) -> bool:
    """True for the opcodes that carry an ImmDt after the RETH."""
    return opcode in _IMM_OPCODES


def mac_bytes(mac: str | bytes) -> bytes:
    """``"02:00:00:00:00:01"`` (or 6 raw bytes) as 6 bytes."""
    if isinstance(mac, (bytes, bytearray)):
        if len(mac) != 6:
            raise ValueError(f"a MAC address has 6 bytes, not {len(mac)}")
        return bytes(mac)
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
    return ipaddress.IPv4Address(ip).packed


def ipv4_checksum(hdr: bytes) -> int:
    """The ones'-complement header checksum of a 20-byte IPv4 header (checksum field taken as is)."""
    s = sum(struct.unpack("!10H", hdr[:IPV4_LEN]))
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    return (~s) & 0xFFFF


def build(*, eth_dst: bytes, eth_src: bytes, ip_src: bytes, ip_dst: bytes, udp_sport: int,
          opcode: int, dest_qpn: int, psn: int, va: int, rkey: int, payload: bytes,
          imm: int | None = None, ackreq: bool = False, pkey: int = DEFAULT_PKEY,
          ttl: int = DEFAULT_TTL, tos: int = 0, ip_id: int = 0, migreq: bool = True) -> bytes:
    """One RDMA WRITE ONLY (with ImmDt when ``imm`` is given) frame with its ICRC.

    Addresses are raw bytes (see :func:`mac_bytes`, :func:`ip_bytes`); the
    payload is sent as is and must be a multiple of 4 bytes (pad count 0).
    """
    if len(payload) % 4:
        raise ValueError(f"payload must be a multiple of 4 bytes, not {len(payload)}")
    if (imm is not None) != has_imm(opcode):
        raise ValueError(f"opcode 0x{opcode:02x} {'needs' if has_imm(opcode) else 'has no'} ImmDt")
    ext = struct.pack("!QII", va, rkey, len(payload))
    if imm is not None:
        ext += struct.pack("!I", imm)
    bth = struct.pack("!BBHII", opcode, 0x40 if migreq else 0, pkey, dest_qpn & 0xFFFFFF,
                      ((0x80000000 if ackreq else 0) | (psn & 0xFFFFFF)))
    udp_len = UDP_LEN + BTH_LEN + len(ext) + len(payload) + ICRC_LEN
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, tos, IPV4_LEN + udp_len, ip_id, _IP_DF,
                               ttl, IP_PROTO_UDP, 0, ip_src, ip_dst))
    struct.pack_into("!H", ip, 10, ipv4_checksum(ip))
    udp = struct.pack("!HHHH", udp_sport, ROCE_UDP_PORT, udp_len, 0)
    frame = eth_dst + eth_src + struct.pack("!H", ETH_TYPE_IPV4) + bytes(ip) + udp + bth + ext + payload
    return frame + _icrc.icrc(frame)


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


def parse(frame: bytes | bytearray | memoryview, pkey: int = DEFAULT_PKEY) -> RoceFrame | Counter:
    """Check ``frame`` in the protocol's order; return its fields or the counter of the first failed check.

    This covers every check that needs no switch state: framing, IPv4 and
    UDP, lengths, ICRC, BTH version and P_Key, and the extension headers of
    RDMA WRITE opcodes. Opcode policy, QPN, R_Key and address checks belong
    to the receiver.
    """
    f = bytes(frame)
    n = len(f)
    if n < ETH_LEN:
        return Counter.DROP_BAD_LENGTH
    if struct.unpack_from("!H", f, 12)[0] != ETH_TYPE_IPV4:
        return Counter.DROP_NON_ROCE
    if n < ETH_LEN + IPV4_LEN:
        return Counter.DROP_BAD_LENGTH
    ip = f[ETH_LEN:ETH_LEN + IPV4_LEN]
    flags_frag = struct.unpack_from("!H", ip, 6)[0]
    if ip[0] != 0x45 or (flags_frag & 0x3FFF) or ipv4_checksum(ip) != 0:
        return Counter.DROP_BAD_HEADER
    if ip[9] != IP_PROTO_UDP:
        return Counter.DROP_NON_ROCE
    total = struct.unpack_from("!H", ip, 2)[0]
    if total < IPV4_LEN + UDP_LEN or ETH_LEN + total > n:
        return Counter.DROP_BAD_LENGTH
    off = ETH_LEN + IPV4_LEN
    sport, dport, udp_len = struct.unpack_from("!HHH", f, off)
    if dport != ROCE_UDP_PORT:
        return Counter.DROP_NON_ROCE
    if udp_len != total - IPV4_LEN or total < IPV4_LEN + UDP_LEN + BTH_LEN + ICRC_LEN:
        return Counter.DROP_BAD_LENGTH
    end = ETH_LEN + total
    if not _icrc.check(f[:end]):
        return Counter.DROP_BAD_ICRC
    off += UDP_LEN
    opcode, flags, bth_pkey, qpn_word, psn_word = struct.unpack_from("!BBHII", f, off)
    if (flags & 0x0F) != 0 or bth_pkey != pkey:
        return Counter.DROP_BAD_HEADER
    off += BTH_LEN
    pad = (flags >> 4) & 0x3
    va = rkey = dma_len = imm = None
    if has_reth(opcode):
        if off + RETH_LEN > end - ICRC_LEN:
            return Counter.DROP_BAD_LENGTH
        va, rkey, dma_len = struct.unpack_from("!QII", f, off)
        off += RETH_LEN
        if has_imm(opcode):
            if off + IMMDT_LEN > end - ICRC_LEN:
                return Counter.DROP_BAD_LENGTH
            imm = struct.unpack_from("!I", f, off)[0]
            off += IMMDT_LEN
        if dma_len != end - ICRC_LEN - off - pad:
            return Counter.DROP_BAD_LENGTH
    return RoceFrame(
        eth_dst=f[0:6], eth_src=f[6:12], ip_src=ip[12:16], ip_dst=ip[16:20], udp_sport=sport,
        opcode=opcode, migreq=bool(flags & 0x40), pad=pad, pkey=bth_pkey,
        dest_qpn=qpn_word & 0xFFFFFF, ackreq=bool(psn_word >> 31), psn=psn_word & 0xFFFFFF,
        va=va, rkey=rkey, dma_len=dma_len, imm=imm, payload=f[off:end - ICRC_LEN - pad],
    )
