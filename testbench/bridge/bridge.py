"""The cocotb side of :class:`~inagg.testbench.bridge.harness.BridgeHarness`: whole frames in, whole frames out.

:class:`FrameBridge` owns the harness's clock, reset and frame rings. A
caller queues frames per port with :meth:`FrameBridge.send`; whenever it
wakes, :meth:`FrameBridge.pull` takes every finished frame out of the egress
rings and :meth:`FrameBridge.push` copies queued frames into free ingress
rows. One wake costs one read of the harness's ``status`` word, one write of
its ``control`` word, and one simulator access per ring with frames to
move, whatever the number of frames and beats: the rows cross as raw bytes
(:class:`~inagg.testbench.bridge.vpi.RowMemory`), not as cocotb's string
of bits. Between wakes the simulator runs alone:
:meth:`FrameBridge.wait` sleeps until the harness's alarm, which rings when
an egress ring is half full, when an ingress ring that frames wait for runs
empty, or after a given number of cycles.

Nothing is dropped inside the bridge that a network would deliver: a frame
waits in its port's queue while the ingress ring is full, and the switch
waits while an egress ring is full. Frames no port can carry are counted in
:attr:`FrameBridge.stats`: ``oversize`` (longer than a ring row, which holds
a result frame: the MTU of this switch), ``empty``, and ``truncated`` for a
frame the switch sent longer than a row (none does); and, while the order
is recorded (for a compare), ``order_overrun``: order log entries
overwritten before a wake read them.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections import deque

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles

from inagg.models.protocol import QPN_WORKER_BITS
from inagg.testbench.bridge.harness import (COUNT_BITS, ENTRY_ACK, ENTRY_PORT, ENTRY_RESEND, HOP_PAYLOAD_BITS,
                                            RingGeometry)
from inagg.testbench.replay import RESENT, SKIPPED, AckTaken, TimerRanOut
from inagg.testbench.bridge.vpi import RowMemory

__all__ = ["FrameBridge", "CLOCK_NS"]

CLOCK_NS = 4  # 250 MHz
_MOD = 1 << COUNT_BITS
_MASK = _MOD - 1


class FrameBridge:
    """The frame rings of a Verilated harness whose rows and words ``harness`` describes."""

    def __init__(self, dut, harness: RingGeometry):
        self.dut = dut
        self.ports, self.depth, self.frame_bytes = harness.ports, harness.depth, harness.frame_bytes
        self.port_bits, self.order_depth = harness.port_bits, harness.order_depth
        self._entry_bits, self._augmented = harness.entry_bits, harness.augmented
        self._beats = harness.beats
        self._row_bits = harness.row_bits
        self._len_byte = harness.beats * harness.width // 8  # the length lane's first byte
        self._rows = np.zeros((harness.depth, harness.row_bits // 8), np.uint8)  # the rows being written
        self._ring_names = harness.ring_names
        self._iring: list[RowMemory] = []  # in start(): the simulator must be running
        self._oring: list[RowMemory] = []
        self._status, self._control, self.alarm = dut.status, dut.control, dut.alarm
        self._tails = [0] * (2 * self.ports)  # ingress tails, then egress tails
        self._heads = [0] * self.ports        # ingress heads at the last pull
        self._order_seen = 0
        self._wake_at = 0
        self._wake_rx = False
        self._control_value = -1
        self.cycle = 0  # the harness's cycle counter (mod 2**32) at the last pull
        self.queues: list[deque[bytes]] = [deque() for _ in range(self.ports)]
        self.stats: Tally = Tally()
        self.order: list = []  # ports, and with Mode III the replay's entries of the hop
        self.record_order = False

    async def start(self) -> None:
        """Start the clock (in the simulator, not in Python) and reset the harness."""
        dut = self.dut
        rings = [RowMemory(f"{dut._name}.{name}", self.depth, self._row_bits) for name in self._ring_names]
        self._iring, self._oring = rings[:self.ports], rings[self.ports:]
        self._write_control()
        cocotb.start_soon(Clock(dut.clk, CLOCK_NS, unit="ns", impl="gpi").start())
        dut.rst.value = 1
        await ClockCycles(dut.clk, 4)
        dut.rst.value = 0
        await ClockCycles(dut.clk, 2)

    @property
    def backlog(self) -> int:
        """Frames queued in Python that wait for an ingress row."""
        return sum(len(q) for q in self.queues)

    @property
    def idle(self) -> bool:
        """No frame waits in Python or in an ingress ring (as of the last :meth:`pull`)."""
        return not self.backlog and self._heads == self._tails[:self.ports]

    def send(self, port: int, frame: bytes) -> bool:
        """Queue ``frame`` for switch port ``port`` (it goes in at the next :meth:`push`).

        Returns False, counting it, for a frame no port can carry."""
        if not 0 < len(frame) <= self.frame_bytes:
            self.stats["empty" if not frame else "oversize"] += 1
            return False
        self.queues[port].append(frame)
        return True

    def pull(self) -> list[tuple[int, bytes]]:
        """The frames the switch sent since the last call, as (port, frame), each port's in sending order.

        Reads the status word that :meth:`push` goes by as well."""
        status = self._status.value.to_unsigned()
        P = self.ports
        self._heads = [(status >> (COUNT_BITS * p)) & _MASK for p in range(P)]
        count = (status >> (2 * P * COUNT_BITS)) & 0xFFFFFFFF
        self.cycle = status >> (2 * P * COUNT_BITS + 32)
        got = []
        fb, lb = self.frame_bytes, self._len_byte
        for p in range(P):
            head = (status >> (COUNT_BITS * (P + p))) & _MASK
            tail = self._tails[P + p]
            n = (head - tail) % _MOD
            if not n:
                continue
            rows = self._oring[p].read(tail, n)
            lengths = rows[:, lb] | rows[:, lb + 1].astype(np.uint16) << 8
            for row, length in zip(rows, lengths.tolist()):
                if length > fb:
                    self.stats["truncated"] += 1
                else:
                    got.append((p, row[:length].tobytes()))
            self._tails[P + p] = head
        new = (count - self._order_seen) % (1 << 32)
        if new:
            if self.record_order:
                if new > self.order_depth:
                    self.stats["order_overrun"] += new - self.order_depth  # entries lost: the compare is off
                log = self.dut.order_log.value.to_unsigned()
                mask, bits, depth = (1 << self._entry_bits) - 1, self._entry_bits, self.order_depth
                entries = [(log >> (bits * (n % depth))) & mask for n in range(self._order_seen, self._order_seen + new)]
                self.order += map(self._decode, entries) if self._augmented else entries
            self._order_seen = count
        return got

    @staticmethod
    def _decode(entry: int):
        """A Mode III harness's order log entry as :func:`inagg.testbench.replay.replay` takes it."""
        kind, payload = entry >> HOP_PAYLOAD_BITS, entry & ((1 << HOP_PAYLOAD_BITS) - 1)
        if kind == ENTRY_PORT:
            return payload
        if kind == ENTRY_RESEND:
            return SKIPPED if payload & 1 else RESENT
        if kind == ENTRY_ACK:
            return AckTaken(payload >> 1, bool(payload & 1))
        return TimerRanOut(payload >> QPN_WORKER_BITS, payload & ((1 << QPN_WORKER_BITS) - 1))

    def push(self) -> None:
        """Copy queued frames into the free ingress rows (by the heads :meth:`pull` read), a port's in one access."""
        rows, lb = self._rows, self._len_byte
        for p in range(self.ports):
            q = self.queues[p]
            if not q:
                continue
            tail = self._tails[p]
            n = min(self.depth - (tail - self._heads[p]) % _MOD, len(q))
            if not n:
                continue
            batch = rows[:n]
            batch[:] = 0
            for row in batch:
                frame = q.popleft()
                row[:len(frame)] = np.frombuffer(frame, np.uint8)
                row[lb], row[lb + 1] = len(frame) & 0xFF, len(frame) >> 8
            self._iring[p].write(tail, batch)
            self._tails[p] = (tail + n) % _MOD

    def _write_control(self) -> None:
        P = self.ports
        value = sum(t << (COUNT_BITS * i) for i, t in enumerate(self._tails))
        value |= (self._order_seen | self._wake_at << 32 | int(self._wake_rx) << 64) << (2 * P * COUNT_BITS)
        if value != self._control_value:
            self._control.value = value
            self._control_value = value

    @property
    def flush_cycles(self) -> int:
        """Longest a result waits in an egress ring that does not fill: half a ring of every port's frames."""
        return self.depth // 2 * self.ports * self._beats

    async def wait(self, cycles: int) -> None:
        """Sleep until an egress ring is half full, an ingress ring with frames waiting for it runs empty,
        or ``cycles`` cycles pass (at least 1, at most :attr:`flush_cycles`).

        Hands the tails and the order acknowledgement of the last
        :meth:`pull` / :meth:`push` to the harness first.
        """
        self._wake_at = (self.cycle + max(1, min(cycles, self.flush_cycles))) & 0xFFFFFFFF
        self._wake_rx = bool(self.backlog)
        self._write_control()
        await self.alarm.value_change
