"""Jobs and contribution frames for testbenches and benchmarks, built with :func:`inagg.models.wire.build`."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

import numpy as np

from inagg.models import icrc, rc, wire
from inagg.models.job import JobSpec, Mode, SwitchSpec, WorkerSpec
from inagg.models.frame import CONTRIBUTION, HEADERS, IPV4
from inagg.models.switch import ModelSwitch
from inagg.models.protocol import CHUNK_MOD, CONTRIB_HDR_LEN, ICRC_LEN, IPV4_LEN, Counter, Opcode, qp_udp_sport

__all__ = ["make_job", "contribution", "rc_contribution", "rc_ack", "mode_ii_allreduce", "mode_iii_hosts", "lanes", "bad_frames", "strays", "lossy", "windowed", "interleave"]


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
                  ip_dst=wire.ip_bytes(spec.ip), udp_sport=qp_udp_sport(w.qpn),
                  opcode=Opcode.UC_RDMA_WRITE_ONLY, dest_qpn=job.qpn(worker), psn=psn,
                  va=(chunk % CHUNK_MOD) * spec.chunk_bytes, rkey=job.contrib_rkey(worker),
                  payload=np.asarray(values, ">i4").tobytes(), pkey=spec.pkey)
    fields.update(overrides)
    return wire.build(**fields)


def _to_switch(spec: SwitchSpec, job: JobSpec, worker: int) -> rc.Address:
    """Worker ``worker``'s RC queue pair to its switch QPN."""
    w = job.workers[worker]
    return rc.Address(eth_dst=wire.mac_bytes(spec.mac), eth_src=wire.mac_bytes(w.mac), ip_src=wire.ip_bytes(w.ip),
                      ip_dst=wire.ip_bytes(spec.ip), udp_sport=qp_udp_sport(w.qpn), dest_qpn=job.qpn(worker),
                      rkey=job.rkey, pkey=spec.pkey)


def rc_contribution(spec: SwitchSpec, job: JobSpec, worker: int, psn: int, chunk: int, values: np.ndarray, *,
                    va: int | None = None) -> bytes:
    """Worker ``worker``'s Mode II contribution (RC WRITE ONLY) of ``chunk`` at ``psn`` (``va``: another VA)."""
    va = (chunk % CHUNK_MOD) * spec.chunk_bytes if va is None else va
    return rc.encode(rc.Packet(Opcode.RC_RDMA_WRITE_ONLY, psn % rc.PSN_MOD, np.asarray(values, ">i4").tobytes(), True,
                               va, spec.chunk_bytes), _to_switch(spec, job, worker))


def rc_ack(spec: SwitchSpec, job: JobSpec, worker: int, ack: rc.Ack) -> bytes:
    """Worker ``worker``'s ACK or NAK of a Mode II result."""
    return rc.encode(ack, _to_switch(spec, job, worker))


