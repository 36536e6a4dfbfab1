"""The RGMII layer: the nibble (de)serialiser in the Amaranth simulator, the DDR pins elaborated for the ECP5."""

import random

from amaranth import ClockDomain, ClockSignal, Elaboratable, Module, ResetSignal
from amaranth.build import Attrs, Pins, Resource, Subsignal
from amaranth.lib import io, wiring
from amaranth.sim import Simulator

from inagg.hdl.rgmii import RGMII, RGMIIRxDecoder, RGMIITxEncoder
from inagg.hdl.synth.ecp5 import ECP5Platform


def test_encoder_then_decoder_is_gmii_again():
    m = Module()
    m.submodules.enc, m.submodules.dec = enc, dec = RGMIITxEncoder(), RGMIIRxDecoder()
    m.d.comb += [dec.rise.eq(enc.rise), dec.fall.eq(enc.fall)]
    rng = random.Random(1)
    cases = [(rng.randrange(256), en, er) for en in (0, 1) for er in (0, 1) for _ in range(20)]

    async def bench(ctx):
        for data, en, er in cases:
            ctx.set(enc.gmii.data, data)
            ctx.set(enc.gmii.en, en)
            ctx.set(enc.gmii.er, er)
            # RGMII v2.0: low nibble and EN at the rising edge, high nibble and EN xor ER at the falling edge.
            assert ctx.get(enc.rise) == (data & 0xF) | en << 4
            assert ctx.get(enc.fall) == (data >> 4) | (en ^ er) << 4
            assert (ctx.get(dec.gmii.data), ctx.get(dec.gmii.en), ctx.get(dec.gmii.er)) == (data, en, er)

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()


class _Board(Elaboratable):
    """An RGMII port and a 125 MHz clock on an ECP5, for elaboration only (the pin names are placeholders)."""

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = ClockDomain("sync")
        m.domains.tx = ClockDomain("tx")
        m.submodules.clk = clk = io.Buffer("i", platform.request("clk", 0, dir="-"))
        m.d.comb += [ClockSignal("sync").eq(clk.i), ClockSignal("tx").eq(clk.i),
                     ResetSignal("tx").eq(ResetSignal("sync"))]
        m.submodules.rgmii = rgmii = RGMII(platform.request("eth_rgmii", 0, dir="-"))
        wiring.connect(m, rgmii.m, rgmii.s)  # loop back, so nothing is optimized away
        return m


def test_rgmii_uses_the_ecp5_ddr_primitives():
    platform = ECP5Platform(clock_mhz=125)
    platform.add_resources([Resource("eth_rgmii", 0,
                                     Subsignal("rx_clk", Pins("B1", dir="i")), Subsignal("rx_ctl", Pins("C1", dir="i")),
                                     Subsignal("rx_data", Pins("D1 E1 F1 G1", dir="i")),
                                     Subsignal("tx_clk", Pins("B2", dir="o")), Subsignal("tx_ctl", Pins("C2", dir="o")),
                                     Subsignal("tx_data", Pins("D2 E2 F2 G3", dir="o")),
                                     Attrs(IO_TYPE="LVCMOS33"))])
    plan = platform.prepare(_Board(), name="top")
    text = plan.files["top.il"]
    # Five receive pins into IDDRX1F, ten transmit pins (data, control, clock) out of ODDRX1F.
    assert text.count("cell \\IDDRX1F") == 5
    assert text.count("cell \\ODDRX1F") == 6
