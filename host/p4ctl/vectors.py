"""PTF-style reference vectors for the P4 programs, produced by the P4 profile model.

:func:`scenario` is one fixed set of input frames -- a complete all-reduce
of two jobs, duplicates and resends, the next generation of a slot, stale
and too-early chunks, saturating sums, a stray chunk that a slot's first
generation does not keep, and one frame per drop counter the target can see
(a worker's QPN on another port among them) -- for :class:`~inagg.models.p4profile.P4ProfileSwitch`.
:func:`write` stores them as ``<target>_in.pcap`` (what a test sends),
``<target>_out.pcap`` (what the switch must send) and ``<target>.json``
(which input goes to which port, which outputs it must cause on which ports,
and the counters at the end). A PTF or tofino-model run sends each case's
input and compares what comes out with the listed frames, byte for byte.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from inagg.models import wire
from inagg.models.job import JobSpec, SwitchSpec, WorkerSpec
from inagg.models.p4profile import P4ProfileSwitch, P4Target
from inagg.models.protocol import Opcode

__all__ = ["Case", "Vectors", "scenario", "write", "switch_for"]


@dataclass
class Case:
    """One input frame and what the switch answers."""

    name: str
    port: int
    frame: bytes
    out: list[tuple[int, bytes]] = field(default_factory=list)


@dataclass
class Vectors:
    target: P4Target
    spec: SwitchSpec
    jobs: tuple[JobSpec, ...]
    cases: list[Case]
    counters: dict[str, int]


def _jobs() -> tuple[JobSpec, ...]:
    # Job 2's workers have contribution R_Keys of their own (check 15), job 1's take the job's.
    def workers(job: int, n: int, ring: int, own_keys: bool) -> tuple[WorkerSpec, ...]:
        return tuple(WorkerSpec(port=i % 4, mac=f"02:00:00:{job:02x}:00:{i + 1:02x}", ip=f"10.{job}.0.{i + 1}",
                                qpn=0x100 + 0x10 * job + i, rkey=0x7000 + i, result_va=(i + 1) * ring * 16,
                                result_psn=0x10 * i, contrib_rkey=0xC1D00000 | job << 8 | i if own_keys else None)
                     for i in range(n))
    return (JobSpec(job=1, rkey=0xC0DE0001, slot_base=0, slots=4, workers=workers(1, 3, 1 << 16, False)),
            JobSpec(job=2, rkey=0xC0DE0002, slot_base=4, slots=2, workers=workers(2, 2, 1 << 16, True)))


def switch_for(target: P4Target, chunk_bytes: int | None = None) -> tuple[SwitchSpec, tuple[JobSpec, ...]]:
    """The switch and jobs of the vectors for ``target``: 16 slots, 4 ports, chunks of ``chunk_bytes``.

    ``chunk_bytes`` defaults to the target's largest (the stored vectors' size).
    """
    spec = SwitchSpec(slots=16, ports=4, chunk_bytes=max(target.chunk_bytes) if chunk_bytes is None else chunk_bytes)
    target.validate(spec)
    return spec, _jobs()


def scenario(target: P4Target, chunk_bytes: int | None = None) -> Vectors:
    """Run the fixed input frames through the P4 profile model of ``target`` (chunk size as :func:`switch_for`)."""
    spec, jobs = switch_for(target, chunk_bytes)
    sw = P4ProfileSwitch(target, spec)
    for j in jobs:
        sw.add_job(j)
    lanes = spec.lanes
    rng = np.random.default_rng(9)
    cases: list[Case] = []

    def frame(job: JobSpec, w: int, chunk: int, x: np.ndarray, **kw) -> bytes:
        ws = job.workers[w]
        args = dict(eth_dst=wire.mac_bytes(spec.mac), eth_src=wire.mac_bytes(ws.mac), ip_src=wire.ip_bytes(ws.ip),
                    ip_dst=wire.ip_bytes(spec.ip), udp_sport=0xD000 | w, opcode=Opcode.UC_RDMA_WRITE_ONLY,
                    dest_qpn=job.qpn(w), psn=chunk & 0xFFFFFF, va=chunk * spec.chunk_bytes, rkey=job.contrib_rkey(w),
                    payload=np.asarray(x, np.int32).astype(">i4").tobytes())
        args.update(kw)
        return wire.build(**args)

    def send(name: str, job: JobSpec, w: int, f: bytes) -> None:
        port = job.workers[w].port
        cases.append(Case(name, port, f, sw.receive(port, f)))

    def data() -> np.ndarray:
        return rng.integers(-(1 << 20), 1 << 20, lanes, dtype=np.int32)

    a, b = jobs
    # A complete chunk of each job, interleaved; then resends and duplicates.
    for w in range(3):
        send(f"job1 chunk0 worker{w}", a, w, frame(a, w, 0, data()))
        if w < 2:
            send(f"job2 chunk0 worker{w}", b, w, frame(b, w, 0, data()))
    x = data()
    send("job1 chunk1 worker0", a, 0, frame(a, 0, 1, x))
    send("job1 chunk1 worker0 duplicate while aggregating", a, 0, frame(a, 0, 1, x))
    send("job1 chunk0 worker1 duplicate of a completed chunk: resend", a, 1, frame(a, 1, 0, data()))
    for w in (1, 2):
        send(f"job1 chunk1 worker{w}", a, w, frame(a, w, 1, data()))
    # Slot 0 of job 1 (R = 4): chunk 4 is its next generation, chunk 8 too early, chunk 0 now stale.
    send("job1 chunk4 worker0: next generation of slot 0", a, 0, frame(a, 0, 4, data()))
    send("job1 chunk8 worker1: window", a, 1, frame(a, 1, 8, data()))
    send("job1 chunk0 worker2: stale", a, 2, frame(a, 2, 0, data()))
    # Saturation: a lane overflows upwards, another downwards, a third overflows and comes back.
    big = np.zeros(lanes, np.int32)
    big[0], big[1], big[2] = 0x7FFFFFF0, -0x7FFFFFF0, 0x7FFFFFF0
    send("job2 chunk1 worker0 saturating", b, 0, frame(b, 0, 1, big))
    big2 = np.zeros(lanes, np.int32)
    big2[0], big2[1], big2[2] = 0x100, -0x100, 0x100
    send("job2 chunk1 worker1 saturating: result SATURATED", b, 1, frame(b, 1, 1, big2))
    send("job2 chunk1 worker1 duplicate: SATURATED resend", b, 1, frame(b, 1, 1, big2))
    # Liveness: a stray far ahead of the job takes FREE slot 3; the job's chunk 3 takes it back (the slot never
    # completed) and completes; after that the stray is too far ahead.
    stray = (1 << 30) + 3
    send("job1 stray chunk 2**30+3 worker2: takes FREE slot 3", a, 2, frame(a, 2, stray, data()))
    send("job1 chunk3 worker0: restarts the stray's slot", a, 0, frame(a, 0, 3, data()))
    for w in (1, 2):
        send(f"job1 chunk3 worker{w}", a, w, frame(a, w, 3, data()))
    send("job1 stray chunk 2**30+3 worker2 again: window", a, 2, frame(a, 2, stray, data()))
    # One frame per drop the target can see.
    ok = frame(a, 0, 2, data())
    arp = ok[:12] + b"\x08\x06" + ok[14:60]
    cases_bad = [
        ("non-IPv4 (ARP)", arp),
        ("IPv4 not UDP", _ip_patch(ok, 9, 6)),
        ("bad IPv4 checksum", ok[:24] + bytes([ok[24] ^ 1]) + ok[25:]),
        ("IPv4 options (IHL 6)", _ip_patch(ok, 0, 0x46)),
        ("IPv4 reserved flag", _ip_patch(ok, 6, ok[20] | 0x80)),
        ("UDP port not 4791", ok[:36] + struct.pack("!H", 4792) + ok[38:]),
        ("truncated frame", ok[:200]),
        ("other chunk size", frame(a, 0, 2, np.zeros(lanes // 2, np.int32))),
        ("bad P_Key", frame(a, 0, 2, data(), pkey=0x7FFF)),
        ("RC opcode", frame(a, 0, 2, data(), opcode=Opcode.RC_RDMA_WRITE_ONLY)),
        ("unknown job", frame(a, 0, 2, data(), dest_qpn=a.qpn(0) + (5 << 6))),
        ("worker index beyond the job", frame(a, 0, 2, data(), dest_qpn=a.qpn(3))),
        ("worker 1's QPN on worker 0's port", frame(a, 1, 2, data())),
        ("wrong R_Key", frame(a, 0, 2, data(), rkey=0xBAD)),
        ("job 2 worker 0 with the job's R_Key, not its own", frame(b, 0, 2, data(), rkey=b.rkey)),
        ("unaligned address", frame(a, 0, 2, data(), va=2 * spec.chunk_bytes + 4)),
        ("address beyond 2**32 chunks", frame(a, 0, 2, data(), va=(1 << 32) * spec.chunk_bytes)),
        ("bad ICRC", ok[:-1] + bytes([ok[-1] ^ 0xFF])),
    ]
    for name, f in cases_bad:
        cases.append(Case(name, 0, f, sw.receive(0, f)))
    counters = {c.name: n for c, n in sw.counters.items()}
    return Vectors(target, spec, jobs, cases, counters)


def _ip_patch(frame: bytes, offset: int, value: int) -> bytes:
    """``frame`` with IPv4 header byte ``offset`` set to ``value`` and the header checksum fixed."""
    f = bytearray(frame)
    f[14 + offset] = value
    f[24:26] = b"\0\0"
    f[24:26] = struct.pack("!H", wire.ipv4_checksum(bytes(f[14:34])))
    return bytes(f)


def _write_pcap(path: Path, frames: list[bytes]) -> None:
    from scapy.utils import RawPcapWriter

    # Raw bytes with fixed timestamps: a dissected copy could re-encode a
    # malformed frame, and the files must regenerate byte for byte.
    with RawPcapWriter(str(path), linktype=1) as out:
        out.write_header(None)
        for i, f in enumerate(frames):
            out.write_packet(f, sec=i, usec=0)


def write(v: Vectors, folder: str | Path) -> list[Path]:
    """Store ``v`` in ``folder``; return the paths written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    ins = [c.frame for c in v.cases]
    outs = [f for c in v.cases for _, f in c.out]
    doc, k = [], 0
    for i, c in enumerate(v.cases):
        doc.append({"name": c.name, "port": c.port, "in": i,
                    "out": [{"port": p, "frame": k + j} for j, (p, _) in enumerate(c.out)]})
        k += len(c.out)
    meta = {
        "target": v.target.name,
        "generator": "python p4/tests/gen_vectors.py",
        "switch": {"mac": v.spec.mac, "ip": v.spec.ip, "ports": v.spec.ports, "slots": v.spec.slots,
                   "chunk_bytes": v.spec.chunk_bytes, "pkey": v.spec.pkey},
        "jobs": [{"job": j.job, "rkey": j.rkey, "slot_base": j.slot_base, "slots": j.slots,
                  "workers": [vars(w) for w in j.workers]} for j in v.jobs],
        "cases": doc,
        "counters": v.counters,
    }
    base = folder / v.target.name
    paths = [base.with_suffix(".json"), folder / f"{v.target.name}_in.pcap", folder / f"{v.target.name}_out.pcap"]
    paths[0].write_text(json.dumps(meta, indent=1) + "\n")
    _write_pcap(paths[1], ins)
    _write_pcap(paths[2], outs)
    return paths
