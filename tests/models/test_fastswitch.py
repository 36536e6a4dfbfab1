"""The fast switch against the reference model: the same randomized traffic, the same frames out, the same counters.

The traffic has several jobs (overlapping regions on a switch with an exception path, so collisions, cuckoo
insertions and refusals happen), every link fault (loss, duplication, reordering, corruption), malformed frames
that reach every drop reason, chunk numbers across the 32-bit wrap, sums that overflow INT32 (promotion), and jobs
removed and added again mid-stream. The fast switch takes it in batches of random sizes, the model frame by frame.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from inagg.models import icrc, wire
from inagg.models.backend import load_backend
from inagg.models.fastswitch import FastSwitch
from inagg.models.frame import CONTRIBUTION, Opcode
from inagg.models.job import Collective, ExceptionSpec, JobSpec, Mode, SwitchSpec, WorkerSpec
from inagg.models.protocol import CHUNK_MOD, ETH_LEN, ICRC_LEN, RC_MODE_COUNTERS, Counter
from inagg.models.regmap import RegMap
from inagg.models.switch import ModelSwitch
from inagg.testbench.traffic import contribution

THOROUGH = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"
FRAMES = 1_000_000 if THOROUGH else 100_000

_TVER = CONTRIBUTION.offset("bth") + 1  # the BTH byte holding se, migreq, pad and tver
_IP_CSUM = slice(CONTRIBUTION.span("ipv4.checksum")[0], sum(CONTRIBUTION.span("ipv4.checksum")))
_DROPS = [c for c in Counter if c.name.startswith("DROP_") and c not in RC_MODE_COUNTERS]


def _workers(job: int, n: int, ports: int, own_keys: bool = False) -> tuple[WorkerSpec, ...]:
    """``n`` workers of ``job``; with ``own_keys`` each with a contribution R_Key of its own."""
    return tuple(WorkerSpec(port=(job + i) % ports, mac=f"02:00:00:{job:02x}:00:{i:02x}", ip=f"10.{job}.0.{i + 1}",
                            qpn=0x1000 * job + i, rkey=0x5000 + i, result_va=0x100000 * (i + 1), result_psn=i * 7,
                            contrib_rkey=0xC000 + 0x10 * job + i if own_keys else None)
                 for i in range(n))


CONFIGS = {
    # Three jobs sharing slots 0..15 through a tiny exception path: collisions, insertions, kicks and refusals.
    "exception": (SwitchSpec(ports=4, slots=16, chunk_bytes=256, exception=ExceptionSpec(table=4, max_kicks=2,
                                                                                        stash=1)),
                  [JobSpec(job=1, rkey=0xA1, slot_base=0, slots=8, workers=_workers(1, 3, 4)),
                   JobSpec(job=2, rkey=0xA2, slot_base=0, slots=16, workers=_workers(2, 2, 4)),
                   JobSpec(job=5, rkey=0xA5, slot_base=8, slots=8, workers=_workers(5, 4, 4))]),
    # Disjoint jobs on the direct-mapped slots only, 1 KB chunks.
    "direct": (SwitchSpec(ports=8, slots=64, chunk_bytes=1024),
               [JobSpec(job=3, rkey=0xB3, slot_base=0, slots=32, workers=_workers(3, 4, 8)),
                JobSpec(job=7, rkey=0xB7, slot_base=32, slots=16, workers=_workers(7, 2, 8, own_keys=True))]),
}


class Traffic:
    """Randomized frames for the jobs of one switch, from a seeded generator."""

    def __init__(self, spec: SwitchSpec, jobs: list[JobSpec], rng: np.random.Generator):
        self.spec, self.jobs, self.rng = spec, jobs, rng
        # Where each job's workers are: near 0, just below the 32-bit wrap, or anywhere.
        self.next = {j.job: int(rng.choice([0, CHUNK_MOD - 3 * j.slots, rng.integers(CHUNK_MOD)])) for j in jobs}
        self.lost: dict[int, list[tuple[int, bytes]]] = {j.job: [] for j in jobs}  # resent with the next window

    def lanes(self, n: int) -> np.ndarray:
        """``n`` rows of int32 lanes, all small, all large, or anywhere (then sums overflow INT32 and promote)."""
        scale = [1 << 10, 1 << 24, 1 << 31][int(self.rng.integers(3))]
        return self.rng.integers(-scale, scale, (n, self.spec.chunk_bytes // 4), dtype=np.int64).astype(">i4")

    def contribution(self, job: JobSpec, worker: int, chunk: int, lanes: np.ndarray | None = None, **kw) -> bytes:
        lanes = self.lanes(1)[0] if lanes is None else lanes
        return contribution(self.spec, job, worker, chunk, lanes, psn=chunk, **{"udp_sport": 0xC000 | worker, **kw})

    def window(self, job: JobSpec) -> list[tuple[int, bytes]]:
        """Up to half a region of chunks from every worker, reordered, with losses (resent in the job's next
        window, as a worker's timeout would) and duplicates."""
        rng, start = self.rng, self.next[job.job]
        chunks = [(start + i) % CHUNK_MOD for i in range(int(rng.integers(1, job.window + 1)))]
        self.next[job.job] = (start + len(chunks)) % CHUNK_MOD
        lanes = iter(self.lanes(len(chunks) * len(job.workers)))
        out = self.lost[job.job] + [(w.port, self.contribution(job, i, c, next(lanes))) for c in chunks
                                    for i, w in enumerate(job.workers)]
        keep = rng.random(len(out)) >= 0.03  # loss
        self.lost[job.job] = [f for f, k in zip(out, keep) if not k]
        out = [f for f, k in zip(out, keep) if k]
        for i in rng.integers(0, len(out), int(rng.integers(0, 3))) if out else ():  # duplication
            out.insert(int(rng.integers(i, len(out) + 1)), out[i])
        order = np.argsort(np.arange(len(out)) + rng.normal(0, 2, len(out)))  # reordering, mostly local
        return [out[i] for i in order]

    def malformed(self) -> tuple[int, bytes]:
        """A frame for one of the drop reasons, or a contribution hurt on the link."""
        rng = self.rng
        job = self.jobs[int(rng.integers(len(self.jobs)))]
        worker = int(rng.integers(len(job.workers)))
        chunk = (self.next[job.job] + int(rng.integers(-2 * job.slots, 2 * job.slots))) % CHUNK_MOD
        port = int(rng.integers(self.spec.ports))
        c = self.spec.chunk_bytes
        kind = int(rng.integers(14))
        if kind == 0:  # corruption: one bit flipped anywhere
            f = bytearray(self.contribution(job, worker, chunk))
            bit = int(rng.integers(8 * len(f)))
            f[bit // 8] ^= 1 << bit % 8
            return port, bytes(f)
        if kind == 1:  # a header bit flipped and the ICRC (and sometimes the IPv4 checksum) made good again
            f = bytearray(self.contribution(job, worker, chunk))
            bit = int(rng.integers(8 * 12, 8 * CONTRIBUTION.size))
            f[bit // 8] ^= 1 << bit % 8
            if rng.random() < 0.5:
                f[_IP_CSUM] = b"\0\0"
                f[_IP_CSUM] = wire.ipv4_checksum(bytes(f[ETH_LEN:])).to_bytes(2, "big")
            return port, _reseal(bytes(f))
        if kind == 2:  # truncated, or with Ethernet padding after the datagram
            f = self.contribution(job, worker, chunk)
            return port, f[:int(rng.integers(0, len(f)))] if rng.random() < 0.7 else f + bytes(int(rng.integers(1, 60)))
        if kind == 3:
            return port, self._opcode(job, worker, chunk)
        if kind == 4:
            return port, self.contribution(job, worker, chunk, payload=bytes(c + 4 * int(rng.choice([-1, 1]))))
        if kind == 5:  # another job's number, a worker the job lacks, a QPN that is not the switch's
            qpn = int(rng.choice([job.qpn(worker) ^ (1 << 6 + int(rng.integers(10))),
                                  job.qpn(0) + len(job.workers), 0x123456]))
            return port, self.contribution(job, worker, chunk, dest_qpn=qpn)
        if kind == 6:  # a wrong R_Key, or another worker's (the job's one key, or that worker's own)
            other = (worker + 1) % len(job.workers)
            return port, self.contribution(job, worker, chunk, rkey=[job.contrib_rkey(worker) ^ 1,
                                                                     job.contrib_rkey(other)][int(rng.integers(2))])
        if kind == 7:
            va = [chunk * c + 4, CHUNK_MOD * c + chunk * c, (1 << 64) - c][int(rng.integers(3))]
            return port, self.contribution(job, worker, chunk, va=va)
        if kind == 8:
            return port, self.contribution(job, worker, chunk, pkey=self.spec.pkey ^ 0x8000)
        if kind == 9:  # BTH version, or a pad count: the ICRC stays good
            f = bytearray(self.contribution(job, worker, chunk))
            f[_TVER] |= int(rng.choice([0x01, 0x10, 0x30]))
            return port, _reseal(bytes(f))
        if kind == 10:  # not RoCE: another EtherType, IP protocol or UDP port
            f = self.contribution(job, worker, chunk)
            return port, [f[:12] + b"\x86\xdd" + f[14:], _field(f, "ipv4.protocol", 6), _field(f, "udp.dport", 4792)][
                int(rng.integers(3))]
        if kind == 11:  # lengths that disagree
            f = self.contribution(job, worker, chunk)
            return port, [_field(f, "ipv4.total_len", len(f) - ETH_LEN + 4), _field(f, "udp.len", 99),
                          _field(f, "ipv4.total_len", 30)][int(rng.integers(3))]
        if kind == 12:  # a chunk far ahead of or behind its slot
            far = (chunk + int(rng.choice([job.slots + 1, 3 * job.slots, CHUNK_MOD // 2 + 5]))) % CHUNK_MOD
            return job.workers[worker].port, self.contribution(job, worker, far)
        # Runts: shorter than an Ethernet header, or than the IPv4 header behind one.
        return port, rng.integers(0, 256, int(rng.integers(0, 40)), dtype=np.uint8).tobytes()

    def _opcode(self, job: JobSpec, worker: int, chunk: int) -> bytes:
        op = int(self.rng.choice([Opcode.RC_RDMA_WRITE_ONLY, Opcode.UC_RDMA_WRITE_ONLY_IMM, Opcode.RC_ACK]))
        if op == Opcode.RC_ACK:  # no RETH: patch the opcode of a contribution and seal it again
            return _reseal(_field(self.contribution(job, worker, chunk), "bth.opcode", op))
        return self.contribution(job, worker, chunk, opcode=op, imm=chunk & 0xFFFF if op & 1 else None)

    def frames(self, n: int) -> list[tuple[int, bytes]]:
        out = []
        while len(out) < n:
            if self.rng.random() < 0.15:
                out.append(self.malformed())
            else:
                out += self.window(self.jobs[int(self.rng.integers(len(self.jobs)))])
        return out


def _field(frame: bytes, path: str, value: int) -> bytes:
    """``frame`` with whole-byte field ``path`` set to ``value`` (nothing resealed)."""
    off, n = CONTRIBUTION.span(path)
    return frame[:off] + value.to_bytes(n, "big") + frame[off + n:]


def _reseal(frame: bytes) -> bytes:
    """``frame`` with a good ICRC again where the ICRC is defined for it."""
    try:
        return frame[:-ICRC_LEN] + icrc.icrc(frame[:-ICRC_LEN])
    except ValueError:
        return frame


def _run_both(spec: SwitchSpec, jobs: list[JobSpec], seed: int, n: int) -> tuple[ModelSwitch, FastSwitch, int]:
    rng = np.random.default_rng(seed)
    model, fast = ModelSwitch(spec), FastSwitch(spec)
    for j in jobs:
        model.add_job(j)
        fast.add_job(j)
    traffic = Traffic(spec, jobs, rng)
    frames = traffic.frames(n)
    sent = 0
    i = 0
    while i < len(frames):
        batch = frames[i:i + int(rng.choice([1, 7, 64, 300, 2000]))]
        want = [out for port, frame in batch for out in model.receive(port, frame)]
        assert fast.receive_batch(batch) == want, f"frames {i}..{i + len(batch)} of seed {seed}"
        sent += len(want)
        i += len(batch)
        if rng.random() < 0.02:  # a job torn down and set up again, as the controller does
            j = jobs[int(rng.integers(len(jobs)))]
            model.remove_job(j.job)
            fast.remove_job(j.job)
            model.add_job(j)
            fast.add_job(j)
        assert fast.counters == model.counters
    assert fast.exception_entries() == model.exception_entries()
    return model, fast, sent


@pytest.mark.parametrize("config", CONFIGS)
def test_fast_switch_sends_what_the_model_sends(config):
    spec, jobs = CONFIGS[config]
    model, fast, sent = _run_both(spec, jobs, seed=len(config), n=FRAMES)
    c = model.counters
    assert c[Counter.RX_FRAMES] >= FRAMES and sent > FRAMES // 4
    # The traffic reached every outcome it is there for.
    reached = {k for k, v in c.items() if v}
    # No collision drop: without an exception path job regions may not overlap, with one a held slot diverts.
    expect = set(_DROPS) - {Counter.DROP_COLLISION} | {Counter.PROMOTED, Counter.TX_RESENDS}
    if spec.exception is not None:
        expect |= {Counter.EXC_INSERTS, Counter.EXC_REFUSED}
    assert expect <= reached, sorted(c.name for c in expect - reached)
    assert not reached & RC_MODE_COUNTERS, "UC traffic counted in an RC mode's counter"


@given(seed=st.integers(0, 2**32 - 1), config=st.sampled_from(sorted(CONFIGS)))
def test_fast_switch_matches_the_model_on_short_runs(seed, config):
    spec, jobs = CONFIGS[config]
    _run_both(spec, jobs, seed, n=300)


def test_the_loop_is_compiled_when_the_switch_is_made_not_on_its_first_frame():
    """A service's first all-reduce must not wait for numba: seconds with a cold cache, past the workers' timers."""
    from inagg.models import fastswitch

    spec, jobs = CONFIGS["direct"]
    switch = FastSwitch(spec)
    compiled = list(fastswitch._run.signatures)
    assert len(compiled) == 1
    switch.add_job(jobs[0])
    switch.receive(0, bytes(100))
    switch.receive_batch(Traffic(spec, jobs[:1], np.random.default_rng(0)).frames(50))
    assert fastswitch._run.signatures == compiled  # real frames take the specialization compiled at construction


def test_fast_switch_is_the_default_backend_and_refuses_what_it_lacks():
    import dataclasses

    spec, jobs = CONFIGS["direct"]
    switch = load_backend("fast").open(spec)
    assert isinstance(switch, FastSwitch)
    with pytest.raises(ValueError, match=r"^port 8 does not exist: the switch has 8 ports$"):
        switch.receive(8, b"")
    with pytest.raises(ValueError, match=r"^port -1 does not exist: the switch has 8 ports$"):
        switch.receive_batch([(0, b""), (-1, b"")])
    assert switch.receive_batch([]) == [] and switch.receive_batch(iter([(0, b"")])) == []
    assert switch.counters[Counter.RX_FRAMES] == switch.counters[Counter.DROP_BAD_LENGTH] == 1
    job = jobs[0]
    switch.add_job(job)
    with pytest.raises(ValueError, match="is configured already"):
        switch.add_job(job)
    with pytest.raises(ValueError, match="is not configured"):
        switch.remove_job(99)
    # A JobSpec field this switch does not implement (a mode, a parent) is refused by name.
    base = JobSpec(job=9, rkey=1, slot_base=32, slots=2, workers=job.workers)
    switch.add_job(dataclasses.replace(base, mode=Mode.UC))
    with pytest.raises(ValueError, match=r"implements UC jobs only: job 10 sets mode=<Mode.TRANSLATED: 'II'>"):
        switch.add_job(dataclasses.replace(base, job=10, slot_base=34, mode=Mode.TRANSLATED))
    with pytest.raises(ValueError, match=r"implements UC jobs only: job 11 sets collective=<Collective.BARRIER"):
        switch.add_job(dataclasses.replace(base, job=11, slot_base=36, collective=Collective.BARRIER))


@pytest.mark.parametrize("make", [ModelSwitch, FastSwitch])
def test_a_worker_counts_on_its_own_port_only(make):
    """Issue 21, ingress-port binding (check 14): a worker's contribution that comes in on another port than its
    own is DROP_UNKNOWN_QPN, with its right key; on its own port it counts."""
    spec = SwitchSpec(ports=3, slots=8, chunk_bytes=256)
    job = JobSpec(job=1, rkey=0xB1, slot_base=0, slots=8, workers=_workers(1, 2, 3, own_keys=True))
    assert [w.port for w in job.workers] == [1, 2]
    switch = make(spec)
    switch.add_job(job)
    lanes = np.ones(spec.lanes, np.int64)
    for port in (0, 2):
        assert switch.receive(port, contribution(spec, job, 0, 0, lanes)) == []
    assert switch.counters[Counter.DROP_UNKNOWN_QPN] == 2 and switch.counters[Counter.RX_CONTRIB] == 0
    assert switch.receive(1, contribution(spec, job, 0, 0, lanes)) == []
    out = switch.receive_batch([(1, contribution(spec, job, 1, 0, lanes)), (2, contribution(spec, job, 1, 0, lanes))])
    assert switch.counters[Counter.RX_CONTRIB] == 2 and sorted(p for p, _ in out) == [1, 2]
    assert switch.counters[Counter.DROP_UNKNOWN_QPN] == 3


@pytest.mark.parametrize("make", [ModelSwitch, FastSwitch])
def test_a_worker_with_its_own_r_key_takes_no_other(make):
    """Issue 21: with per-worker contribution R_Keys one worker's leaked key does not let anyone contribute as
    another worker, nor does the job's key; the RTL takes such a job (a CONTRIB_RKEY register per worker)."""
    spec = SwitchSpec(ports=2, slots=8, chunk_bytes=256)
    job = JobSpec(job=1, rkey=0xB1, slot_base=0, slots=8, workers=_workers(1, 2, 2, own_keys=True))
    switch = make(spec)
    switch.add_job(job)
    lanes = np.ones(spec.lanes, np.int64)
    port = [w.port for w in job.workers]
    for key in (job.contrib_rkey(1), job.rkey):  # as worker 0: worker 1's key, then the job's
        assert switch.receive(port[0], contribution(spec, job, 0, 0, lanes, rkey=key)) == []
    assert switch.counters[Counter.DROP_BAD_RKEY] == 2 and switch.counters[Counter.RX_CONTRIB] == 0
    switch.receive(port[0], contribution(spec, job, 0, 0, lanes))  # its own key
    out = switch.receive(port[1], contribution(spec, job, 1, 0, lanes))
    assert switch.counters[Counter.RX_CONTRIB] == 2 and len(out) == 2
    regmap = RegMap(jobs=4, workers=4)
    writes = dict(regmap.job_writes(job, spec))
    assert [writes[regmap.worker(1, w, "CONTRIB_RKEY")] for w in range(2)] == [job.contrib_rkey(w) for w in range(2)]
