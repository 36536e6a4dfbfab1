"""The whole board under cocotb: :class:`~inagg.hdl.board.BoardTop`'s switch and MACs with RGMII pins as ports.

:class:`BoardSimTop` wires the board top's switch (:func:`~inagg.hdl.board.board_switch`)
to two :class:`~inagg.hdl.rgmii.RGMIICore`\\ s through
:func:`~inagg.hdl.board.connect_macs`, as :class:`~inagg.hdl.board.BoardTop` does, and leaves out
what has no simulation model here: the ECP5 PLL (cocotb drives every clock)
and the IDDRX1F/ODDRX1F, modelled in flip-flops on both clock edges as the
MAC's RGMII top does (:func:`inagg.testbench.mac.ddr_pins`). Each port's
receive domain (``rx0``, ``rx1``) has its own clock, as each PHY's RXC on
the board.

:class:`BoardTB` drives it as a cable would: cocotbext-eth's
``RgmiiSource``/``RgmiiSink`` on each port's pins, the host library's
management session on the management port, and at the end every frame
that left a port, preamble stripped and FCS included, compared with the
model switch's and the model bridge's, in the order the RTL's slot engine
took the contributions (``order_*``, the switch's :attr:`~inagg.hdl.switch.Switch.order`).
"""

from __future__ import annotations

import logging
import struct
import zlib
from collections import deque

import cocotb
from amaranth import DomainRenamer, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge
from cocotbext.eth import GmiiFrame, RgmiiSink, RgmiiSource

from inagg.hdl.board import board_switch, connect_macs
from inagg.hdl.mac import MIN_FRAME
from inagg.hdl.rgmii import RGMIICore
from inagg.hdl.switch import Switch
from inagg.models import regmap as rm
from inagg.models.job import SwitchSpec
from inagg.models.mgmt import MgmtBridge
from inagg.models.switch import ModelSwitch
from inagg.testbench import sim
from inagg.testbench.mac import ddr_pins, falling_edge
from inagg.testbench.mgmt import Registers, is_mgmt
from inagg.testbench.replay import DIVERTED, assert_frames_match, replay
from inagg.testbench.switch_tb import MgmtPort

__all__ = ["BOARD_TOPLEVEL", "BoardSimTop", "build_board", "wire_frame", "BoardTB"]

BOARD_TOPLEVEL = "inagg_board"


class BoardSimTop(wiring.Component):
    """A board top's ``switch`` (:func:`~inagg.hdl.board.board_switch`) behind two RGMII MACs whose DDR pins are
    flip-flops, for Verilator.

    Ports: ``rgmii{p}_rxd``/``rgmii{p}_rx_ctl`` in and ``rgmii{p}_txd``/``rgmii{p}_tx_ctl``
    out for each port ``p``; the clocks and resets ``clk``/``rst`` (the
    switch's ``sync``), ``tx_clk``/``tx_rst`` and ``rx{p}_clk``/``rx{p}_rst``;
    ``order_valid``/``order_port``/``order_diverted``. The MACs' counters are
    read in the register map, as on the board.
    """

    def __init__(self, switch: Switch):
        self.switch = sw = switch
        self.cores = [RGMIICore(sw.width) for _ in range(sw.ports)]
        members = {"order_valid": Out(1), "order_port": Out(len(sw.order.p.port)), "order_diverted": Out(1)}
        for p in range(sw.ports):
            members.update({f"rgmii{p}_rxd": In(4), f"rgmii{p}_rx_ctl": In(1),
                            f"rgmii{p}_txd": Out(4), f"rgmii{p}_tx_ctl": Out(1)})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        sw = self.switch
        connect_macs(m, sw, [DomainRenamer({"rx": f"rx{p}"})(core) for p, core in enumerate(self.cores)])
        falling_edge(m, "tx")
        for p, core in enumerate(self.cores):
            falling_edge(m, f"rx{p}")
            ddr_pins(m, core, (getattr(self, f"rgmii{p}_rxd"), getattr(self, f"rgmii{p}_rx_ctl")),
                     (getattr(self, f"rgmii{p}_txd"), getattr(self, f"rgmii{p}_tx_ctl")), rx=f"rx{p}")
        m.d.comb += [self.order_valid.eq(sw.order.valid), self.order_port.eq(sw.order.p.port),
                     self.order_diverted.eq(sw.order.p.diverted)]
        return m


