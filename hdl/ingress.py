"""One ingress port: frame checks, ICRC, and a store-and-forward payload buffer.

A frame's verdict needs its ICRC, which is known only after its last beat.
So the port keeps each frame's payload, realigned to lane boundaries, in a
buffer of its own, and hands a frame to the slot engine only after every
check of ``docs/protocol.md`` section 5 up to the address check passed: a
bad frame never reaches slot memory, whatever byte of it is wrong. Frames
that fail are counted here and their buffered beats are discarded here, at
the port's own rate, without taking a cycle from the shared slot pipeline.

The buffer holds two payloads, so a port takes a frame while the engine
drains the previous one; when it is full, ``i.ready`` falls (backpressure,
never a drop).

The port is four stages, each a component: :class:`HeaderCapture` counts
beats, captures the header and realigns the payload into the buffer; the
:class:`~inagg.hdl.icrc.ICRCChecker` checks the ICRC as the beats pass;
:class:`FrameChecks` runs the other checks on the captured header in the
cycle after the last beat; the port itself picks the verdict a cycle later
and queues it, and :class:`PayloadSender` hands the buffered payloads of
accepted frames to the engine and discards the others. Header fields are
read at the offsets :mod:`inagg.models.frame` declares.
"""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal, Value, signed
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from inagg.models.frame import AETH, CONTRIBUTION, IPV4, Opcode, layout
from inagg.models.job import Mode
from inagg.models.rc import PSN_MOD
from inagg.models.regmap import MODE_CODES
from inagg.models.protocol import (
    BTH_LEN, CONTRIB_HDR_LEN, ETH_LEN, ETH_TYPE_IPV4, ICRC_LEN, IMM_OPCODES, IMMDT_LEN, IP_PROTO_UDP,
    IPV4_LEN, QPN_JOB_BITS, QPN_PREFIX, QPN_WORKER_BITS, RETH_LEN, RETH_OPCODES, ROCE_UDP_PORT, UDP_LEN, Counter,
)
from inagg.hdl.axis import be_get, beat_signature, check_chunk_bytes, check_slots, check_width
from inagg.hdl.control import ContribRead, JobRead, N_COUNTERS, event_vector
from inagg.hdl.headers import field
from inagg.hdl.icrc import ICRCChecker

__all__ = ["PSN_BITS", "frame_desc_layout", "frame_signature", "AckDesc", "ICRCFeed", "HeaderCapture", "FrameChecks",
           "PayloadSender", "IngressPort"]

PSN_BITS = PSN_MOD.bit_length() - 1
"""Bits of a BTH PSN (24)."""
_HDR_LEN = CONTRIB_HDR_LEN  # bytes the checks read: Ethernet up to the end of RETH
_IP = CONTRIBUTION.offset("ipv4")
# The byte that completes the IPv4 total length.
_TOTAL_LEN_LAST = sum(CONTRIBUTION.span("ipv4.total_len")) - 1
_FIFO_DESCS = 8
_FAILING = data.StructLayout({"failed": 1, "counter": range(N_COUNTERS)})


def _first_failing(m: Module, checks: list) -> Value:
    """A ``_FAILING`` value: whether any of ``(failed, counter)`` checks failed, and the first one's counter."""
    out = Signal(_FAILING)
    for k, (failed, counter) in enumerate(checks):
        with (m.If if k == 0 else m.Elif)(failed):
            m.d.comb += [out.failed.eq(1), out.counter.eq(counter)]
    return out


def frame_desc_layout(slots: int) -> data.StructLayout:
    """What the engine needs of an accepted contribution, besides its lanes: ``translated``, an RC contribution
    whose slot its PSN names (Modes II and III); ``augmented``, of Mode III, answered by the switch; ``again``,
    no contribution but a Mode III result to send ``worker`` again (:class:`~inagg.hdl.augmented.ResendFrames`)."""
    return data.StructLayout({
        "job": QPN_JOB_BITS, "worker": QPN_WORKER_BITS, "chunk": 32, "slot": range(slots),
        "workers": QPN_WORKER_BITS + 1, "slots": 17, "translated": 1, "augmented": 1, "again": 1,
        "psn": PSN_BITS,
    })


_ACK = layout(Opcode.RC_ACK)

AckDesc = data.StructLayout({"job": QPN_JOB_BITS, "worker": QPN_WORKER_BITS, "psn": PSN_BITS,
                             "syndrome": 8, "msn": 24, "augmented": 1})
