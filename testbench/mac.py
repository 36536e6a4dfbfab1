"""The MAC's Verilator tops: on GMII (:class:`~inagg.hdl.mac.MACTop`) and on RGMII with DDR pins modelled in logic.

The ECP5's DDR primitives (what :class:`~inagg.hdl.rgmii.RGMII` becomes)
have no simulation model here, so :class:`RGMIISimTop` stands in for them
with flip-flops on both clock edges: the receive pins are sampled at the
rising and at the falling edge and handed over together, and each transmit
pin changes at the edge *before* the one it is read at, which is what a PHY
sees of an ODDRX1F with its clock forwarded 90 degrees late. The RGMII
(de)serialiser and the MAC behind it are the gateware's own.
"""

from __future__ import annotations

from amaranth import Cat, ClockDomain, ClockSignal, Module, ResetSignal, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from inagg.hdl.mac import MACTop, connect_flat, flat_members
from inagg.hdl.rgmii import RGMIICore
from inagg.testbench import sim

__all__ = ["PHYS", "RGMIISimTop", "falling_edge", "ddr_pins", "build_mac"]

PHYS = ("gmii", "rgmii")


class RGMIISimTop(wiring.Component):
    """:class:`~inagg.hdl.rgmii.RGMIICore` with ports ``rgmii_rxd/rx_ctl``, ``rgmii_txd/tx_ctl`` and :func:`flat_members`.

    For cocotbext-eth's ``RgmiiSource``/``RgmiiSink`` on ``rx_clk``/``tx_clk``.
    """

    def __init__(self, width: int = 64, **params):
        self.core = RGMIICore(width, **params)
        super().__init__({"rgmii_rxd": In(4), "rgmii_rx_ctl": In(1), "rgmii_txd": Out(4), "rgmii_tx_ctl": Out(1),
                          **flat_members(width, self.core.mac.counter_width)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.core = core = self.core
        connect_flat(m, self, core)
        for domain in ("rx", "tx"):
            falling_edge(m, domain)
        ddr_pins(m, core, (self.rgmii_rxd, self.rgmii_rx_ctl), (self.rgmii_txd, self.rgmii_tx_ctl))
        return m


def falling_edge(m: Module, domain: str) -> None:
    """Add ``<domain>_fall`` to ``m``: ``domain``'s clock and reset, its flip-flops clocked on the falling edge."""
    m.domains += ClockDomain(f"{domain}_fall", clk_edge="neg", local=True)
    m.d.comb += [ClockSignal(f"{domain}_fall").eq(ClockSignal(domain)),
                 ResetSignal(f"{domain}_fall").eq(ResetSignal(domain))]


def ddr_pins(m: Module, core, rx_pins: tuple, tx_pins: tuple, *, rx: str = "rx", tx: str = "tx") -> None:
    """The DDR pins of :class:`~inagg.hdl.rgmii.RGMIICore` ``core`` in flip-flops on both edges of ``rx`` and ``tx``.

    ``rx_pins`` is (data, ctl) in, ``tx_pins`` (data, ctl) out; the
    ``<domain>_fall`` domains must exist (:func:`falling_edge`).
    """
    # Receive: the rising edge's sample waits for the falling edge's, and both go in at the next rising edge.
    pins, rise, fall = Cat(*rx_pins), Signal(5, name=f"{rx}_rise_pins"), Signal(5, name=f"{rx}_fall_pins")
    m.d[rx] += [rise.eq(pins), core.rx_rise.eq(rise), core.rx_fall.eq(fall)]
    m.d[f"{rx}_fall"] += fall.eq(pins)
    # Transmit: two flip-flops whose XOR is the pin; the falling edge sets it to the rising half, the rising
    # edge to the falling half of the cycle before, so the pin never changes at the edge a PHY samples it.
    p, n = Signal(5, name=f"{tx}_p_pins"), Signal(5, name=f"{tx}_n_pins")
    m.d[f"{tx}_fall"] += n.eq(core.tx_rise ^ p)
    m.d[tx] += p.eq(core.tx_fall ^ n)
    m.d.comb += Cat(*tx_pins).eq(p ^ n)


def _top(width: int, phy: str):
    return (MACTop if phy == "gmii" else RGMIISimTop)(width)


def build_mac(width: int, phy: str) -> sim.Build:
    """Verilate the MAC top at ``width`` on ``phy`` (one of :data:`PHYS`)."""
    if phy not in PHYS:
        raise ValueError(f"PHY interface must be one of {PHYS}, not {phy!r}")
    return sim.build("mac", dict(width=width, phy=phy), _top, toplevel="inagg_mac", optimize=["-O2"])
