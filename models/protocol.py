"""Wire constants of the inagg protocol (``docs/protocol.md`` is the spec).

Every other part -- the gateware, the host library, the P4 program's control
plane and the testbenches -- takes these numbers from here. The header
layouts and the fixed field values are declared in :mod:`inagg.models.frame`;
the constants below that name them are read from there.
"""

from __future__ import annotations

import enum

from inagg.models import frame as _frame
from inagg.models.frame import Opcode

__all__ = [
    "ROCE_UDP_PORT", "ETH_TYPE_IPV4", "IP_PROTO_UDP",
    "ETH_LEN", "IPV4_LEN", "UDP_LEN", "BTH_LEN", "RETH_LEN", "IMMDT_LEN", "ICRC_LEN",
    "CONTRIB_HDR_LEN", "RESULT_HDR_LEN", "IPV4_VERSION_IHL", "DEFAULT_PKEY", "DEFAULT_TTL",
    "Opcode", "CONTRIB_OPCODES", "RESULT_OPCODES", "RETH_OPCODES", "IMM_OPCODES",
    "QPN_PREFIX", "QPN_JOB_BITS", "QPN_WORKER_BITS", "MAX_JOBS", "MAX_WORKERS",
    "switch_qpn", "split_qpn",
    "IMM_FP32", "IMM_SATURATED", "IMM_CHUNK_MASK", "encode_imm", "decode_imm",
    "CHUNK_BYTES_DEFAULT", "CHUNK_BYTES_ALLOWED", "LANE_BYTES", "CHUNK_MOD",
    "QP_SPORT_BASE", "QP_SPORT_QPN_BITS", "qp_udp_sport", "Counter", "RC_MODE_COUNTERS",
]

ROCE_UDP_PORT = _frame.UDP["dport"].value
ETH_TYPE_IPV4 = _frame.ETHERNET["ether_type"].value
IP_PROTO_UDP = _frame.IPV4["protocol"].value

ETH_LEN = _frame.ETHERNET.size
IPV4_LEN = _frame.IPV4.size  # options are not allowed (IHL must be 5)
UDP_LEN = _frame.UDP.size
BTH_LEN = _frame.BTH.size
RETH_LEN = _frame.RETH.size
IMMDT_LEN = _frame.IMMDT.size
ICRC_LEN = _frame.ICRC_LEN

CONTRIB_HDR_LEN = _frame.CONTRIBUTION.size  # 70
RESULT_HDR_LEN = _frame.RESULT.size  # 74

# IPv4 byte 0: version 4, IHL 5 (no options).
IPV4_VERSION_IHL = _frame.IPV4["version"].value << 4 | _frame.IPV4["ihl"].value
DEFAULT_PKEY = 0xFFFF
DEFAULT_TTL = _frame.IPV4["ttl"].value
LANE_BYTES = 4
# Chunk sequences are 32-bit serial numbers (docs/protocol.md 1.5).
CHUNK_MOD = 1 << 32
CHUNK_BYTES_DEFAULT = 1024
CHUNK_BYTES_ALLOWED = (256, 512, 1024, 2048, 4096)


CONTRIB_OPCODES = frozenset({Opcode.RC_RDMA_WRITE_ONLY, Opcode.UC_RDMA_WRITE_ONLY})
RESULT_OPCODES = frozenset({Opcode.RC_RDMA_WRITE_ONLY_IMM, Opcode.UC_RDMA_WRITE_ONLY_IMM})
RETH_OPCODES = frozenset(op for op, hs in _frame.OPCODE_HEADERS.items() if _frame.RETH in hs)
"""The opcodes whose BTH is followed by a RETH."""
IMM_OPCODES = frozenset(op for op, hs in _frame.OPCODE_HEADERS.items() if _frame.IMMDT in hs)
"""The opcodes that carry an ImmDt (after their RETH)."""

# A switch-side destination QPN names one (job, worker) pair:
#   qpn[23:16] = QPN_PREFIX, qpn[15:6] = job, qpn[5:0] = worker index.
QPN_PREFIX = 0xA5
QPN_JOB_BITS = 10
QPN_WORKER_BITS = 6
MAX_JOBS = 1 << QPN_JOB_BITS
MAX_WORKERS = 1 << QPN_WORKER_BITS


def switch_qpn(job: int, worker: int) -> int:
    """The QPN a worker of a job sends its contributions to."""
    if not 0 <= job < MAX_JOBS:
        raise ValueError(f"job must be in 0..{MAX_JOBS - 1}, not {job!r}")
    if not 0 <= worker < MAX_WORKERS:
        raise ValueError(f"worker must be in 0..{MAX_WORKERS - 1}, not {worker!r}")
    return (QPN_PREFIX << 16) | (job << QPN_WORKER_BITS) | worker


def split_qpn(qpn: int) -> tuple[int, int] | None:
    """(job, worker) named by a switch QPN, or None when the prefix is not ours."""
    if (qpn >> 16) != QPN_PREFIX:
        return None
    return (qpn >> QPN_WORKER_BITS) & (MAX_JOBS - 1), qpn & (MAX_WORKERS - 1)


