"""RGMII in front of the GMII MAC: the nibble (de)serialiser as logic, the DDR pins in a thin layer apart.

RGMII (v2.0) carries GMII's byte in two nibbles, one per clock edge:
``RXD[3:0]``/``TXD[3:0]`` hold bits 3..0 at the rising edge and bits 7..4 at
the falling edge, and ``RX_CTL``/``TX_CTL`` hold DV/EN at the rising edge
and DV xor ER (EN xor ER) at the falling edge. :class:`RGMIICore` is the
MAC with that (de)serialiser, whose DDR halves are plain signals, so it
simulates (in Amaranth and on Verilator) without I/O primitives.
:class:`RGMII` puts Amaranth's ``io.DDRBuffer`` on the pins, which the
Lattice platform turns into the ECP5's ``IDDRX1F``/``ODDRX1F``; those have no
simulation model here, so that layer is only elaborated for the ECP5, not
simulated.

Clocks: the receive domain ``rx`` runs on the PHY's ``RXC``; ``tx`` is the
125 MHz transmit clock the board top provides, forwarded on ``TXC`` edge
aligned with the data (the PHY's transmit clock delay, or a delay line,
supplies the 2 ns skew RGMII asks for); ``sync`` is the switch's.
"""

from __future__ import annotations

from amaranth import Cat, ClockDomain, ClockSignal, Module, ResetSignal
from amaranth.lib import io, wiring
from amaranth.lib.cdc import ResetSynchronizer
from amaranth.lib.wiring import In, Out

from inagg.hdl.axis import beat_signature
from inagg.hdl.mac import COUNTERS, MAC, GMIISignature

__all__ = ["RGMIIRxDecoder", "RGMIITxEncoder", "RGMIICore", "RGMII", "RX_HZ"]

#: RXC at 1 Gb/s.
RX_HZ = 125_000_000


class RGMIIRxDecoder(wiring.Component):
    """One receive clock cycle's two DDR samples into a GMII byte.

    Members
    -------
    rise, fall : In(5)
        ``RXD[3:0]`` and ``RX_CTL`` (bit 4) as sampled at the rising edge and
        at the falling edge after it.
    gmii : Out(GMIISignature())
    """

    def __init__(self):
        super().__init__({"rise": In(5), "fall": In(5), "gmii": Out(GMIISignature())})

    def elaborate(self, platform):
        m = Module()
        m.d.comb += [self.gmii.data.eq(Cat(self.rise[:4], self.fall[:4])), self.gmii.en.eq(self.rise[4]),
                     self.gmii.er.eq(self.rise[4] ^ self.fall[4])]
        return m


class RGMIITxEncoder(wiring.Component):
    """A GMII byte into the two DDR halves of a transmit clock cycle.

    Members
    -------
    gmii : In(GMIISignature())
    rise, fall : Out(5)
        ``TXD[3:0]`` and ``TX_CTL`` (bit 4) for the rising and the falling edge.
    """

    def __init__(self):
        super().__init__({"gmii": In(GMIISignature()), "rise": Out(5), "fall": Out(5)})

    def elaborate(self, platform):
        m = Module()
        m.d.comb += [self.rise.eq(Cat(self.gmii.data[:4], self.gmii.en)),
                     self.fall.eq(Cat(self.gmii.data[4:], self.gmii.en ^ self.gmii.er))]
        return m


def _mac_members(mac: MAC) -> dict:
    """The switch-side members of a MAC wrapper: its streams and counters."""
    return {"m": Out(beat_signature(mac.width)), "s": In(beat_signature(mac.width)),
            **{name: Out(mac.counter_width) for name in COUNTERS}}


def _forward_mac(m: Module, outer, mac: MAC) -> None:
    """Wire ``outer``'s members of :func:`_mac_members` to ``mac``."""
    wiring.connect(m, wiring.flipped(outer.s), mac.s)
    wiring.connect(m, mac.m, wiring.flipped(outer.m))
    m.d.comb += [getattr(outer, name).eq(getattr(mac, name)) for name in COUNTERS]


