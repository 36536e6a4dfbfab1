"""A Gigabit Ethernet MAC on GMII: framing, FCS, frame buffers, clock crossing and width conversion.

Receive path, one byte per cycle of the PHY's receive clock (domain ``rx``)
until the frame buffer, then ``width``-bit beats in the switch's domain
(``sync``)::

    gmii_rx -> GMIIReceiver -> FrameBuffer(8) -> Upsizer -> AsyncFIFO -> m
               (preamble, FCS, runt, long)  (drops whole frames)   (rx -> sync)

Transmit path, from the switch's domain into the transmit clock (``tx``)::

    s -> AsyncFIFO -> length check -> FrameBuffer(width) -> Downsizer -> GMIITransmitter -> gmii_tx
        (sync -> tx)                  (whole frames only)                (preamble, pad, FCS, gap)

A frame is dropped whole or passed on whole: the receive buffer keeps a
frame until its FCS is checked and rewinds over it when it is bad, and the
transmit buffer hands a frame to the transmitter only once all of it is
there, so that the transmitter, which must send a byte every cycle, never
waits in the middle of a frame. The beats in and out are the switch's
(:func:`~inagg.hdl.axis.beat_signature`): the frame without preamble and
FCS. ``docs/board.md`` ("The MAC") describes the counters and limits;
:mod:`inagg.hdl.rgmii` puts the DDR pins of an RGMII PHY in front of it.
"""

from __future__ import annotations

from amaranth import Cat, Const, DomainRenamer, Module, Mux, Signal
from amaranth.lib import cdc, data, stream, wiring
from amaranth.lib.crc import catalog
from amaranth.lib.fifo import AsyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from inagg.models.regmap import MAC_STATS
from inagg.hdl.axis import beat_layout, beat_signature, check_width

__all__ = ["PREAMBLE", "SFD", "MIN_FRAME", "MAX_FRAME", "IFG", "COUNTERS", "GMIISignature",
           "BYTE_LAYOUT", "byte_signature", "GMIIReceiver", "GMIITransmitter", "FrameBuffer", "Upsizer", "Downsizer", "MAC",
           "flat_members", "connect_flat", "MACTop"]

PREAMBLE, SFD = 0x55, 0xD5
#: Shortest and longest frame on the wire, FCS included (IEEE 802.3 clause 3.2.7; 1,522: with a VLAN tag).
MIN_FRAME, MAX_FRAME = 64, 1522
FCS_BYTES = 4
#: Bytes of idle between two transmitted frames (the 96-bit-time inter-frame gap).
IFG = 12
#: The MAC's counters, each an ``Out(counter_width)`` member of :class:`MAC` in the switch's domain: the register
#: map's (:data:`~inagg.models.regmap.MAC_STATS`), named and ordered there, so that the two cannot drift apart.
COUNTERS = tuple(MAC_STATS)


class GMIISignature(wiring.Signature):
    """One direction of GMII, from its source's side: ``data`` (8 bits), ``en`` (TX_EN/RX_DV), ``er``."""

    def __init__(self):
        super().__init__({"data": Out(8), "en": Out(1), "er": Out(1)})


#: A frame byte: ``data`` and ``last`` on the frame's final byte.
BYTE_LAYOUT = data.StructLayout({"data": 8, "last": 1})


def byte_signature(*, always_ready: bool = False) -> stream.Signature:
    """A stream of frame bytes (:data:`BYTE_LAYOUT`)."""
    return stream.Signature(BYTE_LAYOUT, always_ready=always_ready)


def _crc32(m: Module, name: str):
    """The Ethernet FCS (CRC-32, one byte per cycle) as submodule ``name`` of ``m``."""
    crc = catalog.CRC32_ETHERNET(data_width=8).create()
    m.submodules[name] = crc
    return crc


