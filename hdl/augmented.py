"""EPIC's Mode III (connection augmented) in gateware: the slot rules and the results' ACK state.

``docs/protocol.md`` section 7 is the specification and
:class:`inagg.models.modes.AugmentedJob` its reference. Mode III keeps
Mode II's state (:mod:`inagg.hdl.translated`) and adds per (job, worker)
a "NAK sent" bit, one more bit of the :class:`~inagg.hdl.translated.PsnTable`
word (``PsnTable(jobs, nak=True)``). Upward the switch is each child's RC
responder: :class:`AugmentedRules` decides what the slot does with one
contribution and which ACK or NAK answers it; :func:`augmented_events` are
its counter strobes, the model's for the same frame. Downward it is each
child's requester for the results: :class:`ResultAcks` keeps per slot the
children that ACKed its result, each child's ACK point, and asks for
Go-Back-N on a NAK.

The slot engine uses both for Mode III frames (``SlotEngine(augmented=True)``),
and :class:`~inagg.hdl.switch.Switch` builds them in with
``SwitchGeometry(augmented=True)`` (``docs/rtl.md``, "Mode III").
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from inagg.models.protocol import MAX_WORKERS, QPN_JOB_BITS, QPN_WORKER_BITS, Counter
from inagg.models.rc import Syndrome
from inagg.hdl.axis import check_chunk_bytes, check_width
from inagg.hdl.ingress import PSN_BITS, frame_signature
from inagg.hdl.translated import PsnTable, slot_after, translated_desc_layout, translated_meta_layout

__all__ = ["ResendFrames", "AugmentedOutcome", "AugmentedReply", "AugmentedRules", "augmented_events",
           "ResultDone", "ResultAck", "Resend", "STAMP_BITS", "acked_entry_layout", "ResultAcks"]

SLOT_BITS = 24
"""Most slots of a job's region, as a power of two: ``PSN mod slots`` names a slot across a PSN wrap."""


AugmentedOutcome = data.StructLayout({"add": 1, "store": 1, "complete": 1, "dup": 1, "ahead": 1, "busy": 1,
                                      "bad_address": 1, "ack": 1, "nak": 1})
"""What Mode III makes of one contribution: ``add``, ``store``, ``complete`` and ``bad_address`` as in
:data:`~inagg.hdl.translated.TranslatedOutcome`; a ``dup``licate behind the expected PSN (ACKed again, never
added); a PSN ``ahead`` (dropped; ``nak``: the gap's one NAK); ``busy``: the slot still holds a result some
child has not ACKed (dropped, not ACKed). ``ack``: an ACK answers it (an in-order add or a duplicate)."""

AugmentedReply = data.StructLayout({"psn": PSN_BITS, "syndrome": 8, "msn": 24})
"""The AETH answer to a contribution (``ack`` or ``nak``): BTH PSN, syndrome and MSN, as
:class:`~inagg.hdl.ingress.AckDesc` carries them."""


