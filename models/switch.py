"""The reference switch as a behavioural model: the UC mode here, EPIC's modes in :mod:`~inagg.models.modes`
(II, III) and :mod:`~inagg.models.terminated` (I).

Configured with a :class:`~inagg.models.job.SwitchSpec` and jobs
(:class:`~inagg.models.job.JobSpec`), :meth:`ModelSwitch.receive` takes one
frame that arrived on a port and returns the frames the switch sends, in
order, as ``(port, frame)`` pairs. Counters and slot state are open to
inspection, so the RTL can be compared with it frame by frame and counter by
counter. ``docs/protocol.md`` is the specification this code follows; each
rule below names its section there.

A job's :class:`~inagg.models.job.Mode` picks its rules: ``Mode.UC`` jobs
follow this module, Mode II and III jobs their object of
:mod:`inagg.models.modes`, Mode I jobs theirs of :mod:`inagg.models.terminated`;
:meth:`ModelSwitch.receive` hands every frame addressed to them to that object.

UC and Mode II jobs need no clock (the hosts keep the timers), and give the
same output for the same arrival order on every run; Mode I's and Mode III's
result timers run on the clock a driver gives :meth:`ModelSwitch.on_timer`.
"""

from __future__ import annotations

import enum
from collections import Counter as Tally
from dataclasses import dataclass

import numpy as np

from inagg.models import arith, modes, terminated, wire
from inagg.models.backend import Backend, SwitchBackend
from inagg.models.cuckoo import KEY_JOB_SHIFT, CuckooTable, make_key
from inagg.models.frame import CONTRIBUTION, RESULT
from inagg.models.job import Collective, JobSpec, Mode, SwitchSpec
from inagg.models.protocol import (
    CHUNK_MOD, IMM_CHUNK_MASK, IMM_FP32, Counter, Opcode, encode_imm, qp_udp_sport, split_qpn,
)
from inagg.models.tree import TreeCounter

__all__ = ["SlotState", "Slot", "ModelSwitch", "BACKEND"]

_HALF = 1 << 31


class SlotState(enum.IntEnum):
    FREE = 0
    AGG = 1    # collecting contributions
    DONE = 2   # complete; the result stays until the job's next chunk for this slot
    SENT = 3   # tree: the partial went to the parent, the result has not come back yet


@dataclass
class Slot:
    """One chunk's aggregation state, as the slot memory holds it.

    ``first``: the slot has not completed since it was FREE (its first
    generation), when no two chunks of its job can both be due
    (docs/protocol.md section 3, "Liveness").
    """

    lanes: arith.LaneState
    state: SlotState = SlotState.FREE
    job: int = 0
    chunk: int = 0
    bitmap: int = 0
    count: int = 0
    first: bool = False

    def start(self, job: int, chunk: int) -> None:
        self.state, self.job, self.chunk, self.bitmap, self.count = SlotState.AGG, job, chunk, 0, 0

    def clear(self) -> None:
        self.start(0, 0)
        self.state, self.first = SlotState.FREE, False


@dataclass
class _Job:
    spec: JobSpec
    result_psn: list[int]
    # The collective's data flow (docs/protocol.md section 11), as worker bitmaps:
    # who sends lanes up, who gets lanes down; whether this switch's partial and
    # its parent's result carry lanes. No defaults: only of() derives them, so a
    # job built field by field cannot silently take no one's lanes.
    data_in: int
    data_out: int
    up_data: bool
    down_data: bool

    @classmethod
    def of(cls, spec: JobSpec) -> "_Job":
        everyone = (1 << len(spec.workers)) - 1
        root = 0 if spec.root is None else 1 << spec.root
        data_in, data_out = {
            Collective.REDUCE: (everyone, root),
            Collective.BROADCAST: (root, everyone),
            Collective.BARRIER: (0, 0),
        }.get(spec.collective, (everyone, everyone))
        return cls(spec, [w.result_psn for w in spec.workers], data_in, data_out, data_in != 0, data_out != 0)


