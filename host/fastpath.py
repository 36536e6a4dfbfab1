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

:class:`ResultParser` is the receiving half: it checks a result frame with
the reference check chain (:mod:`inagg.models.wire`) and returns its chunk,
type and lanes, or the counter of the first check that failed.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from inagg.models import icrc as _icrc
from inagg.models import wire
from inagg.models.frame import CONTRIBUTION, RESULT
from inagg.models.job import JobSpec, SwitchSpec
from inagg.models.protocol import (
    CHUNK_MOD, CONTRIB_HDR_LEN, ETH_LEN, ICRC_LEN, IMM_CHUNK_MASK, IMM_FP32, IMM_SATURATED, IPV4_LEN,
    RESULT_HDR_LEN, Counter, qp_udp_sport,
)

__all__ = ["ContribTemplate", "ResultParser", "Result", "ResultBatch", "split_results"]

# The fields a result's checks compare with a value of the receiver's or a fixed one (a router
# may rewrite TOS, TTL and the identification); va, imm and psn vary per result.
_EXPECT = ("ethernet.ether_type", "ipv4.version", "ipv4.ihl", "ipv4.flag_mf", "ipv4.frag_offset", "ipv4.protocol",
           "ipv4.total_len", "udp.dport", "udp.len", "bth.opcode", "bth.pad", "bth.tver", "bth.pkey", "bth.dqpn",
           "reth.rkey", "reth.dma_len")
_read_result = RESULT.reader(*_EXPECT, "reth.va", "immdt.imm", "bth.psn")
_read_fixed = RESULT.reader(*_EXPECT)
_R_VA, _R_IMM = RESULT.span("reth.va")[0], RESULT.span("immdt.imm")[0]
_R_IP = RESULT.offset("ipv4")


def _compared_bits() -> np.ndarray:
    """A mask of the header bits _EXPECT's fields occupy, found with the reader: a bit is one of them
    when flipping it changes what the reader returns."""
    base = _read_fixed(bytes(RESULT_HDR_LEN))
    mask = np.zeros(RESULT_HDR_LEN, np.uint8)
    for byte in range(RESULT_HDR_LEN):
        for bit in range(8):
            f = bytearray(RESULT_HDR_LEN)
            f[byte] = 1 << bit
            if _read_fixed(bytes(f)) != base:
                mask[byte] |= 1 << bit
    return mask


_COMPARED = _compared_bits()
# Offsets in a contribution, from the frame description.
_IP = CONTRIBUTION.offset("ipv4")
_PSN, _PSN_LEN = CONTRIBUTION.span("bth.psn")
_VA, _VA_LEN = CONTRIBUTION.span("reth.va")
# The masked CRC prefix covers IPv4, UDP and the BTH up to the PSN: all constant per QP.
_CONST_END = _PSN
_PREFIX_CRC = zlib.crc32(b"\xff" * 8)


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
            udp_sport=qp_udp_sport(me.qpn), opcode=CONTRIBUTION.opcode,
            dest_qpn=job.qpn(rank), psn=0, va=0, rkey=job.contrib_rkey(rank),
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
        if chunks.size and (chunks.min() < 0 or chunks.max() >= CHUNK_MOD):
            raise ValueError("chunk sequences must be in 0..2**32-1")
        k = lanes.shape[0]
        out = np.empty((k, self.frame_len), np.uint8)
        out[:, :CONTRIB_HDR_LEN] = self._header
        c = chunks.astype(np.uint64)
        psn = (c & np.uint64((1 << 8 * _PSN_LEN) - 1)).astype(">u4").view(np.uint8).reshape(k, 4)
        out[:, _PSN:_PSN + _PSN_LEN] = psn[:, 4 - _PSN_LEN:]
        out[:, _VA:_VA + _VA_LEN] = (c * np.uint64(self.chunk_bytes)).astype(">u8").view(np.uint8).reshape(k, _VA_LEN)
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