class AugmentedRules(wiring.Component):
    """Mode III's slot decision (``docs/protocol.md`` section 7, steps 2-4) for one contribution, combinationally.

    The members ``meta``, ``desc``, ``expected``, ``new`` and ``slot`` are
    those of :class:`~inagg.hdl.translated.TranslatedRules`, with
    :func:`~inagg.hdl.translated.translated_meta_layout` for the slot. Unlike
    Mode II, nothing clears a shadow slot: a slot is freed when every child
    ACKed its result (its bitmap is then read as empty: :class:`ResultAcks`
    says so), and a contribution whose slot still holds another PSN is
    ``busy``.

    Parameters
    ----------
    workers:
        Most workers per job, 1 to 64.
    slots:
        Most slots of a job's region, a power of two from 2 to ``2**24``.

    Members
    -------
    meta : In(translated_meta_layout(workers))
    desc : In(translated_desc_layout(slots))
    expected : In(PSN_BITS)
    nak_sent : In(1)
        The worker's "NAK sent" bit: a NAK went out for the gap it is in.
    outcome : Out(AugmentedOutcome)
    new : Out(translated_meta_layout(workers))
    reply : Out(AugmentedReply)
        The ACK or NAK to the worker, when ``outcome.ack`` or ``outcome.nak``.
    write : Out(1)
        The worker's table entry changes (an add or a NAK): write ``next_expected`` and ``next_nak_sent``.
    next_expected : Out(PSN_BITS)
    next_nak_sent : Out(1)
    slot : Out(range(slots))
    """

    def __init__(self, workers: int, slots: int):
        if not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
            raise ValueError(f"workers must be an integer from 1 to {MAX_WORKERS}, not {workers!r}")
        if not isinstance(slots, int) or slots < 2 or slots > 1 << SLOT_BITS or slots & (slots - 1):
            raise ValueError(f"slots must be a power of two from 2 to 2**{SLOT_BITS}, not {slots!r}")
        self._workers = workers
        super().__init__({"meta": In(translated_meta_layout(workers)), "desc": In(translated_desc_layout(slots)),
                          "expected": In(PSN_BITS), "nak_sent": In(1), "outcome": Out(AugmentedOutcome),
                          "new": Out(translated_meta_layout(workers)), "reply": Out(AugmentedReply),
                          "write": Out(1), "next_expected": Out(PSN_BITS), "next_nak_sent": Out(1),
                          "slot": Out(range(slots))})

    def elaborate(self, platform):
        m = Module()
        meta, desc, out, reply = self.meta, self.desc, self.outcome, self.reply
        # PSNs are 24-bit serial numbers (RFC 1982): the distance's top bit says "behind".
        dist = Signal(PSN_BITS)
        m.d.comb += dist.eq(desc.psn - self.expected)
        behind, ahead = dist[-1], (dist != 0) & ~dist[-1]
        m.d.comb += self.slot.eq(desc.psn & (desc.slots - 1))
        held = meta.bitmap != 0
        with m.If(ahead):
            m.d.comb += [out.ahead.eq(1), out.nak.eq(~self.nak_sent)]
        with m.Elif(behind):
            # Step 4: the child missed our ACK; whatever the slot holds now, the contribution is in.
            m.d.comb += [out.dup.eq(1), out.ack.eq(1)]
        with m.Elif(held & (meta.psn != desc.psn)):
            # The slot's result waits for a child's ACK: no ACK, so the child sends it again on its timer.
            m.d.comb += out.busy.eq(1)
        with m.Elif(held & (meta.chunk != desc.chunk)):
            m.d.comb += out.bad_address.eq(1)
        with m.Else():
            m.d.comb += [out.add.eq(1), out.ack.eq(1)]
        new = self.new
        m.d.comb += [
            *slot_after(out, new, meta, desc, held, self._workers),
            self.write.eq(out.add | out.nak),
            self.next_expected.eq(Mux(out.add, desc.psn + 1, self.expected)),
            self.next_nak_sent.eq(out.nak),
            # Step 2 ACKs the PSN taken, step 4 the newest one, step 3 NAKs the one expected; the MSN counts
            # the child's messages taken, one per contribution.
            reply.psn.eq(Mux(out.add, desc.psn, Mux(out.dup, self.expected - 1, self.expected))),
            reply.syndrome.eq(Mux(out.nak, Syndrome.NAK_SEQ, Syndrome.ACK)),
            reply.msn.eq(self.next_expected),
        ]
        return m


def augmented_events(outcome) -> dict:
    """The counter strobes of an :data:`AugmentedOutcome`, as the model counts them (``TX_RESULTS`` and
    ``PROMOTED`` are the emitters' and the lanes' to count)."""
    return {Counter.RX_CONTRIB: outcome.add, Counter.COMPLETED: outcome.complete,
            Counter.DUP_CONTRIB: outcome.dup, Counter.DROP_PSN_AHEAD: outcome.ahead,
            Counter.DROP_BUFFER_BUSY: outcome.busy, Counter.DROP_BAD_ADDRESS: outcome.bad_address,
            Counter.ACK_SENT: outcome.ack, Counter.NAK_SENT: outcome.nak}