class GMIIReceiver(wiring.Component):
    """Frames from GMII: strips preamble, SFD and FCS and tells each frame's fate at its end.

    Runs one byte per cycle; it cannot stall, so its output is always ready.
    A byte leaves six cycles after it came in, from a register: when RX_DV
    falls, the four bytes still held are the FCS and the fifth is the
    frame's last byte, which goes out the next cycle with ``last``, its
    verdict strobe and, when the frame is bad, ``drop`` (then the frame
    buffer behind discards all of it). A frame longer than
    ``max_frame`` sets ``drop`` as soon as it gets there, so that the buffer
    does not fill up with it first.

    Parameters
    ----------
    max_frame : int
        Longest good frame, FCS included (64..16,383; 1,522 by default).

    Members
    -------
    gmii : In(GMIISignature())
    o : Out(byte_signature(always_ready=True))
        The frame's bytes, and on any of them ``drop``: discard the frame.
    drop : Out(1)
        With ``o.valid``: the frame is bad.
    good, fcs_error, runt, long : Out(1)
        One strobe per frame at its end: passed on, or dropped for an FCS
        mismatch or an RX_ER during the frame, for fewer than 64 bytes, for
        more than ``max_frame`` (a frame is counted under the first of runt,
        long, FCS that applies). A frame cut off in its preamble counts nowhere.
    """

    def __init__(self, max_frame: int = MAX_FRAME):
        if not isinstance(max_frame, int) or not MIN_FRAME <= max_frame < 1 << 14:
            raise ValueError(f"Maximum frame must be an integer from {MIN_FRAME} to {(1 << 14) - 1}, not {max_frame!r}")
        self.max_frame = max_frame
        super().__init__({"gmii": In(GMIISignature()), "o": Out(byte_signature(always_ready=True)), "drop": Out(1),
                          "good": Out(1), "fcs_error": Out(1), "runt": Out(1), "long": Out(1)})

    def elaborate(self, platform):
        m = Module()
        crc = _crc32(m, "crc")
        held = Signal(8 * (FCS_BYTES + 1))  # the last five bytes; the oldest in the top byte
        count = Signal(range(self.max_frame + 2))  # bytes of the frame so far, stopping at max_frame + 1
        error = Signal()  # an RX_ER came during the frame
        too_long = count > self.max_frame
        # Every output is a register or a gate of registers, so that the frame buffer's write logic and the
        # counters behind do not hang off the CRC and the byte count (they made a 10 ns path on the 25F). The FCS
        # check of the bytes so far is registered too: it is read a cycle after the last byte has entered the CRC.
        fcs_ok = Signal()
        ending = Signal()  # the frame's last byte is out this cycle
        runt, long, failed = Signal(), Signal(), Signal()  # at ``ending``: why the frame failed, FCS aside
        drop = Signal()  # with a byte: discard the frame, FCS aside
        m.d.sync += [fcs_ok.eq(crc.match_detected), ending.eq(0), self.o.valid.eq(0)]
        m.d.comb += [crc.data.eq(self.gmii.data), self.drop.eq(drop | (ending & ~fcs_ok)),
                     self.runt.eq(ending & runt), self.long.eq(ending & long),
                     self.fcs_error.eq(ending & ~runt & ~long & (failed | ~fcs_ok)),
                     self.good.eq(ending & ~runt & ~long & ~failed & fcs_ok)]
        with m.FSM():
            with m.State("IDLE"):
                m.d.sync += [count.eq(0), error.eq(0)]
                with m.If(self.gmii.en):
                    m.d.comb += crc.start.eq(1)
                    with m.If(self.gmii.data == SFD):  # a PHY may shorten the preamble
                        m.next = "DATA"
                    with m.Elif(self.gmii.data == PREAMBLE):
                        m.next = "PREAMBLE"
                    with m.Else():
                        m.next = "DISCARD"
            with m.State("PREAMBLE"):
                with m.If(~self.gmii.en):
                    m.next = "IDLE"
                with m.Elif(self.gmii.data == SFD):
                    m.next = "DATA"
                with m.Elif(self.gmii.data != PREAMBLE):
                    m.next = "DISCARD"
            with m.State("DATA"):
                # Each new byte pushes out the fifth latest, which is then known not to be FCS.
                m.d.sync += [self.o.valid.eq(count >= FCS_BYTES + 1), self.o.payload.data.eq(held[-8:])]
                with m.If(self.gmii.en):
                    m.d.comb += crc.valid.eq(1)
                    m.d.sync += [held.eq(Cat(self.gmii.data, held[:-8])), error.eq(error | self.gmii.er),
                                 self.o.payload.last.eq(0), drop.eq(too_long)]
                    with m.If(~too_long):
                        m.d.sync += count.eq(count + 1)
                with m.Else():
                    short = count < MIN_FRAME
                    m.d.sync += [self.o.payload.last.eq(1), ending.eq(1), runt.eq(short), long.eq(~short & too_long),
                                 failed.eq(error), drop.eq(short | too_long | error)]
                    m.next = "IDLE"
            with m.State("DISCARD"):
                with m.If(~self.gmii.en):
                    m.next = "IDLE"
        return m


