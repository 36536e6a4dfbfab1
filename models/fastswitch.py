"""The fast software switch: :class:`~inagg.models.switch.ModelSwitch`'s UC rules, compiled, over batches of frames.

:class:`FastSwitch` is the switch the demo, the service and the DDP path use
by default. It sends the same frames in the same order and keeps the same
counters as the reference :class:`~inagg.models.switch.ModelSwitch` for
every input (``tests/models/test_fastswitch.py`` compares them on randomized
traffic with every fault and drop reason); ``docs/fastswitch.md`` says why
it is compiled with numba rather than vectorized with numpy, and
``docs/results/fastswitch.md`` how fast it is.

Where the time goes in the reference: a Python call per header field, a
numpy call per lane operation, a result frame built field by field with
its own ICRC. Here one compiled loop (:func:`_run`) takes a whole batch of
frames laid end to end in one buffer and does, per frame, the checks of
``docs/protocol.md`` section 5 in their order, the slot logic and the lane
arithmetic, and writes each result from a per-worker header template (as
the hosts' :class:`~inagg.host.fastpath.ContribTemplate` does for
contributions). The ICRC of a result continues a CRC state precomputed over
the template's constant bytes, and the payload's CRC is computed once per
completed chunk and shifted into every worker's result (CRC-32 is affine
in its start state), so a chunk of N workers costs one payload CRC, not N.

Every offset, field width and fixed value comes from :mod:`inagg.models.frame`
and :mod:`inagg.models.protocol` at import, in arrays handed to the compiled
code, so numba's on-disk cache never holds a stale layout. The CRC tables
are derived from :func:`zlib.crc32`, the codec :mod:`inagg.models.icrc` uses.

The exception path's cuckoo table stays the reference
:class:`~inagg.models.cuckoo.CuckooTable`: the compiled loop looks keys up in
an array copy of it and hands a frame that needs an insertion back to
Python, which inserts with the reference code and refreshes the copy.

Only UC jobs without a parent are implemented: :meth:`FastSwitch.add_job`
refuses a job that sets any other :class:`~inagg.models.job.JobSpec` field
away from its default, naming it.
"""

from __future__ import annotations

import dataclasses
import enum
import zlib
from collections.abc import Iterable, Sequence

import numpy as np
from numba import njit

from inagg.models import icrc, wire
from inagg.models.backend import Backend, SwitchBackend
from inagg.models.cuckoo import KEY_JOB_SHIFT, CuckooTable, make_key
from inagg.models.frame import BTH, CONTRIBUTION, IPV4, RESULT
from inagg.models.job import JobSpec, SwitchSpec
from inagg.models.protocol import (
    ETH_LEN, ETH_TYPE_IPV4, ICRC_LEN, IMM_OPCODES, IP_PROTO_UDP, MAX_JOBS, QPN_JOB_BITS, QPN_PREFIX,
    QPN_WORKER_BITS, RESULT_HDR_LEN, RETH_OPCODES, ROCE_UDP_PORT, Counter, Opcode, qp_udp_sport, split_qpn,
)
from inagg.models.switch import ModelSwitch

__all__ = ["FastSwitch", "BACKEND"]

# -- the frame, as numbers for the compiled loop ------------------------------------------------------------

# The fields the loop reads from a contribution or writes into a result; _F holds their (bit offset, width).
_FIELDS = (
    "ethernet.ether_type", "ipv4.version", "ipv4.ihl", "ipv4.flag_mf", "ipv4.frag_offset", "ipv4.protocol",
    "ipv4.total_len", "udp.dport", "udp.len", "bth.opcode", "bth.pad", "bth.tver", "bth.pkey", "bth.dqpn",
    "reth.va", "reth.rkey", "reth.dma_len", "ipv4.flag_rsvd",
)
(F_ETYPE, F_VERSION, F_IHL, F_MF, F_FRAG, F_PROTO, F_TOTAL, F_DPORT, F_UDPLEN, F_OPCODE, F_PAD, F_TVER, F_PKEY,
 F_DQPN, F_VA, F_RKEY, F_DMALEN, F_RSVD) = range(len(_FIELDS))
_F = np.array([CONTRIBUTION.bit_span(p) for p in _FIELDS], np.int64)
_RESULT_FIELDS = ("bth.psn", "reth.va", "immdt.imm")
R_PSN, R_VA, R_IMM = range(len(_RESULT_FIELDS))
_R = np.array([RESULT.bit_span(p) for p in _RESULT_FIELDS], np.int64)


class _K(enum.IntEnum):
    """Indices of the scalar constants in the array ``k`` the loop takes."""

    ETH_LEN = 0
    IP_LEN = 1
    ETYPE = 2
    VERSION = 3
    IHL = 4
    PROTO = 5
    DPORT = 6
    UDP_LEN = 7
    MIN_TOTAL = 8      # shortest IPv4 total length of a RoCEv2 datagram: IPv4, UDP, BTH, ICRC
    BTH_END = 9
    RETH_LEN = 10
    IMM_LEN = 11
    ICRC_LEN = 12
    TVER = 13
    PKEY = 14
    QPN_PREFIX = 15
    QPN_WORKER_BITS = 16
    MAX_JOBS = 17
    CONTRIB_OPCODE = 18
    CHUNK = 19         # chunk bytes (the payload of a contribution and of a result)
    LANES = 20
    EXC = 21           # 1 when the switch has an exception path
    EXC_TABLE = 22     # entries per cuckoo table
    FAST_SLOTS = 23    # the direct-mapped slots; overflow slot p is row FAST_SLOTS + p
    KEY_JOB_SHIFT = 24
    MASKED_END = 25    # bytes after the Ethernet header that the ICRC may cover as ones
    RESULT_LEN = 26
    RESULT_HDR = 27
    RESULT_CONST = 28  # template bytes before the result's PSN: their CRC is precomputed per worker
    WORKERS_MAX = 29   # most workers of any installed job: the results one frame may cause
    QPN_PREFIX_SHIFT = 30
    ONES_REG = 31      # the CRC register after the 8 bytes of ones that stand in for InfiniBand's LRH


