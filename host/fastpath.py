"""The data-plane fast path: contribution frames from header templates, results parsed without scapy.

A worker sends thousands of frames per all-reduce that differ only in the PSN,
the virtual address and the lanes. :class:`ContribTemplate` builds the
constant header once with the reference codec (:func:`inagg.models.wire.build`),
precomputes the CRC-32 state of its constant part (the 8 bytes of ones, the
IPv4 and UDP headers and the BTH up to the PSN, variant fields masked), and
then writes a whole batch of frames into one numpy array: the per-frame
fields and payloads in vectorized numpy, the ICRC with one ``zlib.crc32``
call per frame that continues from the precomputed state. The frames are byte
for byte what :func:`inagg.models.wire.build` emits (property-tested).

:class:`ResultParser` is the receiving half: it checks a result frame in the
order of ``docs/protocol.md`` section 5 and returns its chunk, type and lanes,
or the counter of the first check that failed.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import numpy as np

from inagg.models import icrc as _icrc
from inagg.models import wire
from inagg.models.job import JobSpec, SwitchSpec
from inagg.models.protocol import (
    BTH_LEN, CONTRIB_HDR_LEN, ETH_LEN, ETH_TYPE_IPV4, ICRC_LEN, IMM_CHUNK_MASK, IMM_FP32,
    IMM_SATURATED, IP_PROTO_UDP, IPV4_LEN, RESULT_HDR_LEN, ROCE_UDP_PORT, UDP_LEN, Counter, Opcode,
)

__all__ = ["ContribTemplate", "ResultParser", "Result", "worker_udp_sport"]

_CHUNK_MOD = 1 << 32
# Offsets in the frame.
_IP = ETH_LEN
_BTH = ETH_LEN + IPV4_LEN + UDP_LEN
_PSN = _BTH + 9
_VA = _BTH + BTH_LEN
# The masked CRC prefix covers IPv4, UDP and BTH bytes 0..8: all constant per QP.
_CONST_END = _PSN
_PREFIX_CRC = zlib.crc32(b"\xff" * 8)


def worker_udp_sport(worker_qpn: int) -> int:
    """UDP source port of a worker QP's contributions: fixed per QP, as a RoCE NIC derives it."""
    return 0xC000 | (worker_qpn & 0x3FFF)


