"""Testbench gateware around the switch: whole frames in and out, so Python moves frames, not beats.

A cocotb coroutine that drives an AXI-Stream beat by beat wakes Python every
clock cycle; at tens of microseconds per wake that caps the simulation far
below what Verilator runs the switch at. :class:`BridgeHarness` puts frame
rings between the switch and the testbench instead, and one word each way
for everything else.

**Rings.** Per switch port ``p`` an ingress ring ``i{p}_ring`` and an egress
ring ``o{p}_ring``, memories of ``depth`` rows. A row holds one frame:
``beats`` lanes of ``width`` bits (byte 0 of the frame in the low bits of
lane 0) and one more lane with the frame's byte length in its low 16 bits.
The testbench writes ingress rows and reads egress rows through the
simulator (VPI), one access per frame; the gateware reads and writes them a
beat at a time. Ingress: the harness loads row ``head mod depth`` when the
testbench's tail is ahead, streams it into the switch at one beat per cycle
and advances the head after the last beat. Egress: the harness writes each
frame the switch sends on port ``p`` into row ``head mod depth``; with every
row full it holds ``ready`` low, so the switch waits and nothing is lost. A
frame longer than a row keeps its true length and loses the bytes beyond
the row, so the testbench can count it as truncated.

**Words.** ``status`` (out) packs, from bit 0: the ingress heads, the egress
heads (16 bits per port each), ``order_count`` (32) and the cycle counter
(32). ``control`` (in) packs the ingress tails, the egress tails (16 bits
per port each), ``order_ack`` (32), ``wake_at`` (32) and ``wake_rx`` (1);
it passes a register, so the harness acts on a write from the second
clock edge after it.
Counters wrap; a ring holds fewer than 2**15 rows, so ``tail - head``
modulo 2**16 is its occupancy.

**Alarm.** ``alarm`` toggles at the clock edge where an egress ring
reaches half full, where the cycle counter reaches ``wake_at``, or (with
``wake_rx``) where an ingress ring runs empty. The testbench sleeps on a
change of this one signal and moves half a ring of frames per wake, so the
simulator runs alone between the events that matter; the timer bounds how
long a frame waits in a ring that does not fill.

**Order log.** The slot engine's arrival order
(:attr:`inagg.hdl.switch.Switch.order`) goes into ``order_log``: the port of
the ``n``-th contribution the engine took sits in entry ``n mod order_depth``
(bits ``e * port_bits ..`` of entry ``e``). The testbench acknowledges what
it read in ``order_ack``; the ingress rings start no new frame while fewer
than ``4 * ports`` entries are free, which covers every frame already inside
the switch, so no entry is overwritten unread.

With Mode III (``SwitchGeometry(augmented=True)``) an entry is
:attr:`RingGeometry.entry_bits` wide: a kind in its top two bits and a
payload below, so the log also says what :mod:`inagg.testbench.replay`
needs of the switch's ``hop`` stream: :data:`ENTRY_PORT` (a contribution
from port ``payload``), :data:`ENTRY_RESEND` (a frame of the switch's
Go-Back-N went through the engine; bit 0: it sent nothing), :data:`ENTRY_ACK`
(an ACK of results from port ``payload >> 1`` took effect; bit 0: its job was
torn down on its way, ``hop``'s ``gone``), :data:`ENTRY_TIMER`
(the ACK timer of job ``payload >> 6``, worker ``payload & 63`` ran out). A
``hop`` event goes in before the engine's entry of the same cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth import Cat, ClockDomain, ClockSignal, Const, Module, Mux, ResetSignal, Signal
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out

from inagg.hdl.switch import Switch
from inagg.models.geometry import SwitchGeometry, check_width
from inagg.models.protocol import ICRC_LEN, QPN_JOB_BITS, QPN_WORKER_BITS, RESULT_HDR_LEN

__all__ = ["BridgeHarness", "RingGeometry", "RING_DEPTH", "frame_slot_bytes", "COUNT_BITS", "ENTRY_PORT", "ENTRY_RESEND",
           "ENTRY_ACK", "ENTRY_TIMER", "HOP_PAYLOAD_BITS"]

COUNT_BITS = 16
ENTRY_PORT, ENTRY_RESEND, ENTRY_ACK, ENTRY_TIMER = range(4)
"""Kinds of an order log entry of a Mode III harness (module docstring)."""
HOP_PAYLOAD_BITS = QPN_JOB_BITS + QPN_WORKER_BITS
"""Payload bits of an order log entry of a Mode III harness: a timer's job and worker."""