ResultDone = data.StructLayout({"job": QPN_JOB_BITS, "psn": PSN_BITS, "slot": SLOT_BITS,
                                "workers": QPN_WORKER_BITS + 1, "base": SLOT_BITS, "slots": SLOT_BITS + 1})
"""A Mode III result the slot engine completed: its job, PSN and slot (the next result PSN is ``psn + 1``), and
the job's children and slot region (first slot ``base``, ``slots``), which the ACK timers need."""

ResultAck = data.StructLayout({"job": QPN_JOB_BITS, "worker": QPN_WORKER_BITS, "psn": PSN_BITS, "syndrome": 8,
                               "gone": 1})
"""A child's checked ACK or NAK of Mode III results (the fields of :data:`~inagg.hdl.ingress.AckDesc` it needs);
``gone``: its job was torn down after its port's checks."""

Resend = data.StructLayout({"job": QPN_JOB_BITS, "worker": QPN_WORKER_BITS, "first": PSN_BITS,
                            "end": PSN_BITS, "base": SLOT_BITS, "slots": SLOT_BITS + 1, "timer": 1})
"""Go-Back-N: the results ``first`` up to, not including, ``end`` go again to the child ``worker``, from the
job's region (``base``, ``slots``); ``timer``: the child's ACK timer ran out (else it NAKed)."""

STAMP_BITS = 32
"""Bits of the ACK timers' cycle counter: a timeout and the gap between two visits of a child's timer must stay
below half its range (2**31 cycles, 21 s at 100 MHz)."""


def acked_entry_layout(workers: int) -> data.StructLayout:
    """Per slot, the children that ACKed the result of PSN ``psn``, and the cycle it completed (one word of
    :class:`ResultAcks`)."""
    return data.StructLayout({"psn": PSN_BITS, "acked": workers, "stamp": STAMP_BITS})


