"""Board tops: the switch with its management bridge behind two RGMII MACs, on an ECP5 board of amaranth-boards.

::

    clk (board oscillator) -> ECP5PLL -+-> tx   (125 MHz: the MACs' transmit clock, forwarded on TXC)
                                       \\-> sync (the switch's clock, 50 MHz by default)
    eth_rgmii 0 <-> RGMII (rx0 on RXC) <-> Switch port 0 (management bridge: mgmt_port)
    eth_rgmii 1 <-> RGMII (rx1 on RXC) <-> Switch port 1

Each MAC crosses between its PHY's receive clock, ``tx`` and ``sync`` in
its own ``AsyncFIFO``\\ s (``docs/board.md``, "The MAC"), so the switch's
clock is free: it must carry line rate at its width (two ports of 1 Gb/s
into one slot engine: 2 x 125 MHz x 8 / W, 31.25 MHz at W = 64), and a
slower one leaves the small devices timing to spare. Pins, clocks and LEDs
come from the board's amaranth-boards platform (:data:`BOARDS`); nothing
here names a pin.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from fractions import Fraction
from types import SimpleNamespace

from amaranth import ClockDomain, ClockSignal, Instance, Module, Signal
from amaranth.build import DiffPairs, Pins, Resource, ResourceError, Subsignal
from amaranth.lib import io, wiring
from amaranth.lib.cdc import ResetSynchronizer
from amaranth.lib.wiring import In, Out

from inagg.hdl.mac import COUNTERS
from inagg.hdl.rgmii import RGMII
from inagg.hdl.switch import Switch

__all__ = ["Board", "BOARDS", "board", "pll_dividers", "ECP5PLL", "board_switch", "connect_macs", "BoardTop", "TX_HZ"]

#: The RGMII transmit clock at 1 Gb/s.
TX_HZ = 125_000_000


@dataclass(frozen=True)
class Board:
    """A board the tops are built for.

    Attributes
    ----------
    name : str
        Its name on the command line.
    platform : str
        Its amaranth-boards platform, ``"module:Class"`` in ``amaranth_boards``.
    switch : dict
        The :class:`~inagg.hdl.switch.Switch` keywords (``ports`` aside: a
        board has two) of its default build, sized to the device.
    sync_hz : int
        The switch's clock by default.
    cable : str
        The ``openFPGALoader --cable`` of the usual JTAG adapter.
    ecpprog : bool
        Whether ``ecpprog`` reaches the board (an FT2232H on the board).
    """

    name: str
    platform: str
    switch: dict = field(hash=False)
    sync_hz: int
    cable: str
    ecpprog: bool

    def make_platform(self):
        """A new instance of the board's amaranth-boards platform."""
        module, cls = self.platform.split(":")
        return getattr(importlib.import_module(f"amaranth_boards.{module}"), cls)()


BOARDS = {b.name: b for b in (
    # LFE5U-25F (24,288 LUT4): the P=2 W=64 switch with four jobs of eight workers and the bridge took 23,277
    # LUT4 alone on the 85F (docs/results/synth.md), so this build holds one job of up to four workers, the
    # demo's default (docs/board.md); docs/results/synth.md has its figures. No FTDI on the board: an external
    # JTAG adapter on its J27 header, the FT232H of amaranth-boards' own programming command.
    Board("colorlight-5a75b", "colorlight_5a75b_r7_0:Colorlight_5A75B_R70Platform",
          dict(width=64, slots=64, chunk_bytes=256, jobs=1, workers=4), 50_000_000, "ft232", False),
    # LFE5UM-45F (43,848 LUT4): the switch rows' P=2 W=64 configuration whole. Its USB port is an FT2232H.
    Board("versa-ecp5", "versa_ecp5:VersaECP5Platform",
          dict(width=64, slots=64, chunk_bytes=256, jobs=4, workers=8), 50_000_000, "ft2232", True),
)}


def board(name: str) -> Board:
    """The board called ``name``; ``ValueError`` listing the boards otherwise."""
    if name not in BOARDS:
        raise ValueError(f"Board must be one of {', '.join(BOARDS)}, not {name!r}")
    return BOARDS[name]


# ECP5 sysCLOCK PLL limits (Lattice TN1263 / the ECP5 data sheet): phase detector and VCO frequency, divider ranges.
_PFD_HZ = (3_125_000, 400_000_000)
_VCO_HZ = (400_000_000, 800_000_000)
_CLKI_DIV, _CLKFB_DIV, _OUT_DIV = range(1, 129), range(1, 81), range(1, 129)