def frame_slot_bytes(width: int, chunk_bytes: int) -> int:
    """Frame bytes of one ring row: the longest frame the protocol has (a result), in whole beats."""
    nb = width // 8
    return -(-(RESULT_HDR_LEN + chunk_bytes + ICRC_LEN) // nb) * nb


def _check_pow2(name: str, value: object, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high or value & (value - 1):
        raise ValueError(f"{name} must be a power of two from {low} to {high}, not {value!r}")
    return value


# Rows per ring unless a build says otherwise. Python wakes when an egress ring is half full, and its cost is
# mostly per wake and per batch of results, not per frame: with 4 workers at W = 512, 4 MiB each, depth 8 woke
# 1,578 times and spent 64 us of Python a packet, depth 32 403 times and 28 us, depth 64 220 times and 24 us
# (cycles 262,360 / 263,157 / 264,471: a result waits a little longer for its wake).
RING_DEPTH = 32


@dataclass(frozen=True)
class RingGeometry:
    """Where the testbench finds things in a harness: the rows of its rings, its words, its order log.

    Plain numbers, so the testbench needs no gateware object; :class:`BridgeHarness`
    builds to them. ``depth`` and ``order_depth`` are checked as the harness's parameters.
    """

    ports: int
    width: int
    chunk_bytes: int
    depth: int = RING_DEPTH
    order_depth: int = 256
    augmented: bool = False

    def __post_init__(self) -> None:
        check_width(self.width)
        _check_pow2("Ring depth", self.depth, 2, 64)
        _check_pow2("Order log depth", self.order_depth, max(8, 1 << (8 * self.ports - 1).bit_length()), 4096)

    @property
    def frame_bytes(self) -> int:
        """Frame bytes a row holds (:func:`frame_slot_bytes`)."""
        return frame_slot_bytes(self.width, self.chunk_bytes)

    @property
    def beats(self) -> int:
        """Beats of a row's frame; the length lane follows them."""
        return self.frame_bytes * 8 // self.width

    @property
    def row_bits(self) -> int:
        return (self.beats + 1) * self.width

    @property
    def port_bits(self) -> int:
        """Bits of a port number in the order log (the switch's own)."""
        return max(1, (self.ports - 1).bit_length())

    @property
    def entry_bits(self) -> int:
        """Bits of an order log entry: a port number, or with Mode III a kind and a payload (module docstring)."""
        return 2 + HOP_PAYLOAD_BITS if self.augmented else self.port_bits

    @property
    def ring_names(self) -> list[str]:
        """The Verilog names of the ring memories, ingress then egress."""
        return [f"i{p}_ring" for p in range(self.ports)] + [f"o{p}_ring" for p in range(self.ports)]


class BridgeHarness(wiring.Component):
    """:class:`~inagg.hdl.switch.Switch` behind frame rings (see the module docstring).

    Parameters
    ----------
    switch : SwitchGeometry
        The switch's geometry (:class:`~inagg.models.geometry.SwitchGeometry`),
        or instead its keywords ``ports``, ``width``, ``slots``,
        ``chunk_bytes``, ``jobs``, ``workers`` (no exception path).
    depth:
        Rows per ring, a power of two from 2 to 64 (:data:`RING_DEPTH`).
    order_depth:
        Entries of the order log, a power of two from 8 per port (at least 8) to 4096.

    Members
    -------
    clk, rst : In(1)
        The clock and the synchronous reset; the reset passes a register (it acts one edge later).
    control : In
        Tails, order acknowledgement and wake-up requests (module docstring).
    status : Out
        Heads, order count and cycle counter.
    alarm : Out(1)
        Toggles at every event the testbench waits for.
    order_log : Out(order_depth * geometry.entry_bits)
        The engine's arrival order (with Mode III, and where the hop's ACKs and timers took effect).
    s_axil_* :
        The switch's AXI4-Lite registers, as on :class:`~inagg.hdl.switch.SwitchTop`.

    The rings ``i{p}_ring`` and ``o{p}_ring`` are memories, reached through
    the simulator (:attr:`RingGeometry.ring_names` of :attr:`geometry`).
    """

    def __init__(self, switch: SwitchGeometry | None = None, *, depth: int = RING_DEPTH, order_depth: int = 256,
                 **params):
        if switch is None:
            switch = SwitchGeometry(**params)
        elif params or not isinstance(switch, SwitchGeometry):
            raise TypeError(f"BridgeHarness takes a SwitchGeometry or its keywords, not {switch!r} and "
                            f"{sorted(params)}")
        ports, width = switch.ports, switch.width
        self.geometry = g = RingGeometry(ports, width, switch.chunk_bytes, depth, order_depth, switch.augmented)
        self.switch = Switch(switch)
        assert self.switch.control.port_bits == g.port_bits
        self.ports, self.width, self.depth, self.order_depth = ports, width, depth, order_depth
        self.frame_bytes, self.beats, self.row_bits, self.port_bits = g.frame_bytes, g.beats, g.row_bits, g.port_bits
        members = {
            "clk": In(1),
            "rst": In(1),
            "control": In(2 * ports * COUNT_BITS + 65),
            "status": Out(2 * ports * COUNT_BITS + 64),
            "alarm": Out(1),
            "order_log": Out(self.order_depth * g.entry_bits),
        }
        for name, member in self.switch.axil.signature.members.items():
            members[f"s_axil_{name}"] = member
        super().__init__(members)

    def _log_hop(self, m: Module, count: Signal, at: Signal) -> None:
        """The order log of a Mode III build: the engine's entries and the ``hop`` events, up to two a cycle."""
        sw, bits = self.switch, self.geometry.entry_bits
        order, hop = sw.order, sw.hop

        def entry(kind: int, payload) -> Cat:
            return Cat(Const(0, HOP_PAYLOAD_BITS) | payload, Const(kind, 2))

        # The switch's Go-Back-N frames come through the arbiter's input after the ports.
        resent = order.p.port == self.ports
        engine = Mux(resent, entry(ENTRY_RESEND, order.p.gone), entry(ENTRY_PORT, order.p.port))
        hop_entry = Mux(hop.p.ack, entry(ENTRY_ACK, Cat(hop.p.gone, hop.p.port)), entry(ENTRY_TIMER, Cat(hop.p.worker, hop.p.job)))
        with m.If(hop.valid):
            m.d.sync += [count.eq(count + 1 + order.valid), self.order_log.word_select(at, bits).eq(hop_entry)]
            with m.If(order.valid):
                m.d.sync += self.order_log.word_select((at + 1)[:len(at)], bits).eq(engine)
        with m.Elif(order.valid):
            m.d.sync += [count.eq(count + 1), self.order_log.word_select(at, bits).eq(engine)]

    def elaborate(self, platform):
        m = Module()
        m.submodules.switch = sw = self.switch
        # The reset passes a register, as the control word does: every register's next-state logic reads
        # the reset, so with the reset a top-level input Verilator evaluates all of it in the input region,
        # at both eval calls of a cycle (rising and falling edge) besides the clocked region.
        m.domains.sync = ClockDomain("sync")
        m.domains.rst_in = ClockDomain("rst_in", reset_less=True)
        rst_q = Signal(init=1)
        m.d.rst_in += rst_q.eq(self.rst)
        m.d.comb += [ClockSignal("sync").eq(self.clk), ClockSignal("rst_in").eq(self.clk),
                     ResetSignal("sync").eq(rst_q)]
        P, W, K, beats = self.ports, self.width, self.depth, self.beats
        nb = W // 8
        lg_nb = nb.bit_length() - 1
        lg_k = K.bit_length() - 1

        for name, member in sw.axil.signature.members.items():
            mine, theirs = getattr(self, f"s_axil_{name}"), getattr(sw.axil, name)
            m.d.comb += (mine.eq(theirs) if member.flow == Out else theirs.eq(mine))

        # The testbench's word passes a register: with nothing in the switch depending combinationally on a
        # top-level input, Verilator's input region (evaluated again at every eval call) is left nearly empty.
        ctl = Signal.like(self.control, name="control_q")
        m.d.sync += ctl.eq(self.control)
        itail = [ctl[COUNT_BITS * p:COUNT_BITS * (p + 1)] for p in range(P)]
        otail = [ctl[COUNT_BITS * (P + p):COUNT_BITS * (P + p + 1)] for p in range(P)]
        order_ack = ctl[2 * P * COUNT_BITS:][:32]
        wake_at = ctl[2 * P * COUNT_BITS + 32:][:32]
        wake_rx = ctl[2 * P * COUNT_BITS + 64]

        cycle = Signal(32)
        m.d.sync += cycle.eq(cycle + 1)

        # Order log: a circular buffer written at each engine take.
        count = Signal(32)
        at = count[:(self.order_depth - 1).bit_length()]
        if self.switch.augmented:
            self._log_hop(m, count, at)
        else:
            with m.If(sw.order.valid):
                m.d.sync += [count.eq(count + 1), self.order_log.word_select(at, self.port_bits).eq(sw.order.p.port)]
        room = Signal()
        m.d.comb += room.eq((count - order_ack)[:32] < self.order_depth - 4 * P)

        iheads, oheads, rx_fire, tx_fire = [], [], [], []
        for p in range(P):
            # -- ingress: load the head row, stream it one beat per cycle --
            ring = memory.Memory(shape=self.row_bits, depth=K, init=[])
            m.submodules[f"i{p}_ring"] = ring
            rd = ring.read_port()
            s = sw.s[p]
            head = Signal(COUNT_BITS)
            loaded = Signal()  # rd.data holds row head mod K
            beat = Signal(range(beats))
            length = rd.data[beats * W:][:COUNT_BITS]
            last_beat = Signal(COUNT_BITS)
            rem = Signal(range(nb + 1))
            m.d.comb += [last_beat.eq((length - 1) >> lg_nb), rem.eq(length - (last_beat << lg_nb))]
            last = beat == last_beat
            pending = head != itail[p]
            m.d.comb += [
                rd.addr.eq(head[:lg_k]),
                # Load when a row is ready; a started frame ignores the order log, a new one waits for room.
                rd.en.eq(~loaded & pending & room),
                s.valid.eq(loaded),
                s.p.data.eq(rd.data.word_select(beat, W)),
                s.p.keep.eq(Mux(last, ~(Const((1 << nb) - 1, nb) << rem)[:nb], (1 << nb) - 1)),
                s.p.last.eq(last),
            ]
            with m.If(rd.en):
                m.d.sync += loaded.eq(1)
            with m.If(s.valid & s.ready):
                with m.If(last):
                    m.d.sync += [beat.eq(0), head.eq(head + 1), loaded.eq(0)]
                with m.Else():
                    m.d.sync += beat.eq(beat + 1)
            iheads.append(head)
            rx_fire.append(s.valid & s.ready & last & ((head + 1)[:COUNT_BITS] == itail[p]))

            # -- egress: write the switch's frames into the rows, a beat per lane --
            ring = memory.Memory(shape=self.row_bits, depth=K, init=[])
            m.submodules[f"o{p}_ring"] = ring
            wr = ring.write_port(granularity=W)
            o = sw.m[p]
            ohead = Signal(COUNT_BITS)
            obeat = Signal(COUNT_BITS)
            olen = Signal(COUNT_BITS)
            m.d.comb += [o.ready.eq((ohead - otail[p])[:COUNT_BITS] < K), olen.eq((obeat << lg_nb) + sum(o.p.keep))]
            take = o.valid & o.ready
            m.d.comb += [
                wr.addr.eq(ohead[:lg_k]),
                wr.data.eq(Cat(*([o.p.data] * beats), olen)),
                wr.en.eq(Cat(*[take & (obeat == b) for b in range(beats)], take & o.p.last)),
            ]
            with m.If(take):
                m.d.sync += obeat.eq(Mux(o.p.last, 0, obeat + 1))
                with m.If(o.p.last):
                    m.d.sync += ohead.eq(ohead + 1)
            oheads.append(ohead)
            tx_fire.append(take & o.p.last & ((ohead + 1 - otail[p])[:COUNT_BITS] == K // 2))

        m.d.comb += self.status.eq(Cat(*iheads, *oheads, count, cycle))
        alarm = Signal()
        with m.If(Cat(*tx_fire).any() | (wake_rx & Cat(*rx_fire).any()) | (cycle == wake_at)):
            m.d.sync += alarm.eq(~alarm)
        m.d.comb += self.alarm.eq(alarm)
        return m
