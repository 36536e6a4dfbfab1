"""The Ethernet MACs' counters in the switch's register map (issue 23): ``Switch(..., mac_ports=n)`` in the Amaranth
simulator, each counter's register reading its input, and a port without a MAC reading as absent registers do."""

import gc
import warnings

import pytest
from amaranth.hdl import UnusedElaboratable
from amaranth.sim import Simulator

from inagg.hdl.switch import Switch, check_parameters, generate_verilog
from inagg.models import regmap as rm
from inagg.testbench.axil_sim import axil_read

GEOMETRY = dict(ports=2, width=64, slots=16, chunk_bytes=256, jobs=1, workers=2)
SLVERR = 0b10


def _value(port: int, k: int, step: int) -> int:
    """A distinct 32-bit value for counter ``k`` of ``port``; ``step`` changes it, so a read sees its input now."""
    return (0x9E37_79B9 * (8 * port + k + 1) + step) & 0xFFFF_FFFF


@pytest.mark.parametrize("mac_ports", [1, 2])
def test_each_counter_reads_its_input(mac_ports):
    dut = Switch(**GEOMETRY, mac_ports=mac_ports)
    assert len(dut.mac_stats) == mac_ports
    got, want = {}, {}

    async def bench(ctx):
        for step in range(2):
            for p in range(mac_ports):
                for k, name in enumerate(rm.MAC_STATS):
                    ctx.set(getattr(dut.mac_stats[p], name), _value(p, k, step))
            for p in range(GEOMETRY["ports"] + 1):
                for k, name in enumerate(rm.MAC_STATS):
                    got[step, p, name] = await axil_read(ctx, dut.axil, rm.RegMap.mac_stat(p, name))
                    want[step, p, name] = (_value(p, k, step), 0) if p < mac_ports else (0, SLVERR)
            # The word after a port's counters is no register, on a port with a MAC too.
            got[step, "spare"] = await axil_read(ctx, dut.axil, rm.MAC_BASE + 4 * len(rm.MAC_STATS))
            want[step, "spare"] = (0, SLVERR)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert got == want


def test_without_macs_the_region_is_absent():
    """The default switch has no MAC counters: their registers answer SLVERR, as the management bridge's do on a
    switch without a bridge, and as an unmapped address does."""
    dut = Switch(**GEOMETRY)
    assert not hasattr(dut, "mac_stats")
    got = {}

    async def bench(ctx):
        for name in rm.MAC_STATS:
            got[name] = await axil_read(ctx, dut.axil, rm.RegMap.mac_stat(0, name))
        got["MGMT.accepted"] = await axil_read(ctx, dut.axil, rm.RegMap.mgmt_stat("accepted"))
        got["unmapped"] = await axil_read(ctx, dut.axil, 0x0F00)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert got == dict.fromkeys(got, (0, SLVERR))


def test_the_verilog_top_takes_each_counter():
    verilog = generate_verilog(**GEOMETRY, mac_ports=1)
    for name in rm.MAC_STATS:
        assert f"input [31:0] mac0_{name};" in verilog and f"mac1_{name}" not in verilog
    assert "mac0_" not in generate_verilog(**GEOMETRY)


@pytest.mark.parametrize("mac_ports, message", [
    (3, r"^MAC ports must be an integer in 0\.\.2, not 3$"),
    (-1, r"^MAC ports must be an integer in 0\.\.2, not -1$"),
    (True, r"^MAC ports must be an integer in 0\.\.2, not True$"),
])
def test_mac_ports_are_checked(mac_ports, message):
    with pytest.raises(ValueError, match=message):
        check_parameters(**GEOMETRY, mac_ports=mac_ports)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)  # the refused switch's parts are never elaborated
        with pytest.raises(ValueError, match=message):
            Switch(**GEOMETRY, mac_ports=mac_ports)
        gc.collect()