class ModelSwitch(SwitchBackend):
    """The reference switch (see the module docstring), a :class:`~inagg.models.backend.SwitchBackend`.

    ``hop_timeout`` is the ACK timeout of a result on the hop (Modes I and III).
    """

    per_worker_rkeys = True  # check 15 of a UC job compares a worker's WorkerSpec.contrib_rkey where it has one

    def __init__(self, spec: SwitchSpec | None = None, *, hop_timeout: float = modes.HOP_TIMEOUT):
        self.spec = spec or SwitchSpec()
        # Jobs of EPIC's modes (models/modes.py, models/terminated.py), by job number, and the clock of their timers.
        self.modes: dict[int, modes.TranslatedJob | terminated.TerminatedJob] = {}
        self.hop_timeout = hop_timeout
        self.now = 0.0
        self._mac = wire.mac_bytes(self.spec.mac)
        self._ip = wire.ip_bytes(self.spec.ip)
        lanes = self.spec.lanes
        self.fast = [Slot(arith.LaneState(lanes)) for _ in range(self.spec.slots)]
        self.jobs: dict[int, _Job] = {}
        self.counters = {c: 0 for c in Counter}
        self.tree_counters = {c: 0 for c in TreeCounter}
        # Frames sent again, by (port, the counter that counted them: TX_RESENDS, UP_RESENDS or HOP_RESENDS):
        # where a tree's losses were repaired, per hop (the demo's table, docs/host.md).
        self.resent: Tally = Tally()
        self._uplinks: dict[int, int] = {}  # result QPN from a parent -> job
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
        self.spec.check_job(job, (j.spec for j in self.jobs.values()), modes=modes.MODES + terminated.MODES)
        if job.parent is not None:
            if job.parent.result_qpn in self._uplinks:
                raise ValueError(f"job {job.job}'s uplink result QPN 0x{job.parent.result_qpn:06x} is job "
                                 f"{self._uplinks[job.parent.result_qpn]}'s already")
            self._uplinks[job.parent.result_qpn] = job.job
        self.jobs[job.job] = _Job.of(job)
        if job.mode is not Mode.UC:
            opened = terminated.open_job if job.mode is Mode.TERMINATED else modes.open_job
            self.modes[job.job] = opened(self, job, hop_timeout=self.hop_timeout)

    def remove_job(self, job: int) -> None:
        """Tear a job down: free its fast slots and its exception-path slots."""
        if job not in self.jobs:
            raise ValueError(f"job {job} is not configured")
        up = self.jobs.pop(job).spec.parent
        if up is not None:
            del self._uplinks[up.result_qpn]
        self.modes.pop(job, None)
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
        up = self._uplinks.get(r.dest_qpn)
        if up is not None and up in self.modes:  # Modes I, II and III: a result or an ACK from the parent
            return self.modes[up].from_parent(r)
        if up is not None and r.opcode == RESULT.opcode:
            return self._from_parent(self.jobs[up], r)
        named = split_qpn(r.dest_qpn)
        job = self.jobs.get(named[0]) if named else None
        # Check 14 knows a worker's QPN on its WorkerSpec.port only (ingress-port binding).
        known = job is not None and named[1] < len(job.spec.workers) and job.spec.workers[named[1]].port == port
        if known and job.spec.mode is not Mode.UC:
            return self.modes[job.spec.job].receive(named[1], r)
        kind, size = self._expects(job, named[1], r.opcode) if known else (CONTRIBUTION, c)
        bad = wire.check_receiver(r, kind, size, qpn_ok=known, rkey_ok=known and r.rkey == job.spec.contrib_rkey(named[1]),
                                  va_ok=r.va is not None and r.va % c == 0 and r.va // c < CHUNK_MOD
                                  and (r.imm is None or r.imm == encode_imm(r.va // c, True)))
        if bad is not None:
            return self._count(bad)
        if kind is RESULT:
            return self._contribute(job, named[1], r.va // c, r.payload, promoted=True)
        return self._contribute(job, named[1], r.va // c, r.payload)

    def _held(self, job: JobSpec, idx: int) -> Slot | None:
        """The slot job holds at region index ``idx``, fast or overflow; None when it holds none there."""
        fast = self.fast[job.slot_base + idx]
        if fast.state != SlotState.FREE and fast.job == job.job:
            return fast
        ptr = None if self.exception is None else self.exception.lookup(make_key(job.job, idx))
        return None if ptr is None else self.overflow[ptr]

    def _locate(self, job: JobSpec, chunk: int) -> Slot | Counter:
        """The slot of (job, chunk): protocol.md "Slots" and "Slot collisions"."""
        idx = chunk & (job.slots - 1)
        held = self._held(job, idx)
        if held is not None:
            return held
        fast = self.fast[job.slot_base + idx]
        if fast.state == SlotState.FREE:
            return fast
        if self.exception is None:
            return Counter.DROP_COLLISION
        key = make_key(job.job, idx)
        # With every overflow slot in use the table is full as well.
        if not self._free or not self.exception.insert(key, self._free[0]):
            return Counter.EXC_REFUSED
        self.counters[Counter.EXC_INSERTS] += 1
        return self.overflow[self._free.pop(0)]

    def _contribute(self, job: _Job, worker: int, chunk: int, payload: bytes,
                    promoted: bool = False) -> list[tuple[int, bytes]]:
        spec = job.spec
        slot = self._locate(spec, chunk)
        if isinstance(slot, Counter):
            return self._count(slot)
        if slot.state == SlotState.FREE:
            slot.start(spec.job, chunk)
            slot.first = True
        elif slot.chunk != chunk:
            if not slot.first:
                ahead = (chunk - slot.chunk) % CHUNK_MOD
                if ahead >= _HALF:
                    return self._count(Counter.DROP_STALE)
                if ahead != spec.slots or slot.state != SlotState.DONE:
                    return self._count(Counter.DROP_WINDOW)
            # The next generation: every worker holds the old result (protocol.md "Slot reuse"). Or a first
            # generation meets another chunk: one of the two is a stray, which must not hold the slot for good
            # ("Liveness"); the workers' retransmissions bring the right one back.
            slot.start(spec.job, chunk)
        bit = 1 << worker
        if slot.bitmap & bit:
            self.counters[Counter.DUP_CONTRIB] += 1
            if slot.state == SlotState.SENT:  # the parent may have lost the partial: protocol.md section 10
                return self._up(job, slot, TreeCounter.UP_RESENDS)
            if slot.state != SlotState.DONE:
                return []
            self.counters[Counter.TX_RESENDS] += 1
            self.resent[spec.workers[worker].port, Counter.TX_RESENDS] += 1
            return [self._result(job, worker, slot)]
        if payload:
            self._add(slot.lanes, payload, promoted, first=not slot.bitmap & job.data_in)
        slot.bitmap |= bit
        slot.count += 1
        self.counters[Counter.RX_CONTRIB] += 1
        if slot.count < len(spec.workers):
            return []
        slot.first = False
        if spec.parent is not None:
            slot.state = SlotState.SENT
            return self._up(job, slot, TreeCounter.UP_PARTIALS)
        slot.state = SlotState.DONE
        self.counters[Counter.COMPLETED] += 1
        if any(self._lanes_out(slot.lanes)[1:]):
            self.counters[Counter.PROMOTED] += 1
        return [self._result(job, w, slot) for w in range(len(spec.workers))]

    # Lane arithmetic is the one rule the profiles of docs/protocol.md section 8
    # differ in; a profile's switch overrides these two methods and nothing else
    # of the slot logic.

    def _add(self, lanes: arith.LaneState, payload: bytes, promoted: bool, first: bool) -> None:
        """Add a contribution's payload into a slot's lanes: INT32 lanes, or with ``promoted`` a child
        switch's partial (lane words, then one promotion bit per lane: docs/protocol.md section 10)."""
        if promoted:
            n = self.spec.lanes
            words = np.frombuffer(payload, ">u4", n)
            arith.merge(lanes, words, np.unpackbits(np.frombuffer(payload, np.uint8, offset=4 * n),
                                                    count=n).astype(bool), first=first)
        else:
            self._accumulate(lanes, np.frombuffer(payload, ">i4").astype(np.int32), first=first)

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
        if job.data_out >> worker & 1:
            payload, fp32, saturated = self._lanes_out(slot.lanes)
        else:
            payload, fp32, saturated = b"", False, False
            self.tree_counters[TreeCounter.TX_COMPLETIONS] += 1
        psn = job.result_psn[worker]
        job.result_psn[worker] = (psn + 1) & 0xFFFFFF
        self.counters[Counter.TX_RESULTS] += 1
        frame = wire.build(
            eth_dst=wire.mac_bytes(w.mac), eth_src=self._mac, ip_src=self._ip, ip_dst=wire.ip_bytes(w.ip),
            udp_sport=qp_udp_sport(w.qpn), opcode=Opcode.UC_RDMA_WRITE_ONLY_IMM, dest_qpn=w.qpn,
            psn=psn, va=w.result_va + (slot.chunk & (job.spec.slots - 1)) * self.spec.chunk_bytes,
            rkey=w.rkey, payload=payload, imm=encode_imm(slot.chunk, fp32, saturated), pkey=self.spec.pkey,
        )
        return w.port, frame

    # -- the tree: docs/protocol.md section 10 --------------------------

    def _expects(self, job: _Job, worker: int, opcode: int) -> tuple:
        """(frame kind, DMA length) a contribution of ``worker`` must have: a child switch's promoted
        partial is a 0x2B frame with one promotion bit per lane after the lanes; a child that sends no
        data (the collective's rule) sends no lanes."""
        c = self.spec.chunk_bytes
        if not job.data_in >> worker & 1:
            return CONTRIBUTION, 0
        if opcode == RESULT.opcode and worker in job.spec.subswitches:
            return RESULT, self.partial_bytes
        return CONTRIBUTION, c

    @property
    def partial_bytes(self) -> int:
        """DMA length of a child switch's partial with promoted lanes: the lanes, then a bit per lane."""
        c = self.spec.chunk_bytes
        return c + c // 32

    def _partial(self, lanes: arith.LaneState, chunk: int) -> tuple[bytes, int | None]:
        """A partial's payload and ImmDt (docs/protocol.md section 10): the lane words; with promoted lanes also
        their promotion bits after them and an ImmDt of FP32 | chunk (``UP_PROMOTED`` counted), else None."""
        payload = lanes.words.astype(">u4").tobytes()
        if not lanes.promoted.any():
            return payload, None
        self.tree_counters[TreeCounter.UP_PROMOTED] += 1
        return payload + np.packbits(lanes.promoted).tobytes(), encode_imm(chunk, True)

    @staticmethod
    def _take_result(lanes: arith.LaneState, r: wire.RoceFrame) -> None:
        """Load a parent's result into a slot's lanes: every lane FP32 when its ImmDt says so."""
        lanes.words[:] = np.frombuffer(r.payload, ">u4")
        lanes.promoted[:] = bool(r.imm & IMM_FP32)

    def _up(self, job: _Job, slot: Slot, event: TreeCounter) -> list[tuple[int, bytes]]:
        """Send ``slot``'s partial to the parent as a contribution of this switch."""
        up, c = job.spec.parent, self.spec.chunk_bytes
        self.tree_counters[event] += 1
        if event is TreeCounter.UP_RESENDS:
            self.resent[up.port, event] += 1
        payload, imm = self._partial(slot.lanes, slot.chunk) if job.up_data else (b"", None)
        opcode = Opcode.UC_RDMA_WRITE_ONLY if imm is None else Opcode.UC_RDMA_WRITE_ONLY_IMM
        frame = wire.build(
            eth_dst=wire.mac_bytes(up.mac), eth_src=self._mac, ip_src=self._ip, ip_dst=wire.ip_bytes(up.ip),
            udp_sport=qp_udp_sport(up.result_qpn), opcode=opcode, dest_qpn=up.qpn, psn=slot.chunk,
            va=slot.chunk * c, rkey=up.rkey, payload=payload, imm=imm, pkey=self.spec.pkey,
        )
        return [(up.port, frame)]

    def _from_parent(self, job: _Job, r: wire.RoceFrame) -> list[tuple[int, bytes]]:
        """A result from the parent: keep it in the slot waiting for it and send it to every child."""
        spec, c = job.spec, self.spec.chunk_bytes
        up = spec.parent
        chunk30 = r.imm & IMM_CHUNK_MASK
        bad = wire.check_receiver(r, RESULT, c if job.down_data else 0, qpn_ok=True,
                                  rkey_ok=r.rkey == up.result_rkey,
                                  va_ok=r.va == up.result_va + (chunk30 & (spec.slots - 1)) * c)
        if bad is not None:
            return self._count(bad)
        slot = self._held(spec, chunk30 & (spec.slots - 1))
        if slot is None or slot.chunk & IMM_CHUNK_MASK != chunk30 or slot.state == SlotState.AGG:
            self.tree_counters[TreeCounter.DROP_PARENT_STALE] += 1
            return []
        if slot.state == SlotState.DONE:
            self.tree_counters[TreeCounter.DUP_PARENT] += 1
            return []
        if r.payload:
            self._take_result(slot.lanes, r)
        slot.state = SlotState.DONE
        self.tree_counters[TreeCounter.RX_PARENT] += 1
        return [self._result(job, w, slot) for w in range(len(spec.workers))]
    # -- the clock of the result timers of Modes I and III --------------------

    @property
    def deadline(self) -> float | None:
        """When :meth:`on_timer` must run next: the earliest result timer (Modes I and III), or None."""
        armed = [d for m in self.modes.values() if (d := m.deadline) is not None]
        return min(armed) if armed else None

    def on_timer(self, now: float) -> list[tuple[int, bytes]]:
        """Set the switch's clock to ``now``; return the results that timers due by then send again."""
        self.now = max(self.now, now)
        d = self.deadline
        if d is None or d > self.now:
            return []
        return [f for m in self.modes.values() for f in m.on_timer(self.now)]

    # -- the rest of the backend interface --------------------------------
    # UC jobs need no clock: receive() returns every frame a frame causes.

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
