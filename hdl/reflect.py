"""Mode II's ACK reflection (``docs/protocol.md`` section 6.2, step 5): a host's ACK of a result, back to it.

:class:`AckRouter` takes each port's checked ACKs to the reflector of the worker's port;
:class:`AckReflector` makes the ACK frames of one port; :class:`FrameMux` puts them on the port's egress
between the result emitter's frames, whole frames each.
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from inagg.models.frame import Opcode, layout
from inagg.models.protocol import ICRC_LEN, Counter
from inagg.hdl.axis import beat_signature, check_width
from inagg.hdl.control import N_COUNTERS, SwitchConfig, WorkerRead, event_vector
from inagg.hdl.emitter import to_worker
from inagg.hdl.headers import header_bytes
from inagg.hdl.icrc import ICRCGenerator
from inagg.hdl.ingress import AckDesc

__all__ = ["AckRouter", "AckReflector", "FrameMux"]

_ACK = layout(Opcode.RC_ACK)
_ACK_HDR_LEN = _ACK.size


class AckReflector(wiring.Component):
    """Mode II step 5: each host's ACK or NAK of a result, back to that host as the ACK of its contribution.

    The frame is the model's (:meth:`inagg.models.modes.TranslatedJob._result_ack`): RC ACK (0x11) from the
    switch's addresses to the worker's MAC, IP and QPN, from its QP's UDP source port, with the PSN, syndrome
    and MSN unchanged, and a fresh ICRC. Descriptors wait in a FIFO of ``depth`` entries, so that a port's
    ingress hands an ACK over in one cycle while the egress is busy with a result; its header is built in the
    cycle it leaves the FIFO (the worker table read), which is the cycle the last beat of the ACK before goes
    out, and its beats go out through a one-beat register, as the :class:`~inagg.hdl.emitter.ResultEmitter`'s
    do: back to back, one beat a cycle.

    Parameters
    ----------
    width:
        Beat width.
    workers:
        Most workers per job (the worker table's stride).
    depth:
        ACKs that may wait.

    Members
    -------
    i : In(stream.Signature(AckDesc))
    o : Out(beat_signature(width))
        ACK frames.
    worker : Out(WorkerRead())
        The worker table, read for the ACK leaving the FIFO (``psn_inc`` stays low).
    switch : In(SwitchConfig)
    events : Out(N_COUNTERS)
        ``ACK_REFLECTED`` strobes, one per frame but those that say ``augmented``: the slot engine's own
        ACKs and NAKs of Mode III contributions, which go out the same way and which it counts.
    """

    def __init__(self, *, width: int, workers: int, depth: int = 4):
        self._width, self._workers, self._depth = check_width(width), workers, depth
        super().__init__({"i": In(stream.Signature(AckDesc)), "o": Out(beat_signature(width)),
                          "worker": Out(WorkerRead()), "switch": In(SwitchConfig), "events": Out(N_COUNTERS)})

    def elaborate(self, platform):
        m = Module()
        nb = self._width // 8
        m.submodules.queue = queue = fifo.SyncFIFO(width=AckDesc.size, depth=self._depth)
        # The header's full beats, then one with its last r bytes and the ICRC (58 bytes of header: r + 4 fits
        # a beat of every width).
        q, r = divmod(_ACK_HDR_LEN, nb)
        m.submodules.icrc = gen = ICRCGenerator(self._width, _ACK_HDR_LEN, beats=q + 1)
        m.d.comb += [queue.w_data.eq(self.i.payload), queue.w_en.eq(self.i.valid), self.i.ready.eq(queue.w_rdy)]
        head = data.View(AckDesc, queue.r_data)
        entry = self.worker.entry
        m.d.comb += self.worker.index.eq(head.job * self._workers + head.worker)
        hdr = Signal(8 * _ACK_HDR_LEN)
        hdr_pad = Signal((q + 1) * self._width)
        m.d.comb += hdr_pad.eq(hdr)
        # The beat of the frame; a frame of one beat (W = 512) needs no counter.
        i = Signal(range(q + 1)) if q else Const(0, 1)
        busy = Signal()
        o_valid, o_last = Signal(), Signal()
        o_data = Signal(self._width)
        o_keep = Signal(nb)
        g_last = i == q
        g_data = hdr_pad.word_select(i, self._width)
        adv = busy & (~o_valid | self.o.ready)
        m.d.comb += [gen.valid.eq(adv), gen.beat.eq(i), gen.data.eq(g_data)]
        with m.If(self.o.ready):
            m.d.sync += o_valid.eq(0)
        with m.If(adv):
            m.d.sync += [o_valid.eq(1), o_data.eq(g_data), o_last.eq(g_last),
                         o_keep.eq(Mux(g_last, (1 << (r + ICRC_LEN)) - 1, (1 << nb) - 1))]
            if q:
                m.d.sync += i.eq(i + 1)
            with m.If(g_last):
                m.d.sync += busy.eq(0)
        # The next header is built in the cycle the last beat of this one goes out, so ACKs leave back to
        # back, one beat a cycle: as fast as a port takes the ACKs in (an ACK is as long out as in).
        load = queue.r_rdy & (~busy | (adv & g_last))
        with m.If(load):
            m.d.sync += [hdr.eq(header_bytes(_ACK, {
                **to_worker(entry, self.switch, _ACK_HDR_LEN + ICRC_LEN),
                "bth.opcode": Opcode.RC_ACK, "bth.pkey": self.switch.pkey, "bth.dqpn": entry.qpn,
                "bth.psn": head.psn, "aeth.syndrome": head.syndrome, "aeth.msn": head.msn})),
                busy.eq(1)]
            if q:
                m.d.sync += i.eq(0)
        # The slot engine's own Mode III answers go out the same way; the engine counts them (ACK_SENT).
        m.d.comb += [queue.r_en.eq(load),
                     self.events.eq(event_vector({Counter.ACK_REFLECTED: load & ~head.augmented}))]
        m.d.comb += [
            self.o.valid.eq(o_valid), self.o.p.keep.eq(o_keep), self.o.p.last.eq(o_last),
            # The generator has taken the last beat when it leaves the register: its ICRC is ready.
            self.o.p.data.eq(Mux(o_last, o_data | (gen.value << (8 * r)), o_data)),
        ]
        return m


class FrameMux(wiring.Component):
    """Two streams of frames onto one, whole frames at a time, taking turns when both have one waiting.

    Between frames the mux takes the input that has a frame waiting, and
    when both have one, the input that did not have the last turn, so
    neither waits for more than one frame of the other; the input stays
    taken to its frame's last beat. Beats pass through in the same cycle;
    ``o.ready`` reaches the taken input alone.

    Members
    -------
    a, b : In(beat_signature(width))
    o : Out(beat_signature(width))
    """

    def __init__(self, width: int):
        super().__init__({"a": In(beat_signature(check_width(width))), "b": In(beat_signature(width)),
                          "o": Out(beat_signature(width))})

    def elaborate(self, platform):
        m = Module()
        busy, held, last_b = Signal(), Signal(), Signal()  # inside a frame; its input (1: b); b had the last turn
        # Between frames: b when only b waits, or when both wait and a had the last turn.
        pick_b = Mux(busy, held, self.b.valid & (~self.a.valid | ~last_b))
        src = [self.a, self.b]
        m.d.comb += [self.o.valid.eq(Mux(pick_b, self.b.valid, self.a.valid)),
                     self.o.p.eq(Mux(pick_b, self.b.p.as_value(), self.a.p.as_value())),
                     src[0].ready.eq(~pick_b & self.o.ready), src[1].ready.eq(pick_b & self.o.ready)]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += [busy.eq(~self.o.p.last), held.eq(pick_b)]
            with m.If(~busy):
                m.d.sync += last_b.eq(pick_b)
        return m


class AckRouter(wiring.Component):
    """Each ingress port's checked ACKs to the reflector of its worker's port, as the model sends them.

    Every ingress port's ACKs wait in a FIFO of ``depth`` entries
    (``room``: two more fit, the port's ``ack_room``); each output takes,
    among the FIFOs whose oldest ACK is for a worker on its port, one per
    cycle, round robin from the FIFO after the one it took last.

    With ``engine`` (a build with Mode III) a port's ACK that says
    ``augmented`` acknowledges the switch's own results: it goes to the
    slot engine (``engine``) instead; and the slot engine's own ACKs and
    NAKs of Mode III contributions (``own``, one more FIFO) go to their
    workers' ports beside the reflected ones.

    Parameters
    ----------
    ports:
        Ingress ports, and outputs.
    jobs, workers, port_bits:
        Geometry of ``ports_of`` (as the result emitters take it).
    depth:
        ACKs per ingress FIFO, 3 or more.
    engine:
        Mode III's ``own`` input and ``engine`` output.

    Members
    -------
    i : In(stream.Signature(AckDesc, always_ready=True)).array(ports)
    room : Out(ports)
    o : Out(stream.Signature(AckDesc)).array(ports)
    ports_of : In(jobs * workers * port_bits)
        Every worker's port.
    own : In(stream.Signature(AckDesc))
    engine : Out(stream.Signature(AckDesc))
    engine_from : Out(range(ports))
        With ``engine`` only; ``engine_from``: the port of the ACK on ``engine``.
    """

    def __init__(self, *, ports: int, jobs: int, workers: int, port_bits: int, depth: int = 4, engine: bool = False):
        if not isinstance(depth, int) or depth < 3:
            raise ValueError(f"ACK FIFO depth must be an integer of 3 or more, not {depth!r}")
        if not isinstance(engine, bool):
            raise TypeError(f"engine must be a bool, not {engine!r}")
        self._ports, self._workers, self._port_bits, self._depth = ports, workers, port_bits, depth
        self._engine = engine
        super().__init__({"i": In(stream.Signature(AckDesc, always_ready=True)).array(ports), "room": Out(ports),
                          "o": Out(stream.Signature(AckDesc)).array(ports),
                          "ports_of": In(jobs * workers * port_bits),
                          **({"own": In(stream.Signature(AckDesc)), "engine": Out(stream.Signature(AckDesc)),
                              "engine_from": Out(range(ports))} if engine else {})})

    def elaborate(self, platform):
        m = Module()
        n = self._ports
        heads, dests, queues = [], [], []
        # The ports' FIFOs, then with `engine` the slot engine's; output n is then the slot engine.
        sources = list(self.i) + ([self.own] if self._engine else [])
        outputs = list(self.o) + ([self.engine] if self._engine else [])
        for k, src in enumerate(sources):
            q = fifo.SyncFIFOBuffered(width=AckDesc.size, depth=self._depth)
            m.submodules[f"queue{k}"] = q
            head = data.View(AckDesc, q.r_data)
            dest = Signal(range(n + 1), name=f"dest{k}")
            m.d.comb += dest.eq(self.ports_of.word_select(head.job * self._workers + head.worker, self._port_bits))
            if k < n:
                m.d.comb += [q.w_data.eq(src.payload), q.w_en.eq(src.valid), self.room[k].eq(q.level + 2 <= self._depth)]
                if self._engine:
                    with m.If(head.augmented):
                        m.d.comb += dest.eq(n)
            else:
                m.d.comb += [q.w_data.eq(src.payload), q.w_en.eq(src.valid), src.ready.eq(q.w_rdy)]
            heads.append(head)
            dests.append(dest)
            queues.append(q)
        n_src = len(sources)
        pops = [[] for _ in range(n_src)]
        for out, o in enumerate(outputs):
            want = [queues[k].r_rdy & (dests[k] == out) for k in range(n_src)]
            last = Signal(range(n_src), name=f"last{out}")
            grant = Signal(range(n_src), name=f"grant{out}")
            with m.Switch(last):
                for prev in range(n_src):
                    with m.Case(prev):
                        order = [(prev + 1 + d) % n_src for d in range(n_src)]
                        for k in reversed(order):  # the first in round-robin order wins: assigned last
                            with m.If(want[k]):
                                m.d.comb += grant.eq(k)
            m.d.comb += [o.valid.eq(Cat(*want).any()), o.payload.eq(Array(h.as_value() for h in heads)[grant])]
            with m.If(o.valid & o.ready):
                m.d.sync += last.eq(grant)
            if out == n:
                m.d.comb += self.engine_from.eq(grant)
            for k in range(n_src):
                pops[k].append(o.valid & o.ready & (grant == k))
        for k in range(n_src):
            m.d.comb += queues[k].r_en.eq(Cat(*pops[k]).any())
        return m