class GMIITransmitter(wiring.Component):
    """Frames onto GMII: preamble and SFD, padding to 60 bytes, FCS, and the inter-frame gap.

    It takes a frame's first byte only after the gap and the preamble and
    then one byte every cycle until ``last``: the stream in must have the
    whole frame ready (a :class:`FrameBuffer` in front gives it whole).
    GMII is driven from registers, two cycles after the byte is taken.

    Members
    -------
    i : In(byte_signature())
        Frames without FCS; shorter ones than 60 bytes are padded with zeros.
    gmii : Out(GMIISignature())
    sent : Out(1)
        Strobes as a frame's last FCS byte goes out.
    """

    def __init__(self):
        super().__init__({"i": In(byte_signature()), "gmii": Out(GMIISignature()), "sent": Out(1)})

    def elaborate(self, platform):
        m = Module()
        crc = _crc32(m, "crc")
        count = Signal(range(max(MIN_FRAME, 8 + IFG) + 1))  # bytes sent of the preamble, the payload or the gap
        wire, en, fcs, start, valid, sent = Signal(8), Signal(), Signal(), Signal(), Signal(), Signal()
        # Two register stages after the state machine, so that neither the CRC nor the pins hang off the byte
        # picked from the downsizer's beat: the CRC takes a byte a cycle after the state machine, and an FCS byte
        # leaves a cycle after the CRC has taken the frame's last byte, from its register.
        wire_r, fcs_r, index_r = Signal(8), Signal(), Signal(2)
        en_r, sent_r = Signal(), Signal()
        m.d.sync += [wire_r.eq(wire), en_r.eq(en), fcs_r.eq(fcs), index_r.eq(count[:2]), crc.start.eq(start),
                     crc.valid.eq(valid), sent_r.eq(sent),
                     self.gmii.data.eq(Mux(fcs_r, crc.crc.word_select(index_r, 8), wire_r)), self.gmii.en.eq(en_r),
                     self.sent.eq(sent_r)]
        m.d.comb += crc.data.eq(wire_r)
        with m.FSM():
            with m.State("GAP"):
                # Also the state after reset: a frame never follows another with less than the gap between.
                with m.If(count < IFG - 1):
                    m.d.sync += count.eq(count + 1)
                with m.Elif(self.i.valid):
                    m.d.sync += count.eq(0)
                    m.next = "PREAMBLE"
            with m.State("PREAMBLE"):
                m.d.comb += [en.eq(1), wire.eq(Mux(count == 7, SFD, PREAMBLE)), start.eq(1)]
                m.d.sync += count.eq(count + 1)
                with m.If(count == 7):
                    m.d.sync += count.eq(0)
                    m.next = "DATA"
            with m.State("DATA"):
                m.d.comb += [en.eq(1), self.i.ready.eq(1), wire.eq(self.i.payload.data), valid.eq(1)]
                with m.If(count < MIN_FRAME - FCS_BYTES):  # only whether to pad matters
                    m.d.sync += count.eq(count + 1)
                with m.If(self.i.payload.last):
                    with m.If(count < MIN_FRAME - FCS_BYTES - 1):
                        m.next = "PAD"
                    with m.Else():
                        m.d.sync += count.eq(0)
                        m.next = "FCS"
            with m.State("PAD"):
                m.d.comb += [en.eq(1), valid.eq(1)]
                m.d.sync += count.eq(count + 1)
                with m.If(count == MIN_FRAME - FCS_BYTES - 1):
                    m.d.sync += count.eq(0)
                    m.next = "FCS"
            with m.State("FCS"):
                # The CRC's bytes go out least significant first; the register holds still meanwhile.
                m.d.comb += [en.eq(1), fcs.eq(1)]
                m.d.sync += count.eq(count + 1)
                with m.If(count == FCS_BYTES - 1):
                    m.d.comb += sent.eq(1)
                    m.d.sync += count.eq(0)
                    m.next = "GAP"
        return m