_NK = len(_K)
# Slot metadata columns (int64), and the slot states of models/switch.py's SlotState.
# S_PROM: a lane of the slot is promoted; S_FIRST: the slot has not completed since it was FREE (Slot.first).
S_STATE, S_JOB, S_CHUNK, S_BITMAP, S_COUNT, S_PROM, S_FIRST = range(7)
FREE, AGG, DONE = 0, 1, 2
# Job table columns, one row per job number.
J_ON, J_BASE, J_SLOTS, J_WORKERS, J_FIRST = range(5)
# Worker table columns, one row per worker of every installed job.
W_PORT, W_VA, W_PSN, W_CRC0, W_RKEY = range(5)
# What the loop stopped for.
DONE_ALL, NEED_INSERT, OUT_FULL = range(3)
_HALF = 1 << 31
_CHUNK_MOD = 1 << 32


def _crc_tables() -> np.ndarray:
    """Slicing-by-16 tables of the reflected CRC-32 register, read off :func:`zlib.crc32` (``t[0]`` the byte table)."""
    t = np.zeros((16, 256), np.int64)
    # zlib.crc32(data, v) runs the register from ~v and returns its complement: one byte from register 0.
    t[0] = [zlib.crc32(bytes([b]), 0xFFFFFFFF) ^ 0xFFFFFFFF for b in range(256)]
    for k in range(1, 16):
        t[k] = (t[k - 1] >> 8) ^ t[0][t[k - 1] & 0xFF]
    return t


def _shift_tables(nbytes: int) -> np.ndarray:
    """Tables ``x`` with register(r, zeros(nbytes)) = x[0][r & 255] ^ x[1][r >> 8 & 255] ^ ... (linear in r)."""
    basis = np.array([zlib.crc32(bytes(nbytes), (1 << b) ^ 0xFFFFFFFF) ^ 0xFFFFFFFF for b in range(32)], np.uint64)
    x = np.zeros((4, 256), np.int64)
    v = np.arange(256)
    for j in range(4):
        acc = np.zeros(256, np.uint64)
        for b in range(8):
            acc ^= np.where(v >> b & 1, basis[8 * j + b], 0).astype(np.uint64)
        x[j] = acc
    return x


_T = _crc_tables()
_OPS = np.zeros(256, np.uint8)  # bit 0: a RETH follows the BTH, bit 1: an ImmDt follows the RETH
for _op in RETH_OPCODES:
    _OPS[_op] |= 1
for _op in IMM_OPCODES:
    _OPS[_op] |= 2
_MASKED = np.zeros(icrc.MASKED_LEN, np.uint8)  # ORed into the bytes after the Ethernet header for the ICRC
_MASKED[list(icrc.MASKED_OFFSETS)] = 0xFF


# -- the compiled loop --------------------------------------------------------------------------------------

@njit(cache=True, inline="always")
def _get(buf, base, f, i):
    """Field ``i`` of table ``f`` (bit offset, width) of the frame at ``buf[base:]``, big-endian."""
    bit, width = f[i, 0], f[i, 1]
    first, last = bit >> 3, (bit + width - 1) >> 3
    v = np.int64(0)
    for b in range(first, last + 1):
        v = (v << 8) | np.int64(buf[base + b])
    mask = (np.int64(1) << width) - 1 if width < 64 else np.int64(-1)
    return (v >> (8 * (last + 1) - bit - width)) & mask


@njit(cache=True, inline="always")
def _put(buf, f, i, value):
    """Write ``value`` into whole-byte field ``i`` of table ``f`` of the frame in ``buf``."""
    first, n = f[i, 0] >> 3, f[i, 1] >> 3
    for b in range(n):
        buf[first + b] = (value >> (8 * (n - 1 - b))) & 0xFF


