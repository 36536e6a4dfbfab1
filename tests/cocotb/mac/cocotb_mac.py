"""cocotb tests of a MAC top (run by test_mac.py): frames in on GMII or RGMII out on the stream, and back.

Each test compares every frame that comes out with the frames sent, checks
the counters, and ends with nothing left in flight.
"""

from __future__ import annotations

import logging
import random
import struct
import zlib

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource
from cocotbext.eth import GmiiFrame, GmiiSink, GmiiSource, RgmiiSink, RgmiiSource

from inagg.hdl.mac import IFG, MAX_FRAME, MIN_FRAME
from inagg.testbench.sim import parameters, stimulus

PARAMS = {**parameters(), **stimulus()}
PERIOD_PS = 8000  # 125 MHz
TX_PERIOD_PS = PERIOD_PS - 8  # 0.1 % off the receive clock
SIZES = [60, 61, 62, 63, 64, 65, 100, 127, 128, 255, 256, 512, 1000, 1514, 1517, 1518]  # without FCS


class TB:
    """Clocks, resets, the PHY models on GMII and the switch's stream models."""

    def __init__(self, dut):
        self.dut = dut
        cocotb.start_soon(Clock(dut.rx_clk, PERIOD_PS, unit="ps").start())
        cocotb.start_soon(Clock(dut.tx_clk, TX_PERIOD_PS, unit="ps").start())
        cocotb.start_soon(Clock(dut.clk, 6400 if PARAMS["width"] == 64 else 13_000, unit="ps").start())
        if PARAMS["phy"] == "gmii":
            self.phy_in = GmiiSource(dut.gmii_rxd, dut.gmii_rx_er, dut.gmii_rx_dv, dut.rx_clk, dut.rx_rst)
            self.phy_out = GmiiSink(dut.gmii_txd, dut.gmii_tx_er, dut.gmii_tx_en, dut.tx_clk, dut.tx_rst)
        else:
            self.phy_in = RgmiiSource(dut.rgmii_rxd, dut.rgmii_rx_ctl, dut.rx_clk, dut.rx_rst)
            self.phy_out = RgmiiSink(dut.rgmii_txd, dut.rgmii_tx_ctl, dut.tx_clk, dut.tx_rst)
        self.received = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis"), dut.clk, dut.rst)
        self.to_send = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis"), dut.clk, dut.rst)
        for model in (self.phy_in, self.phy_out, self.received, self.to_send):
            model.log.setLevel(logging.WARNING)  # they log every frame in full

    @classmethod
    async def start(cls, dut) -> TB:
        tb = cls(dut)
        for rst in (dut.rx_rst, dut.tx_rst, dut.rst):
            rst.value = 1
        await ClockCycles(dut.clk, 10)
        for rst in (dut.rx_rst, dut.tx_rst, dut.rst):
            rst.value = 0
        await ClockCycles(dut.clk, 10)
        return tb

    def counters(self) -> dict[str, int]:
        names = ("rx_good", "rx_fcs_errors", "rx_runts", "rx_long", "rx_overflow", "tx_frames", "tx_long")
        return {name: int(getattr(self.dut, name).value) for name in names}

    async def settle(self):
        """Wait until both PHY models are idle and the counters have crossed into the switch's clock."""
        await self.phy_in.wait()
        while not self.phy_out.idle() or self.to_send.count():
            await ClockCycles(self.dut.tx_clk, 100)
        await ClockCycles(self.dut.clk, 3000)  # the receive buffer's latency is one longest frame


def payload(n: int, rng: random.Random) -> bytes:
    return rng.randbytes(n)


def bad_fcs(frame: bytes) -> GmiiFrame:
    return GmiiFrame.from_raw_payload(frame + struct.pack("<L", zlib.crc32(frame) ^ 1))


@cocotb.test()
async def receive_back_to_back(dut):
    """Frames of 64 to 1,522 bytes back to back at line rate (the 12-byte gap) arrive whole and in order."""
    tb = await TB.start(dut)
    rng = random.Random(PARAMS["seed"])
    frames = [payload(n, rng) for n in SIZES * 2]
    for frame in frames:
        await tb.phy_in.send(GmiiFrame.from_payload(frame))
    for frame in frames:
        got = await tb.received.recv()
        assert bytes(got.tdata) == frame
    await tb.settle()
    assert tb.received.empty()
    assert tb.counters()["rx_good"] == len(frames)
    assert tb.counters()["rx_overflow"] == 0