@dataclass(frozen=True)
class ResultBatch:
    """Results that passed every check, one entry per frame (:meth:`ResultParser.parse_batch`)."""

    chunk30: np.ndarray    # int64: the chunk's low 30 bits
    fp32: np.ndarray       # bool
    saturated: np.ndarray  # bool
    words: np.ndarray      # (n, lanes) big-endian uint32 view of the lanes, as in Result.words
    zero_icrc: np.ndarray  # bool: taken with an ICRC field of zero

    @classmethod
    def of(cls, results: Sequence[Result], lanes: int) -> "ResultBatch":
        """The batch of ``results`` (:class:`Result`, each of ``lanes`` lanes)."""
        words = np.stack([r.words for r in results]) if results else np.zeros((0, lanes), ">u4")
        return cls(np.array([r.chunk30 for r in results], np.int64), np.array([r.fp32 for r in results], bool),
                   np.array([r.saturated for r in results], bool), words,
                   np.array([r.zero_icrc for r in results], bool))

    def extend(self, other: "ResultBatch") -> "ResultBatch":
        """This batch followed by ``other``."""
        return ResultBatch(*(np.concatenate([a, b]) for a, b in zip(
            (self.chunk30, self.fp32, self.saturated, self.words, self.zero_icrc),
            (other.chunk30, other.fp32, other.saturated, other.words, other.zero_icrc))))


def split_results(parsed: Sequence[Result | Counter], lanes: int) -> tuple[ResultBatch, list[Counter]]:
    """What a parser's ``parse`` gave frame by frame, as ``parse_batch`` gives it: the results, the counters."""
    return (ResultBatch.of([r for r in parsed if not isinstance(r, Counter)], lanes),
            [r for r in parsed if isinstance(r, Counter)])


