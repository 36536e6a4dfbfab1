"""Jobs and contribution frames for testbenches and benchmarks, built with :func:`inagg.models.wire.build`."""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np

from inagg.models import icrc, wire
from inagg.models.job import JobSpec, SwitchSpec, WorkerSpec
from inagg.models.protocol import CHUNK_MOD, Counter, Opcode, result_udp_sport

__all__ = ["make_job", "contribution", "lanes", "bad_frames", "lossy", "windowed", "interleave"]


def make_job(spec: SwitchSpec, job: int, workers: int, slot_base: int, slots: int, *, ports=None,
             rkey: int | None = None, psn0: int = 0) -> JobSpec:
    """A job of ``workers`` workers spread over the switch's ports (or on ``ports``, cycled)."""
    ports = list(ports) if ports is not None else list(range(spec.ports))
    ws = []
    for w in range(workers):
        host = job * 64 + w + 1
        ws.append(WorkerSpec(port=ports[w % len(ports)], mac=f"02:00:00:{job:02x}:{w:02x}:01",
                             ip=f"10.{1 + job}.{w // 250}.{1 + w % 250}", qpn=0x100000 + host * 3,
                             rkey=0x5000_0000 + host, result_va=0x7F00_0000_0000 + host * 0x100000,
                             result_psn=(psn0 + host * 997) & 0xFFFFFF))
    return JobSpec(job=job, rkey=rkey if rkey is not None else 0xC0DE_0000 + job, slot_base=slot_base,
                   slots=slots, workers=tuple(ws))


def lanes(rng: np.random.Generator, spec: SwitchSpec, bound: int = 1 << 24) -> np.ndarray:
    """Random INT32 lanes of one chunk, ``|x| < bound`` so that sums of up to 64 workers stay in INT32."""
    return rng.integers(-bound, bound, spec.lanes, dtype=np.int32)


def contribution(spec: SwitchSpec, job: JobSpec, worker: int, chunk: int, values: np.ndarray, *,
                 psn: int = 0, **overrides) -> bytes:
    """Worker ``worker``'s contribution frame for ``chunk`` of ``job``; ``overrides`` go to ``wire.build``."""
    w = job.workers[worker]
    fields = dict(eth_dst=wire.mac_bytes(spec.mac), eth_src=wire.mac_bytes(w.mac), ip_src=wire.ip_bytes(w.ip),
                  ip_dst=wire.ip_bytes(spec.ip), udp_sport=result_udp_sport(w.qpn),
                  opcode=Opcode.UC_RDMA_WRITE_ONLY, dest_qpn=job.qpn(worker), psn=psn,
                  va=(chunk % CHUNK_MOD) * spec.chunk_bytes, rkey=job.rkey,
                  payload=np.asarray(values, ">i4").tobytes(), pkey=spec.pkey)
    fields.update(overrides)
    return wire.build(**fields)


def lossy(frames: list, pyrng: random.Random, *, loss: float, dup: float) -> tuple[list, list]:
    """``frames`` as a lossy link passes them: (what arrives, duplicates included; what is lost).

    Each frame is lost with probability ``loss``, else sent twice with
    probability ``dup``; one draw of ``pyrng`` per frame, in order.
    """
    sent, lost = [], []
    for f in frames:
        roll = pyrng.random()
        if roll < loss:
            lost.append(f)
            continue
        sent.append(f)
        if roll > 1 - dup:
            sent.append(f)
    return sent, lost


def windowed(spec: SwitchSpec, job: JobSpec, chunks: range, values: Callable[[int], np.ndarray],
             pyrng: random.Random, *, loss: float, dup: float, resend_done: bool = False) -> list[tuple[int, bytes]]:
    """A job's (port, frame) contributions window by window, as its workers would send them over a lossy link.

    A window is half the job's slots (the protocol's ``R = 2W``), so no chunk
    of a window waits for a slot. Each window's frames are shuffled and pass
    :func:`lossy`; its lost frames are resent after it. ``resend_done``
    resends one lost frame once more, after its chunk has completed, so the
    switch answers with the stored result. ``values(c)`` gives chunk ``c``'s
    lanes, one row a worker.
    """
    window = job.slots // 2
    out = []
    for base in range(chunks.start, chunks.stop, window):
        batch = []
        for c in range(base, min(base + window, chunks.stop)):
            rows = values(c)
            batch += [(w.port, contribution(spec, job, i, c, rows[i])) for i, w in enumerate(job.workers)]
        pyrng.shuffle(batch)
        sent, late = lossy(batch, pyrng, loss=loss, dup=dup)
        out += sent + late + (late[:1] if resend_done else [])
    return out


def interleave(streams: list[list], pyrng: random.Random) -> list:
    """The streams' items merged at random, each stream's own order kept (jobs sharing a switch)."""
    streams = [list(s) for s in streams]
    out = []
    while any(streams):
        out.append(pyrng.choice([s for s in streams if s]).pop(0))
    return out


def _refresh(frame: bytearray) -> bytes:
    """Recompute the IPv4 checksum and the ICRC of an edited contribution (datagram extent as its IP length)."""
    ip = frame[14:34]
    ip[10:12] = b"\0\0"
    frame[24:26] = wire.ipv4_checksum(bytes(ip)).to_bytes(2, "big")
    end = 14 + int.from_bytes(frame[16:18], "big")
    frame[end - 4:end] = icrc.icrc(bytes(frame[:end - 4]))
    return bytes(frame)