@cocotb.test()
async def receive_drops_bad_frames(dut):
    """Bad FCS, RX_ER, runts and over-long frames among good ones, random idle gaps: only the good pass."""
    tb = await TB.start(dut)
    rng = random.Random(PARAMS["seed"] + 1)
    before = tb.counters()
    expect, good = {"rx_good": 0, "rx_fcs_errors": 0, "rx_runts": 0, "rx_long": 0}, []
    for i in range(60):
        kind = rng.choice(["good", "good", "fcs", "er", "runt", "long"])
        n = {"runt": rng.randint(0, MIN_FRAME - 5), "long": rng.randint(MAX_FRAME - 3, 2500)}.get(
            kind, rng.choice(SIZES))
        frame = payload(n, rng)
        if kind == "fcs":
            gf = bad_fcs(frame)
        else:
            gf = GmiiFrame.from_payload(frame, min_len=0)
            if kind == "er":
                gf.error = [0] * len(gf.data)
                gf.error[rng.randrange(8, len(gf.data))] = 1
        expect[{"good": "rx_good", "fcs": "rx_fcs_errors", "er": "rx_fcs_errors", "runt": "rx_runts",
                "long": "rx_long"}[kind]] += 1
        if kind == "good":
            good.append(frame)
        # The gap after each frame: from the shortest a PHY may hand over to a few frame times.
        gf.tx_complete = lambda _frame: setattr(tb.phy_in, "ifg", rng.choice([1, 2, 12, rng.randint(1, 3000)]))
        await tb.phy_in.send(gf)
    for frame in good:
        got = await tb.received.recv()
        assert bytes(got.tdata) == frame
    await tb.settle()
    assert tb.received.empty()
    after = tb.counters()
    assert {k: after[k] - before[k] for k in expect} == expect
    assert after["rx_overflow"] == before["rx_overflow"]


@cocotb.test()
async def transmit(dut):
    """Frames from the switch leave with preamble, padding to 64 bytes, FCS and at least the 12-byte gap."""
    tb = await TB.start(dut)
    rng = random.Random(PARAMS["seed"] + 2)
    before = tb.counters()
    frames = [payload(n, rng) for n in [1, 14, 59] + SIZES + [1519, 3000, 60]]
    for frame in frames:
        await tb.to_send.send(AxiStreamFrame(frame))
    sent = [f for f in frames if len(f) <= MAX_FRAME - 4]
    times = []
    for frame in sent:
        got = await tb.phy_out.recv()
        # GmiiSink keeps the preamble from its second byte on, RgmiiSink all of it; their times count all eight.
        assert got.get_preamble() == b"\x55" * (6 if PARAMS["phy"] == "gmii" else 7) + b"\xd5"
        assert round((got.sim_time_sfd - got.sim_time_start) / TX_PERIOD_PS) == 8
        assert got.check_fcs()
        assert got.get_payload() == frame + bytes(max(0, MIN_FRAME - 4 - len(frame)))
        assert got.error is None
        times.append((got.sim_time_start, got.sim_time_end))
    await tb.settle()
    assert tb.phy_out.empty()
    # sim_time_end is the first idle cycle, sim_time_start the first busy one.
    gaps = [round((start - end) / TX_PERIOD_PS) for (_, end), (start, _) in zip(times, times[1:])]
    assert min(gaps) == IFG  # never shorter, and back to back at line rate
    after = tb.counters()
    assert after["tx_frames"] - before["tx_frames"] == len(sent)
    assert after["tx_long"] - before["tx_long"] == len(frames) - len(sent)


@cocotb.test()
async def receive_overflow_is_counted(dut):
    """With the switch not taking frames, the receive buffer fills and later frames are counted as lost."""
    tb = await TB.start(dut)
    rng = random.Random(PARAMS["seed"] + 3)
    before = tb.counters()
    tb.received.pause = True
    frames = [payload(1000, rng) for _ in range(12)]
    for frame in frames:
        await tb.phy_in.send(GmiiFrame.from_payload(frame))
    await tb.phy_in.wait()
    await ClockCycles(dut.rx_clk, 2000)
    tb.received.pause = False
    got = []
    await ClockCycles(dut.rx_clk, 20_000)
    while not tb.received.empty():
        got.append(bytes((await tb.received.recv()).tdata))
    after = tb.counters()
    lost = after["rx_overflow"] - before["rx_overflow"]
    # What came out is the first frames, each whole; the lost ones never appear, and each frame counts once.
    assert lost > 0 and got == frames[:len(got)] and len(got) + lost == len(frames)
    assert after["rx_good"] - before["rx_good"] == len(got)
    await RisingEdge(dut.clk)