class RGMIICore(wiring.Component):
    """The MAC behind the RGMII (de)serialiser; the DDR halves are ports (domains as :class:`~inagg.hdl.mac.MAC`).

    Parameters: :class:`~inagg.hdl.mac.MAC`'s.

    Members
    -------
    rx_rise, rx_fall : In(5)
        The receive pins' samples of one ``rx`` cycle (see :class:`RGMIIRxDecoder`).
    tx_rise, tx_fall : Out(5)
        The transmit pins' values for one ``tx`` cycle (see :class:`RGMIITxEncoder`).
    m, s, and the counters :
        :class:`~inagg.hdl.mac.MAC`'s.
    """

    def __init__(self, width: int = 64, **params):
        self.mac = MAC(width, **params)
        super().__init__({"rx_rise": In(5), "rx_fall": In(5), "tx_rise": Out(5), "tx_fall": Out(5),
                          **_mac_members(self.mac)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.mac = mac = self.mac
        m.submodules.rx_decoder = decoder = RGMIIRxDecoder()
        m.submodules.tx_encoder = encoder = RGMIITxEncoder()
        m.d.comb += [decoder.rise.eq(self.rx_rise), decoder.fall.eq(self.rx_fall),
                     self.tx_rise.eq(encoder.rise), self.tx_fall.eq(encoder.fall)]
        wiring.connect(m, decoder.gmii, mac.gmii_rx)
        wiring.connect(m, mac.gmii_tx, encoder.gmii)
        _forward_mac(m, self, mac)
        return m


class RGMII(wiring.Component):
    """:class:`RGMIICore` on the pins of an RGMII PHY, through ``io.DDRBuffer`` (ECP5: IDDRX1F/ODDRX1F).

    Defines the ``rx`` domain (local, so one RGMII per port may each have
    theirs) on the PHY's receive clock, constrained to 125 MHz, its reset
    the ``tx`` domain's, synchronized; ``tx`` and ``sync`` come from the
    design around it.

    Parameters
    ----------
    pins :
        An object with the ports (``platform.request(..., dir="-")``)
        ``rx_clk``, ``rx_ctl``, ``rx_data`` (4 bits), ``tx_clk``, ``tx_ctl``,
        ``tx_data`` (4 bits), as amaranth-boards names an ``eth_rgmii`` resource.
    width, **params :
        :class:`~inagg.hdl.mac.MAC`'s.

    Members
    -------
    m, s, and the counters :
        :class:`~inagg.hdl.mac.MAC`'s.
    """

    def __init__(self, pins, width: int = 64, **params):
        self.pins = pins
        self.core = RGMIICore(width, **params)
        super().__init__(_mac_members(self.core.mac))

    def elaborate(self, platform):
        m = Module()
        m.submodules.core = core = self.core
        _forward_mac(m, self, core)

        # Local: a board top has one RGMII per port, each with its own receive clock.
        m.domains.rx = ClockDomain("rx", local=True)
        m.submodules.rxc = rxc = io.Buffer("i", self.pins.rx_clk)
        m.d.comb += ClockSignal("rx").eq(rxc.i)
        if platform is not None:
            platform.add_clock_constraint(rxc.i, RX_HZ)
        m.submodules.rx_reset = ResetSynchronizer(ResetSignal("tx"), domain="rx")

        m.submodules.rx_data = rx_data = io.DDRBuffer("i", self.pins.rx_data, i_domain="rx")
        m.submodules.rx_ctl = rx_ctl = io.DDRBuffer("i", self.pins.rx_ctl, i_domain="rx")
        m.d.comb += [core.rx_rise.eq(Cat(rx_data.i[0], rx_ctl.i[0])), core.rx_fall.eq(Cat(rx_data.i[1], rx_ctl.i[1]))]

        m.submodules.tx_data = tx_data = io.DDRBuffer("o", self.pins.tx_data, o_domain="tx")
        m.submodules.tx_ctl = tx_ctl = io.DDRBuffer("o", self.pins.tx_ctl, o_domain="tx")
        m.submodules.tx_clk = tx_clk = io.DDRBuffer("o", self.pins.tx_clk, o_domain="tx")
        m.d.comb += [tx_data.o[0].eq(core.tx_rise[:4]), tx_ctl.o[0].eq(core.tx_rise[4]),
                     tx_data.o[1].eq(core.tx_fall[:4]), tx_ctl.o[1].eq(core.tx_fall[4]),
                     tx_clk.o[0].eq(1), tx_clk.o[1].eq(0)]  # the clock: high in the first half of each cycle
        return m