class FrameBuffer(wiring.Component):
    """A FIFO of whole frames: a frame leaves only once its last beat is in, and a bad one never does.

    The write side keeps two pointers: where the next beat goes, and the end
    of the last whole frame (the *commit* point). A frame's last beat moves
    the commit point; ``drop`` (with any beat) rewinds the write pointer to
    it and discards the rest of the frame, its last beat included. The read
    side sees the committed frames only, and a beat leaves two cycles after
    it is read (the read data register and the output register).

    Parameters
    ----------
    layout : data.StructLayout
        A beat; its field ``last`` ends a frame.
    depth : int
        Beats it holds, a power of two from 4 to 65,536 (one place stays empty).
    always_ready : bool
        True: it never stalls its input (a PHY cannot wait), and a frame that
        finds it full is dropped (``overflow``). False: it stalls while full
        instead, so it must hold the longest frame its source passes on.

    Members
    -------
    i : In(stream.Signature(layout, always_ready=always_ready))
    drop : In(1)
        With ``i.valid``: discard the frame this beat belongs to.
    o : Out(stream.Signature(layout))
    overflow : Out(1)
        Only when ``always_ready``: strobes with the last beat of a frame that
        found the buffer full (and was not dropped by ``drop`` anyway).
    """

    def __init__(self, layout: data.StructLayout, depth: int, *, always_ready: bool = False):
        if not isinstance(depth, int) or not 4 <= depth <= 1 << 16 or depth & (depth - 1):
            raise ValueError(f"Frame buffer depth must be a power of two from 4 to 65536, not {depth!r}")
        self.layout, self.depth, self.always_ready = layout, depth, always_ready
        members = {"i": In(stream.Signature(layout, always_ready=always_ready)), "drop": In(1),
                   "o": Out(stream.Signature(layout))}
        if always_ready:
            members["overflow"] = Out(1)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        # The read side never reads a place the write side writes: it stops at the commit point, where writes
        # start. Yosys, told so (``no_rw_check``) as it merges the flip-flops behind an asynchronous read port
        # into the EBR, leaves out its emulation of a read-first collision: a bypass multiplexer after the EBR's
        # slow data output (2.5 ns more on the 25F). A synchronous read port would get it whatever the attribute.
        m.submodules.mem = mem = Memory(shape=self.layout, depth=self.depth, init=[], attrs={"no_rw_check": 1})
        wp, rp = mem.write_port(), mem.read_port(domain="comb")
        bits = (self.depth - 1).bit_length()
        wr, commit, rd = Signal(bits), Signal(bits), Signal(bits)
        # ``wr + 1`` kept in a register of its own: the full check then needs no adder before the write enable.
        wr_next = Signal(bits, init=1)
        full = wr_next == rd
        dropped, lost = Signal(), Signal()  # this frame is discarded: by ``drop``, for want of space
        bad = dropped | self.drop
        if not self.always_ready:
            # Not from ``drop`` itself: a source's ``drop`` may come late in the cycle. A frame being dropped
            # goes on at full speed from its next beat on; its first dropped beat may wait for a free place.
            m.d.comb += self.i.ready.eq(~full | dropped)
        gone = bad | lost | full
        m.d.comb += [wp.addr.eq(wr), wp.data.eq(self.i.payload)]
        with m.If(self.i.valid & self.i.ready):
            with m.If(gone):
                m.d.sync += [wr.eq(commit), wr_next.eq(commit + 1), dropped.eq(bad & ~self.i.payload.last),
                             lost.eq(~bad & ~self.i.payload.last)]
                if self.always_ready:
                    m.d.comb += self.overflow.eq(self.i.payload.last & ~bad)
            with m.Else():
                m.d.comb += wp.en.eq(1)
                m.d.sync += [wr.eq(wr_next), wr_next.eq(wr_next + 1)]
                with m.If(self.i.payload.last):
                    m.d.sync += commit.eq(wr_next)

        # Two stages: the read data register (``data``, which becomes the EBR's own), then the output register.
        # An EBR read without its output register (which Yosys does not infer on the ECP5) takes 5.8 ns from the
        # clock to its data at speed 6, so nothing but a flip-flop may follow it. Each stage holds while the one
        # after it is full.
        read = Signal()  # ``data`` holds a beat
        advance = ~self.o.valid | self.o.ready
        load = (rd != commit) & (~read | advance)
        data = Signal(self.layout)
        m.d.comb += rp.addr.eq(rd)
        with m.If(load):
            m.d.sync += [rd.eq(rd + 1), read.eq(1), data.eq(rp.data)]
        with m.Elif(advance):
            m.d.sync += read.eq(0)
        with m.If(advance):
            m.d.sync += [self.o.payload.eq(data), self.o.valid.eq(read)]
        return m