@njit(cache=True)
def _crc(t, reg, buf, a, b, ones):
    """The reflected CRC-32 register ``reg`` run over ``buf[a:b]`` (slicing by 16, then 8, then bytes), each
    byte ORed with ``ones[i]`` (the ICRC's masked fields) while ``i`` is within ``ones``."""
    r = np.int64(reg)
    n8 = (b - a) // 8
    words = buf[a:a + 8 * n8].view(np.uint64)  # little-endian loads: the reflected CRC's byte order
    masks = ones[:ones.size // 8 * 8].view(np.uint64)
    j = 0
    while j < n8:
        w = words[j] | masks[j] if j < masks.size else words[j]
        lo, hi = np.int64(w & np.uint64(0xFFFFFFFF)) ^ r, np.int64(w >> np.uint64(32))
        if j + 1 < n8:
            v = words[j + 1] | masks[j + 1] if j + 1 < masks.size else words[j + 1]
            lo2, hi2 = np.int64(v & np.uint64(0xFFFFFFFF)), np.int64(v >> np.uint64(32))
            r = (t[15, lo & 0xFF] ^ t[14, (lo >> 8) & 0xFF] ^ t[13, (lo >> 16) & 0xFF] ^ t[12, lo >> 24]
                 ^ t[11, hi & 0xFF] ^ t[10, (hi >> 8) & 0xFF] ^ t[9, (hi >> 16) & 0xFF] ^ t[8, hi >> 24]
                 ^ t[7, lo2 & 0xFF] ^ t[6, (lo2 >> 8) & 0xFF] ^ t[5, (lo2 >> 16) & 0xFF] ^ t[4, lo2 >> 24]
                 ^ t[3, hi2 & 0xFF] ^ t[2, (hi2 >> 8) & 0xFF] ^ t[1, (hi2 >> 16) & 0xFF] ^ t[0, hi2 >> 24])
            j += 2
        else:
            r = (t[7, lo & 0xFF] ^ t[6, (lo >> 8) & 0xFF] ^ t[5, (lo >> 16) & 0xFF] ^ t[4, lo >> 24]
                 ^ t[3, hi & 0xFF] ^ t[2, (hi >> 8) & 0xFF] ^ t[1, (hi >> 16) & 0xFF] ^ t[0, hi >> 24])
            j += 1
    a += 8 * n8
    while a < b:
        r = t[0, (r ^ buf[a]) & 0xFF] ^ (r >> 8)
        a += 1
    return r


@njit(cache=True)
def _icrc_ok(t, masked, k, buf, base, end):
    """True when the 4 bytes before ``end`` are the ICRC of the datagram (icrc.matches)."""
    ip = base + k[_K.ETH_LEN]
    r = _crc(t, k[_K.ONES_REG], buf, ip, ip + masked.size, masked)
    r = _crc(t, r, buf, ip + masked.size, end - k[_K.ICRC_LEN], masked[:0])
    got = np.int64(0)
    for b in range(4):
        got |= np.int64(buf[end - 4 + b]) << (8 * b)
    return r ^ 0xFFFFFFFF == got


@njit(cache=True)
def _ip_checksum_ok(buf, ip, n):
    s = 0
    for b in range(0, n, 2):
        s += (np.int64(buf[ip + b]) << 8) | buf[ip + b + 1]
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    return (~s & 0xFFFF) == 0


@njit(cache=True)
def _check(buf, base, n, port, k, f, ops, t, masked, jobs, wk):
    """Checks of docs/protocol.md section 5 on one frame that came in on ``port``: (counter or -1, job, worker,
    chunk)."""
    if n < k[_K.ETH_LEN]:
        return Counter.DROP_BAD_LENGTH, 0, 0, 0
    if _get(buf, base, f, F_ETYPE) != k[_K.ETYPE]:
        return Counter.DROP_NON_ROCE, 0, 0, 0
    if n < k[_K.ETH_LEN] + k[_K.IP_LEN]:
        return Counter.DROP_BAD_LENGTH, 0, 0, 0
    if (_get(buf, base, f, F_VERSION) != k[_K.VERSION] or _get(buf, base, f, F_IHL) != k[_K.IHL]
            or _get(buf, base, f, F_RSVD) or _get(buf, base, f, F_MF) or _get(buf, base, f, F_FRAG)
            or not _ip_checksum_ok(buf, base + k[_K.ETH_LEN], k[_K.IP_LEN])):
        return Counter.DROP_BAD_HEADER, 0, 0, 0
    if _get(buf, base, f, F_PROTO) != k[_K.PROTO]:
        return Counter.DROP_NON_ROCE, 0, 0, 0
    total = _get(buf, base, f, F_TOTAL)
    if total < k[_K.IP_LEN] + k[_K.UDP_LEN] or k[_K.ETH_LEN] + total > n:
        return Counter.DROP_BAD_LENGTH, 0, 0, 0
    if _get(buf, base, f, F_DPORT) != k[_K.DPORT]:
        return Counter.DROP_NON_ROCE, 0, 0, 0
    if _get(buf, base, f, F_UDPLEN) != total - k[_K.IP_LEN] or total < k[_K.MIN_TOTAL]:
        return Counter.DROP_BAD_LENGTH, 0, 0, 0
    end = base + k[_K.ETH_LEN] + total
    if not _icrc_ok(t, masked, k, buf, base, end):
        return Counter.DROP_BAD_ICRC, 0, 0, 0
    if _get(buf, base, f, F_TVER) != k[_K.TVER] or _get(buf, base, f, F_PKEY) != k[_K.PKEY]:
        return Counter.DROP_BAD_HEADER, 0, 0, 0
    opcode = _get(buf, base, f, F_OPCODE)
    pad = _get(buf, base, f, F_PAD)
    payload_end = end - k[_K.ICRC_LEN]
    off = base + k[_K.BTH_END]
    va, rkey, dma_len = np.int64(0), np.int64(0), np.int64(-1)
    if ops[opcode] & 1:
        if off + k[_K.RETH_LEN] > payload_end:
            return Counter.DROP_BAD_LENGTH, 0, 0, 0
        va, rkey, dma_len = _get(buf, base, f, F_VA), _get(buf, base, f, F_RKEY), _get(buf, base, f, F_DMALEN)
        off += k[_K.RETH_LEN]
        if ops[opcode] & 2:
            if off + k[_K.IMM_LEN] > payload_end:
                return Counter.DROP_BAD_LENGTH, 0, 0, 0
            off += k[_K.IMM_LEN]
        if dma_len != payload_end - off - pad:
            return Counter.DROP_BAD_LENGTH, 0, 0, 0
    # The receiver's checks (wire.check_receiver) with the switch's state.
    if opcode != k[_K.CONTRIB_OPCODE]:
        return Counter.DROP_BAD_OPCODE, 0, 0, 0
    if dma_len != k[_K.CHUNK] or pad:
        return Counter.DROP_BAD_LENGTH, 0, 0, 0
    qpn = _get(buf, base, f, F_DQPN)
    job, worker = (qpn >> k[_K.QPN_WORKER_BITS]) & (k[_K.MAX_JOBS] - 1), qpn & ((1 << k[_K.QPN_WORKER_BITS]) - 1)
    if qpn >> k[_K.QPN_PREFIX_SHIFT] != k[_K.QPN_PREFIX] or not jobs[job, J_ON] or worker >= jobs[job, J_WORKERS]:
        return Counter.DROP_UNKNOWN_QPN, 0, 0, 0
    if wk[jobs[job, J_FIRST] + worker, W_PORT] != port:  # ingress-port binding: the worker's own port only
        return Counter.DROP_UNKNOWN_QPN, 0, 0, 0
    if rkey != wk[jobs[job, J_FIRST] + worker, W_RKEY]:  # the worker's contribution R_Key (the job's, or its own)
        return Counter.DROP_BAD_RKEY, 0, 0, 0
    # A VA is 64 bits: read as int64 it may be negative, so test it unsigned.
    uva = np.uint64(va)
    if uva % np.uint64(k[_K.CHUNK]) != 0 or uva // np.uint64(k[_K.CHUNK]) >= np.uint64(_CHUNK_MOD):
        return Counter.DROP_BAD_ADDRESS, 0, 0, 0
    return -1, job, worker, np.int64(uva // np.uint64(k[_K.CHUNK]))


@njit(cache=True)
def _hash_pos(t, key, size):
    """Positions of ``key`` in cuckoo tables 0 and 1 (cuckoo.hashes: zlib.crc32 of its 4 big-endian bytes)."""
    r = np.int64(0xFFFFFFFF)
    for s in (24, 16, 8, 0):
        r = t[0, (r ^ ((key >> s) & 0xFF)) & 0xFF] ^ (r >> 8)
    crc = r ^ 0xFFFFFFFF
    return crc & (size - 1), (crc >> 16) & (size - 1)


@njit(cache=True)
def _lookup(t, k, ckeys, cvals, key):
    """Overflow slot of ``key`` in the array copy of the cuckoo table, -1 when absent (CuckooTable.lookup)."""
    size = k[_K.EXC_TABLE]
    h0, h1 = _hash_pos(t, key, size)
    if ckeys[h0] == key:
        return cvals[h0]
    if ckeys[size + h1] == key:
        return cvals[size + h1]
    for i in range(2 * size, ckeys.size):
        if ckeys[i] == key:
            return cvals[i]
    return -1


@njit(cache=True, inline="always")
def _start(meta, s, job, chunk):
    """Slot ``s`` takes (job, chunk) and starts collecting (Slot.start)."""
    meta[s, S_STATE], meta[s, S_JOB], meta[s, S_CHUNK], meta[s, S_BITMAP], meta[s, S_COUNT] = AGG, job, chunk, 0, 0


@njit(cache=True)
def _copy(dst, a, src, b, n):
    """``dst[a:a + n] = src[b:b + n]`` in 8-byte words (numba's slice assignment goes byte by byte)."""
    words = n // 8
    d, s = dst[a:a + 8 * words].view(np.uint64), src[b:b + 8 * words].view(np.uint64)
    for i in range(words):
        d[i] = s[i]
    for i in range(8 * words, n):
        dst[a + i] = src[b + i]


@njit(cache=True, inline="always")
def _swap(v):
    """The 32-bit word ``v`` with its bytes reversed, as INT32: network order to the CPU's, and back."""
    v = np.int64(v)
    return np.int32(((v & 0xFF) << 24) | ((v & 0xFF00) << 8) | ((v >> 8) & 0xFF00) | ((v >> 24) & 0xFF))


@njit(cache=True)
def _accumulate(buf, p, words, prom, s, lanes, first, promoted):
    """Add the contribution at ``buf[p:]`` into slot ``s`` (arith.accumulate); True when a lane is promoted after.

    ``promoted`` says whether a lane of the slot is promoted before. While none is, one pass adds in int64
    and looks for an overflow; only a contribution that overflows, or a slot with promoted lanes, takes the
    lane-by-lane rules. Those choose between the INT32 and the FP32 word without a branch: promotion is as
    good as random in gradient data, and a mispredicted branch per lane cost a quarter of the switch's time.
    """
    x = buf[p:p + 4 * lanes].view(np.uint32)  # big-endian words: _swap reads them
    if first:
        for ln in range(lanes):
            words[s, ln] = _swap(x[ln])
            prom[s, ln] = False
        return False
    if not promoted:
        ovf = False
        for ln in range(lanes):
            sm = np.int64(words[s, ln]) + np.int64(_swap(x[ln]))
            ovf |= (sm > 2147483647) | (sm < -2147483648)
        if not ovf:
            for ln in range(lanes):
                words[s, ln] = words[s, ln] + _swap(x[ln])
            return False
    for ln in range(lanes):
        w, xv = words[s, ln], _swap(x[ln])
        sm = np.int64(w) + np.int64(xv)
        q = prom[s, ln] | (sm > 2147483647) | (sm < -2147483648)
        # A promoted lane adds in FP32; one that overflows now takes the exact sum, rounded once (RNE).
        f = np.float32(np.int32(w).view(np.float32) + np.float32(xv) if prom[s, ln] else np.float32(sm))
        words[s, ln] = f.view(np.int32) if q else np.int32(sm)
        prom[s, ln] = q
    return True


@njit(cache=True)
def _lanes_out(words, prom, s, lanes, fp32, dst, a):
    """Write slot ``s``'s result lanes big-endian at ``dst[a:]``, all FP32 when ``fp32`` (arith.emit)."""
    y = dst[a:a + 4 * lanes].view(np.int32)
    for i in range(lanes):
        w = words[s, i]
        f = np.float32(w)  # an unpromoted lane of an FP32 result: INT32 to FP32 with RNE
        y[i] = _swap(f.view(np.int32) if fp32 and not prom[s, i] else w)


@njit(cache=True)
def _emit(out, out_port, n_out, k, r, t, x, tmpl, wk, w, s, chunk, job_slots, fp32, payload_crc):
    """Result ``n_out`` for worker row ``w`` of slot ``s``, its payload already in place (ModelSwitch._result)."""
    row = out[n_out]
    hdr = k[_K.RESULT_HDR]
    _copy(row, 0, tmpl[w], 0, hdr)
    psn = wk[w, W_PSN]
    wk[w, W_PSN] = (psn + 1) & 0xFFFFFF
    _put(row, r, R_PSN, psn)
    _put(row, r, R_VA, wk[w, W_VA] + (chunk & (job_slots - 1)) * k[_K.CHUNK])
    _put(row, r, R_IMM, (np.int64(1) << 31 if fp32 else 0) | (chunk & ((1 << 30) - 1)))
    reg = _crc(t, wk[w, W_CRC0], row, k[_K.RESULT_CONST], hdr, row[:0])
    # CRC-32 is affine in its start register: run the header's register through the payload's length of zeros
    # (the shift tables) and add the payload's own CRC from register 0.
    reg = x[0, reg & 0xFF] ^ x[1, (reg >> 8) & 0xFF] ^ x[2, (reg >> 16) & 0xFF] ^ x[3, reg >> 24] ^ payload_crc
    icrc = reg ^ 0xFFFFFFFF
    e = k[_K.RESULT_LEN]
    for b in range(4):
        row[e - 4 + b] = (icrc >> (8 * b)) & 0xFF
    out_port[n_out] = wk[w, W_PORT]


@njit(cache=True)
def _run(buf, offs, lens, ports, start, k, f, r, ops, t, x, masked, jobs, wk, tmpl, meta, words, prom, ckeys,
         cvals, out, out_port, counters):
    """Frames ``start..`` of the batch (frame ``i`` in on port ``ports[i]``) in order; returns (why it stopped,
    the frame it stopped at, results out).

    It stops before a frame that needs a cuckoo insertion (Python inserts and calls again from that
    frame) and before a frame whose results might not fit ``out`` (Python drains it and calls again).
    """
    n_out = 0
    lanes, chunk_bytes = k[_K.LANES], k[_K.CHUNK]
    hdr = k[_K.RESULT_HDR]
    for i in range(start, offs.size):
        if n_out + k[_K.WORKERS_MAX] > out.shape[0]:
            return OUT_FULL, i, n_out
        base, n = offs[i], lens[i]
        bad, job, worker, chunk = _check(buf, base, n, ports[i], k, f, ops, t, masked, jobs, wk)
        if bad >= 0:
            counters[Counter.RX_FRAMES] += 1
            counters[bad] += 1
            continue
        # The slot of (job, chunk): protocol.md "Slots" and "Slot collisions" (ModelSwitch._locate).
        jslots = jobs[job, J_SLOTS]
        idx = chunk & (jslots - 1)
        s = jobs[job, J_BASE] + idx
        if not (meta[s, S_STATE] != FREE and meta[s, S_JOB] == job):
            if not k[_K.EXC]:
                if meta[s, S_STATE] != FREE:
                    counters[Counter.RX_FRAMES] += 1
                    counters[Counter.DROP_COLLISION] += 1
                    continue
            else:
                ptr = _lookup(t, k, ckeys, cvals, (job << k[_K.KEY_JOB_SHIFT]) | idx)
                if ptr >= 0:
                    s = k[_K.FAST_SLOTS] + ptr
                elif meta[s, S_STATE] != FREE:
                    return NEED_INSERT, i, n_out
        counters[Counter.RX_FRAMES] += 1
        # The slot's rules (ModelSwitch._contribute).
        if meta[s, S_STATE] == FREE:
            _start(meta, s, job, chunk)
            meta[s, S_FIRST] = 1
        elif meta[s, S_CHUNK] != chunk:
            if not meta[s, S_FIRST]:
                ahead = (chunk - meta[s, S_CHUNK]) % _CHUNK_MOD
                if ahead >= _HALF:
                    counters[Counter.DROP_STALE] += 1
                    continue
                if ahead != jslots or meta[s, S_STATE] != DONE:
                    counters[Counter.DROP_WINDOW] += 1
                    continue
            _start(meta, s, job, chunk)  # the next generation, or a first generation meets a stray (ModelSwitch)
        bit = np.int64(1) << worker
        nworkers, first = jobs[job, J_WORKERS], jobs[job, J_FIRST]
        if meta[s, S_BITMAP] & bit:
            counters[Counter.DUP_CONTRIB] += 1
            if meta[s, S_STATE] != DONE:
                continue
            counters[Counter.TX_RESENDS] += 1
            counters[Counter.TX_RESULTS] += 1
            fp32 = meta[s, S_PROM] != 0
            _lanes_out(words, prom, s, lanes, fp32, out[n_out], hdr)
            pcrc = _crc(t, 0, out[n_out], hdr, hdr + chunk_bytes, masked[:0])
            _emit(out, out_port, n_out, k, r, t, x, tmpl, wk, first + worker, s, meta[s, S_CHUNK], jslots, fp32, pcrc)
            n_out += 1
            continue
        # Lane arithmetic (arith.accumulate): INT32, a lane promoted to FP32 when its sum overflows.
        p = base + k[_K.BTH_END] + k[_K.RETH_LEN]  # the payload
        meta[s, S_PROM] = _accumulate(buf, p, words, prom, s, lanes, meta[s, S_COUNT] == 0, meta[s, S_PROM] != 0)
        meta[s, S_BITMAP] |= bit
        meta[s, S_COUNT] += 1
        counters[Counter.RX_CONTRIB] += 1
        if meta[s, S_COUNT] < nworkers:
            continue
        meta[s, S_STATE], meta[s, S_FIRST] = DONE, 0
        counters[Counter.COMPLETED] += 1
        fp32 = meta[s, S_PROM] != 0
        _lanes_out(words, prom, s, lanes, fp32, out[n_out], hdr)
        if fp32:
            counters[Counter.PROMOTED] += 1
        pcrc = _crc(t, 0, out[n_out], hdr, hdr + chunk_bytes, masked[:0])
        for w in range(nworkers):
            if w:
                _copy(out[n_out], hdr, out[n_out - w], hdr, chunk_bytes)
            counters[Counter.TX_RESULTS] += 1
            _emit(out, out_port, n_out, k, r, t, x, tmpl, wk, first + w, s, chunk, jslots, fp32, pcrc)
            n_out += 1
    return DONE_ALL, offs.size, n_out


# -- the switch ---------------------------------------------------------------------------------------------

_OUT_ROWS = 1024  # results one call of the loop may write before Python drains them
# ``ranks`` counts the tree's ranks for the hosts' scale agreement; a switch does not read it.
_IMPLEMENTED = ("job", "rkey", "slot_base", "slots", "workers", "ranks")


class FastSwitch(SwitchBackend):
    """A :class:`~inagg.models.backend.SwitchBackend` with :class:`~inagg.models.switch.ModelSwitch`'s
    output and counters for UC jobs, fast (see the module docstring).

    Besides the backend interface it has :meth:`receive_batch`, which takes
    many frames in one call: the per-frame cost of :meth:`receive` is mostly
    the call itself.
    """

    per_worker_rkeys = True  # the worker table holds each worker's contribution R_Key (W_RKEY)

    def __init__(self, spec: SwitchSpec | None = None):
        self.spec = spec or SwitchSpec()
        exc = self.spec.exception
        capacity = exc.capacity if exc is not None else 0
        rows = self.spec.slots + capacity
        self._meta = np.zeros((rows, S_FIRST + 1), np.int64)
        self._words = np.zeros((rows, self.spec.lanes), np.int32)
        self._off1, self._len1, self._port1 = (np.zeros(1, np.int64) for _ in range(3))  # receive()'s one frame
        self._prom = np.zeros((rows, self.spec.lanes), np.bool_)
        self._jobs = np.zeros((MAX_JOBS, 5), np.int64)
        self._specs: dict[int, JobSpec] = {}
        self._counters = np.zeros(len(Counter), np.int64)
        self._result_len = RESULT_HDR_LEN + self.spec.chunk_bytes + ICRC_LEN
        self._out = np.zeros((_OUT_ROWS, self._result_len), np.uint8)
        self._out_port = np.zeros(_OUT_ROWS, np.int64)
        self._x = _shift_tables(self.spec.chunk_bytes)
        if exc is not None:
            self.exception: CuckooTable | None = CuckooTable(exc.table, exc.max_kicks, exc.stash)
            self._free = list(range(capacity))
        else:
            self.exception, self._free = None, []
        self._ckeys = np.full(max(capacity, 1), -1, np.int64)
        self._cvals = np.zeros(max(capacity, 1), np.int64)
        self._workers_changed()
        # Compile (or load from numba's cache) now, not on the first frame: with a cold cache that takes
        # seconds, 40 on a loaded machine, and a service's first all-reduce would outwait its workers'
        # retransmissions (SERVICE_TIMING gives up after about 10 s) and fail with ChunkTimeoutError.
        self.receive_batch(())

    def _constants(self, workers_max: int) -> np.ndarray:
        s = self.spec
        k = np.zeros(_NK, np.int64)
        bth = CONTRIBUTION.offset("bth")
        values = {
            _K.ETH_LEN: ETH_LEN, _K.IP_LEN: IPV4.size, _K.ETYPE: ETH_TYPE_IPV4,
            _K.VERSION: IPV4["version"].value, _K.IHL: IPV4["ihl"].value, _K.PROTO: IP_PROTO_UDP,
            _K.DPORT: ROCE_UDP_PORT, _K.UDP_LEN: CONTRIBUTION.offset("bth") - CONTRIBUTION.offset("udp"),
            _K.MIN_TOTAL: bth - ETH_LEN + BTH.size + ICRC_LEN, _K.BTH_END: bth + BTH.size,
            _K.RETH_LEN: RESULT.offset("immdt") - RESULT.offset("reth"),
            _K.IMM_LEN: RESULT.size - RESULT.offset("immdt"),
            _K.ICRC_LEN: ICRC_LEN, _K.TVER: BTH["tver"].value, _K.PKEY: s.pkey, _K.QPN_PREFIX: QPN_PREFIX,
            _K.QPN_PREFIX_SHIFT: QPN_JOB_BITS + QPN_WORKER_BITS, _K.ONES_REG: zlib.crc32(b"\xff" * 8) ^ 0xFFFFFFFF,
            _K.QPN_WORKER_BITS: QPN_WORKER_BITS, _K.MAX_JOBS: MAX_JOBS, _K.CONTRIB_OPCODE: CONTRIBUTION.opcode,
            _K.CHUNK: s.chunk_bytes, _K.LANES: s.lanes, _K.EXC: int(s.exception is not None),
            _K.EXC_TABLE: s.exception.table if s.exception is not None else 1, _K.FAST_SLOTS: s.slots,
            _K.KEY_JOB_SHIFT: KEY_JOB_SHIFT, _K.MASKED_END: icrc.MASKED_LEN, _K.RESULT_LEN: self._result_len,
            _K.RESULT_HDR: RESULT_HDR_LEN, _K.RESULT_CONST: _R[R_PSN, 0] // 8, _K.WORKERS_MAX: workers_max,
        }
        for key, v in values.items():
            k[key] = v
        return k

    # -- control plane ----------------------------------------------------

    def add_job(self, job: JobSpec) -> None:
        """Install a UC job (ModelSwitch.add_job's rules); ``ValueError`` for one this switch does not implement."""
        for fld in dataclasses.fields(job):
            if fld.name not in _IMPLEMENTED and getattr(job, fld.name) != fld.default:
                raise ValueError(f"the fast switch implements UC jobs only: job {job.job} sets {fld.name}="
                                 f"{getattr(job, fld.name)!r} (use the model switch)")
        if job.job in self._specs:
            raise ValueError(f"job {job.job} is configured already")
        self.spec.check_job(job, self._specs.values())
        self._specs[job.job] = job
        self._workers_changed()

    def remove_job(self, job: int) -> None:
        """Tear a job down: free its fast slots and its exception-path slots (ModelSwitch.remove_job)."""
        if job not in self._specs:
            raise ValueError(f"job {job} is not configured")
        del self._specs[job]
        fast = self._meta[:self.spec.slots]
        fast[(fast[:, S_STATE] != FREE) & (fast[:, S_JOB] == job)] = 0
        if self.exception is not None:
            for key in sorted(k for k, _ in self.exception_entries() if k >> KEY_JOB_SHIFT == job):
                ptr = self.exception.delete(key)
                self._meta[self.spec.slots + ptr] = 0
                self._free.append(ptr)
            self._sync_exception()
        self._workers_changed()

    exception_entries = ModelSwitch.exception_entries

    def _sync_exception(self) -> None:
        """Copy the cuckoo table into the arrays the loop searches (tables 0 and 1, then the stash)."""
        self._ckeys[:] = -1
        size = self.exception.size
        for t, table in enumerate(self.exception.tables):
            for pos, e in enumerate(table):
                if e is not None:
                    self._ckeys[t * size + pos], self._cvals[t * size + pos] = e
        for i, (key, ptr) in enumerate(self.exception.stash_entries):
            self._ckeys[2 * size + i], self._cvals[2 * size + i] = key, ptr

    def _workers_changed(self) -> None:
        """Rebuild the job and worker tables and the result templates, keeping each worker's next result PSN."""
        old = {(j, w): int(self._wk[row, W_PSN]) for (j, w), row in getattr(self, "_rows", {}).items()}
        self._jobs[:] = 0
        rows = [(spec, w) for spec in self._specs.values() for w in range(len(spec.workers))]
        self._rows = {(spec.job, w): i for i, (spec, w) in enumerate(rows)}
        self._wk = np.zeros((max(len(rows), 1), 5), np.int64)
        self._tmpl = np.zeros((max(len(rows), 1), RESULT_HDR_LEN), np.uint8)
        mac, ip = wire.mac_bytes(self.spec.mac), wire.ip_bytes(self.spec.ip)
        const = _R[R_PSN, 0] // 8
        for i, (spec, w) in enumerate(rows):
            ws = spec.workers[w]
            if w == 0:
                self._jobs[spec.job] = (1, spec.slot_base, spec.slots, len(spec.workers), i)
            header = wire.build(
                eth_dst=wire.mac_bytes(ws.mac), eth_src=mac, ip_src=ip, ip_dst=wire.ip_bytes(ws.ip),
                udp_sport=qp_udp_sport(ws.qpn), opcode=Opcode.UC_RDMA_WRITE_ONLY_IMM, dest_qpn=ws.qpn, psn=0,
                va=0, rkey=ws.rkey, payload=bytes(self.spec.chunk_bytes), imm=0, pkey=self.spec.pkey,
            )[:RESULT_HDR_LEN]
            self._tmpl[i] = np.frombuffer(header, np.uint8)
            masked = icrc.masked_header(header[ETH_LEN:])
            reg0 = zlib.crc32(masked[:const - ETH_LEN], zlib.crc32(b"\xff" * 8)) ^ 0xFFFFFFFF
            va = ws.result_va - (1 << 64) if ws.result_va >> 63 else ws.result_va  # the loop's int64, wrapping
            self._wk[i] = (ws.port, va, old.get((spec.job, w), ws.result_psn), reg0, spec.contrib_rkey(w))
        self._k = self._constants(max((len(s.workers) for s in self._specs.values()), default=0))
        # What every call of the loop takes after the frames, in its order.
        self._state = (self._k, _F, _R, _OPS, _T, self._x, _MASKED, self._jobs, self._wk, self._tmpl, self._meta,
                       self._words, self._prom, self._ckeys, self._cvals, self._out, self._out_port,
                       self._counters)

    # -- data plane -------------------------------------------------------

    def receive(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        """Process one frame that arrived on ``port``; return what the switch sends."""
        if not 0 <= port < self.spec.ports:
            raise ValueError(f"port {port} does not exist: the switch has {self.spec.ports} ports")
        self._len1[0], self._port1[0] = len(frame), port
        return self._drain(np.frombuffer(frame, np.uint8), self._off1, self._len1, self._port1)

    def receive_batch(self, frames: Iterable[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
        """Process ``(port, frame)`` pairs in order; return everything the switch sends, in sending order.

        The same as calling :meth:`receive` on each and concatenating the answers, in one compiled pass;
        a port that does not exist is refused (``ValueError``) before any frame of the batch is taken.
        """
        frames = frames if isinstance(frames, Sequence) else list(frames)
        ports, data = zip(*frames) if frames else ((), ())
        bad = [p for p in ports if not 0 <= p < self.spec.ports]
        if bad:
            raise ValueError(f"port {bad[0]} does not exist: the switch has {self.spec.ports} ports")
        lens = np.fromiter(map(len, data), np.int64, len(data))
        offs = np.zeros(lens.size, np.int64)
        np.cumsum(lens[:-1], out=offs[1:])
        return self._drain(np.frombuffer(b"".join(data), np.uint8), offs, lens, np.fromiter(ports, np.int64, lens.size))

    def _drain(self, buf: np.ndarray, offs: np.ndarray, lens: np.ndarray, ports: np.ndarray) -> list[tuple[int, bytes]]:
        """Run the loop over the frames at ``offs`` in ``buf`` (in on ``ports``) to the end, inserting and
        draining on the way."""
        sent: list[tuple[int, bytes]] = []
        i = 0
        while True:
            why, i, n = _run(buf, offs, lens, ports, i, *self._state)
            if n:
                out = self._out[:n].tobytes()
                size = self._result_len
                sent += zip(self._out_port[:n].tolist(), [out[o:o + size] for o in range(0, n * size, size)])
            if why == DONE_ALL:
                return sent
            if why == NEED_INSERT and not self._insert(buf, int(offs[i])):
                i += 1

    def _insert(self, buf: np.ndarray, base: int) -> bool:
        """Give the frame at ``buf[base:]`` an overflow slot (ModelSwitch._locate's tail); False when refused."""
        job, _ = split_qpn(int(_get(buf, base, _F, F_DQPN)))
        va = int(_get(buf, base, _F, F_VA)) % (1 << 64)
        key = make_key(job, va // self.spec.chunk_bytes & (self._specs[job].slots - 1))
        # With every overflow slot in use the table is full as well.
        if not self._free or not self.exception.insert(key, self._free[0]):
            self._counters[Counter.RX_FRAMES] += 1
            self._counters[Counter.EXC_REFUSED] += 1
            return False
        self._counters[Counter.EXC_INSERTS] += 1
        self._free.pop(0)
        self._sync_exception()
        return True

    # -- the rest of the backend interface --------------------------------

    @property
    def counters(self) -> dict[Counter, int]:
        """Every :class:`~inagg.models.protocol.Counter`, by counter (a snapshot)."""
        return dict(zip(Counter, self._counters.tolist()))

    # Without a clock, as the reference: receive() returns every frame a frame causes.
    poll, fileno, drops, retired_slots, close = (ModelSwitch.poll, ModelSwitch.fileno, ModelSwitch.drops,
                                                 ModelSwitch.retired_slots, ModelSwitch.close)


BACKEND = Backend("fast", open=FastSwitch)