# ImmDt of a result: bit 31 says the lanes are FP32, bit 30 that a lane
# saturated on a target that cannot promote (P4 profile), bits 29..0 are the
# low bits of the chunk sequence number.
IMM_FP32 = 1 << 31
IMM_SATURATED = 1 << 30
IMM_CHUNK_MASK = (1 << 30) - 1


def encode_imm(chunk: int, fp32: bool, saturated: bool = False) -> int:
    """The 32-bit immediate of the result for ``chunk``."""
    return (IMM_FP32 if fp32 else 0) | (IMM_SATURATED if saturated else 0) | (chunk & IMM_CHUNK_MASK)


def decode_imm(imm: int) -> tuple[int, bool, bool]:
    """(chunk low bits, fp32, saturated) of a result immediate."""
    return imm & IMM_CHUNK_MASK, bool(imm & IMM_FP32), bool(imm & IMM_SATURATED)


# UDP source port of a QP's frames: QP_SPORT_BASE with the QPN's low bits in place.
QP_SPORT_BASE = 0xC000
QP_SPORT_QPN_BITS = 14


def qp_udp_sport(worker_qpn: int) -> int:
    """UDP source port of the frames of worker QP ``worker_qpn``, both ways: fixed per QP, in the dynamic range.

    Real NICs derive the RoCEv2 source port from the QP so that ECMP keeps a
    QP on one path; a worker sends its contributions from it and the switch
    sends that worker's results from it.
    """
    return QP_SPORT_BASE | (worker_qpn & ((1 << QP_SPORT_QPN_BITS) - 1))


class Counter(enum.IntEnum):
    """Every counter of the switch, in register-map order (one 32-bit register each)."""

    RX_FRAMES = 0
    RX_CONTRIB = 1          # contributions accepted into a slot (first copy per worker)
    TX_RESULTS = 2          # result frames sent, resends included
    TX_RESENDS = 3          # results resent to one worker after a duplicate contribution
    COMPLETED = 4           # chunks whose aggregate completed
    PROMOTED = 5            # completed chunks emitted as FP32
    DUP_CONTRIB = 6         # duplicate contributions (ignored; may trigger a resend)
    DROP_NON_ROCE = 7       # not IPv4/UDP/4791 (ARP, IPv6, other UDP, ...)
    DROP_BAD_HEADER = 8     # IPv4 options/fragment/bad checksum, BTH version, P_Key
    DROP_BAD_LENGTH = 9     # truncated, or IP/UDP/RETH lengths inconsistent
    DROP_BAD_ICRC = 10
    DROP_BAD_OPCODE = 11
    DROP_UNKNOWN_QPN = 12
    DROP_BAD_RKEY = 13
    DROP_BAD_ADDRESS = 14   # VA not on a chunk boundary
    DROP_STALE = 15         # a chunk older than the one its slot holds
    DROP_WINDOW = 16        # a chunk too far ahead of its slot (worker broke the window rule)
    DROP_COLLISION = 17     # slot held by another job and no exception path took it
    EXC_INSERTS = 18        # keys the exception path took
    EXC_REFUSED = 19        # exception path full (table and stash): contribution refused
    # EPIC's RC modes (docs/protocol.md sections 6 and 7); always 0 on a UC-only switch.
    ACK_REFLECTED = 20      # Mode II: a host's ACK/NAK of a result, sent back as the ACK/NAK of its contribution
    DROP_PSN_AHEAD = 21     # Modes I-III: a contribution whose PSN is ahead of the one expected
    ACK_SENT = 22           # Modes I, III: ACKs of contributions the switch sent (re-ACKs of duplicates included)
    NAK_SENT = 23           # Modes I, III: NAK sequence errors sent, one per gap
    HOP_RESENDS = 24        # Modes I, III: results sent again on the hop, after a child's NAK or the switch's timer
    DROP_BUFFER_BUSY = 25   # Modes I, III: contribution refused while its slot holds a result some child has not ACKed
    # EPIC's Mode I (docs/protocol.md section 6.4): the switch's own RC requester of results.
    QP_ERRORS = 26          # Mode I: a result QP ran out of retries or got a NAK other than a sequence error
    DROP_QP_ERROR = 27      # Mode I: a frame to a QP in the error state (dropped)
    RNR_NAK_SENT = 28       # Mode I: RNR NAKs sent for an in-order packet whose slot is busy, one per copy
    RNR_NAK_RECEIVED = 29   # Mode I: RNR NAKs the switch's requesters (results, partials) received


RC_MODE_COUNTERS = frozenset({Counter.ACK_REFLECTED, Counter.DROP_PSN_AHEAD, Counter.ACK_SENT, Counter.NAK_SENT,
                              Counter.HOP_RESENDS, Counter.DROP_BUFFER_BUSY, Counter.QP_ERRORS,
                              Counter.DROP_QP_ERROR, Counter.RNR_NAK_SENT, Counter.RNR_NAK_RECEIVED})
"""The counters only jobs in EPIC's RC modes (``models/modes.py``, ``models/terminated.py``) count; a UC job
leaves them at zero."""