def mode_ii_allreduce(spec: SwitchSpec, seed: int) -> tuple[list[JobSpec], list[tuple[int, bytes]], int]:
    """A UC job 0 (slots 0-3) and a Mode II AllReduce job 1 of four workers (slots 4-7: W = 2) over the ports of
    ``spec`` (two or more, eight slots or more), and their traffic, as (port, frame).

    The hosts send PSNs 0 and 1 in order, then a re-send of PSN 0 (behind: the result again, once the
    slot is done), a PSN ahead (dropped), ACKs and a NAK of results, another chunk for a PSN
    (``DROP_BAD_ADDRESS`` in the slot rules) and a VA off a chunk boundary (the same counter, at the
    port); then rounds in which each host's frame may be lost (its next PSN is then ahead, and it goes
    back to the lost one), sent twice, or followed by an ACK; the UC job's chunks come in between.
    Returns the jobs, the traffic and how many of its frames are ACKs.
    """
    uc = make_job(spec, 0, 2, 0, 4)
    job = dataclasses.replace(make_job(spec, 1, 4, 4, 4), mode=Mode.TRANSLATED)
    rng, pyrng = np.random.default_rng(seed), random.Random(seed)
    t, acks = [], []

    def c(w, psn, chunk=None, **kw):
        t.append((job.workers[w].port,
                  rc_contribution(spec, job, w, psn, psn if chunk is None else chunk, lanes(rng, spec), **kw)))

    def a(w, psn, syndrome=rc.Syndrome.ACK):
        t.append((job.workers[w].port, rc_ack(spec, job, w, rc.Ack(psn, syndrome, psn + 1))))
        acks.append(psn)

    for psn in (0, 1):
        for w in range(4):
            c(w, psn)
        t.append((uc.workers[psn].port, contribution(spec, uc, psn, 0, lanes(rng, spec))))
    c(0, 0)                        # behind
    c(1, 3)                        # ahead
    a(0, 0)
    a(1, 0, rc.Syndrome.NAK_SEQ)
    a(2, 1)
    c(0, 2)
    c(1, 2, chunk=6)               # another chunk for PSN 2 (or the first of two that disagree)
    c(2, 2, va=2 * spec.chunk_bytes + 4)      # a VA inside a chunk: the port drops it
    c(2, 2)
    c(3, 2)
    c(2, 1)                        # behind, PSN 1 done by now
    expected = [3, 2, 3, 3]        # the next PSN each host sends (worker 1's PSN 2 went to the wrong chunk)
    c(1, 2)
    for chunk in range(1, 4):
        for w in range(2):
            t.append((uc.workers[w].port, contribution(spec, uc, w, chunk, lanes(rng, spec))))
        for w in range(4):
            p = expected[w]
            r = pyrng.random()
            if r < 0.2:            # lost: the next one is ahead, the host goes back
                c(w, p + 1)
                c(w, p)
            elif r < 0.35:
                c(w, p)
                c(w, p)
            else:
                c(w, p)
            expected[w] = p + 1
            if pyrng.random() < 0.5:
                a(w, p, pyrng.choice([rc.Syndrome.ACK, rc.Syndrome.NAK_SEQ]))
    for w in range(4):             # the hosts catch up: PSNs to the same point
        for p in range(expected[w], max(expected)):
            c(w, p)
    return [uc, job], t, len(acks)


def mode_iii_hosts(spec: SwitchSpec, job: JobSpec, seed: int, count: int, *, loss: float = 0.0,
                   dup: float = 0.0) -> list[tuple[int, bytes]]:
    """The frames, as (port, frame), that reach the switch from Mode III hosts of ``job`` that mostly keep the
    rules, made against a model switch so that their ACKs acknowledge results that exist: each of ``count``
    frames is a host's next contribution (sometimes one behind or ahead, Go-Back-N from the PSN the switch
    expects, now and then another chunk for a PSN) or its ACK or NAK sequence error of results (its oldest
    unACKed one, or one or two later, or one behind). On the way a frame is lost with probability ``loss``,
    else arrives twice with probability ``dup``; the hosts go on from what the switch got."""
    model_switch = ModelSwitch(spec)
    model_switch.add_job(job)
    model = model_switch.modes[job.job]
    n = len(job.workers)
    rng, sent, out = np.random.default_rng(seed), [0] * n, []
    for _ in range(count):
        w = int(rng.integers(n))
        if rng.random() < 0.3 and model.next_result != model.acked[w]:
            q = (model.acked[w] + int(rng.integers(-1, 3))) % rc.PSN_MOD
            syndrome = rc.Syndrome.NAK_SEQ if rng.random() < 0.25 else rc.Syndrome.ACK
            frame = rc_ack(spec, job, w, rc.Ack(q, syndrome, q))
        else:
            r = rng.random()
            if r < 0.15:
                sent[w] = model.expected[w]
            off = sent[w] + (0 if r < 0.75 else -int(rng.integers(1, 3)) if r < 0.9 else int(rng.integers(1, 3)))
            if off == sent[w] and sent[w] - min(sent) < job.slots:
                sent[w] += 1
            chunk = (off + (job.slots if rng.random() < 0.04 else 0)) % (1 << 30)
            frame = rc_contribution(spec, job, w, off % rc.PSN_MOD, chunk, lanes(rng, spec, 1000))
        roll = rng.random()
        for _ in range(0 if roll < loss else 2 if roll > 1 - dup else 1):
            model_switch.receive(job.workers[w].port, frame)
            out.append((job.workers[w].port, frame))
    return out