"""A host's checked ACK or NAK of a result: its (job, worker), BTH PSN and AETH. In a Mode II job it is
reflected (:class:`~inagg.hdl.translated.AckReflector`); in a Mode III job (``augmented``) it acknowledges
the switch's results (:class:`~inagg.hdl.augmented.ResultAcks`). The slot engine's own answers to Mode III
contributions take the same layout, ``augmented`` set."""


def frame_signature(width: int, slots: int) -> stream.Signature:
    """Accepted contributions: ``chunk_bytes * 8 / width`` beats of lanes each, the descriptor on every beat."""
    return stream.Signature(data.StructLayout({"data": width, "last": 1, "desc": frame_desc_layout(slots)}))


def _start_layout(beats: int) -> data.StructLayout:
    return data.StructLayout({"fire": 1, "length": 24, "stored": range(beats + 1)})


def _checked_layout(beats: int, slots: int) -> data.StructLayout:
    return data.StructLayout({"fire": 1, "before": _FAILING, "after": _FAILING, "stored": range(beats + 1),
                              "desc": frame_desc_layout(slots), "ack": 1, "aeth": 32})


def _verdict_layout(beats: int, slots: int) -> data.StructLayout:
    return data.StructLayout({"take": 1, "stored": range(beats + 1), "desc": frame_desc_layout(slots)})


class ICRCFeed(wiring.Signature):
    """The beats of a frame as :class:`~inagg.hdl.icrc.ICRCChecker` takes them, from the sender's side."""

    def __init__(self, width: int):
        super().__init__({"valid": Out(1), "beat": Out(16), "data": Out(width), "end": Out(16)})