class ContribTemplate:
    """Contribution frames (UC RDMA WRITE ONLY) of one worker of one job.

    Parameters
    ----------
    switch:
        The switch the job runs on (addresses, chunk size, P_Key).
    job:
        The job.
    rank:
        The worker's index in ``job.workers``.
    """

    def __init__(self, switch: SwitchSpec, job: JobSpec, rank: int):
        if not isinstance(rank, int) or not 0 <= rank < len(job.workers):
            raise ValueError(f"rank must be an integer in 0..{len(job.workers) - 1}, not {rank!r}")
        me = job.workers[rank]
        self.chunk_bytes = switch.chunk_bytes
        self.lanes = switch.lanes
        self.frame_len = CONTRIB_HDR_LEN + self.chunk_bytes + ICRC_LEN
        header = wire.build(
            eth_dst=wire.mac_bytes(switch.mac), eth_src=wire.mac_bytes(me.mac),
            ip_src=wire.ip_bytes(me.ip), ip_dst=wire.ip_bytes(switch.ip),
            udp_sport=worker_udp_sport(me.qpn), opcode=Opcode.UC_RDMA_WRITE_ONLY,
            dest_qpn=job.qpn(rank), psn=0, va=0, rkey=job.rkey,
            payload=bytes(self.chunk_bytes), pkey=switch.pkey,
        )[:CONTRIB_HDR_LEN]
        self._header = np.frombuffer(header, np.uint8)
        self._crc0 = zlib.crc32(_icrc.masked_header(header[_IP:])[:_CONST_END - _IP], _PREFIX_CRC)

    def build(self, chunks: np.ndarray, lanes: np.ndarray) -> np.ndarray:
        """Frames for chunk sequences ``chunks`` (shape (k,)) carrying ``lanes`` (int32, shape (k, lanes)).

        Returns a uint8 array of shape (k, frame_len), one frame per row. The
        PSN is the chunk sequence's low 24 bits, so a resend is the same frame.
        """
        chunks = np.asarray(chunks)
        lanes = np.asarray(lanes)
        if lanes.dtype != np.int32 or lanes.ndim != 2 or lanes.shape[1] != self.lanes:
            raise ValueError(f"lanes must be int32 of shape (k, {self.lanes}), not {lanes.dtype} {lanes.shape}")
        if chunks.shape != (lanes.shape[0],):
            raise ValueError(f"need one chunk sequence per row of lanes: {chunks.shape} vs {lanes.shape[0]} rows")
        if chunks.size and (chunks.min() < 0 or chunks.max() >= _CHUNK_MOD):
            raise ValueError("chunk sequences must be in 0..2**32-1")
        k = lanes.shape[0]
        out = np.empty((k, self.frame_len), np.uint8)
        out[:, :CONTRIB_HDR_LEN] = self._header
        c = chunks.astype(np.uint64)
        out[:, _PSN:_PSN + 3] = (c & 0xFFFFFF).astype(">u4").view(np.uint8).reshape(k, 4)[:, 1:]
        out[:, _VA:_VA + 8] = (c * np.uint64(self.chunk_bytes)).astype(">u8").view(np.uint8).reshape(k, 8)
        # One pass: the big-endian view of the payload bytes takes the int32 lanes as they are.
        out[:, CONTRIB_HDR_LEN:-ICRC_LEN].view(">i4")[...] = lanes
        flat = memoryview(out).cast("B")
        n, crc0, crc32 = self.frame_len, self._crc0, zlib.crc32
        tail = n - ICRC_LEN - _CONST_END
        crcs = np.array([crc32(flat[o:o + tail], crc0) for o in range(_CONST_END, k * n, n)], np.uint32)
        out[:, -ICRC_LEN:] = crcs.astype("<u4").view(np.uint8).reshape(k, ICRC_LEN)
        return out


@dataclass(frozen=True, slots=True)
class Result:
    """A result frame that passed every check: its chunk's low 30 bits, its type and its lanes."""

    chunk30: int
    fp32: bool
    saturated: bool
    va: int
    psn: int
    words: np.ndarray  # the lanes as they are on the wire (a big-endian uint32 view): INT32 or binary32 bits
    zero_icrc: bool = False  # taken with an ICRC field of zero (ResultParser's accept_zero_icrc)


# Ethernet, IPv4, UDP, BTH, RETH, ImmDt of a result, big-endian.
_RESULT_HDR = struct.Struct("!6s6sH BBHHHBBH4s4s HHHH BBHII QII I")
assert _RESULT_HDR.size == RESULT_HDR_LEN