class ResultParser:
    """Checks result frames addressed to one worker of one job and extracts their lanes.

    The checks are the reference chain of ``docs/protocol.md`` section 5:
    :func:`inagg.models.wire.parse` for the frame (lengths, IPv4, UDP, ICRC,
    BTH) and :func:`inagg.models.wire.check_receiver` with a result as the
    frame kind for the receiver's own: opcode 0x2B, DMA length C, the
    worker's QPN, result R_Key and ring addressing. Fields a router may
    rewrite (TOS, TTL, IPv4 identification) are not checked.

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
        self._lanes = switch.chunk_bytes // 4
        # What a result for this worker that passes every check carries in _EXPECT's fields.
        total = self.frame_len - ETH_LEN
        mine = {"ipv4.total_len": total, "udp.len": total - IPV4_LEN, "bth.opcode": RESULT.opcode,
                "bth.pkey": switch.pkey, "bth.dqpn": me.qpn, "reth.rkey": me.rkey, "reth.dma_len": switch.chunk_bytes}
        self._expect = [mine[p] if p in mine else RESULT.field(p).value for p in _EXPECT]
        # The same values as header bytes, for the checks of a whole batch at once (_COMPARED bits only).
        header = wire.build(eth_dst=wire.mac_bytes(me.mac), eth_src=wire.mac_bytes(switch.mac),
                            ip_src=wire.ip_bytes(switch.ip), ip_dst=wire.ip_bytes(me.ip), udp_sport=0,
                            opcode=RESULT.opcode, dest_qpn=me.qpn, psn=0, va=0, rkey=me.rkey,
                            payload=bytes(switch.chunk_bytes), imm=0, pkey=switch.pkey)[:RESULT_HDR_LEN]
        assert list(_read_fixed(header)) == self._expect, "the result template disagrees with the checks"
        self._header = np.frombuffer(header, np.uint8) & _COMPARED

    def parse(self, frame: bytes | bytearray | memoryview) -> Result | Counter:
        """The result carried by ``frame``, or the counter of the first failed check."""
        f = frame if type(frame) is bytes else bytes(frame)
        fast = self._fast(f)
        if fast is None:
            return self._checked(f)
        va, imm, psn = fast
        return Result(imm & IMM_CHUNK_MASK, bool(imm & IMM_FP32), bool(imm & IMM_SATURATED), va, psn,
                      np.frombuffer(f, ">u4", self._lanes, RESULT_HDR_LEN))

    def parse_batch(self, frames: Sequence[bytes | bytearray | memoryview]) -> tuple["ResultBatch", list[Counter]]:
        """The results among ``frames`` as one :class:`ResultBatch`, and the counter of every other frame.

        The same checks as :meth:`parse`, frame by frame (the ICRC is one ``zlib`` call per frame); the
        lanes and the ImmDt flags of the whole batch are then read as arrays, not one result at a time.
        """
        n = self.frame_len
        fs = [f if type(f) is bytes else bytes(f) for f in frames]
        whole = [i for i, f in enumerate(fs) if len(f) >= n]
        buf = np.frombuffer(b"".join([fs[i][:n] for i in whole]), np.uint8).reshape(len(whole), n)
        # _fast's checks on every frame at once: the compared header fields, the address, the IPv4
        # checksum (the ones'-complement sum of the header's 16-bit words is 0xFFFF), then the ICRC.
        imm = buf[:, _R_IMM:_R_IMM + 4].view(">u4")[:, 0].astype(np.int64)
        va = buf[:, _R_VA:_R_VA + 8].view(">u8")[:, 0]
        words16 = buf[:, _R_IP:_R_IP + IPV4_LEN].view(">u2").sum(axis=1, dtype=np.uint32)
        words16 = (words16 & 0xFFFF) + (words16 >> 16)
        ok = ((((buf[:, :RESULT_HDR_LEN] & _COMPARED) == self._header).all(axis=1))
              & (va == np.uint64(self._va) + ((imm & IMM_CHUNK_MASK) % self._ring).astype(np.uint64)
                 * np.uint64(self.chunk_bytes))
              & (((words16 & 0xFFFF) + (words16 >> 16)) == 0xFFFF))
        ok[ok] = _icrc.values(buf[ok], n - ICRC_LEN) == buf[ok, n - ICRC_LEN:].view("<u4")[:, 0]
        imm, buf = imm[ok], buf[ok]
        batch = ResultBatch(imm & IMM_CHUNK_MASK, (imm & IMM_FP32) != 0, (imm & IMM_SATURATED) != 0,
                            buf[:, RESULT_HDR_LEN:RESULT_HDR_LEN + self.chunk_bytes].view(">u4"), np.zeros(imm.size, bool))
        passed = set(np.asarray(whole)[ok].tolist())
        slow = [self._checked(f) for i, f in enumerate(fs) if i not in passed]
        if not slow:
            return batch, []
        # The rare frames the reference chain sorts: refused, or taken (a Tofino's zero ICRC).
        taken, drops = split_results(slow, self._lanes)
        return batch.extend(taken), drops

    def _fast(self, f: bytes) -> tuple[int, int, int] | None:
        """(va, imm, psn) of a result for this worker that passes every check, read whole; None for any other frame.

        Anything else, and a Tofino's zero ICRC, is for the reference chain to sort (:meth:`_checked`).
        """
        if len(f) < self.frame_len:
            return None
        *fixed, va, imm, psn = _read_result(f)
        if (fixed == self._expect and va == self._va + ((imm & IMM_CHUNK_MASK) % self._ring) * self.chunk_bytes
                and wire.ipv4_checksum(f[ETH_LEN:ETH_LEN + IPV4_LEN]) == 0 and _icrc.matches(f, self.frame_len)):
            return va, imm, psn
        return None

    def _checked(self, frame: bytes) -> Result | Counter:
        """:meth:`parse` through the reference chain, check by check."""
        # A frame too short for a result is sorted by the reference parser with every ICRC
        # checked, and then counted as a bad length.
        short = len(frame) < RESULT_HDR_LEN
        r = wire.parse(frame, self._pkey, accept_zero_icrc=self.accept_zero_icrc and not short)
        if isinstance(r, Counter):
            return r
        if short:
            return Counter.DROP_BAD_LENGTH
        chunk30 = self.chunk(r, self.chunk_bytes)
        if isinstance(chunk30, Counter):
            return chunk30
        words = np.frombuffer(r.payload, ">u4")
        return Result(chunk30, bool(r.imm & IMM_FP32), bool(r.imm & IMM_SATURATED), r.va, r.psn, words, r.zero_icrc)

    def chunk(self, r: wire.RoceFrame, dma_len: int) -> int | Counter:
        """The chunk number of parsed frame ``r`` as a result of ``dma_len`` bytes for this worker, or the
        counter of its first failed receiver check (:func:`inagg.models.wire.check_receiver`)."""
        chunk30 = r.imm & IMM_CHUNK_MASK if r.imm is not None else None
        bad = wire.check_receiver(
            r, RESULT, dma_len, qpn_ok=r.dest_qpn == self._qpn, rkey_ok=r.rkey == self._rkey,
            va_ok=chunk30 is not None and r.va == self._va + (chunk30 % self._ring) * self.chunk_bytes)
        return chunk30 if bad is None else bad