class HeaderCapture(wiring.Component):
    """Receive stage: counts a frame's beats, captures its header bytes and realigns its payload.

    Parameters
    ----------
    width:
        Beat width in bits.
    beats:
        Payload beats of a contribution (``chunk_bytes * 8 / width``).

    Members
    -------
    i : In(beat_signature(width))
        Frames from the MAC. ``i.ready`` is ``payload.ready & room``.
    room : In(1)
        The descriptor queue has room for the verdicts that may be in flight.
    payload : Out(stream.Signature(width))
        The bytes after the captured header, realigned to lane boundaries: at
        most ``beats`` beats per frame, pushed as they arrive.
    hdr : Out(8 * 70)
        The frame's first 70 bytes (Ethernet to RETH), frame byte ``k`` in
        bits ``8k..8k+7``; complete from the cycle after the last beat.
    icrc : Out(ICRCFeed(width))
        Every accepted beat, with the datagram's end once its total length has arrived.
    start : Out(StructLayout({"fire", "length", "stored"}))
        One cycle after a last beat: ``fire``, the frame's length in bytes and
        the payload beats pushed for it.
    """

    def __init__(self, width: int, beats: int):
        self._width, self._beats = width, beats
        super().__init__({
            "i": In(beat_signature(width)),
            "room": In(1),
            "payload": Out(stream.Signature(width)),
            "hdr": Out(8 * _HDR_LEN),
            "icrc": Out(ICRCFeed(width)),
            "start": Out(_start_layout(beats)),
        })

    def elaborate(self, platform):
        m = Module()
        nb = self._width // 8
        beats = self._beats
        beat = Signal(16)
        hdr = self.hdr
        prev = Signal(self._width)
        stored = Signal(range(beats + 1))
        # Two verdicts may be in flight behind a last beat: `room` keeps space for them.
        m.d.comb += self.i.ready.eq(self.payload.ready & self.room)
        accept = self.i.valid & self.i.ready
        bdata = self.i.p.data
        # A signal, not an expression: every field slices it, and Amaranth would rebuild an
        # expression for each slice.
        hdr_now = Signal.like(hdr)
        m.d.comb += hdr_now.eq(Cat(*[Mux(beat == k // nb, bdata.word_select(k % nb, 8), hdr.word_select(k, 8))
                                     for k in range(_HDR_LEN)]))
        end_now = ETH_LEN + field(hdr_now, CONTRIBUTION, "ipv4.total_len")
        length_beat = _TOTAL_LEN_LAST // nb
        m.d.comb += [
            self.icrc.valid.eq(accept), self.icrc.beat.eq(beat), self.icrc.data.eq(bdata),
            # Beats before the total length arrives lie wholly inside any datagram long enough to matter.
            self.icrc.end.eq(Mux(beat >= length_beat, end_now, 0xFFFF) if length_beat else end_now),
        ]
        q, r = divmod(_HDR_LEN, nb)
        push = accept & (beat > q) & (beat <= q + beats)
        m.d.comb += [self.payload.p.eq(Cat(prev[8 * r:], bdata[:8 * r])), self.payload.valid.eq(push)]
        frame_len = Signal(24)
        m.d.comb += frame_len.eq(beat * nb + sum(self.i.p.keep))
        m.d.sync += self.start.fire.eq(0)
        with m.If(accept):
            m.d.sync += [hdr.eq(hdr_now), prev.eq(bdata), stored.eq(stored + push)]
            with m.If(self.i.p.last):
                m.d.sync += [beat.eq(0), stored.eq(0), self.start.fire.eq(1), self.start.length.eq(frame_len),
                             self.start.stored.eq(stored + push)]
            with m.Elif(beat != 0xFFFF):
                m.d.sync += beat.eq(beat + 1)
        return m


class FrameChecks(wiring.Component):
    """Checks stage: every check of ``docs/protocol.md`` section 5 but the ICRC, on a captured header.

    In the cycle after a frame's last beat the checks run (compares, the
    IPv4 checksum, the job-table and worker-table reads) and their outcome
    is registered: the first failing check before the ICRC's place in the
    order, the first after it, and the accepted contribution's descriptor.
    A contribution must carry its worker's ``CONTRIB_RKEY`` (check 15) and
    come in on its worker's ``PORT`` (check 14: on another port its QPN
    names no worker, ``DROP_UNKNOWN_QPN``).

    Parameters
    ----------
    chunk_bytes, slots, beats:
        The switch's chunk size and slot count; payload beats per contribution.
    port:
        The switch port the checks serve.

    Members
    -------
    hdr : In(8 * 70)
        The captured header (:class:`HeaderCapture`).
    start : In(StructLayout({"fire", "length", "stored"}))
        The frame to check.
    pkey : In(16)
        The P_Key contributions must carry.
    job : Out(JobRead())
        The job table, read for the frame's job.
    worker : Out(ContribRead())
        The worker table, read for the frame's (job, worker).
    checked : Out(StructLayout({"fire", "before", "after", "stored", "desc"}))
        A cycle after ``start.fire``: the outcome.
    """

    def __init__(self, chunk_bytes: int, slots: int, beats: int, port: int):
        self._chunk, self._slots, self._beats, self._port = chunk_bytes, slots, beats, port
        super().__init__({
            "hdr": In(8 * _HDR_LEN),
            "start": In(_start_layout(beats)),
            "pkey": In(16),
            "job": Out(JobRead()),
            "worker": Out(ContribRead()),
            "checked": Out(_checked_layout(beats, slots)),
        })

    def elaborate(self, platform):
        m = Module()
        lg_chunk = self._chunk.bit_length() - 1
        hdr = self.hdr

        def f(path):
            return field(hdr, CONTRIBUTION, path)

        total = f("ipv4.total_len")
        end = ETH_LEN + total
        ip_words = [be_get(hdr, _IP + 2 * k, 2) for k in range(IPV4_LEN // 2)]
        csum = Signal(20)
        fold1 = Signal(17)
        fold2 = Signal(16)
        m.d.comb += [csum.eq(sum(ip_words)), fold1.eq(csum[:16] + csum[16:]), fold2.eq(fold1[:16] + fold1[16:])]
        opcode = f("bth.opcode")
        pad = f("bth.pad")
        qpn = f("bth.dqpn")
        job_no = qpn[QPN_WORKER_BITS:QPN_WORKER_BITS + QPN_JOB_BITS]
        worker = qpn[:QPN_WORKER_BITS]
        va = f("reth.va")
        rkey = f("reth.rkey")
        dma_len = f("reth.dma_len")
        has_reth = opcode.matches(*sorted(RETH_OPCODES))
        has_imm = opcode.matches(*sorted(IMM_OPCODES))
        # Bytes left for the payload after RETH (and ImmDt) and the pad.
        dma_expect = Signal(signed(19))
        m.d.comb += dma_expect.eq(total - (IPV4_LEN + UDP_LEN + BTH_LEN + RETH_LEN + ICRC_LEN)
                                  - Mux(has_imm, IMMDT_LEN, 0) - pad)
        m.d.comb += [self.job.index.eq(job_no), self.worker.job.eq(job_no), self.worker.worker.eq(worker)]
        entry, own = self.job.entry, self.worker.entry
        chunk = va[lg_chunk:lg_chunk + 32]

        # Modes II and III (protocol.md sections 6.2 and 7, step 1): a known worker of such a job sends RC
        # WRITE ONLY contributions and RC ACKs of its results; everyone else UC contributions.
        # Check 14 with ingress-port binding: the worker's QPN is known on its own port only.
        known = (qpn[16:] == QPN_PREFIX) & entry.valid & (worker < entry.workers) & (own.port == self._port)
        augmented = known & (entry.mode == MODE_CODES[Mode.AUGMENTED])
        translated = augmented | (known & (entry.mode == MODE_CODES[Mode.TRANSLATED]))
        ack = translated & (opcode == Opcode.RC_ACK)
        want = Mux(translated, Opcode.RC_RDMA_WRITE_ONLY, CONTRIBUTION.opcode)
        ack_len = IPV4_LEN + UDP_LEN + BTH_LEN + AETH.size + ICRC_LEN

        n = self.start.length
        # The checks before the ICRC and those after it, each as its first failure; the ICRC's
        # result comes a cycle later, when the checker has it (IngressPort).
        before = _first_failing(m, [
            (n < ETH_LEN, Counter.DROP_BAD_LENGTH),
            (f("ethernet.ether_type") != ETH_TYPE_IPV4, Counter.DROP_NON_ROCE),
            (n < ETH_LEN + IPV4_LEN, Counter.DROP_BAD_LENGTH),
            ((f("ipv4.version") != IPV4["version"].value) | (f("ipv4.ihl") != IPV4["ihl"].value)
             | (f("ipv4.flag_rsvd") != 0) | (f("ipv4.flag_mf") != 0) | (f("ipv4.frag_offset") != 0)
             | (fold2 != 0xFFFF),
             Counter.DROP_BAD_HEADER),
            (f("ipv4.protocol") != IP_PROTO_UDP, Counter.DROP_NON_ROCE),
            ((total < IPV4_LEN + UDP_LEN) | (end > n), Counter.DROP_BAD_LENGTH),
            (f("udp.dport") != ROCE_UDP_PORT, Counter.DROP_NON_ROCE),
            ((f("udp.len") != total - IPV4_LEN)
             | (total < IPV4_LEN + UDP_LEN + BTH_LEN + ICRC_LEN), Counter.DROP_BAD_LENGTH),
        ])
        after = _first_failing(m, [
            ((f("bth.tver") != 0) | (f("bth.pkey") != self.pkey), Counter.DROP_BAD_HEADER),
            (has_reth & ((total < IPV4_LEN + UDP_LEN + BTH_LEN + RETH_LEN + ICRC_LEN)
                         | (has_imm & (total < IPV4_LEN + UDP_LEN + BTH_LEN + RETH_LEN + IMMDT_LEN + ICRC_LEN))
                         | (dma_expect < 0) | (dma_len != dma_expect[:18])), Counter.DROP_BAD_LENGTH),
            (ack & (total - pad != ack_len), Counter.DROP_BAD_LENGTH),  # the AETH alone after the BTH
            (~ack & (opcode != want), Counter.DROP_BAD_OPCODE),
            (~ack & ((dma_len != self._chunk) | (pad != 0)), Counter.DROP_BAD_LENGTH),
            (~known, Counter.DROP_UNKNOWN_QPN),
            (~ack & (rkey != own.rkey), Counter.DROP_BAD_RKEY),
            (~ack & ((va[:lg_chunk] != 0) | (va[lg_chunk + 32:] != 0)), Counter.DROP_BAD_ADDRESS),
        ])
        checked = self.checked
        m.d.sync += [
            checked.fire.eq(self.start.fire), checked.before.eq(before), checked.after.eq(after),
            checked.stored.eq(self.start.stored),
            checked.desc.job.eq(job_no), checked.desc.worker.eq(worker), checked.desc.chunk.eq(chunk),
            # Modes II and III: slot p mod 2W for PSN p (protocol.md section 6.2); UC: chunk mod R.
            checked.desc.slot.eq(entry.slot_base + (Mux(translated, f("bth.psn"), chunk) & (entry.slots - 1))),
            checked.desc.workers.eq(entry.workers), checked.desc.slots.eq(entry.slots),
            checked.desc.translated.eq(translated), checked.desc.augmented.eq(augmented),
            checked.desc.psn.eq(f("bth.psn")),
            checked.ack.eq(ack),
            checked.aeth.eq(field(hdr, _ACK, "aeth.syndrome") << 24 | field(hdr, _ACK, "aeth.msn")),
        ]
        return m


class PayloadSender(wiring.Component):
    """Send stage: the payloads of accepted frames to the engine, those of dropped frames to nowhere.

    Parameters
    ----------
    width, slots, beats:
        Beat width, slot count, payload beats per contribution.

    Members
    -------
    verdicts : In(stream.Signature(verdict layout size))
        One verdict per frame, in arrival order: take it or drop it, and how
        many payload beats it left in the buffer.
    payload : In(stream.Signature(width))
        The payload buffer's beats.
    o : Out(frame_signature(width, slots))
        Contributions to the engine, through a skid register.
    """

    def __init__(self, width: int, slots: int, beats: int):
        self._width, self._slots, self._beats = width, slots, beats
        super().__init__({
            "verdicts": In(stream.Signature(_verdict_layout(beats, slots).size)),
            "payload": In(stream.Signature(width)),
            "o": Out(frame_signature(width, slots)),
        })

    def elaborate(self, platform):
        m = Module()
        beats = self._beats
        pay, dq = self.payload, self.verdicts
        # o.ready comes late in the cycle (the engine's slot decision, the arbiter), and the payload
        # FIFO's read logic is placed by its memory: the skid register takes the beat on offer
        # whenever it is empty, so o.ready drives only its own enables, and beats pass it in the
        # same cycle when o.ready is high (no added latency, no lost cycle).
        up_valid, skid_valid = Signal(), Signal()
        up, skid = Signal(self.o.p.shape()), Signal(self.o.p.shape())
        up_ready = ~skid_valid
        m.d.comb += [self.o.valid.eq(skid_valid | up_valid),
                     self.o.p.eq(Mux(skid_valid, skid.as_value(), up.as_value()))]
        with m.If(self.o.ready):
            m.d.sync += skid_valid.eq(0)
        with m.Elif(up_valid & up_ready):
            m.d.sync += [skid_valid.eq(1), skid.eq(up)]
        head = data.View(_verdict_layout(beats, self._slots), dq.payload)
        sent = Signal(range(beats + 1))
        with m.If(dq.valid & head.take):
            last = sent == beats - 1
            m.d.comb += [
                up_valid.eq(pay.valid), up.data.eq(pay.payload), up.last.eq(last), up.desc.eq(head.desc),
                pay.ready.eq(up_ready),
            ]
            with m.If(up_valid & up_ready):
                m.d.sync += sent.eq(Mux(last, 0, sent + 1))
                m.d.comb += dq.ready.eq(last)
        with m.Elif(dq.valid):
            with m.If(sent == head.stored):
                m.d.sync += sent.eq(0)
                m.d.comb += dq.ready.eq(1)
            with m.Else():
                m.d.comb += pay.ready.eq(1)
                with m.If(pay.valid):
                    m.d.sync += sent.eq(sent + 1)
        return m


class IngressPort(wiring.Component):
    """Checks and buffers the frames of one port (see the module docstring).

    Parameters
    ----------
    width:
        Beat width in bits (64, 256 or 512).
    chunk_bytes:
        Payload bytes of a contribution, C.
    slots:
        Slots of the switch (the descriptor's slot number).
    port:
        The switch port this is: a worker's contributions count only on its own.

    Members
    -------
    i : In(beat_signature(width))
        Frames from the MAC, without FCS.
    o : Out(frame_signature(width, slots))
        Contributions that passed every stateless check, in arrival order.
        ``o.ready`` reaches only a skid register (no combinational path
        to the payload buffer).
    job : Out(JobRead())
        The job table, read at each frame's verdict.
    worker : Out(ContribRead())
        The worker table, read with the job table.
    pkey : In(16)
        The P_Key contributions must carry.
    events : Out(N_COUNTERS)
        Counter strobes: ``RX_FRAMES`` and the drop reason of each frame,
        three cycles after its last beat.
    ack : Out(stream.Signature(AckDesc, always_ready=True))
        Mode II: each checked ACK or NAK of a result, for one cycle, two
        cycles after its last beat (its bytes never reach ``o``).
    ack_room : In(1)
        The ACKs' receiver can take two more: without it the port lowers
        ``i.ready`` after a frame's last beat, as when its verdicts queue
        is full.
    """

    def __init__(self, width: int, chunk_bytes: int, slots: int, port: int):
        self._width = check_width(width)
        self._chunk = check_chunk_bytes(chunk_bytes)
        self._slots = check_slots(slots)
        self._port = port
        super().__init__({
            "i": In(beat_signature(width)),
            "o": Out(frame_signature(width, slots)),
            "job": Out(JobRead()),
            "worker": Out(ContribRead()),
            "pkey": In(16),
            "events": Out(N_COUNTERS),
            "ack": Out(stream.Signature(AckDesc, always_ready=True)),
            "ack_room": In(1, init=1),
        })

    def elaborate(self, platform):
        m = Module()
        beats = self._chunk // (self._width // 8)
        m.submodules.payload = pay = fifo.SyncFIFOBuffered(width=self._width, depth=2 * beats)
        verdict_layout = _verdict_layout(beats, self._slots)
        m.submodules.descs = dq = fifo.SyncFIFOBuffered(width=verdict_layout.size, depth=_FIFO_DESCS)
        m.submodules.capture = cap = HeaderCapture(self._width, beats)
        m.submodules.icrc = icrc = ICRCChecker(self._width)
        m.submodules.checks = chk = FrameChecks(self._chunk, self._slots, beats, self._port)
        m.submodules.send = snd = PayloadSender(self._width, self._slots, beats)

        # -- receive: count beats, capture the headers, realign the payload --
        wiring.connect(m, wiring.flipped(self.i), cap.i)
        wiring.connect(m, cap.payload, pay.w_stream)
        m.d.comb += cap.room.eq((dq.level < _FIFO_DESCS - 2) & self.ack_room)
        m.d.comb += [icrc.valid.eq(cap.icrc.valid), icrc.beat.eq(cap.icrc.beat), icrc.data.eq(cap.icrc.data),
                     icrc.end.eq(cap.icrc.end)]

        # -- verdict: the checks of protocol.md section 5, in order --
        # Two verdict stages: the checks themselves in the cycle after the last beat, registered
        # as the first failing check before the ICRC and the first after it (FrameChecks); the
        # ICRC's result and the choice between them a cycle later, when the checker has it.
        m.d.comb += [chk.hdr.eq(cap.hdr), chk.start.eq(cap.start), chk.pkey.eq(self.pkey)]
        wiring.connect(m, chk.job, wiring.flipped(self.job))
        wiring.connect(m, chk.worker, wiring.flipped(self.worker))
        checked = chk.checked
        code = Signal(range(N_COUNTERS))
        take = Signal()
        with m.If(checked.before.failed):
            m.d.comb += code.eq(checked.before.counter)
        with m.Elif(~icrc.ok):
            m.d.comb += code.eq(Counter.DROP_BAD_ICRC)
        with m.Elif(checked.after.failed):
            m.d.comb += code.eq(checked.after.counter)
        with m.Else():
            m.d.comb += take.eq(1)

        verdict = Signal(verdict_layout)
        m.d.comb += [
            verdict.take.eq(take & ~checked.ack), verdict.stored.eq(checked.stored), verdict.desc.eq(checked.desc),
            dq.w_data.eq(verdict), dq.w_en.eq(checked.fire),
            self.ack.valid.eq(checked.fire & take & checked.ack),
            self.ack.p.job.eq(checked.desc.job), self.ack.p.worker.eq(checked.desc.worker),
            self.ack.p.psn.eq(checked.desc.psn), self.ack.p.syndrome.eq(checked.aeth[24:]),
            self.ack.p.msn.eq(checked.aeth[:24]), self.ack.p.augmented.eq(checked.desc.augmented),
        ]
        # Registered: the counters' adders are in another block.
        drops = {c: checked.fire & ~take & (code == c) for c in Counter if c != Counter.RX_FRAMES}
        m.d.sync += self.events.eq(event_vector({Counter.RX_FRAMES: checked.fire, **drops}))

        # -- send: contributions to the engine, dropped frames' beats to nowhere --
        wiring.connect(m, dq.r_stream, snd.verdicts)
        wiring.connect(m, pay.r_stream, snd.payload)
        wiring.connect(m, snd.o, wiring.flipped(self.o))
        return m
