"""cocotb testbench of the Verilated switch top: bus models, configuration, model comparison.

One :class:`SwitchTB` owns the clock, the reset, an AXI-Stream source and
sink per port (cocotbext-axi), the AXI4-Lite manager, and a monitor of the
order in which the slot engine takes contributions. :meth:`SwitchTB.check`
replays everything sent into :class:`~inagg.models.switch.ModelSwitch` in
that order and compares every frame, byte for byte (results and reflected Mode II ACKs each in the model's
order), and every counter. :class:`MgmtSwitchTB` is the same for a top built
with a management port: the host library's management session configures
it through frames, and its responses are compared with the model bridge's.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque

import cocotb
from cocotb.clock import Clock
from cocotb.simtime import get_sim_time
from cocotb.task import resume
from cocotb.triggers import ClockCycles, RisingEdge, gather
from cocotbext.axi import AxiLiteBus, AxiLiteMaster, AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource

from inagg.host.mgmt import MgmtBus, MgmtSession
from inagg.models import regmap as rm
from inagg.models.job import JobSpec, SwitchSpec
from inagg.models.mgmt import MgmtBridge
from inagg.models.protocol import Counter
from inagg.models.switch import ModelSwitch
from inagg.testbench.mgmt import Registers, is_mgmt
from inagg.testbench.replay import DIVERTED, RESENT, SKIPPED, AckTaken, TimerRanOut, assert_frames_match, replay

__all__ = ["SwitchTB", "MgmtPort", "MgmtSwitchTB"]


class SwitchTB:
    """The switch top under test, driven through its AXI ports."""

    def __init__(self, dut, spec: SwitchSpec):
        self.dut = dut
        self.spec = spec
        self.ports = spec.ports
        cocotb.start_soon(Clock(dut.clk, 4, unit="ns").start())
        self.src = [AxiStreamSource(AxiStreamBus.from_prefix(dut, f"s{p}_axis"), dut.clk, dut.rst)
                    for p in range(self.ports)]
        self.snk = [AxiStreamSink(AxiStreamBus.from_prefix(dut, f"m{p}_axis"), dut.clk, dut.rst)
                    for p in range(self.ports)]
        self.axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axil"), dut.clk, dut.rst)
        for model in (*self.src, *self.snk, self.axil.write_if, self.axil.read_if):
            model.log.setLevel(logging.WARNING)  # they log every frame and access at INFO
        self.regmap: rm.RegMap | None = None
        self.model = ModelSwitch(spec)
        self.sent: dict[int, list[bytes]] = {p: [] for p in range(self.ports)}
        self.order: list = []
        self.received: dict[int, list[bytes]] = {p: [] for p in range(self.ports)}
        cocotb.start_soon(self._watch_order())
        for p in range(self.ports):
            cocotb.start_soon(self._collect(p))

    @classmethod
    async def start(cls, dut, spec: SwitchSpec, **kwargs) -> "SwitchTB":
        """The testbench of ``dut`` built for ``spec`` (``kwargs``: the class's own), after the switch's reset."""
        tb = cls(dut, spec, **kwargs)
        await tb.reset()
        return tb

    async def _watch_order(self) -> None:
        # A build with Mode III also says where ACKs and timers took effect, and which frames of its own
        # sent a result again (its arbiter's input after the ports and the exception path's).
        hop = getattr(self.dut, "hop_valid", None)
        resent = self.ports + (self.spec.exception is not None)
        while True:
            await RisingEdge(self.dut.clk)
            if hop is not None and hop.value:
                d = self.dut
                self.order.append(AckTaken(int(d.hop_port.value), bool(d.hop_gone.value)) if d.hop_ack.value
                                  else TimerRanOut(int(d.hop_job.value), int(d.hop_worker.value)))
            if self.dut.order_valid.value and hop is not None and int(self.dut.order_port.value) == resent:
                self.order.append(SKIPPED if self.dut.order_gone.value else RESENT)
            elif self.dut.order_valid.value:
                self.order.append(int(self.dut.order_port.value) | (DIVERTED if self.dut.order_diverted.value else 0))
            if self.dut.order_refused.value:
                self.order.append(self.ports)

    async def _collect(self, port: int) -> None:
        while True:
            frame = await self.snk[port].recv()
            self.received[port].append(bytes(frame.tdata))

    async def reset(self) -> None:
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 4)
        self.dut.rst.value = 0
        await ClockCycles(self.dut.clk, 2)

    async def read(self, addr: int) -> int:
        return await self.axil.read_dword(addr)

    async def write(self, addr: int, value: int) -> None:
        await self.axil.write_dword(addr, value)

    async def configure(self, jobs: list[JobSpec]) -> None:
        """Write the switch's addresses and ``jobs`` through AXI4-Lite, and install them in the model."""
        assert await self.read(rm.RegMap.switch("ID")) == rm.ID_VALUE
        geometry = await self.read(rm.RegMap.switch("JOBS"))
        modes = rm.RegMap.decode_modes(await self.read(rm.RegMap.switch("MODES")))
        self.regmap = dataclasses.replace(rm.RegMap.from_jobs(geometry), modes=modes)
        for addr, value in self.regmap.switch_writes(self.spec):
            await self.write(addr, value)
        for job in jobs:
            await self.add_job(job)

    async def add_job(self, job: JobSpec) -> None:
        for addr, value in self.regmap.job_writes(job, self.spec, (j.spec for j in self.model.jobs.values())):
            await self.write(addr, value)
        self.model.add_job(job)

    async def send(self, port: int, frame: bytes) -> None:
        """Queue ``frame`` on ``port`` (returns once the source took it)."""
        self.sent[port].append(frame)
        await self.src[port].send(AxiStreamFrame(frame))

    async def send_all(self, traffic: list[tuple[int, bytes]], paced: bool = False) -> None:
        """Send (port, frame) pairs, each port's in order, all ports at once.

        ``paced``: a port's next frame is queued only once its source has taken the one before from its queue,
        so frames that other coroutines send meanwhile (management requests) go in between.
        """
        async def one_port(p):
            for q, frame in traffic:
                if q == p:
                    while paced and self.src[p].queue_occupancy_frames:
                        await RisingEdge(self.dut.clk)
                    await self.send(p, frame)
        await gather(*[one_port(p) for p in range(self.ports)])

    async def counters(self) -> dict[Counter, int]:
        return {c: await self.read(rm.RegMap.counter(c)) for c in Counter}

    async def settle(self, quiet: int = 200, limit: int = 200_000) -> None:
        """Wait until every source is idle and no port has sent for ``quiet`` cycles."""
        for src in self.src:
            await src.wait()
        seen, still = -1, 0
        for _ in range(limit):
            await RisingEdge(self.dut.clk)
            now = sum(len(v) for v in self.received.values()) + len(self.order)
            busy = any(int(getattr(self.dut, f"m{p}_axis_tvalid").value) for p in range(self.ports))
            if now == seen and not busy:
                still += 1
                if still >= quiet:
                    return
            else:
                seen, still = now, 0
        raise AssertionError(f"the switch did not settle within {limit} cycles")

    async def check(self) -> dict[int, list[bytes]]:
        """Settle, then compare every output frame and every counter with the model; return the frames."""
        await self.settle()
        expect = replay(self.model, self.sent, self.order)
        assert_frames_match(self.received, expect)
        rtl = await self.counters()
        model = {c: self.model.counters[c] & 0xFFFFFFFF for c in Counter}
        diff = {c.name: (rtl[c], model[c]) for c in Counter if rtl[c] != model[c]}
        assert not diff, f"counters differ (rtl, model): {diff}"
        for snk in self.snk:
            assert snk.empty()
        return expect


class MgmtPort:
    """A testbench's side of a management port: the host library's :class:`~inagg.host.mgmt.MgmtBus` on it and
    one request and its response at a time, for a testbench with ``dut.clk``, ``mgmt_port``, ``sent``,
    ``send(port, frame)`` and ``_fresh``, the responses no receiver has taken yet, as they left the port."""

    exchange_cycles = 2000
    """Cycles :meth:`exchange` waits for a response."""

    @staticmethod
    def _response(frame: bytes) -> bytes:
        """A response as the session parses it (a testbench whose port gives the FCS too drops it here)."""
        return frame

    def requests(self) -> list[bytes]:
        """The management frames sent so far, in order, as the switch saw them."""
        return [f for f in self.sent[self.mgmt_port] if is_mgmt(f)]

    def bus(self, session: MgmtSession) -> MgmtBus:
        """A :class:`MgmtBus` of ``session`` on the management port, to be used from a bridge thread."""
        return MgmtBus(session, resume(self._send_request), resume(self._receive), clock=lambda: get_sim_time("sec"))

    async def _send_request(self, frame: bytes) -> None:
        await self.send(self.mgmt_port, frame)

    async def _receive(self, timeout: float) -> bytes | None:
        end = get_sim_time("sec") + timeout
        while not self._fresh and get_sim_time("sec") < end:
            await RisingEdge(self.dut.clk)
        return self._response(self._fresh.popleft()) if self._fresh else None

    async def exchange(self, frame: bytes, cycles: int | None = None) -> bytes:
        """Send ``frame`` on the management port and return the next response; AssertionError after ``cycles``
        (:attr:`exchange_cycles` if None)."""
        cycles = self.exchange_cycles if cycles is None else cycles
        await self.send(self.mgmt_port, frame)
        for _ in range(cycles):
            if self._fresh:
                return self._response(self._fresh.popleft())
            await RisingEdge(self.dut.clk)
        raise AssertionError(f"no management response within {cycles} cycles")


class MgmtSwitchTB(MgmtPort, SwitchTB):
    """:class:`SwitchTB` of a top built with a management port (``mgmt_port``, ``mgmt_key``).

    Frames of the management EtherType that the management port sends are
    responses: they are kept apart from the results, in :attr:`responses`.
    :meth:`bus` is the host library's :class:`~inagg.host.mgmt.MgmtBus` on
    that port, for blocking host code (``Controller`` through
    ``management_target``) run in a ``cocotb.task.bridge`` thread, with
    simulated seconds as its clock. Management frames go in as any frame
    (:meth:`send`), so the model switch counts them (``DROP_NON_ROCE``).
    :meth:`check` also feeds every management frame sent to
    :class:`~inagg.models.mgmt.MgmtBridge` over
    :class:`~inagg.testbench.mgmt.Registers` and compares its responses
    with the RTL's byte for byte, and the ``MGMT.*`` counters; a counter
    read through a frame reads the model switch's at the end, so read
    counters through frames only once the traffic has settled.
    """

    def __init__(self, dut, spec: SwitchSpec, *, port: int, key: bytes):
        self.mgmt_port, self.key = port, key
        self.responses: list[bytes] = []
        self._fresh: deque[bytes] = deque()  # responses no receiver has taken yet
        super().__init__(dut, spec)

    async def _collect(self, port: int) -> None:
        while True:
            frame = bytes((await self.snk[port].recv()).tdata)
            if port == self.mgmt_port and is_mgmt(frame):
                self.responses.append(frame)
                self._fresh.append(frame)
            else:
                self.received[port].append(frame)

    async def check(self) -> dict[int, list[bytes]]:
        expect = await super().check()
        regs = Registers(self.regmap, lambda: self.model.counters)
        bridge = MgmtBridge(self.key, regs.read, regs.write, self.regmap.addr_width)
        want = [r for r in (bridge.receive(f)[0] for f in self.requests()) if r is not None]
        for n, (g, w) in enumerate(zip(self.responses, want)):
            assert g == w, f"management response {n} differs from the model:\n  rtl   {g.hex()}\n  model {w.hex()}"
        assert len(self.responses) == len(want), f"RTL sent {len(self.responses)} responses, the model {len(want)}"
        stats = {name: await self.read(rm.RegMap.mgmt_stat(name)) for name in rm.MGMT_STATS}
        assert stats == bridge.counters, f"MGMT counters differ (rtl, model): {stats}, {bridge.counters}"
        return expect