class Upsizer(wiring.Component):
    """Bytes into beats of ``width`` bits: packed keep, ``last`` on the frame's final beat.

    Members
    -------
    i : In(byte_signature())
    o : Out(beat_signature(width))
    """

    def __init__(self, width: int):
        self.width = check_width(width)
        super().__init__({"i": In(byte_signature()), "o": Out(beat_signature(width))})

    def elaborate(self, platform):
        m = Module()
        n = self.width // 8
        idx = Signal(range(n))
        m.d.comb += self.i.ready.eq(~self.o.valid | self.o.ready)
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(self.i.valid & self.i.ready):
            with m.If(idx == 0):  # a new beat: clear the bytes the previous one left
                m.d.sync += [self.o.payload.data.eq(self.i.payload.data), self.o.payload.keep.eq(1)]
            with m.Else():
                m.d.sync += [self.o.payload.data.word_select(idx, 8).eq(self.i.payload.data),
                             self.o.payload.keep.bit_select(idx, 1).eq(1)]
            m.d.sync += idx.eq(idx + 1)
            with m.If(self.i.payload.last | (idx == n - 1)):
                m.d.sync += [idx.eq(0), self.o.valid.eq(1), self.o.payload.last.eq(self.i.payload.last)]
        return m


class Downsizer(wiring.Component):
    """Beats of ``width`` bits (packed keep) into bytes, one per cycle.

    Members
    -------
    i : In(beat_signature(width))
    o : Out(byte_signature())
    """

    def __init__(self, width: int):
        self.width = check_width(width)
        super().__init__({"i": In(beat_signature(width)), "o": Out(byte_signature())})

    def elaborate(self, platform):
        m = Module()
        n = self.width // 8
        beat = Signal(beat_layout(self.width))
        idx = Signal(range(n))
        have = Signal()
        # Keep is packed: a beat's final byte is the one whose next keep bit is clear.
        final = ~Cat(beat.keep[1:], Const(0, 1)).bit_select(idx, 1)
        m.d.comb += [self.o.valid.eq(have), self.o.payload.data.eq(beat.data.word_select(idx, 8)),
                     self.o.payload.last.eq(final & beat.last),
                     self.i.ready.eq(~have | (self.o.ready & final))]
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [beat.eq(self.i.payload), idx.eq(0), have.eq(1)]
        with m.Elif(self.o.ready & have):
            with m.If(final):
                m.d.sync += have.eq(0)
            with m.Else():
                m.d.sync += idx.eq(idx + 1)
        return m


# Bits of a counter that cross from its event's domain into ``sync``. The events of every counter come two or more
# cycles of their 125 MHz clock apart (a frame's end takes a cycle of RX_DV high and one low; the transmit side
# takes a beat every other cycle), so fewer than 2 ** 4 come between two samples of a ``sync`` of 4.5 MHz or more
# (the switch's clock must be 15.6 MHz or more anyway: "docs/board.md", "The MAC").
_CROSS_BITS = 4