def _top(*, board: str, mgmt_key: str, mgmt_port: int, **switch) -> BoardSimTop:
    return BoardSimTop(board_switch(board, mgmt_key=bytes.fromhex(mgmt_key), mgmt_port=mgmt_port, **switch))


def build_board(board: str, *, mgmt_key: str, mgmt_port: int = 0, **switch) -> sim.Build:
    """Verilate :class:`BoardSimTop` of ``board_switch(board, ...)`` (``mgmt_key`` in hex: parameters are JSON)."""
    return sim.build("board", dict(board=board, mgmt_key=mgmt_key, mgmt_port=mgmt_port, **switch), _top,
                     toplevel=BOARD_TOPLEVEL, public=sim.Public(), optimize=["-O2"])


def wire_frame(frame: bytes) -> bytes:
    """``frame`` as a MAC sends it after the preamble: padded to 60 bytes, its FCS appended."""
    frame = frame.ljust(MIN_FRAME - 4, b"\0")
    return frame + struct.pack("<L", zlib.crc32(frame))


class BoardTB(MgmtPort):
    """:class:`BoardSimTop` on its pins: clocks, resets, a PHY model per port, the management bus, the models.

    Clocks: each port's receive clock and the transmit clock at 125 MHz, but
    each a little off the others (as three crystals are), and the switch's
    at ``sync_ps``, so every ``AsyncFIFO`` of the MACs crosses between
    unrelated clocks. :attr:`sent` holds each port's frames as the switch
    sees them (padded, without FCS), :attr:`wire` every frame each port sent
    as it left the pins (FCS included), :attr:`order` the slot engine's order.
    """

    RX_PS = (8000, 8008)  # port 0 at 125 MHz, port 1 0.1 % slower
    TX_PS = 7992
    exchange_cycles = 20_000

    @staticmethod
    def _response(frame: bytes) -> bytes:
        return frame[:-4]  # the session's parser takes no FCS

    def __init__(self, dut, spec: SwitchSpec, *, port: int, key: bytes, sync_ps: int):
        self.dut, self.spec, self.ports, self.mgmt_port, self.key = dut, spec, spec.ports, port, key
        cocotb.start_soon(Clock(dut.clk, sync_ps, unit="ps").start())
        cocotb.start_soon(Clock(dut.tx_clk, self.TX_PS, unit="ps").start())
        self.phy_in, self.phy_out = [], []
        for p in range(self.ports):
            rx_clk = getattr(dut, f"rx{p}_clk")
            cocotb.start_soon(Clock(rx_clk, self.RX_PS[p], unit="ps").start())
            self.phy_in.append(RgmiiSource(getattr(dut, f"rgmii{p}_rxd"), getattr(dut, f"rgmii{p}_rx_ctl"), rx_clk,
                                           getattr(dut, f"rx{p}_rst")))
            self.phy_out.append(RgmiiSink(getattr(dut, f"rgmii{p}_txd"), getattr(dut, f"rgmii{p}_tx_ctl"),
                                          dut.tx_clk, dut.tx_rst))
        for model in (*self.phy_in, *self.phy_out):
            model.log.setLevel(logging.WARNING)  # they log every frame in full
        self.model = ModelSwitch(spec)
        self.regmap: rm.RegMap | None = None
        self.sent: dict[int, list[bytes]] = {p: [] for p in range(self.ports)}
        self.wire: dict[int, list[bytes]] = {p: [] for p in range(self.ports)}
        self.order: list[int] = []
        self._fresh: deque[bytes] = deque()  # management responses no receiver has taken yet
        cocotb.start_soon(self._watch_order())
        for p in range(self.ports):
            cocotb.start_soon(self._collect(p))

    @classmethod
    async def start(cls, dut, spec: SwitchSpec, **kwargs) -> BoardTB:
        tb = cls(dut, spec, **kwargs)
        resets = [dut.rst, dut.tx_rst, *(getattr(dut, f"rx{p}_rst") for p in range(tb.ports))]
        for rst in resets:
            rst.value = 1
        await ClockCycles(dut.clk, 10)
        for rst in resets:
            rst.value = 0
        await ClockCycles(dut.clk, 10)
        return tb

    async def _watch_order(self) -> None:
        while True:
            await RisingEdge(self.dut.clk)
            if self.dut.order_valid.value:
                self.order.append(int(self.dut.order_port.value) | (DIVERTED if self.dut.order_diverted.value else 0))

    async def _collect(self, port: int) -> None:
        while True:
            got = await self.phy_out[port].recv()
            assert got.get_preamble() == b"\x55" * 7 + b"\xd5" and got.error is None
            frame = bytes(got.get_payload(strip_fcs=False))
            self.wire[port].append(frame)
            if port == self.mgmt_port and is_mgmt(frame):
                self._fresh.append(frame)

    async def send(self, port: int, frame: bytes) -> None:
        """Send ``frame`` (without FCS) into ``port``'s pins; returns once the PHY model took it."""
        self.sent[port].append(frame.ljust(MIN_FRAME - 4, b"\0"))  # the MAC passes the padding on
        await self.phy_in[port].send(GmiiFrame.from_payload(frame))

    async def send_raw(self, port: int, frame: GmiiFrame) -> None:
        """Send a frame as built (a bad FCS, a runt) that the MAC is to drop: not one the switch sees."""
        await self.phy_in[port].send(frame)

    def responses(self) -> list[bytes]:
        return [f for f in self.wire[self.mgmt_port] if is_mgmt(f)]

    async def settle(self, quiet: int = 2000, limit: int = 400_000) -> None:
        """Wait until every PHY model is idle and no port has sent for ``quiet`` transmit cycles."""
        for src in self.phy_in:
            await src.wait()
        seen, still = -1, 0
        for _ in range(limit):
            await RisingEdge(self.dut.tx_clk)
            now = sum(map(len, self.wire.values())) + len(self.order)
            if now == seen and all(s.idle() for s in self.phy_out):
                still += 1
                if still >= quiet:
                    return
            else:
                seen, still = now, 0
        raise AssertionError(f"the board did not settle within {limit} cycles")

    async def check(self) -> None:
        """Settle; every frame on the wire equals the model switch's or the model bridge's, FCS included."""
        await self.settle()
        results = replay(self.model, self.sent, self.order)
        got = {p: [f[:-4] for f in frames if not (p == self.mgmt_port and is_mgmt(f))]
               for p, frames in self.wire.items()}
        assert_frames_match(got, results)
        for p, frames in self.wire.items():
            data = [f for f in frames if not (p == self.mgmt_port and is_mgmt(f))]
            assert data == [wire_frame(f) for f in got[p]], f"port {p}: a result's padding or FCS is wrong"
        regs = Registers(self.regmap, lambda: self.model.counters)
        bridge = MgmtBridge(self.key, regs.read, regs.write, self.regmap.addr_width)
        want = [wire_frame(r) for r in (bridge.receive(f)[0] for f in self.requests()) if r is not None]
        responses = self.responses()
        for n, (g, w) in enumerate(zip(responses, want)):
            assert g == w, f"management response {n} differs from the model:\n  rtl   {g.hex()}\n  model {w.hex()}"
        assert len(responses) == len(want), f"the board sent {len(responses)} responses, the model {len(want)}"
        self.bridge = bridge
