"""Wire constants of the inagg protocol (``docs/protocol.md`` is the spec).

Every other part -- the gateware, the host library, the P4 program's control
plane and the testbenches -- takes these numbers from here.
"""

from __future__ import annotations

import enum

__all__ = [
    "ROCE_UDP_PORT", "ETH_TYPE_IPV4", "IP_PROTO_UDP",
    "ETH_LEN", "IPV4_LEN", "UDP_LEN", "BTH_LEN", "RETH_LEN", "IMMDT_LEN", "ICRC_LEN",
    "CONTRIB_HDR_LEN", "RESULT_HDR_LEN", "DEFAULT_PKEY", "DEFAULT_TTL",
    "Opcode", "CONTRIB_OPCODES", "RESULT_OPCODES",
    "QPN_PREFIX", "QPN_JOB_BITS", "QPN_WORKER_BITS", "MAX_JOBS", "MAX_WORKERS",
    "switch_qpn", "split_qpn",
    "IMM_FP32", "IMM_SATURATED", "IMM_CHUNK_MASK", "encode_imm", "decode_imm",
    "CHUNK_BYTES_DEFAULT", "CHUNK_BYTES_ALLOWED", "LANE_BYTES",
    "result_udp_sport", "Counter",
]

ROCE_UDP_PORT = 4791
ETH_TYPE_IPV4 = 0x0800
IP_PROTO_UDP = 17

ETH_LEN = 14
IPV4_LEN = 20  # options are not allowed (IHL must be 5)
UDP_LEN = 8
BTH_LEN = 12
RETH_LEN = 16
IMMDT_LEN = 4
ICRC_LEN = 4

CONTRIB_HDR_LEN = ETH_LEN + IPV4_LEN + UDP_LEN + BTH_LEN + RETH_LEN  # 70
RESULT_HDR_LEN = CONTRIB_HDR_LEN + IMMDT_LEN  # 74

DEFAULT_PKEY = 0xFFFF
DEFAULT_TTL = 64
LANE_BYTES = 4
CHUNK_BYTES_DEFAULT = 1024
CHUNK_BYTES_ALLOWED = (256, 512, 1024, 2048, 4096)


class Opcode(enum.IntEnum):
    """The BTH opcodes the protocol uses (IBTA vol. 1, table 38)."""

    RC_RDMA_WRITE_ONLY = 0x0A
    RC_RDMA_WRITE_ONLY_IMM = 0x0B
    RC_ACK = 0x11
    UC_RDMA_WRITE_ONLY = 0x2A
    UC_RDMA_WRITE_ONLY_IMM = 0x2B


CONTRIB_OPCODES = frozenset({Opcode.RC_RDMA_WRITE_ONLY, Opcode.UC_RDMA_WRITE_ONLY})
RESULT_OPCODES = frozenset({Opcode.RC_RDMA_WRITE_ONLY_IMM, Opcode.UC_RDMA_WRITE_ONLY_IMM})

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


def result_udp_sport(worker_qpn: int) -> int:
    """UDP source port of results to a worker QP: fixed per QP, in the dynamic range.

    Real NICs derive the RoCEv2 source port from the QP so that ECMP keeps a
    QP on one path; the switch does the same for the results it sends.
    """
    return 0xC000 | (worker_qpn & 0x3FFF)


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