def _gray_counter(m: Module, strobe, domain: str, width: int, name: str) -> Signal:
    """Count ``strobe`` in ``domain`` and return the count, ``width`` bits, in ``sync``.

    Only ``_CROSS_BITS`` bits of the count cross, as a Gray code, which
    changes one bit per step, so the synchronizer's sample is always a value
    the count had; ``sync`` adds what the count advanced since its last
    sample (modulo ``2 ** _CROSS_BITS``: fewer steps than that come between
    two samples) to the whole count. Crossing all ``width`` bits cost 62
    LUT4 a counter for the Gray code and its decoding, too many for the 25F
    of the Colorlight board with 14 of them. The domains reset together.
    """
    hit = Signal(name=f"{name}_hit")
    count = Signal(_CROSS_BITS, name=f"{name}_count")
    gray = Signal(_CROSS_BITS, name=f"{name}_gray")
    # A register before the adder and one after it: the strobe comes out of a frame's end logic, and an adder
    # behind it, then the Gray code, made the rx domain's worst path.
    m.d[domain] += [hit.eq(strobe), count.eq(count + hit), gray.eq(count ^ (count >> 1))]
    synced = Signal(_CROSS_BITS, name=f"{name}_synced")
    m.submodules[f"{name}_cdc"] = cdc.FFSynchronizer(gray, synced, o_domain="sync")
    bits = [synced[-1]]
    for i in reversed(range(_CROSS_BITS - 1)):
        bits.insert(0, bits[0] ^ synced[i])
    # The decoded sample is registered before the subtraction and the wide adder, which then take a cycle alone.
    now = Signal(_CROSS_BITS, name=f"{name}_now")
    last = Signal(_CROSS_BITS, name=f"{name}_last")
    value = Signal(width, name=name)
    m.d.sync += [now.eq(Cat(*bits)), last.eq(now), value.eq(value + (now - last)[:_CROSS_BITS])]
    return value


