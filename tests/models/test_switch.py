"""The Mode II model switch: exactly-once all-reduce under faults, and every drop rule.

The driver here is deliberately independent of the host library: a few
lines of worker logic (window rule, resend on timeout) around the switch, so
the switch is checked against the protocol, not against our own worker.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, strategies as st

from inagg.models import arith, icrc, wire
from inagg.models.job import ExceptionSpec, JobSpec, SwitchSpec, WorkerSpec
from inagg.models.protocol import Counter, Opcode, decode_imm, switch_qpn
from inagg.models.switch import ModelSwitch, SlotState

CHUNK = 256
LANES = CHUNK // 4


def make_job(job, n, slot_base, slots, ports=4, rkey=None):
    workers = tuple(
        WorkerSpec(port=i % ports, mac=f"02:00:00:{job:02x}:00:{i:02x}", ip=f"10.{job}.0.{i + 1}",
                   qpn=0x1000 + i, rkey=0x5000 + i, result_va=0x100000 * (i + 1), result_psn=i)
        for i in range(n))
    return JobSpec(job=job, rkey=rkey if rkey is not None else 0xC0DE0000 + job, slot_base=slot_base,
                   slots=slots, workers=workers)


def contrib(sw: ModelSwitch, job: JobSpec, worker: int, chunk: int, lanes: np.ndarray, **kw) -> bytes:
    w = job.workers[worker]
    args = dict(eth_dst=wire.mac_bytes(sw.spec.mac), eth_src=wire.mac_bytes(w.mac), ip_src=wire.ip_bytes(w.ip),
                ip_dst=wire.ip_bytes(sw.spec.ip), udp_sport=0xC000 | worker, opcode=Opcode.UC_RDMA_WRITE_ONLY,
                dest_qpn=job.qpn(worker), psn=chunk & 0xFFFFFF, va=(chunk % 2**32) * sw.spec.chunk_bytes,
                rkey=job.rkey, payload=lanes.astype(">i4").tobytes())
    args.update(kw)
    return wire.build(**args)


class Fabric:
    """Workers of several jobs around one switch, over a link that loses, duplicates and reorders."""

    def __init__(self, sw, jobs, chunks, rng, loss=0.0, dup=0.0, first_chunk=0, scale=1 << 20):
        self.sw, self.jobs, self.rng, self.loss, self.dup = sw, jobs, rng, loss, dup
        self.first, self.n = first_chunk, chunks
        npr = np.random.default_rng(rng.getrandbits(32))
        self.data = {j.job: npr.integers(-scale, scale, (len(j.workers), chunks, LANES), dtype=np.int32) for j in jobs}
        self.lo = {(j.job, w): 0 for j in jobs for w in range(len(j.workers))}
        self.next = dict(self.lo)
        self.results = {k: {} for k in self.lo}
        self.flight: list[tuple[str, int, bytes]] = []
        self.order: dict[tuple[int, int], list[int]] = {}
        self.by_qpn = {(j.job, w.qpn): (j, i) for j in jobs for i, w in enumerate(j.workers)}

    def send(self, job, w, c):
        frame = contrib(self.sw, job, w, self.first + c, self.data[job.job][w, c])
        self.flight.append(("sw", job.workers[w].port, frame))

    def fill(self):
        for job in self.jobs:
            for w in range(len(job.workers)):
                k = (job.job, w)
                while self.next[k] < min(self.n, self.lo[k] + job.window):
                    self.send(job, w, self.next[k])
                    self.next[k] += 1

    def timeout(self):
        for job in self.jobs:
            for w in range(len(job.workers)):
                k = (job.job, w)
                for c in range(self.lo[k], self.next[k]):
                    if c not in self.results[k]:
                        self.send(job, w, c)

    def deliver(self, where, port, frame):
        if where == "sw":
            before = self.sw.counters[Counter.RX_CONTRIB]
            outs = self.sw.receive(port, frame)
            if self.sw.counters[Counter.RX_CONTRIB] != before:
                r = wire.parse(frame)
                key = (r.dest_qpn >> 6 & 1023, r.va // self.sw.spec.chunk_bytes)
                self.order.setdefault(key, []).append(r.dest_qpn & 63)
            self.flight += [("host", p, f) for p, f in outs]
            return
        r = wire.parse(frame)
        assert not isinstance(r, Counter), f"switch emitted a bad frame: {r!r}"
        assert r.opcode == Opcode.UC_RDMA_WRITE_ONLY_IMM and icrc.check(frame)
        job = next(j for j in self.jobs if wire.mac_bytes(j.workers[0].mac)[3] == r.eth_dst[3])
        job, w = self.by_qpn[(job.job, r.dest_qpn)]
        assert r.eth_dst == wire.mac_bytes(job.workers[w].mac) and port == job.workers[w].port
        chunk_lo, fp32, _ = decode_imm(r.imm)
        k = (job.job, w)
        c = next(c for c in range(self.next[k]) if (self.first + c) & 0x3FFFFFFF == chunk_lo)  # late ones too
        assert r.va == job.workers[w].result_va + ((self.first + c) % job.slots) * CHUNK
        lanes = np.frombuffer(r.payload, ">f4" if fp32 else ">i4")
        self.results[k].setdefault(c, lanes.astype(np.float32 if fp32 else np.int32))
        while self.lo[k] in self.results[k]:
            self.lo[k] += 1

    def run(self, max_steps=200_000):
        for _ in range(max_steps):
            self.fill()
            if not self.flight:
                if all(self.lo[k] == self.n for k in self.lo):
                    return
                self.timeout()
                continue
            item = self.flight.pop(self.rng.randrange(len(self.flight)))
            if self.rng.random() < self.loss:
                continue
            if self.rng.random() < self.dup:
                self.flight.append(item)
            self.deliver(*item)
        raise AssertionError("all-reduce did not terminate")

    def check_exact(self):
        for job in self.jobs:
            total = self.data[job.job].astype(np.int64).sum(axis=0)
            for w in range(len(job.workers)):
                got = np.stack([self.results[(job.job, w)][c] for c in range(self.n)])
                assert got.dtype == np.int32 and np.array_equal(got, total), f"job {job.job} worker {w}"


@pytest.mark.parametrize("n", [2, 3, 8, 32])
def test_allreduce_is_exact(n):
    sw = ModelSwitch(SwitchSpec(ports=4, slots=64, chunk_bytes=CHUNK))
    job = make_job(1, n, 0, 16)
    sw.add_job(job)
    f = Fabric(sw, [job], 40, random.Random(n))
    f.run()
    f.check_exact()
    c = sw.counters
    assert c[Counter.COMPLETED] == 40 and c[Counter.RX_CONTRIB] == 40 * n and c[Counter.TX_RESULTS] == 40 * n
    assert sum(v for k, v in c.items() if k.name.startswith("DROP")) == 0


@pytest.mark.parametrize("seed", range(4))
def test_concurrent_jobs_under_loss_duplication_and_reordering(seed):
    sw = ModelSwitch(SwitchSpec(ports=8, slots=64, chunk_bytes=CHUNK))
    jobs = [make_job(3, 5, 0, 8), make_job(7, 2, 8, 8), make_job(9, 16, 32, 32)]
    for j in jobs:
        sw.add_job(j)
    f = Fabric(sw, jobs, 30, random.Random(seed), loss=0.1, dup=0.1, first_chunk=2**32 - 13)
    f.run()
    f.check_exact()
    assert sw.counters[Counter.COMPLETED] == 90
    assert sw.counters[Counter.RX_CONTRIB] == 30 * (5 + 2 + 16)  # each worker's lanes added exactly once
    assert sw.counters[Counter.DUP_CONTRIB] > 0 and sw.counters[Counter.TX_RESENDS] > 0


def test_overflowing_sums_are_promoted_identically_for_every_worker():
    sw = ModelSwitch(SwitchSpec(ports=4, slots=16, chunk_bytes=CHUNK))
    job = make_job(2, 6, 0, 8)
    sw.add_job(job)
    f = Fabric(sw, [job], 12, random.Random(5), loss=0.05, dup=0.05, scale=2**30)
    f.run()
    assert sw.counters[Counter.PROMOTED] > 0
    for c in range(12):
        outs = [f.results[(2, w)][c] for w in range(6)]
        assert all(o.dtype == outs[0].dtype and np.array_equal(o, outs[0]) for o in outs)
        order = f.order[(2, c)]
        assert sorted(order) == list(range(6))
        expect = arith.aggregate(f.data[2][order, c])
        assert expect.dtype == outs[0].dtype and np.array_equal(expect.view(np.uint32), outs[0].view(np.uint32))


def _setup(n=3, slots=4, exception=None):
    sw = ModelSwitch(SwitchSpec(ports=4, slots=16, chunk_bytes=CHUNK, exception=exception))
    job = make_job(1, n, 0, slots)
    sw.add_job(job)
    return sw, job


def ones(v=1):
    return np.full(LANES, v, np.int32)


def test_duplicates_are_ignored_then_answered_with_a_resend():
    sw, job = _setup()
    assert sw.receive(0, contrib(sw, job, 0, 0, ones())) == []
    assert sw.receive(0, contrib(sw, job, 0, 0, ones(99))) == []  # duplicate while aggregating
    sw.receive(1, contrib(sw, job, 1, 0, ones()))
    outs = sw.receive(2, contrib(sw, job, 2, 0, ones()))
    assert [p for p, _ in outs] == [0, 1, 2]
    resend = sw.receive(1, contrib(sw, job, 1, 0, ones()))
    assert len(resend) == 1 and resend[0][0] == 1
    first, again = wire.parse(outs[1][1]), wire.parse(resend[0][1])
    assert again.payload == first.payload and again.psn == first.psn + 1
    assert np.array_equal(np.frombuffer(first.payload, ">i4"), ones(3))
    c = sw.counters
    assert (c[Counter.DUP_CONTRIB], c[Counter.TX_RESENDS], c[Counter.TX_RESULTS]) == (2, 1, 4)


def test_slot_reuse_stale_and_window_rules():
    sw, job = _setup(n=2, slots=4)
    for w in range(2):
        sw.receive(w, contrib(sw, job, w, 1, ones()))
    # chunk 1 + 4 (next generation of slot 1) may start: the slot was DONE.
    assert sw.receive(0, contrib(sw, job, 0, 5, ones())) == []
    assert sw.fast[1].chunk == 5 and sw.fast[1].state == SlotState.AGG
    sw.receive(1, contrib(sw, job, 1, 1, ones()))  # late retransmission of chunk 1
    assert sw.counters[Counter.DROP_STALE] == 1
    sw.receive(1, contrib(sw, job, 1, 9, ones()))  # chunk 9 while 5 still aggregates
    sw.receive(1, contrib(sw, job, 1, 13, ones()))  # too far ahead
    assert sw.counters[Counter.DROP_WINDOW] == 2
    assert sw.fast[1].bitmap == 1 and sw.fast[1].count == 1


@pytest.mark.parametrize("stray", [2**31 + 1, 1 + 4 * 5, (1 - 4 * 3) % 2**32, 9])
def test_a_stray_chunk_on_a_free_slot_does_not_hold_it(stray):
    """Liveness (issue 21, row 6): a stray chunk, far ahead of or behind the job's, takes FREE slot 1; the job's
    chunk 1 takes it back, since the slot never completed; once it has, the stray is stale or too far ahead."""
    sw, job = _setup(n=2, slots=4)
    sw.receive(0, contrib(sw, job, 0, stray, ones()))
    assert sw.fast[1].chunk == stray and sw.fast[1].first
    sw.receive(1, contrib(sw, job, 1, 1, ones()))
    assert sw.fast[1].chunk == 1 and sw.fast[1].bitmap == 2  # the stray's lanes are gone
    assert len(sw.receive(0, contrib(sw, job, 0, 1, ones()))) == 2
    assert sw.fast[1].state == SlotState.DONE and not sw.fast[1].first
    sw.receive(0, contrib(sw, job, 0, stray, ones()))
    assert sw.fast[1].chunk == 1 and sw.counters[Counter.DROP_STALE] + sw.counters[Counter.DROP_WINDOW] == 1
    assert sw.counters[Counter.RX_CONTRIB] == 3


def snapshot(sw):
    slots = sw.fast + sw.overflow
    return ([(s.state, s.job, s.chunk, s.bitmap, s.count, s.lanes.words.tobytes(), s.lanes.promoted.tobytes())
             for s in slots], sw.exception_entries(), [j.result_psn[:] for j in sw.jobs.values()])


@pytest.mark.parametrize("mutate,reason", [
    (lambda sw, j: contrib(sw, j, 0, 0, ones(), dest_qpn=0x123456), Counter.DROP_UNKNOWN_QPN),
    (lambda sw, j: contrib(sw, j, 0, 0, ones(), dest_qpn=switch_qpn(5, 0)), Counter.DROP_UNKNOWN_QPN),
    (lambda sw, j: contrib(sw, j, 0, 0, ones(), dest_qpn=switch_qpn(1, 3)), Counter.DROP_UNKNOWN_QPN),
    (lambda sw, j: contrib(sw, j, 0, 0, ones(), rkey=1), Counter.DROP_BAD_RKEY),
    (lambda sw, j: contrib(sw, j, 0, 0, ones(), va=17), Counter.DROP_BAD_ADDRESS),
    (lambda sw, j: contrib(sw, j, 0, 0, ones(), va=2**32 * CHUNK), Counter.DROP_BAD_ADDRESS),
    (lambda sw, j: contrib(sw, j, 0, 0, ones(), opcode=Opcode.RC_RDMA_WRITE_ONLY), Counter.DROP_BAD_OPCODE),
    (lambda sw, j: contrib(sw, j, 0, 0, ones(), opcode=Opcode.UC_RDMA_WRITE_ONLY_IMM, imm=0), Counter.DROP_BAD_OPCODE),
    (lambda sw, j: contrib(sw, j, 0, 0, np.ones(LANES - 1, np.int32)), Counter.DROP_BAD_LENGTH),
    (lambda sw, j: contrib(sw, j, 0, 0, ones(), pkey=0x8001), Counter.DROP_BAD_HEADER),
    (lambda sw, j: contrib(sw, j, 0, 0, ones())[:-1] + b"\x00", Counter.DROP_BAD_ICRC),
    (lambda sw, j: contrib(sw, j, 0, 0, ones())[:100], Counter.DROP_BAD_LENGTH),
    (lambda sw, j: contrib(sw, j, 0, 0, ones())[:12] + b"\x08\x06" + bytes(28), Counter.DROP_NON_ROCE),
])
def test_malformed_frames_are_dropped_counted_and_change_nothing(mutate, reason):
    sw, job = _setup()
    sw.receive(1, contrib(sw, job, 1, 0, ones()))
    before = snapshot(sw)
    assert sw.receive(0, mutate(sw, job)) == []
    assert sw.counters[reason] == 1 and snapshot(sw) == before


@given(st.lists(st.tuples(st.integers(0, 1101), st.integers(0, 255)), min_size=1, max_size=4),
       st.integers(0, 1102))
def test_fuzzed_frames_never_raise_and_never_touch_a_slot_when_dropped(edits, cut):
    sw, job = _setup()
    sw.receive(1, contrib(sw, job, 1, 0, ones()))
    f = bytearray(contrib(sw, job, 0, 0, ones(7)))
    for pos, val in edits:
        if pos < len(f):
            f[pos] = val
    before = snapshot(sw)
    accepted = sw.counters[Counter.RX_CONTRIB]
    sw.receive(0, bytes(f[:cut]))
    if sw.counters[Counter.RX_CONTRIB] == accepted:
        assert snapshot(sw) == before


def test_overlapping_regions_need_an_exception_path():
    sw, _ = _setup(slots=8)
    with pytest.raises(ValueError, match="overlaps job 1"):
        sw.add_job(make_job(2, 2, 4, 4))
    with pytest.raises(ValueError, match="exceed"):
        sw.add_job(make_job(3, 2, 16, 4))
    with pytest.raises(ValueError, match="configured already"):
        sw.add_job(make_job(1, 2, 8, 4))
    with pytest.raises(ValueError, match="port 9"):
        sw.add_job(JobSpec(job=4, rkey=1, slot_base=8, slots=4, workers=(
            WorkerSpec(port=9, mac="02:00:00:00:00:01", ip="10.0.0.1", qpn=1, rkey=1, result_va=0),)))


def test_collisions_go_to_the_exception_path_and_stay_exact():
    sw = ModelSwitch(SwitchSpec(ports=8, slots=32, chunk_bytes=CHUNK, exception=ExceptionSpec(table=64)))
    jobs = [make_job(1, 4, 0, 16), make_job(2, 3, 0, 16), make_job(3, 5, 8, 8)]
    for j in jobs:
        sw.add_job(j)
    f = Fabric(sw, jobs, 50, random.Random(3), loss=0.05, dup=0.05)
    f.run()
    f.check_exact()
    assert sw.counters[Counter.EXC_INSERTS] > 0 and sw.counters[Counter.DROP_COLLISION] == 0
    assert len(sw.exception_entries()) == sw.counters[Counter.EXC_INSERTS]


def test_full_exception_path_refuses_and_retransmission_recovers_after_teardown():
    sw = ModelSwitch(SwitchSpec(ports=4, slots=8, chunk_bytes=CHUNK,
                                exception=ExceptionSpec(table=2, max_kicks=2, stash=0)))
    a, b = make_job(1, 2, 0, 8), make_job(2, 3, 0, 8)
    sw.add_job(a)
    Fabric(sw, [a], 8, random.Random(1)).run()  # job 1 holds every fast slot
    sw.add_job(b)
    fb = Fabric(sw, [b], 8, random.Random(2))
    with pytest.raises(AssertionError, match="terminate"):
        fb.run(max_steps=3000)  # 8 slots wanted, at most 4 exception entries
    assert sw.counters[Counter.EXC_REFUSED] > 0
    held = sw.exception_entries()
    assert 0 < len(held) <= 4
    fb.timeout()
    while fb.flight:
        fb.deliver(*fb.flight.pop())
    assert sw.exception_entries() == held  # refusals overwrite nothing
    sw.remove_job(1)
    fb.run()  # retransmissions now find free fast slots
    fb.check_exact()
    assert sw.counters[Counter.RX_CONTRIB] == 8 * 2 + 8 * 3
