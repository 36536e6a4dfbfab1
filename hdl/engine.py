"""The slot engine: direct-mapped slots and their read-modify-write pipeline, INT32 lanes promoted to FP32.

Slot ``s`` holds one chunk: its lanes in the lane memory (``beats`` words
of ``width`` bits at ``s * beats``, each with one promotion bit per lane,
:func:`lane_word_layout`) and its state in the metadata memory: ``state``
(FREE, AGG, DONE), the key (``job``, ``chunk``), the worker ``bitmap``,
``count`` and the ``first`` bit (the slot has not completed since it was
FREE: a second chunk then restarts it). A contribution streams through the pipeline one beat per cycle,
never stalling once started:

* **A** reads, on a frame's first beat, the slot's metadata.
* **M** registers the metadata as read, so that no path runs from the
  block RAM through the slot rules.
* **B** decides on the first beat what the frame does (the rules of
  ``docs/protocol.md`` section 3, fast path only: a slot held by another
  job is ``DROP_COLLISION``), writes the metadata back, and reads the
  beat's lane word. The decision is registered for stage L, one copy per
  four lanes, and so are its counter strobes.
* **L** adds the lanes in INT32 with the exact 33-bit sum beside it, and
  picks what each lane's :class:`~inagg.hdl.fp32.IntToFP32` converts: the
  contribution of a promoted lane, the exact sum of an unpromoted one. That
  choice is registered before the converter (one cycle), which keeps the
  converter off the lane word's path.
* **FP** (``1 + convert_latency + add_latency`` cycles, the first of them
  that register): a promoted lane adds the converted contribution to its
  word in its :class:`~inagg.hdl.fp32.FP32Adder`; every other lane waits
  beside it.
* **W** writes the beat's words and promotion bits (a slot's first
  contribution is stored as it came), as :func:`inagg.models.arith.accumulate`
  has them: an INT32 sum, the converted exact sum of the addition that
  overflowed, or the FP32 sum of a promoted lane. When the frame completes
  the chunk or asks for a resend it sends the beat on to the result
  emitters, with every lane also as binary32 (the converter's output of an
  unpromoted lane), since only the chunk's last beat tells whether the
  result goes out as FP32.

Every beat takes the same number of cycles, promoted or not, so writes land
in order through one write port and the pipeline takes one beat per cycle
whatever the lanes hold. A read in B of the word W writes in the same cycle
sees the new value (the read port is transparent to the write port). A
frame to the slot of a frame still in flight would read a word before its
new value lands when frames are shorter than the pipeline
(``beats <= lag``): its first beat then waits until the earlier frame's
last beat is ``lag - beats + 2`` cycles past A (:attr:`SlotEngine.lag`).
The metadata needs no such wait and no forwarding: it is written in B, two
cycles after its read in A, and the next frame's first beat is read four
beats (a chunk's fewest) after the last one's. A first beat also waits
while a frame that sends a result is on its way from L to the emitters,
so that ``can_start`` has counted that result.

:class:`SlotRules` is the one place that maps a contribution to what its
slot does (the seam of the exception path); :class:`SlotDecision` applies
it on a frame's first beat and holds it for the later ones. The stages'
datapaths are :class:`LaneUpdate` (L), :class:`Promotion` (FP) and
:class:`ResultHandoff` (W); :class:`SlotSweep` clears the metadata after
reset and runs a teardown's sweeps.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from inagg.models.protocol import MAX_WORKERS, QPN_JOB_BITS, QPN_WORKER_BITS, Counter
from inagg.models.switch import SlotState
from inagg.hdl.axis import check_chunk_bytes, check_slots, check_width, swap_lanes
from inagg.hdl.control import N_COUNTERS, event_vector
from inagg.hdl.fp32 import FP32Adder, IntToFP32
from inagg.hdl.ingress import PSN_BITS, AckDesc, frame_desc_layout, frame_signature
from inagg.hdl.translated import PsnTable, TranslatedRules, translated_events
from inagg.hdl.augmented import (STAMP_BITS, AugmentedReply, AugmentedRules, ResultAck, ResultAcks, Resend,
                                 augmented_events)

__all__ = ["check_fp32_latencies", "meta_layout", "SweepRequest", "Outcome", "SlotRules", "SlotSweep",
           "DecisionOutcome", "lane_word_layout", "result_desc_layout", "result_signature", "SlotDecision", "LaneUpdate", "Promotion",
           "ResultHandoff", "SlotEngine"]


def meta_layout(workers: int, psn: bool = False) -> data.StructLayout:
    """A slot's state, key, worker bitmap and count; ``first``: the slot has not completed since it was FREE
    (``docs/protocol.md`` section 3, "Liveness"); ``guest``: another job's key diverted from it while held.
    With ``psn`` (a build with Mode II), the PSN a Mode II slot holds; its ``done`` is state DONE."""
    return data.StructLayout({"state": 2, "job": QPN_JOB_BITS, "chunk": 32, "bitmap": workers,
                              "count": range(MAX_WORKERS + 1), "first": 1, "guest": 1,
                              **({"psn": PSN_BITS} if psn else {})})


SweepRequest = data.StructLayout({"start": 1, "job": QPN_JOB_BITS, "first": 17, "count": 17, "check": 1})
"""A sweep over slots ``first .. first + count - 1`` for the slots ``job`` holds: with ``check``, whether one of
them is marked ``guest``; without, clear them to FREE (a job's teardown)."""


def lane_word_layout(width: int) -> data.StructLayout:
    """One word of the lane memory: ``width // 32`` native 32-bit lanes and their promotion bits."""
    return data.StructLayout({"words": width, "promoted": width // 32})


def result_desc_layout(slots: int) -> data.StructLayout:
    """Which result a beat belongs to: ``all`` workers of the job, or ``worker`` alone (a resend); with
    ``translated``, a Mode II result, sent as RC with its contributions' ``psn``."""
    return data.StructLayout({"job": QPN_JOB_BITS, "worker": QPN_WORKER_BITS, "all": 1,
                              "workers": QPN_WORKER_BITS + 1, "chunk": 32, "ring": range(slots),
                              "translated": 1, "psn": PSN_BITS})


def result_signature(width: int, slots: int) -> stream.Signature:
    """Result payloads, in wire order, with their descriptor; never stalled (emitters keep room).

    ``data`` holds the lanes as the slot does (INT32, or binary32 where
    promoted), ``fp`` every lane as binary32; ``promoted`` says whether a
    lane of the chunk up to this beat is promoted, so on the last beat
    whether the result goes out as ``fp`` (ImmDt bit 31) or as ``data``.
    """
    return stream.Signature(data.StructLayout({"data": width, "fp": width, "promoted": 1, "first": 1, "last": 1,
                                               "desc": result_desc_layout(slots)}), always_ready=True)


def _check_latency(what: str, latency: object, most: int) -> int:
    if not isinstance(latency, int) or isinstance(latency, bool) or not 1 <= latency <= most:
        raise ValueError(f"{what} latency must be an integer from 1 to {most}, not {latency!r}")
    return latency


def check_fp32_latencies(convert_latency: object, add_latency: object) -> tuple[int, int]:
    """Raise ``ValueError`` unless both are latencies :class:`SlotEngine` takes; return them."""
    return _check_latency("Conversion", convert_latency, 4), _check_latency("Adder", add_latency, 6)


def _delay_line(m: Module, value, shape, cycles: int, name: str, reset_less: bool = True) -> list:
    """``value`` followed by its copies 1 to ``cycles`` cycles late (element k is k cycles late)."""
    taps = [value]
    for k in range(1, cycles + 1):
        reg = Signal(shape, name=f"{name}_{k}", reset_less=reset_less)
        m.d.sync += reg.eq(taps[-1])
        taps.append(reg)
    return taps


Outcome = data.StructLayout({"add": 1, "store": 1, "dup": 1, "resend": 1, "complete": 1,
                              "unknown_qpn": 1, "collision": 1, "stale": 1, "window": 1})
"""What the slot rules make of one contribution: ``add`` it (``store``: as the slot's first), a ``dup``licate
(``resend``: of a result already made), ``complete`` the chunk, or drop it for one of the four reasons."""

DecisionOutcome = data.StructLayout({**dict(Outcome.members), "ahead": 1, "bad_address": 1, "busy": 1,
                                     "ack": 1, "nak": 1, "again": 1, "bad_opcode": 1})
""":data:`Outcome`, Mode II's own two drops (:class:`~inagg.hdl.translated.TranslatedRules`), Mode III's
``busy`` drop and ``ack``/``nak`` answers (:class:`~inagg.hdl.augmented.AugmentedRules`) and its ``again``
(a result sent to one child again on its NAK), and ``bad_opcode`` for an RC frame whose job was torn down
after its port's checks, each 0 where its mode does not apply: what :class:`SlotDecision` decides."""


class SlotRules(wiring.Component):
    """The slot decision: the rules of ``docs/protocol.md`` section 3 for one contribution, combinationally.

    The one place that maps a contribution to what its slot does (the seam
    of the exception path: a slot held by another job is a ``collision``).

    Parameters
    ----------
    workers:
        Most workers per job (bits of a slot's bitmap).
    depth:
        Slot numbers (direct-mapped and overflow slots).

    Members
    -------
    meta : In(meta_layout(workers))
        The slot's metadata as read.
    desc : In(frame_desc_layout(depth))
        The contribution.
    gone : In(1)
        Its job is no longer enabled.
    outcome : Out(Outcome)
    new : Out(meta_layout(workers))
        The slot's metadata after the contribution (written when ``outcome.add``).
    """

    def __init__(self, workers: int, depth: int):
        self._workers = workers
        super().__init__({"meta": In(meta_layout(workers)), "desc": In(frame_desc_layout(depth)), "gone": In(1),
                          "outcome": Out(Outcome), "new": Out(meta_layout(workers))})

    def elaborate(self, platform):
        m = Module()
        meta, desc, out = self.meta, self.desc, self.outcome
        fresh, proceed = Signal(), Signal()
        ahead = Signal(32)
        m.d.comb += ahead.eq(desc.chunk - meta.chunk)
        with m.If(self.gone):
            m.d.comb += out.unknown_qpn.eq(1)
        with m.Elif(meta.state == SlotState.FREE):
            m.d.comb += [fresh.eq(1), proceed.eq(1)]
        with m.Elif(meta.job != desc.job):
            m.d.comb += out.collision.eq(1)
        with m.Elif(meta.chunk == desc.chunk):
            m.d.comb += proceed.eq(1)
        with m.Elif(meta.first):
            # A slot that never completed meets a second chunk: one of the two is a stray, which must
            # not hold the slot for good; the workers' retransmissions bring the right one back
            # (protocol.md "Liveness").
            m.d.comb += [fresh.eq(1), proceed.eq(1)]
        with m.Elif(ahead[31]):
            m.d.comb += out.stale.eq(1)
        with m.Elif((ahead != desc.slots) | (meta.state != SlotState.DONE)):
            m.d.comb += out.window.eq(1)
        with m.Else():
            # The job's next generation: every worker holds the old result (protocol.md "Slot reuse").
            m.d.comb += [fresh.eq(1), proceed.eq(1)]
        bitmap = Mux(fresh, 0, meta.bitmap)
        count = Mux(fresh, 0, meta.count)
        done_before = ~fresh & (meta.state == SlotState.DONE)
        dup = proceed & bitmap.bit_select(desc.worker, 1)
        add = proceed & ~dup
        complete = add & (count + 1 == desc.workers)
        new = self.new
        m.d.comb += [
            new.state.eq(Mux(complete, SlotState.DONE, SlotState.AGG)), new.job.eq(desc.job),
            new.chunk.eq(desc.chunk), new.bitmap.eq(bitmap | (Const(1, self._workers) << desc.worker)[:self._workers]),
            new.count.eq(count + 1), new.guest.eq(meta.guest),
            new.first.eq(~complete & ((meta.state == SlotState.FREE) | meta.first)),
            out.add.eq(add), out.store.eq(add & (count == 0)), out.dup.eq(dup), out.resend.eq(dup & done_before),
            out.complete.eq(complete),
        ]
        return m


class SlotSweep(wiring.Component):
    """The metadata sweeps: every slot to FREE after reset, and a teardown's pass over a job's slots.

    After reset it writes FREE into slot ``clear_addr`` each cycle while
    ``clearing``. A requested sweep (:data:`SweepRequest`) then reads one
    slot a cycle through the pipeline's metadata read port (``read`` at
    ``read_addr``; the pipeline is empty meanwhile) and acts on it the next
    cycle (``acts``, with the slot's metadata in ``meta``): with ``check``
    it raises ``hazard`` for a slot of the job marked ``guest``, without it
    clears the job's slots (``write_en`` at ``write_addr``).

    Parameters
    ----------
    depth:
        Slot numbers.

    Members
    -------
    sweep : In(SweepRequest)
    meta : In(meta_layout(workers))
        The metadata read the cycle before.
    clearing : Out(1)
    clear_addr : Out(range(depth + 1))
    busy : Out(1)
        A sweep runs, from the cycle after its ``start``.
    hazard : Out(1)
    read : Out(1)
    read_addr : Out(range(depth))
    acts : Out(1)
    write_en : Out(1)
    write_addr : Out(range(depth))
    """

    def __init__(self, depth: int, workers: int):
        self._depth = depth
        super().__init__({
            "sweep": In(SweepRequest), "meta": In(meta_layout(workers)),
            "clearing": Out(1), "clear_addr": Out(range(depth + 1)), "busy": Out(1), "hazard": Out(1),
            "read": Out(1), "read_addr": Out(range(depth)), "acts": Out(1),
            "write_en": Out(1), "write_addr": Out(range(depth)),
        })

    def elaborate(self, platform):
        m = Module()
        # After reset every slot is FREE: sweep the metadata before taking a contribution
        # (the lanes need no clearing, a slot's first contribution is stored as it comes).
        sweep = Signal(range(self._depth + 1))
        clearing = sweep != self._depth
        with m.If(clearing):
            m.d.sync += sweep.eq(sweep + 1)
        m.d.comb += [self.clearing.eq(clearing), self.clear_addr.eq(sweep)]

        # A teardown's sweep: read a slot a cycle, act on it the next (the metadata ports are the
        # pipeline's, which is empty meanwhile).
        sw = Signal(SweepRequest)
        sw_busy, sw_next = Signal(), Signal(range(self._depth + 1))
        sw_read, sw_acts = Signal(), Signal()
        sw_addr = Signal(range(self._depth))
        with m.If(self.sweep.start):
            m.d.sync += [sw.eq(self.sweep), sw_busy.eq(1), sw_next.eq(0), self.hazard.eq(0)]
        # Registered: the sweep's requester starts the next sweep when this falls.
        m.d.comb += [self.busy.eq(sw_busy),
                     sw_read.eq(sw_busy & ~clearing & (sw_next != sw.count))]
        m.d.sync += sw_acts.eq(sw_read)
        with m.If(sw_read):
            m.d.sync += [sw_next.eq(sw_next + 1), sw_addr.eq(sw.first + sw_next)]
        with m.If(sw_busy & (sw_next == sw.count) & ~sw_acts):
            m.d.sync += sw_busy.eq(0)
        swept = self.meta
        sw_held = sw_acts & (swept.state != SlotState.FREE) & (swept.job == sw.job)
        with m.If(sw_held & sw.check & swept.guest):
            m.d.sync += self.hazard.eq(1)
        m.d.comb += [self.read.eq(sw_read), self.read_addr.eq(sw.first + sw_next), self.acts.eq(sw_acts),
                     self.write_en.eq(sw_held & ~sw.check), self.write_addr.eq(sw_addr)]
        return m


#: Lanes that share one copy of stage L's write and store strobes: a copy drives 4 x 33 multiplexer
#: bits, not the whole beat's (the decision's fan-out was the switch's worst path, ``docs/synth.md``).
_LANES_PER_STROBE = 4


def _beat_layout(width: int, beats: int, depth: int) -> data.StructLayout:
    """A beat on its way from stage B to stage W: where it goes, what its frame does, and its INT32 words."""
    n_lanes = width // 32
    return data.StructLayout({"first": 1, "last": 1, "j": range(beats), "write": 1, "emit": 1, "to_all": 1,
                              "adds": n_lanes, "promoted": n_lanes, "overflow": n_lanes, "word": width,
                              "desc": frame_desc_layout(depth)})


class SlotDecision(wiring.Component):
    """Stage B's control: the slot rules on a frame's first beat, held for the frame's later beats.

    The first beat's :class:`SlotRules` outcome decides what every beat of
    the frame does; the later beats take it from registers, so only the
    first beat of a frame waits on the metadata read.

    Parameters
    ----------
    workers, depth : int
        As :class:`SlotRules`.

    Members
    -------
    valid, first : In(1)
        A beat is in stage B; it is its frame's first.
    meta, desc, gone : In
        The :class:`SlotRules` inputs (``meta`` as read, meaningful on a first beat).
    outcome : Out(DecisionOutcome)
        The rules' outcome (meaningful on a first beat, ``decide``).
    decide : Out(1)
        ``valid & first``: the rules act, and their counters count.
    meta_en : Out(1)
        Write ``meta_data`` into the beat's slot.
    meta_data : Out(meta_layout(workers))
    write, store : Out(copies)
        What the beat does: its lanes are written (``store``: as the slot's
        first contribution); ``copies`` equal bits, for flip-flops that each
        drive a group of lanes.
    emit, to_all : Out(1)
        It goes on to the emitters (``to_all``: to every worker of the job,
        else to its own worker alone, a resend).
    expected : In(PSN_BITS)
        With ``translated`` (a build with Mode II): the worker's expected
        PSN, for a frame whose descriptor says ``translated``, which
        :class:`~inagg.hdl.translated.TranslatedRules` decides.
    psn_en : Out(1)
        Write ``next_expected`` (and with ``augmented``, ``next_nak_sent``) for the frame's worker.
    next_expected : Out(PSN_BITS)
    shadow_clear : Out(1)
        On a frame's later beats: the frame was a Mode II add, so its
        worker's bit in the shadow slot is cleared.
    nak_sent, freed : In(1)
        With ``augmented`` (a build with Mode III), for a frame whose
        descriptor says ``augmented``, which
        :class:`~inagg.hdl.augmented.AugmentedRules` decides: the worker's
        "NAK sent" bit, and whether every child has ACKed the result the
        slot holds (:class:`~inagg.hdl.augmented.ResultAcks`), so that the
        slot counts as free.
    next_nak_sent : Out(1)
    reply_en : Out(1)
        Send ``reply``, the ACK or NAK that answers the frame, to its worker.
    reply : Out(AugmentedReply)
    done_en : Out(1)
        The frame completed a Mode III result (for :class:`~inagg.hdl.augmented.ResultAcks`).
    """

    def __init__(self, workers: int, depth: int, overflow: bool, copies: int = 1, translated: bool = False,
                 augmented: bool = False):
        if augmented and not translated:
            raise ValueError("A build with Mode III must have Mode II's PSN state too (translated=True)")
        self._workers, self._depth, self._overflow, self._copies = workers, depth, overflow, copies
        self._translated, self._augmented = translated, augmented
        layout = meta_layout(workers, translated)
        mode_iii = {"nak_sent": In(1), "freed": In(1), "next_nak_sent": Out(1), "reply_en": Out(1),
                    "reply": Out(AugmentedReply), "done_en": Out(1)} if augmented else {}
        super().__init__({"valid": In(1), "first": In(1), "meta": In(layout),
                          "desc": In(frame_desc_layout(depth)), "gone": In(1), "outcome": Out(DecisionOutcome),
                          "decide": Out(1), "meta_en": Out(1), "meta_data": Out(layout),
                          "write": Out(copies), "store": Out(copies), "emit": Out(1), "to_all": Out(1),
                          "expected": In(PSN_BITS), "psn_en": Out(1), "next_expected": Out(PSN_BITS),
                          "shadow_clear": Out(1), **mode_iii})

    def elaborate(self, platform):
        m = Module()
        m.submodules.rules = rules = SlotRules(self._workers, self._depth)
        m.d.comb += [rules.meta.eq(self.meta), rules.desc.eq(self.desc), rules.gone.eq(self.gone)]
        first = self.first
        decide = self.valid & first
        out = Signal(DecisionOutcome)  # the UC rules' outcome, zero-extended: no Mode II drop
        new = Signal(meta_layout(self._workers, self._translated))
        m.d.comb += [out.eq(rules.outcome), new.eq(rules.new)]
        if self._translated:
            # A Mode II frame of a job still there: TranslatedRules on the same metadata (done is DONE).
            mode_ii = self.desc.translated & ~self.desc.augmented & ~self.gone
            m.submodules.translated = tr = TranslatedRules(self._workers, 1 << 16)
            d, meta = self.desc, self.meta
            m.d.comb += [tr.meta.psn.eq(meta.psn), tr.meta.chunk.eq(meta.chunk), tr.meta.bitmap.eq(meta.bitmap),
                         tr.meta.count.eq(meta.count), tr.meta.done.eq(meta.state == SlotState.DONE),
                         tr.desc.worker.eq(d.worker), tr.desc.psn.eq(d.psn), tr.desc.chunk.eq(d.chunk),
                         tr.desc.workers.eq(d.workers), tr.desc.slots.eq(d.slots), tr.expected.eq(self.expected),
                         self.next_expected.eq(tr.next_expected), self.psn_en.eq(decide & mode_ii & tr.outcome.add)]
            with m.If(mode_ii):
                m.d.comb += [out.eq(0), *[getattr(out, f).eq(getattr(tr.outcome, f)) for f in
                                          ("add", "store", "dup", "resend", "complete", "stale", "window", "ahead",
                                           "bad_address")],
                             new.eq(0), new.state.eq(Mux(tr.new.done, SlotState.DONE, SlotState.AGG)),
                             new.job.eq(d.job), new.chunk.eq(tr.new.chunk), new.bitmap.eq(tr.new.bitmap),
                             new.count.eq(tr.new.count), new.guest.eq(meta.guest), new.psn.eq(tr.new.psn)]
            held_clear = Signal()
            with m.If(decide):
                m.d.sync += held_clear.eq(mode_ii & tr.outcome.add)
            m.d.comb += self.shadow_clear.eq(self.valid & ~first & held_clear)
        if self._augmented:
            # A Mode III frame: AugmentedRules on the same metadata, a slot whose result every child ACKed
            # being empty (its bitmap read as 0), so the frame starts it afresh.
            mode_iii = self.desc.augmented & ~self.gone
            m.submodules.augmented = ar = AugmentedRules(self._workers, 1 << 16)
            d, meta = self.desc, self.meta
            m.d.comb += [ar.meta.psn.eq(meta.psn), ar.meta.chunk.eq(meta.chunk),
                         ar.meta.bitmap.eq(Mux(self.freed, 0, meta.bitmap)), ar.meta.count.eq(meta.count),
                         ar.meta.done.eq(meta.state == SlotState.DONE),
                         ar.desc.worker.eq(d.worker), ar.desc.psn.eq(d.psn), ar.desc.chunk.eq(d.chunk),
                         ar.desc.workers.eq(d.workers), ar.desc.slots.eq(d.slots), ar.expected.eq(self.expected),
                         ar.nak_sent.eq(self.nak_sent), self.reply.eq(ar.reply)]
            again = mode_iii & d.again
            with m.If(again):
                # A result asked for again (ResendFrames): sent from the slot to the child while the slot
                # holds it, as it does until this child too has ACKed it; a slot that has moved on (its job
                # torn down and set up again) sends nothing.
                m.d.comb += [out.eq(0), out.again.eq((meta.state == SlotState.DONE) & (meta.psn == d.psn)),
                             self.psn_en.eq(0)]
            with m.Elif(mode_iii):
                m.d.comb += [out.eq(0), *[getattr(out, f).eq(getattr(ar.outcome, f)) for f in
                                          ("add", "store", "dup", "complete", "ahead", "busy", "bad_address",
                                           "ack", "nak")],
                             new.eq(0), new.state.eq(Mux(ar.new.done, SlotState.DONE, SlotState.AGG)),
                             new.job.eq(d.job), new.chunk.eq(ar.new.chunk), new.bitmap.eq(ar.new.bitmap),
                             new.count.eq(ar.new.count), new.guest.eq(meta.guest), new.psn.eq(ar.new.psn),
                             self.next_expected.eq(ar.next_expected), self.next_nak_sent.eq(ar.next_nak_sent),
                             self.psn_en.eq(decide & ar.write)]
            m.d.comb += [self.reply_en.eq(decide & mode_iii & ~again & (ar.outcome.ack | ar.outcome.nak)),
                         self.done_en.eq(decide & mode_iii & ~again & ar.outcome.complete)]
        if self._translated:
            with m.If(self.gone & self.desc.translated):
                # An RC frame whose job is gone is dropped as the model's port checks drop it, with no job
                # for its QPN: only UC's opcode is taken there. A result asked for again is no frame from
                # the network and counts nothing (the model's copy went out at once, before the teardown).
                m.d.comb += [out.eq(0), out.bad_opcode.eq(~self.desc.again)]
        m.d.comb += [self.outcome.eq(out), self.decide.eq(decide)]
        # With overflow slots, a slot that another job's key diverted from is marked, so that
        # its holder's teardown can tell whether freeing it would leave keys with entries on a
        # FREE fast slot (docs/exception.md "Teardown").
        marks = decide & out.collision if self._overflow else Const(0, 1)
        marked = Signal(meta_layout(self._workers, self._translated))
        m.d.comb += [marked.eq(self.meta), marked.guest.eq(1),
                     self.meta_data.eq(Mux(marks, marked, new)), self.meta_en.eq(decide & (out.add | marks))]
        # Each copy of write and store holds the frame's decision in a register of its own: copies
        # that differed in nothing would be merged by synthesis into one again.
        held = {"write": out.add, "store": out.store, "emit": out.complete | out.resend | out.again,
                "to_all": out.complete}
        for name, now in held.items():
            port = getattr(self, name)
            for k in range(len(port)):
                frame = Signal(name=f"frame_{name}{k}")
                m.d.comb += port[k].eq(Mux(first, now, frame))
                with m.If(decide):
                    m.d.sync += frame.eq(port[k])
        return m


class LaneUpdate(wiring.Component):
    """Stage B's lanes: each lane's INT32 sum, whether it overflows, and what its converter takes.

    Each lane has one converter: a promoted lane converts its contribution
    for the adder; an unpromoted lane converts its exact 33-bit sum, which is
    its new word when the addition overflowed and its binary32 value for a
    result that goes out as FP32. Combinational.

    Parameters
    ----------
    width : int
        Beat width in bits.

    Members
    -------
    acc : In(lane_word_layout(width))
        The beat's lane word as read.
    x : In(width)
        The contribution's lanes, native order.
    write, store : In(width // 32)
        Per lane, the same strobe: the beat's lanes are written (``store``: as the slot's
        first contribution). One bit per lane, so that each group of lanes can take its own
        copy of the flip-flop.
    word : Out(width)
        The new INT32 words (the word as read where nothing is written).
    promoted : Out(width // 32)
        Lanes promoted before this contribution.
    overflow : Out(width // 32)
        Lanes this contribution promotes (its INT32 addition overflows).
    adds : Out(width // 32)
        Promoted lanes this contribution adds to in FP32.
    convert : Out(signed(33)).array(width // 32)
        Each lane's converter input.
    """

    def __init__(self, width: int):
        n_lanes = width // 32
        super().__init__({"acc": In(lane_word_layout(width)), "x": In(width), "write": In(n_lanes),
                          "store": In(n_lanes), "word": Out(width), "promoted": Out(n_lanes),
                          "overflow": Out(n_lanes), "adds": Out(n_lanes),
                          "convert": Out(signed(33)).array(n_lanes)})

    def elaborate(self, platform):
        m = Module()
        acc, held = self.acc.words, self.acc.promoted
        for k in range(len(self.promoted)):
            a, x = acc.word_select(k, 32), self.x.word_select(k, 32)
            write, store = self.write[k], self.store[k]
            total = a.as_signed() + x.as_signed()
            p = held[k] & ~store
            m.d.comb += [
                self.promoted[k].eq(p), self.adds[k].eq(p & write),
                self.overflow[k].eq(write & ~store & ~p & (total[32] ^ total[31])),
                self.word.word_select(k, 32).eq(Mux(store, x, Mux(write, total[:32], a))),
                self.convert[k].eq(Mux(p | store, x.as_signed(), Mux(write, total, a.as_signed()))),
            ]
        return m


class Promotion(wiring.Component):
    """Stage FP: every lane through its converter and, where promoted, its FP32 adder, ``latency`` cycles.

    The converter inputs are registered first, off the slot decision's
    path; a lane's word read in stage B waits beside its converter and is
    added to the converted contribution in the lane's
    :class:`~inagg.hdl.fp32.FP32Adder`; the converter's output waits beside
    the adder. Every lane takes the same cycles, promoted or not.

    Parameters
    ----------
    width : int
        Beat width in bits.
    convert_latency, add_latency : int
        Of each lane's :class:`~inagg.hdl.fp32.IntToFP32` and :class:`~inagg.hdl.fp32.FP32Adder`.

    Attributes
    ----------
    latency : int
        ``1 + convert_latency + add_latency``.

    Members
    -------
    convert : In(signed(33)).array(width // 32)
        Each lane's converter input (:class:`LaneUpdate`).
    valid : In(1)
    acc : In(width)
        The lane words as read, added to the converted inputs.
    sums : Out(width)
        ``latency`` cycles later: the FP32 sums (meaningful for promoted lanes).
    converted : Out(width)
        ``latency`` cycles later: the converter outputs.
    """

    def __init__(self, width: int, convert_latency: int, add_latency: int):
        self._convert, self._add = convert_latency, add_latency
        self.latency = 1 + convert_latency + add_latency
        n_lanes = width // 32
        super().__init__({"convert": In(signed(33)).array(n_lanes), "valid": In(1), "acc": In(width),
                          "sums": Out(width), "converted": Out(width)})

    def elaborate(self, platform):
        m = Module()
        width = len(self.acc)
        acc_late = _delay_line(m, self.acc, width, 1 + self._convert, "fp_acc")[-1]
        convs = []
        for k, value in enumerate(self.convert):
            m.submodules[f"conv{k}"] = conv = IntToFP32(33, self._convert)
            m.submodules[f"add{k}"] = adder = FP32Adder(self._add)
            m.d.sync += [conv.i.eq(value), conv.i_valid.eq(self.valid)]
            m.d.comb += [adder.a.eq(acc_late.word_select(k, 32)), adder.b.eq(conv.o), adder.i_valid.eq(conv.o_valid),
                         self.sums.word_select(k, 32).eq(adder.o)]
            convs.append(conv)
        converted = Cat(*[c.o for c in convs])
        m.d.comb += self.converted.eq(_delay_line(m, converted, width, self._add, "fp_conv")[-1])
        return m


class ResultHandoff(wiring.Component):
    """Stage W: a beat's new words into the lane memory, and on to the emitters when its frame sends a result.

    A lane's new word is its FP32 sum where promoted, the converted exact
    sum where this contribution overflowed it, else the INT32 word. Every
    lane also goes out as binary32, since only the chunk's last beat tells
    whether the result goes out as FP32.

    Parameters
    ----------
    width, beats, depth, slots : int
        Beat width, beats per chunk, slot numbers, direct-mapped slots.

    Members
    -------
    valid : In(1)
        A beat is in stage W ...
    beat : In(_beat_layout(width, beats, depth))
        ... this one, ...
    sums, converted : In(width)
        ... with its lanes out of :class:`Promotion`.
    wr_en : Out(1)
    wr_addr : Out(range(depth * beats))
    wr_data : Out(lane_word_layout(width))
        The lane memory's write port.
    o : Out(result_signature(width, slots))
        Results to send.
    promoted : Out(1)
        ``PROMOTED``: the last beat of a result to every worker, with a lane promoted.
    """

    def __init__(self, width: int, beats: int, depth: int, slots: int):
        super().__init__({"valid": In(1), "beat": In(_beat_layout(width, beats, depth)), "sums": In(width),
                          "converted": In(width), "wr_en": Out(1), "wr_addr": Out(range(depth * beats)),
                          "wr_data": Out(lane_word_layout(width)), "o": Out(result_signature(width, slots)),
                          "promoted": Out(1)})

    def elaborate(self, platform):
        m = Module()
        w, width = self.beat, len(self.sums)
        word = Signal(width)
        fp = Signal(width)
        for k in range(width // 32):
            lane = word.word_select(k, 32)
            late = self.converted.word_select(k, 32)
            m.d.comb += [lane.eq(Mux(w.adds[k], self.sums.word_select(k, 32),
                                     Mux(w.overflow[k], late, w.word.word_select(k, 32)))),
                         fp.word_select(k, 32).eq(Mux(w.promoted[k], lane, late))]
        now = w.promoted | w.overflow
        m.d.comb += [self.wr_addr.eq(Cat(w.j, w.desc.slot)), self.wr_data.words.eq(word),
                     self.wr_data.promoted.eq(now), self.wr_en.eq(self.valid & w.write)]
        seen = Signal()                                # a lane of the frame's earlier beats is promoted
        so_far = now.any() | (~w.first & seen)
        with m.If(self.valid):
            m.d.sync += seen.eq(so_far)
        o = self.o.p
        m.d.comb += [
            self.o.valid.eq(self.valid & w.emit),
            o.data.eq(swap_lanes(word)), o.fp.eq(swap_lanes(fp)), o.promoted.eq(so_far),
            o.first.eq(w.first), o.last.eq(w.last),
            o.desc.job.eq(w.desc.job), o.desc.worker.eq(w.desc.worker), o.desc.all.eq(w.to_all),
            o.desc.workers.eq(w.desc.workers), o.desc.chunk.eq(w.desc.chunk),
            o.desc.ring.eq(w.desc.chunk & (w.desc.slots - 1)),
            o.desc.translated.eq(w.desc.translated), o.desc.psn.eq(w.desc.psn),
            self.promoted.eq(self.valid & w.last & w.to_all & so_far),
        ]
        return m


class SlotEngine(wiring.Component):
    """Direct-mapped slots with INT32 lanes promoted to FP32 on overflow (see the module docstring).

    Parameters
    ----------
    width:
        Beat width in bits (64, 256 or 512).
    chunk_bytes:
        Bytes per chunk.
    slots:
        Number of slots, a power of two.
    workers:
        Most workers per job (bits of a slot's bitmap).
    convert_latency:
        Cycles of each lane's :class:`~inagg.hdl.fp32.IntToFP32`, 1 to 4.
    add_latency:
        Cycles of each lane's :class:`~inagg.hdl.fp32.FP32Adder`, 1 to 6.

    The defaults (1 and 2) keep both units above 80 MHz on an ECP5
    (``docs/results/fp32.md``), clear of the switch's own critical path
    (65.5 MHz, ``docs/results/synth.md``), with a short pipeline:
    :attr:`lag` is 4, so only frames of 4 beats (C = 256 at W = 512) to
    one slot wait for each other, one cycle. A faster clock takes deeper
    units, and then frames of ``lag`` beats or fewer to one slot wait.
    overflow:
        Slots after the direct-mapped ones, ``slots .. slots + overflow - 1``:
        the exception path's overflow slots (``docs/exception.md``). They follow
        the same rules; ``desc.slot`` names them.
    psn_jobs:
        0: UC only. Else the build takes Mode II jobs (``docs/protocol.md``
        section 6.2) numbered below ``psn_jobs``: a frame whose descriptor
        says ``translated`` goes by :class:`~inagg.hdl.translated.TranslatedRules`
        with its worker's expected PSN from a
        :class:`~inagg.hdl.translated.PsnTable` (read in A with the metadata,
        written in B), and its second beat clears its worker's bit in the
        shadow slot, read in A and written in B with the ports the first beat
        leaves free; ``psn_clear`` clears a job's expected PSNs.
    augmented:
        With ``psn_jobs``: the build also takes Mode III jobs (``docs/protocol.md``
        section 7). A frame whose descriptor says ``augmented`` goes by
        :class:`~inagg.hdl.augmented.AugmentedRules` with its worker's "NAK
        sent" bit from the :class:`~inagg.hdl.translated.PsnTable`, and its
        slot counts as free once every child ACKed the result it holds, as the
        engine's :class:`~inagg.hdl.augmented.ResultAcks` says (read in A
        beside the metadata). Every such frame is answered on ``reply``; the
        children's ACKs of results come in on ``result_ack`` and Go-Back-N
        requests go out on ``resend``, to come back as frames of
        :class:`~inagg.hdl.augmented.ResendFrames` whose slot sends its
        result to the child alone (``HOP_RESENDS``). Needs chunks of 4 beats or more (as
        every build does), so that completions come 4 cycles apart or more.

    Attributes
    ----------
    beats : int
        Beats per contribution.
    lag : int
        Cycles from a lane word's arrival in L to the write of its new value
        (``1 + convert_latency + add_latency``).
    strobe_lag : int
        Cycles from taking a frame's first beat to its slot-rule strobes in ``events`` (3).
    slot_meta : Memory
        Every slot's :func:`meta_layout`; read by testbenches.
    acks : ResultAcks or None
        With ``augmented``: the results' ACK state (its ``took`` and ``expired`` strobes tell the switch
        when an ACK or a timer took effect).

    Members
    -------
    i : In(frame_signature(width, slots + overflow))
        Accepted contributions. ``i.ready`` is low only on a first beat
        while ``can_start`` is low (with ``augmented``, or the ``reply``
        queue is full), while a result is on its way to the
        emitters, or while a frame to the same slot would read a word before
        its write (see the module docstring), and for ``slots`` cycles after
        reset while the engine marks every slot FREE.
    can_start : In(1)
        Every result emitter can take one more result.
    o : Out(result_signature(width, slots))
        Results to send.
    events : Out(N_COUNTERS)
        Counter strobes of the slot rules and ``PROMOTED``.
    gone : In(1)
        The job of the frame whose first beat ``i`` carries is not enabled (torn
        down after the frame passed its port's checks): the frame is dropped
        as ``DROP_UNKNOWN_QPN``, as the model drops a frame of a removed job.
    sweep : In(SweepRequest)
        Start a sweep over slot metadata (``start`` strobes). ``i.ready`` is
        low while it runs; the caller starts it only with no frame in the
        pipeline before stage W. It reads one slot a cycle: ``count + 1``
        cycles.
    sweep_busy : Out(1)
        A sweep runs, from the cycle after its ``start``.
    sweep_hazard : Out(1)
        After a checking sweep: a slot of the job is marked ``guest``.
    psn_clear : In(1)
        With ``psn_jobs``: set the expected PSN of every worker of
        ``sweep.job`` to 0 (its teardown: a job set up again starts at PSN
        0, as the model's does); ``i.ready`` is low for the 64 cycles it takes.
        With ``augmented`` the job's ACK points and next result PSN too.
    reply : Out(stream.Signature(AckDesc))
        With ``augmented``: the ACK or NAK answering a Mode III frame, in frame
        order (``psn``, ``syndrome`` and ``msn`` of its AETH, to ``worker``).
        A first beat waits while the queue in front of it is full.
    result_ack : In(stream.Signature(ResultAck))
    resend : Out(stream.Signature(Resend))
    hop_timeout : In(STAMP_BITS)
        With ``augmented``: :class:`~inagg.hdl.augmented.ResultAcks`'s ``ack``, ``resend`` and ``timeout``
        (the children's ACK timeout in cycles; 0: none).
    passing : Out(frame payload)
    passing_valid : Out(1)
        The beat in stage B, as it came: its frame's slot-rule strobes are in ``events``
        the next cycle (for :class:`~inagg.hdl.divert.Divert`, which copies a colliding frame).
    """

    def __init__(self, width: int, chunk_bytes: int, slots: int, workers: int, *, convert_latency: int = 1,
                 add_latency: int = 2, overflow: int = 0, psn_jobs: int = 0, augmented: bool = False):
        self._width = check_width(width)
        self._chunk = check_chunk_bytes(chunk_bytes)
        self._slots = check_slots(slots)
        if not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
            raise ValueError(f"Workers per job must be an integer in 1..{MAX_WORKERS}, not {workers!r}")
        if not isinstance(overflow, int) or isinstance(overflow, bool) or not 0 <= overflow <= 1 << 16:
            raise ValueError(f"Overflow slots must be an integer in 0..65536, not {overflow!r}")
        if not isinstance(augmented, bool):
            raise TypeError(f"augmented must be a bool, not {augmented!r}")
        if augmented and not psn_jobs:
            raise ValueError("A build with Mode III jobs needs psn_jobs > 0")
        self._workers = workers
        self._depth = slots + overflow
        self._psn_jobs, self._augmented = psn_jobs, augmented
        self._convert, self._add = check_fp32_latencies(convert_latency, add_latency)
        self.beats = chunk_bytes * 8 // width
        self.lag = 1 + self._convert + self._add
        self.strobe_lag = 3
        self.slot_meta = memory.Memory(shape=meta_layout(workers, psn_jobs > 0), depth=self._depth, init=[])
        self.acks = ResultAcks(jobs=psn_jobs, workers=workers, depth=self._depth) if augmented else None
        super().__init__({
            "i": In(frame_signature(width, self._depth)),
            "can_start": In(1),
            "o": Out(result_signature(width, slots)),
            "events": Out(N_COUNTERS),
            "gone": In(1),
            "sweep": In(SweepRequest),
            "sweep_busy": Out(1),
            "sweep_hazard": Out(1),
            "passing": Out(frame_signature(width, self._depth).members["payload"].shape),
            "passing_valid": Out(1),
            **({"psn_clear": In(1)} if psn_jobs else {}),
            **({"reply": Out(stream.Signature(AckDesc)), "result_ack": In(stream.Signature(ResultAck)),
                "resend": Out(stream.Signature(Resend)), "hop_timeout": In(STAMP_BITS)} if augmented else {}),
        })

    def elaborate(self, platform):
        m = Module()
        beats, width, lag = self.beats, self._width, self.lag
        m.submodules.lanes = lanes = memory.Memory(shape=lane_word_layout(width), depth=self._depth * beats, init=[])
        m.submodules.meta = metas = self.slot_meta
        l_wr = lanes.write_port()
        l_rd = lanes.read_port(transparent_for=(l_wr,))
        m_wr = metas.write_port()
        m_rd = metas.read_port(transparent_for=(m_wr,))

        m.submodules.sweeper = sweeper = SlotSweep(self._depth, self._workers)
        m.d.comb += [sweeper.sweep.eq(self.sweep), sweeper.meta.eq(m_rd.data),
                     self.sweep_busy.eq(sweeper.busy), self.sweep_hazard.eq(sweeper.hazard)]
        clearing = sweeper.clearing

        # -- stage A: the metadata read of a frame's first beat --
        j = Signal(range(beats))
        first = j == 0
        waits = Signal()
        psn_busy = Signal()  # the PSN table's clearing sweep after reset
        room = Signal(init=1)  # for the reply of a Mode III frame: decided two cycles after A
        m.d.comb += self.i.ready.eq(~clearing & ~psn_busy & ~sweeper.busy & ~self.sweep.start
                                    & (~first | (self.can_start & room & ~waits)))
        take = self.i.valid & self.i.ready
        with m.If(take):
            m.d.sync += j.eq(Mux(self.i.p.last, 0, j + 1))
        d = self.i.p.desc
        if self._psn_jobs:
            # A later beat reads the shadow slot, (PSN + W) mod 2W of the job's region of 2W slots.
            half = d.slots >> 1
            shadow = Mux((d.psn & half) != 0, d.slot - half, d.slot + half)[:len(d.slot)]
            m.d.comb += m_rd.addr.eq(Mux(sweeper.read, sweeper.read_addr, Mux(first, d.slot, shadow)))
            m.submodules.psns = psns = PsnTable(self._psn_jobs, nak=self._augmented)
            m.d.comb += [psns.clear.eq(self.psn_clear), psns.clear_job.eq(self.sweep.job)]
            if self._augmented:
                m.submodules.acks = acks = self.acks
                m.d.comb += [psn_busy.eq(psns.busy | acks.busy), acks.clear.eq(self.psn_clear),
                             acks.timeout.eq(self.hop_timeout),
                             acks.clear_job.eq(self.sweep.job), acks.look_addr.eq(d.slot)]
                wiring.connect(m, wiring.flipped(self.result_ack), acks.ack)
                wiring.connect(m, acks.resend, wiring.flipped(self.resend))
            else:
                m.d.comb += psn_busy.eq(psns.busy)
            m.d.comb += [psns.read_en.eq(take & first), psns.read_job.eq(d.job), psns.read_worker.eq(d.worker)]
        else:
            m.d.comb += m_rd.addr.eq(Mux(sweeper.read, sweeper.read_addr, d.slot))

        # The beat's way through stages M, B and L, before the slot rules have spoken.
        head_layout = data.StructLayout({"valid": 1, "first": 1, "last": 1, "gone": 1, "j": range(beats),
                                         "x": width, "desc": frame_desc_layout(self._depth)})
        a_beat = Signal(head_layout)
        m.d.comb += [a_beat.valid.eq(take), a_beat.first.eq(first), a_beat.last.eq(self.i.p.last),
                     a_beat.gone.eq(self.gone), a_beat.j.eq(j), a_beat.x.eq(swap_lanes(self.i.p.data)),
                     a_beat.desc.eq(self.i.p.desc)]
        _, mb, b, lb = _delay_line(m, a_beat, head_layout, 3, "head", reset_less=False)

        # -- stage M: the metadata as read, registered: no path from the block RAM into the rules --
        b_meta = Signal(meta_layout(self._workers, self._psn_jobs > 0))
        m.d.sync += b_meta.eq(m_rd.data)
        b_expected = Signal(PSN_BITS)
        if self._psn_jobs:
            m.d.sync += b_expected.eq(psns.expected)
        b_nak_sent, b_freed = Signal(), Signal()
        if self._augmented:
            # Mode III: the slot's result is gone once the word ResultAcks keeps for it names the PSN the
            # slot holds and has every child of the job; a word of an older result or job names another.
            word, now = acks.look, Signal(meta_layout(self._workers, True))
            everyone = Signal(self._workers)
            m.d.comb += [now.eq(m_rd.data), everyone.eq((1 << mb.desc.workers) - 1)]
            m.d.comb += acks.look_job.eq(mb.desc.job)
            m.d.sync += [b_nak_sent.eq(psns.nak_sent),
                         b_freed.eq((now.state == SlotState.DONE) & (word.psn == now.psn) & ~acks.look_held
                                    & ((word.acked & everyone) == everyone))]

        # -- stage B: the slot decision; the metadata write; the lane word's read --
        groups = -(-(width // 32) // _LANES_PER_STROBE)
        m.submodules.decision = decision = SlotDecision(self._workers, self._depth, self._depth > self._slots,
                                                        copies=groups, translated=self._psn_jobs > 0,
                                                        augmented=self._augmented)
        m.d.comb += decision.expected.eq(b_expected)
        if self._augmented:
            m.d.comb += [decision.nak_sent.eq(b_nak_sent), decision.freed.eq(b_freed),
                         acks.done.valid.eq(decision.done_en), acks.done.p.job.eq(b.desc.job),
                         acks.done.p.psn.eq(b.desc.psn), acks.done.p.slot.eq(b.desc.slot),
                         acks.done.p.workers.eq(b.desc.workers), acks.done.p.slots.eq(b.desc.slots),
                         acks.done.p.base.eq(b.desc.slot - (b.desc.psn & (b.desc.slots - 1)))]
            # Frames of 4 beats or more put a first beat in A only after the one before has decided, so
            # one free entry in A's cycle is room enough.
            m.submodules.replies = replies = fifo.SyncFIFOBuffered(width=AckDesc.size, depth=4)
            reply = Signal(AckDesc)
            m.d.comb += [reply.job.eq(b.desc.job), reply.worker.eq(b.desc.worker), reply.augmented.eq(1),
                         reply.psn.eq(decision.reply.psn),
                         reply.syndrome.eq(decision.reply.syndrome), reply.msn.eq(decision.reply.msn),
                         replies.w_data.eq(reply), replies.w_en.eq(decision.reply_en),
                         room.eq(replies.level < 4),
                         self.reply.valid.eq(replies.r_rdy), self.reply.p.eq(replies.r_data),
                         replies.r_en.eq(self.reply.ready)]
        m.d.comb += [decision.valid.eq(b.valid), decision.first.eq(b.first), decision.meta.eq(b_meta),
                     decision.desc.eq(b.desc), decision.gone.eq(b.gone), l_rd.addr.eq(Cat(b.j, b.desc.slot)),
                     self.passing_valid.eq(b.valid), self.passing.data.eq(swap_lanes(b.x)),
                     self.passing.last.eq(b.last), self.passing.desc.eq(b.desc)]
        with m.If(clearing):
            m.d.comb += [m_wr.addr.eq(sweeper.clear_addr), m_wr.data.eq(0), m_wr.en.eq(1)]
        with m.Elif(sweeper.acts):
            m.d.comb += [m_wr.addr.eq(sweeper.write_addr), m_wr.data.eq(0), m_wr.en.eq(sweeper.write_en)]
        with m.Else():
            m.d.comb += [m_wr.addr.eq(b.desc.slot), m_wr.data.eq(decision.meta_data), m_wr.en.eq(decision.meta_en)]
            if self._psn_jobs:
                # The second beat's write: the worker's bit off in the shadow slot it read in A.
                cleared = Signal.like(b_meta)
                bd = b.desc
                half = bd.slots >> 1
                m.d.comb += [cleared.eq(b_meta), cleared.bitmap.eq(b_meta.bitmap & ~(1 << bd.worker)[:self._workers])]
                with m.If(decision.shadow_clear & (b.j == 1)):
                    m.d.comb += [m_wr.addr.eq(Mux((bd.psn & half) != 0, bd.slot - half, bd.slot + half)),
                                 m_wr.data.eq(cleared), m_wr.en.eq(1)]
        if self._psn_jobs:
            m.d.comb += [psns.write_en.eq(decision.psn_en), psns.write_job.eq(b.desc.job),
                         psns.write_worker.eq(b.desc.worker), psns.write_psn.eq(decision.next_expected)]
            if self._augmented:
                m.d.comb += psns.write_nak.eq(decision.next_nak_sent)
        # What the beat does, registered: the lanes see flip-flops, one copy per group of lanes.
        l_write, l_store = Signal(groups), Signal(groups)
        l_emit, l_all = Signal(), Signal()
        m.d.sync += [l_write.eq(decision.write), l_store.eq(decision.store), l_emit.eq(decision.emit),
                     l_all.eq(decision.to_all)]

        # -- stage L: the lanes --
        m.submodules.update = update = LaneUpdate(width)
        lanes_of = [k // _LANES_PER_STROBE for k in range(width // 32)]
        m.d.comb += [update.acc.eq(l_rd.data), update.x.eq(lb.x), update.write.eq(Cat(*[l_write[g] for g in lanes_of])),
                     update.store.eq(Cat(*[l_store[g] for g in lanes_of]))]

        # -- FP: the converters and adders, and the rest of the beat waiting beside them --
        m.submodules.promotion = promotion = Promotion(width, self._convert, self._add)
        m.d.comb += [promotion.valid.eq(lb.valid), promotion.acc.eq(l_rd.data.words),
                     *[port.eq(value) for port, value in zip(promotion.convert, update.convert)]]
        beat_layout = _beat_layout(width, beats, self._depth)
        beat = Signal(beat_layout)
        m.d.comb += [beat.first.eq(lb.first), beat.last.eq(lb.last), beat.j.eq(lb.j), beat.write.eq(l_write[0]),
                     beat.emit.eq(l_emit), beat.to_all.eq(l_all), beat.adds.eq(update.adds),
                     beat.promoted.eq(update.promoted), beat.overflow.eq(update.overflow), beat.word.eq(update.word),
                     beat.desc.eq(lb.desc)]
        if self._augmented:
            # A frame sent again carries no chunk number: its result's comes from the slot, held from
            # stage B for the frame's beats in L (the next frame decides once this one's last beat is in L).
            slot_chunk = Signal(32)
            with m.If(decision.decide):
                m.d.sync += slot_chunk.eq(b_meta.chunk)
            with m.If(lb.desc.again):
                m.d.comb += beat.desc.chunk.eq(slot_chunk)
        valids = _delay_line(m, lb.valid, 1, lag, "fp_valid", reset_less=False)
        ctrls = _delay_line(m, beat, beat_layout, lag, "fp")

        # A frame's first beat waits while an earlier frame to its slot is too close ahead: its
        # last beat `lag - beats + 1` stages or fewer past A, that is in M, B or the first
        # `lag - beats - 1` stages from L on (the lane word is read in B, written `lag + 1`
        # cycles later). It also waits while a result is between L and the emitters, which count
        # it only once it arrives; a result's first beat in M or B needs no look, as A then holds
        # its frame's second or third beat (a chunk has 4 beats or more), and there its `emit`
        # would still be the decision on the metadata, which would put the slot rules in front
        # of `i.ready` and the arbiter and ingress behind it.
        assert beats >= 4
        ahead = [(mb.valid, mb.last, mb.desc.slot), (b.valid, b.last, b.desc.slot),
                 *[(valids[k], ctrls[k].last, ctrls[k].desc.slot) for k in range(lag + 1)]]
        hazards = [valid & last & (slot == self.i.p.desc.slot)
                   for valid, last, slot in ahead[:max(0, lag - beats + 1)]]
        results = [valids[k] & ctrls[k].first & ctrls[k].emit for k in range(lag + 1)]
        m.d.comb += waits.eq(Cat(*hazards, *results).any())

        # -- stage W --
        m.submodules.handoff = handoff = ResultHandoff(width, beats, self._depth, self._slots)
        m.d.comb += [handoff.valid.eq(valids[-1]), handoff.beat.eq(ctrls[-1]), handoff.sums.eq(promotion.sums),
                     handoff.converted.eq(promotion.converted),
                     l_wr.addr.eq(handoff.wr_addr), l_wr.data.eq(handoff.wr_data), l_wr.en.eq(handoff.wr_en)]
        wiring.connect(m, handoff.o, wiring.flipped(self.o))

        out = decision.outcome
        # The rules' own strobes (DecisionOutcome has every field they name), the two drops only the
        # UC rules make, a torn-down RC job's frames and Mode III's results sent again.
        ev = {**translated_events(out), **augmented_events(out), Counter.DROP_UNKNOWN_QPN: out.unknown_qpn,
              Counter.DROP_BAD_OPCODE: out.bad_opcode, Counter.DROP_COLLISION: out.collision,
              Counter.HOP_RESENDS: out.again}
        # Registered, in step with `passing` of the cycle before: the counters and the divert
        # queue take the strobes from a flip-flop, not through the slot rules.
        decided = Signal(N_COUNTERS)
        m.d.sync += decided.eq(event_vector({c: decision.decide & sig for c, sig in ev.items()}))
        m.d.comb += self.events.eq(decided | event_vector({Counter.PROMOTED: handoff.promoted}))
        return m