class MAC(wiring.Component):
    """A Gigabit Ethernet MAC between GMII and the switch's beat streams (see the module's docstring).

    Clock domains: ``rx`` (the PHY's receive clock, 125 MHz), ``tx`` (the
    transmit clock, 125 MHz) and ``sync`` (the switch's); all three may be
    unrelated.

    Parameters
    ----------
    width : int
        The switch's beat width (:data:`~inagg.models.geometry.WIDTHS`).
    max_frame : int
        Longest frame received or sent, FCS included (1,522: a VLAN-tagged frame).
    rx_bytes : int
        Bytes of the receive frame buffer, a power of two above ``max_frame``
        (default 4,096: two BRAMs on the ECP5); frames that find it full are dropped.
    cdc_depth : int
        Beats of each clock-crossing FIFO (a power of two, at least 4).
    counter_width : int
        Bits of each counter; they wrap.

    Members
    -------
    gmii_rx : In(GMIISignature())
    gmii_tx : Out(GMIISignature())
    m : Out(beat_signature(width))
        Good frames received, without FCS.
    s : In(beat_signature(width))
        Frames to send, without FCS; shorter than 60 bytes is padded, longer
        than ``max_frame - 4`` is dropped (``tx_long``).
    rx_good, rx_fcs_errors, rx_runts, rx_long, rx_overflow, tx_frames, tx_long : Out(counter_width)
        Counters in the ``sync`` domain (:data:`COUNTERS`):
        frames passed on, dropped for a bad FCS or RX_ER, for fewer than 64
        bytes, for more than ``max_frame``, for a full receive buffer; frames
        sent, and frames to send dropped for their length.
    """

    def __init__(self, width: int = 64, *, max_frame: int = MAX_FRAME, rx_bytes: int = 4096, cdc_depth: int = 16,
                 counter_width: int = 32):
        self.width = check_width(width)
        if not isinstance(max_frame, int) or not MIN_FRAME <= max_frame < 1 << 14:
            raise ValueError(f"Maximum frame must be an integer from {MIN_FRAME} to {(1 << 14) - 1}, not {max_frame!r}")
        if not isinstance(rx_bytes, int) or rx_bytes & (rx_bytes - 1) or not max_frame < rx_bytes <= 1 << 16:
            raise ValueError(f"Receive buffer must be a power of two above {max_frame} up to 65536 bytes, "
                             f"not {rx_bytes!r}")
        if not isinstance(cdc_depth, int) or cdc_depth & (cdc_depth - 1) or not 4 <= cdc_depth <= 1024:
            raise ValueError(f"Clock-crossing FIFO depth must be a power of two from 4 to 1024, not {cdc_depth!r}")
        if not isinstance(counter_width, int) or not 1 <= counter_width <= 64:
            raise ValueError(f"Counter width must be an integer from 1 to 64, not {counter_width!r}")
        self.max_frame, self.rx_bytes, self.cdc_depth, self.counter_width = max_frame, rx_bytes, cdc_depth, counter_width
        # The transmit buffer holds the longest frame to send and one beat more (a place stays empty).
        beats = -(-(max_frame - FCS_BYTES) // (width // 8)) + 2
        self.tx_beats = 1 << (beats - 1).bit_length()
        super().__init__({
            "gmii_rx": In(GMIISignature()), "gmii_tx": Out(GMIISignature()),
            "m": Out(beat_signature(width)), "s": In(beat_signature(width)),
            **{name: Out(counter_width) for name in COUNTERS},
        })

    def elaborate(self, platform):
        m = Module()
        layout = beat_layout(self.width)
        rx = DomainRenamer("rx")
        tx = DomainRenamer("tx")

        # Receive: bytes in the PHY's clock until the clock-crossing FIFO.
        m.submodules.rx_mac = rx_mac = rx(GMIIReceiver(self.max_frame))
        m.submodules.rx_buffer = rx_buffer = rx(FrameBuffer(BYTE_LAYOUT, self.rx_bytes,
                                                            always_ready=True))
        m.submodules.rx_upsizer = upsizer = rx(Upsizer(self.width))
        m.submodules.rx_cdc = rx_cdc = AsyncFIFO(width=layout.size, depth=self.cdc_depth, w_domain="rx",
                                                 r_domain="sync")
        wiring.connect(m, wiring.flipped(self.gmii_rx), rx_mac.gmii)
        m.d.comb += [rx_buffer.i.valid.eq(rx_mac.o.valid), rx_buffer.i.payload.eq(rx_mac.o.payload),
                     rx_buffer.drop.eq(rx_mac.drop)]
        wiring.connect(m, rx_buffer.o, upsizer.i)
        m.d.comb += [rx_cdc.w_data.eq(upsizer.o.payload), rx_cdc.w_en.eq(upsizer.o.valid),
                     upsizer.o.ready.eq(rx_cdc.w_rdy),
                     self.m.payload.eq(rx_cdc.r_data), self.m.valid.eq(rx_cdc.r_rdy), rx_cdc.r_en.eq(self.m.ready)]

        # Transmit: beats cross into the transmit clock, whole frames wait there, bytes go out.
        m.submodules.tx_cdc = tx_cdc = AsyncFIFO(width=layout.size, depth=self.cdc_depth, w_domain="sync",
                                                 r_domain="tx")
        m.submodules.tx_buffer = tx_buffer = tx(FrameBuffer(layout, self.tx_beats))
        m.submodules.tx_downsizer = downsizer = tx(Downsizer(self.width))
        m.submodules.tx_mac = tx_mac = tx(GMIITransmitter())
        m.d.comb += [tx_cdc.w_data.eq(self.s.payload), tx_cdc.w_en.eq(self.s.valid), self.s.ready.eq(tx_cdc.w_rdy)]
        # A register between the crossing and the buffer, which takes a beat only when it is empty: the FIFO's
        # read enable then comes from a flip-flop, not from the buffer's full check through its pointers (a
        # 9.6 ns path on the 25F). One beat every two cycles is W / 16 bytes a cycle, more than the line's one.
        beat, held = Signal(layout), Signal()
        with m.If(~held):
            m.d.tx += [beat.eq(tx_cdc.r_data), held.eq(tx_cdc.r_rdy)]
        with m.Elif(tx_buffer.i.ready):
            m.d.tx += held.eq(0)
        # Too long: more than ``limit`` bytes. Keep is packed and every beat but the last is full, so the
        # beat count and one keep bit decide it, without adding up the bytes (a path of 9 ns at W = 64).
        full_beats, rest = divmod(self.max_frame - FCS_BYTES, self.width // 8)
        index = Signal(range(full_beats + 2))  # beats of the frame before this one, stopping past the limit
        too_long = (index > full_beats) | ((index == full_beats) & (~beat.last | beat.keep[rest]))
        m.d.comb += [tx_buffer.i.valid.eq(held), tx_buffer.i.payload.eq(beat), tx_buffer.drop.eq(too_long),
                     tx_cdc.r_en.eq(~held)]
        with m.If(held & tx_buffer.i.ready):
            with m.If(beat.last):
                m.d.tx += index.eq(0)
            with m.Elif(index <= full_beats):
                m.d.tx += index.eq(index + 1)
        wiring.connect(m, tx_buffer.o, downsizer.i)
        wiring.connect(m, downsizer.o, tx_mac.i)
        wiring.connect(m, tx_mac.gmii, wiring.flipped(self.gmii_tx))

        # A frame the receiver passes and the buffer then loses counts as lost only: each frame counts once.
        strobes = {"rx_good": (rx_mac.good & ~rx_buffer.overflow, "rx"), "rx_fcs_errors": (rx_mac.fcs_error, "rx"),
                   "rx_runts": (rx_mac.runt, "rx"), "rx_long": (rx_mac.long, "rx"),
                   "rx_overflow": (rx_buffer.overflow, "rx"), "tx_frames": (tx_mac.sent, "tx"),
                   "tx_long": (held & tx_buffer.i.ready & beat.last & too_long, "tx")}
        assert strobes.keys() == set(COUNTERS), "a strobe for every counter the register map names, and no other"
        for name, (strobe, domain) in strobes.items():
            m.d.comb += getattr(self, name).eq(_gray_counter(m, strobe, domain, self.counter_width, name))
        return m


def flat_members(width: int, counter_width: int) -> dict:
    """The switch-side ports of a MAC top under AXI-Stream names, and one output per counter.

    ``s_axis_tdata/tkeep/tlast/tvalid/tready`` (frames to send) and
    ``m_axis_*`` (frames received), as cocotbext-axi's
    ``AxiStreamBus.from_prefix`` finds them; :func:`connect_flat` wires them.
    """
    members = {}
    for d, prefix in ((In, "s_axis"), (Out, "m_axis")):
        members.update({f"{prefix}_tdata": d(width), f"{prefix}_tkeep": d(width // 8), f"{prefix}_tlast": d(1),
                        f"{prefix}_tvalid": d(1), f"{prefix}_tready": d(1).flip()})
    members.update({name: Out(counter_width) for name in COUNTERS})
    return members


def connect_flat(m: Module, top, mac) -> None:
    """Wire the ports of :func:`flat_members` on ``top`` to ``mac``'s streams ``s``, ``m`` and its counters."""
    m.d.comb += [mac.s.payload.data.eq(top.s_axis_tdata), mac.s.payload.keep.eq(top.s_axis_tkeep),
                 mac.s.payload.last.eq(top.s_axis_tlast), mac.s.valid.eq(top.s_axis_tvalid),
                 top.s_axis_tready.eq(mac.s.ready),
                 top.m_axis_tdata.eq(mac.m.payload.data), top.m_axis_tkeep.eq(mac.m.payload.keep),
                 top.m_axis_tlast.eq(mac.m.payload.last), top.m_axis_tvalid.eq(mac.m.valid),
                 mac.m.ready.eq(top.m_axis_tready)]
    m.d.comb += [getattr(top, name).eq(getattr(mac, name)) for name in COUNTERS]


class MACTop(wiring.Component):
    """:class:`MAC` with flat, conventional port names: the Verilog top that Verilator and cocotb drive.

    Ports ``gmii_rxd/rx_dv/rx_er`` and ``gmii_txd/tx_en/tx_er`` (cocotbext-eth's
    ``GmiiSource``/``GmiiSink``), those of :func:`flat_members`, and the
    clocks and resets ``rx_clk``/``rx_rst``, ``tx_clk``/``tx_rst`` and
    ``clk``/``rst`` (the switch's domain). Parameters: :class:`MAC`'s.
    """

    def __init__(self, width: int = 64, **params):
        self.mac = MAC(width, **params)
        super().__init__({"gmii_rxd": In(8), "gmii_rx_dv": In(1), "gmii_rx_er": In(1),
                          "gmii_txd": Out(8), "gmii_tx_en": Out(1), "gmii_tx_er": Out(1),
                          **flat_members(width, self.mac.counter_width)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.mac = mac = self.mac
        m.d.comb += [mac.gmii_rx.data.eq(self.gmii_rxd), mac.gmii_rx.en.eq(self.gmii_rx_dv),
                     mac.gmii_rx.er.eq(self.gmii_rx_er),
                     self.gmii_txd.eq(mac.gmii_tx.data), self.gmii_tx_en.eq(mac.gmii_tx.en),
                     self.gmii_tx_er.eq(mac.gmii_tx.er)]
        connect_flat(m, self, mac)
        return m