def bad_frames(spec: SwitchSpec, job: JobSpec, rng: np.random.Generator) -> list[tuple[str, bytes, Counter]]:
    """Malformed and foreign frames, each with the counter ``docs/protocol.md`` section 5 books it under.

    Each is one check failing on an otherwise good contribution of worker 0
    of ``job`` (a job the switch has), so together they walk the check order.
    """
    from scapy.layers.inet import IP, TCP, UDP
    from scapy.layers.inet6 import IPv6
    from scapy.layers.l2 import ARP, Ether

    good = contribution(spec, job, 0, 0, lanes(rng, spec))
    sw = spec.mac
    w0 = job.workers[0]

    def edit(offset: int, value: bytes, refresh: bool = True) -> bytes:
        f = bytearray(good)
        f[offset:offset + len(value)] = value
        return _refresh(f) if refresh else bytes(f)

    def contrib(**overrides) -> bytes:
        return contribution(spec, job, 0, 0, lanes(rng, spec), **overrides)

    payload = bytes(rng.integers(0, 256, 64, dtype=np.uint8))
    out = [
        ("runt", good[:10], Counter.DROP_BAD_LENGTH),
        ("arp", bytes(Ether(dst="ff:ff:ff:ff:ff:ff", src=w0.mac) / ARP(psrc=w0.ip, pdst=spec.ip)), Counter.DROP_NON_ROCE),
        ("ipv6", bytes(Ether(dst=sw, src=w0.mac) / IPv6(src="fe80::1", dst="fe80::2") / UDP(dport=4791) / payload),
         Counter.DROP_NON_ROCE),
        ("short ipv4", good[:30], Counter.DROP_BAD_LENGTH),
        ("ip options", edit(14, b"\x46", refresh=False), Counter.DROP_BAD_HEADER),
        ("ip checksum", edit(24, bytes([good[24] ^ 0x01]), refresh=False), Counter.DROP_BAD_HEADER),
        ("ip fragment", _fix_ip(edit(20, b"\x20\x00", refresh=False)), Counter.DROP_BAD_HEADER),
        ("tcp", bytes(Ether(dst=sw, src=w0.mac) / IP(src=w0.ip, dst=spec.ip) / TCP(dport=4791) / payload),
         Counter.DROP_NON_ROCE),
        ("truncated", good[:-20], Counter.DROP_BAD_LENGTH),
        ("ip length short", good[:14] + _ip_len_fixed(good, 27), Counter.DROP_BAD_LENGTH),
        ("ip length long", good[:14] + _ip_len_fixed(good, len(good) - 13), Counter.DROP_BAD_LENGTH),
        ("other udp", bytes(Ether(dst=sw, src=w0.mac) / IP(src=w0.ip, dst=spec.ip) / UDP(sport=1234, dport=53) / payload),
         Counter.DROP_NON_ROCE),
        ("udp length", edit(38, (int.from_bytes(good[38:40], "big") + 4).to_bytes(2, "big")), Counter.DROP_BAD_LENGTH),
        ("icrc last byte", good[:-1] + bytes([good[-1] ^ 0x80]), Counter.DROP_BAD_ICRC),
        ("payload bit", edit(100, bytes([good[100] ^ 0x04]), refresh=False), Counter.DROP_BAD_ICRC),
        ("bth version", edit(43, b"\x41"), Counter.DROP_BAD_HEADER),
        ("pkey", contrib(pkey=spec.pkey ^ 0x8000), Counter.DROP_BAD_HEADER),
        ("dma length", edit(66, (spec.chunk_bytes - 4).to_bytes(4, "big")), Counter.DROP_BAD_LENGTH),
        ("rc opcode", contrib(opcode=Opcode.RC_RDMA_WRITE_ONLY), Counter.DROP_BAD_OPCODE),
        ("write with imm", contrib(opcode=Opcode.UC_RDMA_WRITE_ONLY_IMM, imm=7), Counter.DROP_BAD_OPCODE),
        ("chunk size", contrib(payload=good[70:70 + spec.chunk_bytes // 2]), Counter.DROP_BAD_LENGTH),
        ("qpn prefix", contrib(dest_qpn=job.qpn(0) ^ 0x010000), Counter.DROP_UNKNOWN_QPN),
        ("job absent", contrib(dest_qpn=job.qpn(0) ^ (1 << 8)), Counter.DROP_UNKNOWN_QPN),
        ("worker absent", contrib(dest_qpn=job.qpn(len(job.workers))), Counter.DROP_UNKNOWN_QPN),
        ("rkey", contrib(rkey=job.rkey ^ 1), Counter.DROP_BAD_RKEY),
        ("va unaligned", contrib(va=spec.chunk_bytes + 4), Counter.DROP_BAD_ADDRESS),
        ("va too high", contrib(va=CHUNK_MOD * spec.chunk_bytes), Counter.DROP_BAD_ADDRESS),
    ]
    return out


def _fix_ip(frame: bytes) -> bytes:
    f = bytearray(frame)
    ip = f[14:34]
    ip[10:12] = b"\0\0"
    f[24:26] = wire.ipv4_checksum(bytes(ip)).to_bytes(2, "big")
    return bytes(f)


def _ip_len_fixed(good: bytes, total: int) -> bytes:
    """``good`` after its Ethernet header with IPv4 total length ``total`` and a valid checksum."""
    f = bytearray(good)
    f[16:18] = total.to_bytes(2, "big")
    ip = f[14:34]
    ip[10:12] = b"\0\0"
    f[24:26] = wire.ipv4_checksum(bytes(ip)).to_bytes(2, "big")
    return bytes(f[14:])