class ResultAcks(wiring.Component):
    """Mode III downward, the results' requester state (``docs/protocol.md`` section 7, step 5).

    Per job the PSN of the next result to complete; per (job, child) the
    oldest result PSN it has not ACKed, in a :class:`~inagg.hdl.translated.PsnTable`;
    per slot the bitmap of the children that ACKed its result, tagged with
    that result's PSN (:func:`acked_entry_layout`, one block RAM). A
    completion (``done``) writes its slot's word afresh, so no bit of an
    earlier result or of a torn-down job survives into it. A child's ACK of
    PSN ``q`` (NAK: ``q - 1``) inside its unACKed range sets its bit in the
    slot of every PSN from its oldest unACKed one to ``q``, two cycles a
    slot, and moves its ACK point past ``q``; a NAK sequence error of the
    PSN it then expects asks for that PSN and every later completed result
    again (``resend``). The slot engine reads a slot's word through
    ``look_addr``/``look`` and takes the slot as free when its PSN is the
    slot's and every child's bit is set: the rule that a slot is freed only
    when the slowest child has ACKed its result. Results complete in PSN
    order (a child's PSN ``p + 1`` is taken only after its ``p``), so one
    PSN per job says which results exist.

    **ACK timers.** A child's timer runs while it has a result it has not
    ACKed, from the later of the cycle its oldest unACKed result completed
    (in that slot's word) and the cycle it last made progress (an ACK that
    moved its point, or results sent to it again), kept per (job, child) in
    a block RAM of cycle stamps. When no ACK waits, the block visits the
    children in turn (two cycles for a child without unACKed results, three
    for one with, over ``jobs * 64`` entries) and sends the unACKed results of
    one whose timer has run ``timeout`` cycles or more again, with
    ``resend.p.timer`` set: the model's timer, run out up to one round of
    visits late (:meth:`~inagg.models.modes.AugmentedJob.expire`). A
    ``timeout`` of 0 stops the timers. Stamps are not cleared with a job: a
    stale one can only delay the job's first timer by up to one timeout.

    Parameters
    ----------
    jobs:
        Jobs (of the :class:`PsnTable`), 1 to 1024.
    workers:
        Most children per job, 1 to 64.
    depth:
        Slot numbers.

    Members
    -------
    done : In(stream.Signature(ResultDone, always_ready=True))
        Taken in the cycle it is valid; at most one every two cycles.
    ack : In(stream.Signature(ResultAck))
        An ACK that acknowledges a result finds its job's region (``base``, ``slots``) where that result's
        completion left it; one of a job with no result yet is beyond every result and changes nothing.
    resend : Out(stream.Signature(Resend))
    look_addr : In(range(depth))
    look : Out(acked_entry_layout(workers))
        Slot ``look_addr``'s word, the cycle after.
    look_job : In(QPN_JOB_BITS)
    look_held : Out(1)
        In the cycle ``look`` shows a word: a child's ACK is walking the slots of job ``look_job`` and the
        word's PSN is in its range, so the slot counts as not free yet whatever its bits say. An ACK thus frees
        its slots all at once, in the cycle its walk ends, as the model's ACK does.
    timeout : In(STAMP_BITS)
        The ACK timeout in cycles; 0: no timer.
    took : Out(1)
        An ACK taken from ``ack`` took effect: strobed three cycles after the cycle of a frame's first beat
        in the slot engine's stage A from which on the engine sees it (the clock on which the switch reports
        the contributions its engine takes), so a replay can put the ACK among them. Its NAK's results
        again, if any, are those from its PSN to the last result completed by then.
    expired, expired_job, expired_worker : Out
        A child's ACK timer ran out, on the same clock: Go-Back-N of the results from its ACK point to the
        last one completed by then.
    clear : In(1)
    clear_job : In(QPN_JOB_BITS)
        A teardown: the job's ACK points and next result PSN back to 0.
    busy : Out(1)
        The ACK points are being cleared (after reset and ``clear``).
    hold : In(1)
        Take no ACK and visit no timer (a teardown waits for ``idle``, then holds the block until it is over).
    idle : Out(1)
        No ACK or timer is being taken and no ``took`` or ``expired`` is still to come.
    dropped : Out(1)
        With ``took``: the ACK was ``gone`` and changed nothing (``DROP_BAD_OPCODE``, as the model's port
        checks drop an RC frame whose QPN names no job).
    """

    def __init__(self, *, jobs: int, workers: int, depth: int):
        if not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
            raise ValueError(f"workers must be an integer from 1 to {MAX_WORKERS}, not {workers!r}")
        if not isinstance(depth, int) or isinstance(depth, bool) or not 2 <= depth <= 1 << SLOT_BITS:
            raise ValueError(f"depth must be an integer from 2 to 2**{SLOT_BITS}, not {depth!r}")
        self._jobs, self._workers, self._depth = jobs, workers, depth
        self.points = PsnTable(jobs)  # checks jobs
        super().__init__({"done": In(stream.Signature(ResultDone, always_ready=True)),
                          "ack": In(stream.Signature(ResultAck)), "resend": Out(stream.Signature(Resend)),
                          "look_addr": In(range(depth)), "look": Out(acked_entry_layout(workers)),
                          "look_job": In(QPN_JOB_BITS), "look_held": Out(1),
                          "took": Out(1), "expired": Out(1), "expired_job": Out(QPN_JOB_BITS),
                          "expired_worker": Out(QPN_WORKER_BITS),
                          "timeout": In(STAMP_BITS), "clear": In(1), "clear_job": In(QPN_JOB_BITS),
                          "busy": Out(1), "hold": In(1), "idle": Out(1), "dropped": Out(1)})

    def elaborate(self, platform):
        m = Module()
        entry = acked_entry_layout(self._workers)
        m.submodules.words = words = memory.Memory(shape=entry, depth=self._depth, init=[])
        wr = words.write_port()
        rd = words.read_port(transparent_for=(wr,))
        look = words.read_port(transparent_for=(wr,))
        m.d.comb += [look.addr.eq(self.look_addr), self.look.eq(look.data)]
        m.submodules.points = points = self.points
        m.d.comb += [points.clear.eq(self.clear), points.clear_job.eq(self.clear_job), self.busy.eq(points.busy)]
        m.submodules.stamps = stamps = memory.Memory(shape=STAMP_BITS, depth=self._jobs << QPN_WORKER_BITS, init=[])
        st_wr = stamps.write_port()
        st_rd = stamps.read_port(transparent_for=(st_wr,))
        now = Signal(STAMP_BITS)
        m.d.sync += now.eq(now + 1)

        # Per job, from its completions: the next result's PSN, and its children and region for the timers.
        nexts = Array(Signal(PSN_BITS, name=f"next_result{j}") for j in range(self._jobs))
        children = Array(Signal(QPN_WORKER_BITS + 1, name=f"children{j}") for j in range(self._jobs))
        bases = Array(Signal(SLOT_BITS, name=f"base{j}") for j in range(self._jobs))
        sizes = Array(Signal(SLOT_BITS + 1, name=f"slots{j}") for j in range(self._jobs))
        with m.If(self.clear & (self.clear_job < self._jobs)):
            m.d.sync += [nexts[self.clear_job].eq(0), children[self.clear_job].eq(0)]

        # A completion writes its word when the walk does not: the walk writes every other cycle, so one
        # that comes in a walk's write cycle is held for the next (they come two cycles apart or more).
        held, held_done = Signal(), Signal(ResultDone)
        walk_writes = Signal()
        done = Signal(ResultDone)
        m.d.comb += done.eq(Mux(held, held_done, self.done.p))
        with m.If(self.done.valid):
            p = self.done.p
            m.d.sync += [nexts[p.job].eq(p.psn + 1), children[p.job].eq(p.workers), bases[p.job].eq(p.base),
                         sizes[p.job].eq(p.slots)]
        with m.If(walk_writes):
            with m.If(self.done.valid):
                m.d.sync += [held.eq(1), held_done.eq(self.done.p)]
        with m.Elif(held | self.done.valid):
            m.d.comb += [wr.en.eq(1), wr.addr.eq(done.slot), wr.data.psn.eq(done.psn), wr.data.acked.eq(0),
                         wr.data.stamp.eq(now)]
            m.d.sync += held.eq(0)

        a = Signal(ResultAck)
        upto, at, nxt, start = Signal(PSN_BITS), Signal(PSN_BITS), Signal(PSN_BITS), Signal(PSN_BITS)
        nak = a.syndrome == Syndrome.NAK_SEQ
        bit = (Const(1, self._workers) << a.worker)[:self._workers]
        slot_of = bases[a.job] + (at & (sizes[a.job] - 1))
        # The timers' visit: (job, child) in turn, its point, its progress stamp, and whether it waits.
        scan = Signal(range(self._jobs << QPN_WORKER_BITS))
        s_job, s_worker = scan[QPN_WORKER_BITS:], scan[:QPN_WORKER_BITS]
        point, progress, armed = Signal(PSN_BITS), Signal(STAMP_BITS), Signal()
        take = self.ack.valid & ~points.busy & ~self.hold
        read_job = Mux(take, self.ack.p.job, s_job)
        read_worker = Mux(take, self.ack.p.worker, s_worker)
        m.d.comb += [points.read_job.eq(read_job), points.read_worker.eq(read_worker),
                     st_rd.addr.eq(Cat(read_worker, read_job)),
                     points.write_job.eq(a.job), points.write_worker.eq(a.worker),
                     st_wr.addr.eq(Cat(a.worker, a.job)), st_wr.data.eq(now)]
        after_scan = Mux(scan == (self._jobs << QPN_WORKER_BITS) - 1, 0, scan + 1)
        fire_end = Signal(PSN_BITS)

        def next_now(job):
            # The PSN of the next result as of the completions in this cycle, the one arriving included.
            return Mux(self.done.valid & (self.done.p.job == job), self.done.p.psn + 1, nexts[job])

        # When an ACK or a timer takes effect, on the clock of the frames' first beats in stage A plus three
        # (where the switch reports the contributions the engine took): an ACK with nothing to walk as of
        # the completions its CHECK saw, one that walked as of the cycle before its slots came free, a timer
        # as of the completions it saw when it decided.
        took_now, took_walked, fired = Signal(), Signal(), Signal()
        walked, expired = Signal(2), Signal(2)  # two cycles later
        m.d.sync += [walked.eq(Cat(took_walked, walked[0])), expired.eq(Cat(fired, expired[0]))]
        m.d.comb += [self.took.eq(took_now | walked[1]), self.expired.eq(expired[1])]
        expired_who = Signal(range(self._jobs << QPN_WORKER_BITS))
        with m.If(fired):
            m.d.sync += expired_who.eq(scan)
        m.d.comb += [self.expired_job.eq(expired_who[QPN_WORKER_BITS:]), self.expired_worker.eq(expired_who[:QPN_WORKER_BITS])]
        with m.FSM() as fsm:
            with m.State("IDLE"):
                m.d.comb += self.ack.ready.eq(~points.busy & ~self.hold)
                with m.If(take):
                    m.d.comb += points.read_en.eq(1)
                    # A NAK's AETH syndrome is 0b011xxxxx: it acknowledges the PSNs before its own.
                    m.d.sync += [a.eq(self.ack.p),
                                 upto.eq(Mux(self.ack.p.syndrome[5:7] == 0b11, self.ack.p.psn - 1, self.ack.p.psn))]
                    m.next = "CHECK"
                with m.Elif(~points.busy & ~self.hold & (self.timeout != 0)):
                    m.d.comb += points.read_en.eq(1)
                    m.next = "VISIT"
            with m.State("CHECK"):
                m.d.sync += [at.eq(points.expected), start.eq(points.expected), nxt.eq(nexts[a.job])]
                m.next = "RANGE"
            with m.State("RANGE"):
                behind = (upto - at)[-1]
                beyond = ~(upto - nxt)[-1]
                with m.If(a.gone):
                    # On the clock of any other ACK that walks nothing, so a replay places it alike.
                    m.d.comb += [took_now.eq(1), self.dropped.eq(1)]
                    m.next = "IDLE"
                with m.Elif(behind | beyond):
                    # Nothing to walk: the ACK takes effect as of the completions CHECK saw.
                    m.d.comb += took_now.eq(1)
                    m.next = "NAK"
                with m.Else():
                    m.next = "READ"
            with m.State("READ"):
                m.d.comb += [rd.addr.eq(slot_of), rd.en.eq(1)]
                m.next = "WRITE"
            with m.State("WRITE"):
                m.d.comb += walk_writes.eq(1)
                mine = rd.data.psn == at
                m.d.comb += [wr.en.eq(mine), wr.addr.eq(slot_of), wr.data.psn.eq(at),
                             wr.data.acked.eq(rd.data.acked | bit), wr.data.stamp.eq(rd.data.stamp)]
                m.d.sync += at.eq(at + 1)
                with m.If(at == upto):
                    m.d.comb += [points.write_en.eq(1), points.write_psn.eq(at + 1), st_wr.en.eq(1)]
                    m.next = "SETTLE"
                with m.Else():
                    m.next = "READ"
            with m.State("SETTLE"):
                # The walk is over and its slots are free from now on: the ACK takes effect here, with the
                # results completed so far (one may be on its way in this cycle).
                m.d.comb += took_walked.eq(1)
                m.d.sync += nxt.eq(next_now(a.job))
                m.next = "NAK"
            with m.State("NAK"):
                m.d.comb += [self.resend.p.job.eq(a.job), self.resend.p.worker.eq(a.worker),
                             self.resend.p.first.eq(a.psn), self.resend.p.end.eq(nxt),
                             self.resend.p.base.eq(bases[a.job]), self.resend.p.slots.eq(sizes[a.job])]
                with m.If(nak & (a.psn == at) & (at != nxt)):
                    m.d.comb += [self.resend.valid.eq(1), st_wr.en.eq(self.resend.ready)]
                    with m.If(self.resend.ready):
                        m.next = "IDLE"
                with m.Else():
                    m.next = "IDLE"
            with m.State("VISIT"):
                # The child's point and stamp as read; the word of its oldest unACKed result next.
                here = points.expected
                m.d.comb += [rd.addr.eq(bases[s_job] + (here & (sizes[s_job] - 1))), rd.en.eq(1)]
                m.d.sync += [point.eq(here), progress.eq(st_rd.data),
                             armed.eq((here != nexts[s_job]) & (s_worker < children[s_job]))]
                m.next = "AGE"
            with m.State("AGE"):
                # Both ages at least the timeout: the later of the two stamps is that old.
                late = ((now - progress) >= self.timeout) & ((now - rd.data.stamp) >= self.timeout)
                with m.If(armed & late):
                    m.d.comb += fired.eq(1)
                    m.d.sync += fire_end.eq(next_now(s_job))
                    m.next = "FIRE"
                with m.Else():
                    m.d.sync += scan.eq(after_scan)
                    m.next = "IDLE"
            with m.State("FIRE"):
                m.d.comb += [self.resend.valid.eq(1), self.resend.p.job.eq(s_job), self.resend.p.worker.eq(s_worker),
                             self.resend.p.first.eq(point), self.resend.p.end.eq(fire_end),
                             self.resend.p.base.eq(bases[s_job]), self.resend.p.slots.eq(sizes[s_job]),
                             self.resend.p.timer.eq(1),
                             st_wr.addr.eq(scan), st_wr.en.eq(self.resend.ready)]
                with m.If(self.resend.ready):
                    m.d.sync += scan.eq(after_scan)
                    m.next = "IDLE"
        m.d.comb += self.idle.eq(fsm.ongoing("IDLE") & ~walked.any() & ~expired.any())
        walking = fsm.ongoing("READ") | fsm.ongoing("WRITE")
        m.d.comb += self.look_held.eq(walking & (self.look_job == a.job)
                                      & ((self.look.psn - start)[:PSN_BITS] <= (upto - start)[:PSN_BITS]))
        return m