def strays(spec: SwitchSpec, job: JobSpec, rng: np.random.Generator) -> tuple[list[tuple[int, bytes]], dict]:
    """Stray chunks on FREE slots, the job's first region of chunks, then the strays again, each on its worker's port.

    Slot liveness (``docs/protocol.md`` section 3, issue 21 row 6): worker
    0's strays, far ahead of or behind the job's chunks, take slots 1 to 3 of
    ``job`` (a region of 4 or more slots, chunks from 0) while they are FREE;
    the job's own chunks take them back, since they never completed, and
    complete. Sent again once the slots completed, the strays are dropped.
    Returns the (port, frame) traffic and the counters it must end with.
    """
    stray = [(1 + CHUNK_MOD // 2) % CHUNK_MOD, (2 - 3 * job.slots) % CHUNK_MOD, 3 + 5 * job.slots]
    late = [(job.workers[0].port, contribution(spec, job, 0, c, lanes(rng, spec))) for c in stray]
    own = [(ws.port, contribution(spec, job, w, c, lanes(rng, spec)))
           for c in range(job.slots) for w, ws in enumerate(job.workers)]
    # Each stray is stale or beyond the window once its slot holds the job's chunk.
    counts = {Counter.COMPLETED: job.slots, Counter.RX_CONTRIB: len(stray) + len(own),
              Counter.DROP_STALE: 2, Counter.DROP_WINDOW: 1}
    return late + own + late, counts


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


_IP = CONTRIBUTION.offset("ipv4")
_IP_HDR = slice(_IP, _IP + IPV4_LEN)
_IP_CSUM = IPV4.slice("checksum", _IP)


def _fix_ip(frame: bytes | bytearray) -> bytes:
    """``frame`` with its IPv4 header checksum recomputed."""
    f = bytearray(frame)
    f[_IP_CSUM] = bytes(2)
    f[_IP_CSUM] = wire.ipv4_checksum(bytes(f[_IP_HDR])).to_bytes(2, "big")
    return bytes(f)


def _refresh(frame: bytes | bytearray) -> bytes:
    """Recompute the IPv4 checksum and the ICRC of an edited contribution (datagram extent as its IP length)."""
    f = bytearray(_fix_ip(frame))
    end = _IP + IPV4.unpack(f, _IP)["total_len"]
    f[end - ICRC_LEN:end] = icrc.icrc(bytes(f[:end - ICRC_LEN]))
    return bytes(f)


def _with_fields(frame: bytes, **values: int) -> bytearray:
    """A contribution with fields set, named ``header__field`` (``ipv4__ihl=6``); checksums as they were."""
    f = bytearray(frame)
    for key, value in values.items():
        name, field = key.split("__")
        header, off = HEADERS[name], CONTRIBUTION.offset(name)
        fields = header.unpack(f, off)
        fields[field] = value
        f[off:off + header.size] = header.pack(**fields)
    return f


def bad_frames(spec: SwitchSpec, job: JobSpec, rng: np.random.Generator) -> list[tuple[str, bytes, Counter]]:
    """Malformed and foreign frames, each with the counter ``docs/protocol.md`` section 5 books it under.

    Each is one check failing on an otherwise good contribution of worker 0
    of ``job`` (a job the switch has), so together they walk the check order
    when they come in on worker 0's port (on another, a frame that passes
    checks 1-13 is ``DROP_UNKNOWN_QPN``: ingress-port binding).
    """
    from scapy.layers.inet import IP, TCP, UDP
    from scapy.layers.inet6 import IPv6
    from scapy.layers.l2 import ARP, Ether

    good = contribution(spec, job, 0, 0, lanes(rng, spec))
    sw = spec.mac
    w0 = job.workers[0]

    def edit(refresh: bool = True, **values: int) -> bytes:
        f = _with_fields(good, **values)
        return _refresh(f) if refresh else bytes(f)

    ip, udp = IPV4.unpack(good, _IP), HEADERS["udp"].unpack(good, CONTRIBUTION.offset("udp"))

    def contrib(**overrides) -> bytes:
        return contribution(spec, job, 0, 0, lanes(rng, spec), **overrides)

    payload = bytes(rng.integers(0, 256, 64, dtype=np.uint8))
    out = [
        ("runt", good[:10], Counter.DROP_BAD_LENGTH),
        ("arp", bytes(Ether(dst="ff:ff:ff:ff:ff:ff", src=w0.mac) / ARP(psrc=w0.ip, pdst=spec.ip)), Counter.DROP_NON_ROCE),
        ("ipv6", bytes(Ether(dst=sw, src=w0.mac) / IPv6(src="fe80::1", dst="fe80::2") / UDP(dport=4791) / payload),
         Counter.DROP_NON_ROCE),
        ("short ipv4", good[:30], Counter.DROP_BAD_LENGTH),
        ("ip options", edit(refresh=False, ipv4__ihl=6), Counter.DROP_BAD_HEADER),
        ("ip checksum", edit(refresh=False, ipv4__checksum=ip["checksum"] ^ 0x100), Counter.DROP_BAD_HEADER),
        ("ip fragment", _fix_ip(edit(refresh=False, ipv4__flag_df=0, ipv4__flag_mf=1)), Counter.DROP_BAD_HEADER),
        ("ip reserved flag", edit(ipv4__flag_rsvd=1), Counter.DROP_BAD_HEADER),
        ("tcp", bytes(Ether(dst=sw, src=w0.mac) / IP(src=w0.ip, dst=spec.ip) / TCP(dport=4791) / payload),
         Counter.DROP_NON_ROCE),
        ("truncated", good[:-20], Counter.DROP_BAD_LENGTH),
        ("ip length short", _fix_ip(edit(refresh=False, ipv4__total_len=27)), Counter.DROP_BAD_LENGTH),
        ("ip length long", _fix_ip(edit(refresh=False, ipv4__total_len=len(good) - 13)), Counter.DROP_BAD_LENGTH),
        ("other udp", bytes(Ether(dst=sw, src=w0.mac) / IP(src=w0.ip, dst=spec.ip) / UDP(sport=1234, dport=53) / payload),
         Counter.DROP_NON_ROCE),
        ("udp length", edit(udp__len=udp["len"] + 4), Counter.DROP_BAD_LENGTH),
        ("icrc last byte", good[:-1] + bytes([good[-1] ^ 0x80]), Counter.DROP_BAD_ICRC),
        ("payload bit", good[:100] + bytes([good[100] ^ 0x04]) + good[101:], Counter.DROP_BAD_ICRC),
        ("bth version", edit(bth__tver=1), Counter.DROP_BAD_HEADER),
        ("pkey", contrib(pkey=spec.pkey ^ 0x8000), Counter.DROP_BAD_HEADER),
        ("dma length", edit(reth__dma_len=spec.chunk_bytes - 4), Counter.DROP_BAD_LENGTH),
        ("rc opcode", contrib(opcode=Opcode.RC_RDMA_WRITE_ONLY), Counter.DROP_BAD_OPCODE),
        ("write with imm", contrib(opcode=Opcode.UC_RDMA_WRITE_ONLY_IMM, imm=7), Counter.DROP_BAD_OPCODE),
        ("chunk size", contrib(payload=good[CONTRIB_HDR_LEN:CONTRIB_HDR_LEN + spec.chunk_bytes // 2]),
         Counter.DROP_BAD_LENGTH),
        ("qpn prefix", contrib(dest_qpn=job.qpn(0) ^ 0x010000), Counter.DROP_UNKNOWN_QPN),
        ("job absent", contrib(dest_qpn=job.qpn(0) ^ (1 << 8)), Counter.DROP_UNKNOWN_QPN),
        ("worker absent", contrib(dest_qpn=job.qpn(len(job.workers))), Counter.DROP_UNKNOWN_QPN),
        ("rkey", contrib(rkey=job.contrib_rkey(0) ^ 1), Counter.DROP_BAD_RKEY),
        ("va unaligned", contrib(va=spec.chunk_bytes + 4), Counter.DROP_BAD_ADDRESS),
        ("va too high", contrib(va=CHUNK_MOD * spec.chunk_bytes), Counter.DROP_BAD_ADDRESS),
    ]
    return out

