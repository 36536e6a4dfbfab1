"""The Mode II switch as a behavioural model.

Configured with a :class:`~inagg.models.job.SwitchSpec` and jobs
(:class:`~inagg.models.job.JobSpec`), :meth:`ModelSwitch.receive` takes one
frame that arrived on a port and returns the frames the switch sends, in
order, as ``(port, frame)`` pairs. Counters and slot state are open to
inspection, so the RTL can be compared with it frame by frame and counter by
counter. ``docs/protocol.md`` is the specification this code follows; each
rule below names its section there.

The model has no clock: Mode II needs none (the hosts keep the timers), and
a model without time gives the same output for the same arrival order on
every run.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from inagg.models import arith, wire
from inagg.models.backend import Backend, SwitchBackend
from inagg.models.cuckoo import KEY_JOB_SHIFT, CuckooTable, make_key
from inagg.models.frame import CONTRIBUTION
from inagg.models.job import JobSpec, SwitchSpec
from inagg.models.protocol import CHUNK_MOD, Counter, Opcode, encode_imm, result_udp_sport, split_qpn

__all__ = ["SlotState", "Slot", "ModelSwitch", "BACKEND"]

_HALF = 1 << 31


class SlotState(enum.IntEnum):
    FREE = 0
    AGG = 1    # collecting contributions
    DONE = 2   # complete; the result stays until the job's next chunk for this slot


@dataclass
class Slot:
    """One chunk's aggregation state, as the slot memory holds it."""

    lanes: arith.LaneState
    state: SlotState = SlotState.FREE
    job: int = 0
    chunk: int = 0
    bitmap: int = 0
    count: int = 0

    def start(self, job: int, chunk: int) -> None:
        self.state, self.job, self.chunk, self.bitmap, self.count = SlotState.AGG, job, chunk, 0, 0

    def clear(self) -> None:
        self.start(0, 0)
        self.state = SlotState.FREE


@dataclass
class _Job:
    spec: JobSpec
    result_psn: list[int] = field(default_factory=list)