class ResendFrames(wiring.Component):
    """Go-Back-N requests into frames for the slot engine: per PSN of the range one frame of zeros, ``again``.

    Such a frame adds nothing: the slot engine reads its slot's lanes and
    sends the result they hold to the one child again, counted as
    ``HOP_RESENDS`` (:class:`~inagg.hdl.engine.SlotEngine` with
    ``augmented``). A slot's lanes hold its result until every child ACKed
    it, so the result a child NAKed is still there. The frames enter the
    engine through the :class:`~inagg.hdl.arbiter.FrameArbiter` as one more
    input, taking turns with the ports' frames.

    Parameters
    ----------
    width, chunk_bytes:
        Beat width and bytes per chunk: ``chunk_bytes * 8 / width`` beats a frame.
    slots:
        Slot numbers of the frame stream (:func:`~inagg.hdl.ingress.frame_signature`).

    Members
    -------
    i : In(stream.Signature(Resend))
        Taken when the frames of the request before have all left.
    o : Out(frame_signature(width, slots))
    """

    def __init__(self, width: int, chunk_bytes: int, slots: int):
        self._beats = check_chunk_bytes(chunk_bytes) * 8 // check_width(width)
        super().__init__({"i": In(stream.Signature(Resend)), "o": Out(frame_signature(width, slots))})

    def elaborate(self, platform):
        m = Module()
        req, psn = Signal(Resend), Signal(PSN_BITS)
        j = Signal(range(self._beats))
        busy = Signal()
        m.d.comb += self.i.ready.eq(~busy)
        with m.If(self.i.valid & ~busy):
            m.d.sync += [req.eq(self.i.p), psn.eq(self.i.p.first), busy.eq(self.i.p.first != self.i.p.end)]
        d = self.o.p.desc
        last = j == self._beats - 1
        m.d.comb += [self.o.valid.eq(busy), self.o.p.last.eq(last),
                     d.job.eq(req.job), d.worker.eq(req.worker), d.psn.eq(psn),
                     d.slot.eq(req.base + (psn & (req.slots - 1))), d.slots.eq(req.slots),
                     d.translated.eq(1), d.augmented.eq(1), d.again.eq(1)]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += j.eq(Mux(last, 0, j + 1))
            with m.If(last):
                m.d.sync += [psn.eq(psn + 1), busy.eq(psn + 1 != req.end)]
        return m