def pll_dividers(f_in: int, f_op: int, f_os: int) -> dict[str, int]:
    """Dividers of an EHXPLLL that make exactly ``f_op`` on CLKOP (its feedback) and ``f_os`` on CLKOS from ``f_in``.

    Returns ``CLKI_DIV``, ``CLKFB_DIV``, ``CLKOP_DIV``, ``CLKOS_DIV``, the
    first set found with the VCO highest (least jitter); ``ValueError`` when
    no set makes both frequencies exactly.
    """
    best = None
    for clki in _CLKI_DIV:
        pfd = Fraction(f_in, clki)
        if not _PFD_HZ[0] <= pfd <= _PFD_HZ[1]:
            continue
        fb = Fraction(f_op) / pfd
        if fb.denominator != 1 or fb.numerator not in _CLKFB_DIV:
            continue
        for op in _OUT_DIV:
            vco = f_op * op
            if not _VCO_HZ[0] <= vco <= _VCO_HZ[1] or vco % f_os or vco // f_os not in _OUT_DIV:
                continue
            if best is None or vco > best[0]:
                best = (vco, dict(CLKI_DIV=clki, CLKFB_DIV=fb.numerator, CLKOP_DIV=op, CLKOS_DIV=vco // f_os))
    if best is None:
        raise ValueError(f"No ECP5 PLL setting makes {f_op / 1e6:g} MHz and {f_os / 1e6:g} MHz from "
                         f"{f_in / 1e6:g} MHz exactly")
    return best[1]


class ECP5PLL(wiring.Component):
    """An ECP5 EHXPLLL: ``clk_op`` (its feedback) and ``clk_os`` from ``clk_in``, both at phase 0.

    Parameters
    ----------
    f_in, f_op, f_os : int
        Frequencies in Hz (:func:`pll_dividers`).

    Members
    -------
    clk_in : In(1)
    clk_op, clk_os : Out(1)
    locked : Out(1)
        Both outputs run at their frequencies.
    """

    def __init__(self, f_in: int, f_op: int, f_os: int):
        self.f_in, self.f_op, self.f_os = f_in, f_op, f_os
        self.dividers = pll_dividers(f_in, f_op, f_os)
        super().__init__({"clk_in": In(1), "clk_op": Out(1), "clk_os": Out(1), "locked": Out(1)})

    def elaborate(self, platform):
        m = Module()
        d = self.dividers
        # A coarse phase of DIV - 1 VCO cycles is phase 0 (the convention of Lattice's own PLL generator).
        m.submodules.pll = Instance(
            "EHXPLLL",
            p_CLKI_DIV=d["CLKI_DIV"], p_CLKFB_DIV=d["CLKFB_DIV"], p_FEEDBK_PATH="CLKOP",
            p_CLKOP_ENABLE="ENABLED", p_CLKOP_DIV=d["CLKOP_DIV"], p_CLKOP_CPHASE=d["CLKOP_DIV"] - 1,
            p_CLKOP_FPHASE=0,
            p_CLKOS_ENABLE="ENABLED", p_CLKOS_DIV=d["CLKOS_DIV"], p_CLKOS_CPHASE=d["CLKOS_DIV"] - 1,
            p_CLKOS_FPHASE=0,
            p_OUTDIVIDER_MUXA="DIVA", p_OUTDIVIDER_MUXB="DIVB", p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED",
            p_STDBY_ENABLE="DISABLED", p_DPHASE_SOURCE="DISABLED",
            i_CLKI=self.clk_in, i_CLKFB=self.clk_op, i_RST=0, i_STDBY=0, i_PHASESEL0=0, i_PHASESEL1=0,
            i_PHASEDIR=0, i_PHASESTEP=0, i_PHASELOADREG=0, i_PLLWAKESYNC=0, i_ENCLKOP=0, i_ENCLKOS=0,
            o_CLKOP=self.clk_op, o_CLKOS=self.clk_os, o_LOCK=self.locked)
        if platform is not None:
            platform.add_clock_constraint(self.clk_op, self.f_op)
            platform.add_clock_constraint(self.clk_os, self.f_os)
        return m


def _rgmii_pins(pins) -> SimpleNamespace:
    """An ``eth_rgmii`` resource's RGMII pins under :class:`~inagg.hdl.rgmii.RGMII`'s names.

    amaranth-boards 0.0.21 names the control pins of the Versa's second
    port ``tx_ctrl``/``rx_ctrl`` and every other port's ``tx_ctl``/``rx_ctl``.
    """
    def pin(name):
        return getattr(pins, name) if hasattr(pins, name) else getattr(pins, name.replace("_ctl", "_ctrl"))

    return SimpleNamespace(**{n: pin(n) for n in ("rx_clk", "rx_ctl", "rx_data", "tx_clk", "tx_ctl", "tx_data")})


def _request_rgmii(platform, number: int, taken: set[str]):
    """``eth_rgmii`` ``number``'s pins (``dir="-"``), less the subsignals on pins of an earlier port.

    The Colorlight's two PHYs share their reset and MDIO pins, which
    amaranth-boards gives to both ports' resources; the second port's are
    the first's wires, so its resource is requested again without them
    (as ``inagg_eth_rgmii``). ``taken`` gathers the pins requested.
    """
    resource = platform.lookup("eth_rgmii", number)
    subsignals = [s for s in resource.ios if isinstance(s, Subsignal)]
    kept = [s for s in subsignals if not taken & set(_pin_names(s))]
    for s in kept:
        taken.update(_pin_names(s))
    if len(kept) == len(subsignals):
        return platform.request("eth_rgmii", number, dir="-")
    platform.add_resources([Resource("inagg_eth_rgmii", number, *kept, resource.attrs)])
    return platform.request("inagg_eth_rgmii", number, dir="-")


def _pin_names(subsignal: Subsignal) -> list[str]:
    names = []
    for io_ in subsignal.ios:
        if isinstance(io_, Pins):
            names += io_.names
        elif isinstance(io_, DiffPairs):
            names += io_.p.names + io_.n.names
    return names


def _stretch(m: Module, strobe, bits: int, name: str) -> Signal:
    """High for 2**bits cycles of ``sync`` after each ``strobe``, so that a single frame lights an LED visibly."""
    left = Signal(bits, name=f"{name}_left")
    with m.If(strobe):
        m.d.sync += left.eq(~0)
    with m.Elif(left != 0):
        m.d.sync += left.eq(left - 1)
    return left != 0


def board_switch(name: str, *, mgmt_key: bytes, mgmt_port: int = 0, **switch) -> Switch:
    """The :class:`~inagg.hdl.switch.Switch` of board ``name``'s top: its defaults (:attr:`Board.switch`), two
    ports, overridden by ``switch``, the management bridge on ``mgmt_port`` with ``mgmt_key``, and both ports'
    MAC counters in the register map (``mac_ports``)."""
    if "ports" in switch:
        raise TypeError("A board top's switch has the board's two ports; ports is not a parameter")
    return Switch(ports=2, **{**board(name).switch, **switch}, mgmt_port=mgmt_port, mgmt_key=mgmt_key, mac_ports=2)


def connect_macs(m: Module, sw: Switch, macs) -> list:
    """Add switch ``sw`` and ``macs`` (one per port, with a MAC's ``m``/``s`` streams and counters) to ``m``, wired
    port by port, each MAC's counters to the switch's ``mac_stats`` (the register map's ``MAC_BASE``).

    The seam between a board's logic and its pins: :class:`BoardTop` puts
    :class:`~inagg.hdl.rgmii.RGMII` MACs on the ECP5's DDR pins here, and the
    simulation top (:mod:`inagg.testbench.board`) MACs whose DDR pins are
    modelled in logic. Returns the LEDs' activity strobes: for each port, a
    frame received, then one sent.
    """
    m.submodules.switch = sw
    activity = []
    for p, eth in enumerate(macs):
        m.submodules[f"eth{p}"] = eth
        wiring.connect(m, eth.m, sw.s[p])
        wiring.connect(m, sw.m[p], eth.s)
        m.d.comb += [getattr(sw.mac_stats[p], name).eq(getattr(eth, name)) for name in COUNTERS]
        for stream in (sw.s[p], sw.m[p]):
            activity.append(stream.valid & stream.ready & stream.p.last)
    return activity


class BoardTop(wiring.Component):
    """The switch with its management bridge on ``mgmt_port``, behind two RGMII MACs, on a board of :data:`BOARDS`.

    Clocks: an :class:`ECP5PLL` on the board's default clock makes ``tx``
    (125 MHz) and ``sync`` (``sync_hz``); each MAC's receive domain runs on
    its PHY's RXC. Reset: both domains are held until the PLL locks (and
    while the board's reset button, if amaranth-boards names one, is
    pressed), and so is every PHY's reset pin, for about 2**20 ``sync``
    cycles more (21 ms at 50 MHz) so that a PHY sees a reset pulse of its
    own after configuration. LEDs, as many as the board has: heartbeat
    (``sync`` runs, out of reset), then for each port, in turn, a received
    and a sent frame.

    The MACs' counters (``docs/board.md``) are read in the register map,
    port ``p``'s at :meth:`RegMap.mac_stat(p, name) <inagg.models.regmap.RegMap.mac_stat>`.

    Parameters
    ----------
    name : str
        The board (:data:`BOARDS`).
    mgmt_key : bytes
        The management bridge's 16-byte key, a constant of the bitstream.
    mgmt_port : int
        The switch port (0 or 1) whose management frames reach the registers.
    sync_hz : int or None
        The switch's clock; None: the board's (:attr:`Board.sync_hz`).
    **switch :
        :class:`~inagg.hdl.switch.Switch`'s geometry keywords (``width``,
        ``slots``, ``chunk_bytes``, ``jobs``, ``workers``, ``exc_table``,
        ...) in place of the board's defaults (:attr:`Board.switch`);
        ``ports`` is the board's two.

    Attributes
    ----------
    board : Board
    switch : Switch
    pll : ECP5PLL
        Made at elaboration, when the platform gives the oscillator's frequency.
    """

    def __init__(self, name: str, *, mgmt_key: bytes, mgmt_port: int = 0, sync_hz: int | None = None, **switch):
        self.board = board(name)
        sync_hz = self.board.sync_hz if sync_hz is None else sync_hz
        if not isinstance(sync_hz, int) or isinstance(sync_hz, bool) or not 20_000_000 <= sync_hz <= 200_000_000:
            raise ValueError(f"Switch clock must be an integer from 20 to 200 MHz in Hz, not {sync_hz!r}")
        self.sync_hz = sync_hz
        self.switch = board_switch(name, mgmt_key=mgmt_key, mgmt_port=mgmt_port, **switch)
        self.pll = None
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        sw = self.switch

        m.submodules.clk_buf = clk = io.Buffer("i", platform.request(platform.default_clk, 0, dir="-"))
        self.pll = pll = ECP5PLL(int(platform.default_clk_frequency), TX_HZ, self.sync_hz)
        m.submodules.pll = pll
        m.d.comb += pll.clk_in.eq(clk.i)
        m.domains.sync = ClockDomain("sync")
        m.domains.tx = ClockDomain("tx")
        m.d.comb += [ClockSignal("tx").eq(pll.clk_op), ClockSignal("sync").eq(pll.clk_os)]
        held = ~pll.locked
        if platform.default_rst is not None:
            m.submodules.rst_buf = rst = io.Buffer("i", platform.request(platform.default_rst, 0, dir="-"))
            held = held | rst.i
        m.submodules.sync_reset = ResetSynchronizer(held, domain="sync")
        m.submodules.tx_reset = ResetSynchronizer(held, domain="tx")

        phy_reset = Signal(21, init=1 << 20)  # counts up from 2**20 until bit 20 falls: 2**20 cycles
        with m.If(phy_reset[20]):
            m.d.sync += phy_reset.eq(phy_reset + 1)
        shared = set()  # pins of the ports requested so far
        macs = []
        for p in range(sw.ports):
            pins = _request_rgmii(platform, p, shared)
            macs.append(RGMII(_rgmii_pins(pins), sw.width))
            if hasattr(pins, "rst"):
                m.submodules[f"eth{p}_rst"] = rst_pin = io.Buffer("o", pins.rst)
                m.d.comb += rst_pin.o.eq(phy_reset[20])
        activity = connect_macs(m, sw, macs)

        heartbeat = Signal(26)
        m.d.sync += heartbeat.eq(heartbeat + 1)
        shows = [heartbeat[-1], *activity]
        for i, show in enumerate(shows):
            try:
                pin = platform.request("led", i, dir="-")
            except ResourceError:  # the board has fewer LEDs
                break
            m.submodules[f"led{i}"] = led = io.Buffer("o", pin)
            m.d.comb += led.o.eq(show if i == 0 else _stretch(m, show, 22, f"led{i}"))
        return m