class ModelSwitch(SwitchBackend):
    """The reference Mode II switch (see the module docstring), a :class:`~inagg.models.backend.SwitchBackend`."""

    def __init__(self, spec: SwitchSpec | None = None):
        self.spec = spec or SwitchSpec()
        self._mac = wire.mac_bytes(self.spec.mac)
        self._ip = wire.ip_bytes(self.spec.ip)
        lanes = self.spec.lanes
        self.fast = [Slot(arith.LaneState(lanes)) for _ in range(self.spec.slots)]
        self.jobs: dict[int, _Job] = {}
        self.counters = {c: 0 for c in Counter}
        exc = self.spec.exception
        if exc is not None:
            self.exception: CuckooTable | None = CuckooTable(exc.table, exc.max_kicks, exc.stash)
            self.overflow = [Slot(arith.LaneState(lanes)) for _ in range(exc.capacity)]
            self._free = list(range(exc.capacity))
        else:
            self.exception, self.overflow, self._free = None, [], []

    # -- control plane ----------------------------------------------------

    def add_job(self, job: JobSpec) -> None:
        """Install a job. Its region must fit the slot memory; without an
        exception path it must not overlap another job's region."""
        if job.job in self.jobs:
            raise ValueError(f"job {job.job} is configured already")
        self.spec.check_job(job, (j.spec for j in self.jobs.values()))
        self.jobs[job.job] = _Job(job, [w.result_psn for w in job.workers])

    def remove_job(self, job: int) -> None:
        """Tear a job down: free its fast slots and its exception-path slots."""
        if job not in self.jobs:
            raise ValueError(f"job {job} is not configured")
        del self.jobs[job]
        for s in self.fast:
            if s.state != SlotState.FREE and s.job == job:
                s.clear()
        if self.exception is not None:
            for key in sorted(k for k, _ in self.exception_entries() if k >> KEY_JOB_SHIFT == job):
                ptr = self.exception.delete(key)
                self.overflow[ptr].clear()
                self._free.append(ptr)

    def exception_entries(self) -> list[tuple[int, int]]:
        """(key, overflow slot) of every exception entry, tables first, then the stash."""
        if self.exception is None:
            return []
        out = [e for t in self.exception.tables for e in t if e is not None]
        return out + list(self.exception.stash_entries)

    # -- data plane -------------------------------------------------------

    def _count(self, c: Counter) -> list:
        self.counters[c] += 1
        return []

    def receive(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        """Process one frame that arrived on ``port``; return what the switch sends."""
        if not 0 <= port < self.spec.ports:
            raise ValueError(f"port {port} does not exist: the switch has {self.spec.ports} ports")
        self.counters[Counter.RX_FRAMES] += 1
        r = wire.parse(frame, self.spec.pkey)
        if isinstance(r, Counter):
            return self._count(r)
        c = self.spec.chunk_bytes
        named = split_qpn(r.dest_qpn)
        job = self.jobs.get(named[0]) if named else None
        known = job is not None and named[1] < len(job.spec.workers)
        bad = wire.check_receiver(r, CONTRIBUTION, c, qpn_ok=known, rkey_ok=known and r.rkey == job.spec.rkey,
                                  va_ok=r.va is not None and r.va % c == 0 and r.va // c < CHUNK_MOD)
        if bad is not None:
            return self._count(bad)
        return self._contribute(job, named[1], r.va // c, r.payload)

    def _locate(self, job: JobSpec, chunk: int) -> Slot | Counter:
        """The slot of (job, chunk): protocol.md "Slots" and "Slot collisions"."""
        idx = chunk & (job.slots - 1)
        fast = self.fast[job.slot_base + idx]
        if fast.state != SlotState.FREE and fast.job == job.job:
            return fast
        if self.exception is None:
            if fast.state == SlotState.FREE:
                return fast
            return Counter.DROP_COLLISION
        key = make_key(job.job, idx)
        ptr = self.exception.lookup(key)
        if ptr is not None:
            return self.overflow[ptr]
        if fast.state == SlotState.FREE:
            return fast
        # With every overflow slot in use the table is full as well.
        if not self._free or not self.exception.insert(key, self._free[0]):
            return Counter.EXC_REFUSED
        self.counters[Counter.EXC_INSERTS] += 1
        return self.overflow[self._free.pop(0)]

    def _contribute(self, job: _Job, worker: int, chunk: int, payload: bytes) -> list[tuple[int, bytes]]:
        spec = job.spec
        slot = self._locate(spec, chunk)
        if isinstance(slot, Counter):
            return self._count(slot)
        if slot.state == SlotState.FREE:
            slot.start(spec.job, chunk)
        elif slot.chunk != chunk:
            ahead = (chunk - slot.chunk) % CHUNK_MOD
            if ahead >= _HALF:
                return self._count(Counter.DROP_STALE)
            if ahead != spec.slots or slot.state != SlotState.DONE:
                return self._count(Counter.DROP_WINDOW)
            slot.start(spec.job, chunk)  # every worker holds the old result: protocol.md "Slot reuse"
        bit = 1 << worker
        if slot.bitmap & bit:
            self.counters[Counter.DUP_CONTRIB] += 1
            if slot.state != SlotState.DONE:
                return []
            self.counters[Counter.TX_RESENDS] += 1
            return [self._result(job, worker, slot)]
        x = np.frombuffer(payload, ">i4").astype(np.int32)
        self._accumulate(slot.lanes, x, first=(slot.count == 0))
        slot.bitmap |= bit
        slot.count += 1
        self.counters[Counter.RX_CONTRIB] += 1
        if slot.count < len(spec.workers):
            return []
        slot.state = SlotState.DONE
        self.counters[Counter.COMPLETED] += 1
        if any(self._lanes_out(slot.lanes)[1:]):
            self.counters[Counter.PROMOTED] += 1
        return [self._result(job, w, slot) for w in range(len(spec.workers))]

    # Lane arithmetic is the one rule the profiles of docs/protocol.md section 8
    # differ in; a profile's switch overrides these two methods and nothing else
    # of the slot logic.

    def _accumulate(self, lanes: arith.LaneState, x: np.ndarray, first: bool) -> None:
        """Add contribution ``x`` (int32 lanes) into a slot's lanes: INT32, promoted to FP32 on overflow."""
        arith.accumulate(lanes, x, first=first)

    def _lanes_out(self, lanes: arith.LaneState) -> tuple[bytes, bool, bool]:
        """A slot's result payload and its ImmDt flags (FP32, SATURATED)."""
        out = arith.emit(lanes)
        fp32 = out.dtype == np.float32
        return out.astype(">f4" if fp32 else ">i4").tobytes(), fp32, False

    def _result(self, job: _Job, worker: int, slot: Slot) -> tuple[int, bytes]:
        w = job.spec.workers[worker]
        payload, fp32, saturated = self._lanes_out(slot.lanes)
        psn = job.result_psn[worker]
        job.result_psn[worker] = (psn + 1) & 0xFFFFFF
        self.counters[Counter.TX_RESULTS] += 1
        frame = wire.build(
            eth_dst=wire.mac_bytes(w.mac), eth_src=self._mac, ip_src=self._ip, ip_dst=wire.ip_bytes(w.ip),
            udp_sport=result_udp_sport(w.qpn), opcode=Opcode.UC_RDMA_WRITE_ONLY_IMM, dest_qpn=w.qpn,
            psn=psn, va=w.result_va + (slot.chunk & (job.spec.slots - 1)) * self.spec.chunk_bytes,
            rkey=w.rkey, payload=payload, imm=encode_imm(slot.chunk, fp32, saturated), pkey=self.spec.pkey,
        )
        return w.port, frame

    # -- the rest of the backend interface --------------------------------
    # The model has no clock: receive() returns every frame a frame causes.

    def poll(self) -> list[tuple[int, bytes]]:
        """Nothing: :meth:`receive` returns every frame the switch sends."""
        return []

    def fileno(self) -> None:
        """None: nothing comes later than :meth:`receive` returns it."""
        return None

    @property
    def drops(self) -> dict[str, int]:
        """Empty: every frame reaches the model, which counts its own drops in :attr:`counters`."""
        return {}

    @property
    def retired_slots(self) -> tuple[tuple[int, int], ...]:
        """Empty: :meth:`remove_job` clears every slot of the job."""
        return ()

    def close(self) -> None:
        """Nothing to release: the model holds no process or descriptor."""


BACKEND = Backend("model", open=ModelSwitch)