class ResultParser:
    """Checks result frames addressed to one worker of one job and extracts their lanes.

    The checks follow ``docs/protocol.md`` section 5 for the frame (lengths,
    IPv4, UDP, ICRC, BTH) and then the receiver's own: opcode 0x2B, the
    worker's QPN, result R_Key and ring addressing, DMA length C. Fields a
    router may rewrite (TOS, TTL, IPv4 identification) are not checked.

    ``accept_zero_icrc`` is for a Tofino switch, which cannot compute the
    ICRC and sends every result with an ICRC field of zero (the P4 profile,
    ``docs/protocol.md`` section 8): such a result then passes check 9 and
    comes back with ``zero_icrc`` set, so the caller can count it. Any other
    wrong ICRC is still ``DROP_BAD_ICRC``. Off by default: a zero ICRC from
    any other switch is a corrupted frame.
    """

    def __init__(self, switch: SwitchSpec, job: JobSpec, rank: int, *, accept_zero_icrc: bool = False):
        if not isinstance(rank, int) or not 0 <= rank < len(job.workers):
            raise ValueError(f"rank must be an integer in 0..{len(job.workers) - 1}, not {rank!r}")
        if not isinstance(accept_zero_icrc, bool):
            raise TypeError(f"accept_zero_icrc must be a bool, not {type(accept_zero_icrc).__name__}")
        self.accept_zero_icrc = accept_zero_icrc
        me = job.workers[rank]
        self._pkey = switch.pkey
        self._qpn = me.qpn
        self._rkey = me.rkey
        self._va = me.result_va
        self._ring = job.slots
        self.chunk_bytes = switch.chunk_bytes
        self.frame_len = RESULT_HDR_LEN + switch.chunk_bytes + ICRC_LEN

    def parse(self, frame: bytes | bytearray | memoryview) -> Result | Counter:
        """The result carried by ``frame``, or the counter of the first failed check."""
        f = bytes(frame)
        n = len(f)
        if n < ETH_LEN:
            return Counter.DROP_BAD_LENGTH
        if (f[12] << 8 | f[13]) != ETH_TYPE_IPV4:
            return Counter.DROP_NON_ROCE
        if n < ETH_LEN + IPV4_LEN:
            return Counter.DROP_BAD_LENGTH
        if f[_IP] != 0x45 or (f[_IP + 6] & 0x3F) or f[_IP + 7] or wire.ipv4_checksum(f[_IP:_IP + IPV4_LEN]):
            return Counter.DROP_BAD_HEADER
        if f[_IP + 9] != IP_PROTO_UDP:
            return Counter.DROP_NON_ROCE
        total = (f[_IP + 2] << 8) | f[_IP + 3]
        if total < IPV4_LEN + UDP_LEN or ETH_LEN + total > n:
            return Counter.DROP_BAD_LENGTH
        if n < RESULT_HDR_LEN:
            # Too short for a result; sort it as the reference parser would.
            r = wire.parse(f, self._pkey)
            return r if isinstance(r, Counter) else Counter.DROP_BAD_LENGTH
        (_, _, _, _, _, _, _, _, _, _, _, _, _, _, dport, udp_len, _, opcode, flags, pkey, qpn, psn,
         va, rkey, dma_len, imm) = _RESULT_HDR.unpack_from(f)
        if dport != ROCE_UDP_PORT:
            return Counter.DROP_NON_ROCE
        if udp_len != total - IPV4_LEN or total < IPV4_LEN + UDP_LEN + BTH_LEN + ICRC_LEN:
            return Counter.DROP_BAD_LENGTH
        end = ETH_LEN + total
        crc = zlib.crc32(_icrc.masked_header(f[_IP:_BTH + BTH_LEN]), _PREFIX_CRC)
        zero_icrc = False
        if struct.pack("<I", zlib.crc32(f[_BTH + BTH_LEN:end - ICRC_LEN], crc)) != f[end - ICRC_LEN:end]:
            if not (self.accept_zero_icrc and f[end - ICRC_LEN:end] == bytes(ICRC_LEN)):
                return Counter.DROP_BAD_ICRC
            zero_icrc = True
        if flags & 0x0F or pkey != self._pkey:
            return Counter.DROP_BAD_HEADER
        if not wire.has_reth(opcode):
            return Counter.DROP_BAD_OPCODE
        pad = (flags >> 4) & 3
        if wire.has_imm(opcode) and dma_len != end - ICRC_LEN - RESULT_HDR_LEN - pad \
                or not wire.has_imm(opcode) and dma_len != end - ICRC_LEN - CONTRIB_HDR_LEN - pad:
            return Counter.DROP_BAD_LENGTH
        if opcode != Opcode.UC_RDMA_WRITE_ONLY_IMM:
            return Counter.DROP_BAD_OPCODE
        if dma_len != self.chunk_bytes or pad:
            return Counter.DROP_BAD_LENGTH
        if qpn & 0xFFFFFF != self._qpn:
            return Counter.DROP_UNKNOWN_QPN
        if rkey != self._rkey:
            return Counter.DROP_BAD_RKEY
        chunk30 = imm & IMM_CHUNK_MASK
        if va != self._va + (chunk30 % self._ring) * self.chunk_bytes:
            return Counter.DROP_BAD_ADDRESS
        words = np.frombuffer(f, ">u4", self.chunk_bytes // 4, RESULT_HDR_LEN)
        return Result(chunk30, bool(imm & IMM_FP32), bool(imm & IMM_SATURATED), va, psn & 0xFFFFFF, words,
                      zero_icrc)

