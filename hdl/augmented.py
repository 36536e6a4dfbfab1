"""EPIC's Mode III (connection augmented) in gateware: the slot rules of one contribution.

``docs/protocol.md`` section 7 is the specification and
:class:`inagg.models.modes.AugmentedJob` its reference. Mode III keeps
Mode II's state (:mod:`inagg.hdl.translated`) and adds per (job, worker)
a "NAK sent" bit, one more bit of the :class:`~inagg.hdl.translated.PsnTable`
word (``PsnTable(jobs, nak=True)``), and per slot the bitmap of the
children that ACKed its result (:func:`augmented_meta_layout`). Upward the
switch is each child's RC responder: :class:`AugmentedRules` decides what
the slot does with one contribution and which ACK or NAK answers it;
:func:`augmented_events` are its counter strobes, the model's for the same
frame.

Not yet in the slot engine nor in :class:`~inagg.hdl.switch.Switch`
(``docs/rtl.md``, "Mode III blocks").
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from inagg.models.protocol import MAX_WORKERS, Counter
from inagg.models.rc import Syndrome
from inagg.hdl.ingress import PSN_BITS
from inagg.hdl.translated import slot_after, translated_desc_layout, translated_meta_layout

__all__ = ["augmented_meta_layout", "AugmentedOutcome", "AugmentedReply", "AugmentedRules", "augmented_events"]

SLOT_BITS = 24
"""Most slots of a job's region, as a power of two: ``PSN mod slots`` names a slot across a PSN wrap."""


def augmented_meta_layout(workers: int) -> data.StructLayout:
    """A Mode III slot: Mode II's fields (:func:`~inagg.hdl.translated.translated_meta_layout`) and ``acked``,
    the bitmap of the children that ACKed its result; the slot is free again when it is every child's."""
    return data.StructLayout({**{name: f.shape for name, f in translated_meta_layout(workers)}, "acked": workers})


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
    :func:`augmented_meta_layout` for the slot. Unlike Mode II, nothing
    clears a shadow slot: a slot is freed when every child ACKed its
    result, and a contribution whose slot still holds another PSN is
    ``busy``.

    Parameters
    ----------
    workers:
        Most workers per job, 1 to 64.
    slots:
        Most slots of a job's region, a power of two from 2 to ``2**24``.

    Members
    -------
    meta : In(augmented_meta_layout(workers))
    desc : In(translated_desc_layout(slots))
    expected : In(PSN_BITS)
    nak_sent : In(1)
        The worker's "NAK sent" bit: a NAK went out for the gap it is in.
    outcome : Out(AugmentedOutcome)
    new : Out(augmented_meta_layout(workers))
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
        super().__init__({"meta": In(augmented_meta_layout(workers)), "desc": In(translated_desc_layout(slots)),
                          "expected": In(PSN_BITS), "nak_sent": In(1), "outcome": Out(AugmentedOutcome),
                          "new": Out(augmented_meta_layout(workers)), "reply": Out(AugmentedReply),
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
            new.acked.eq(Mux(held, meta.acked, 0)),
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
