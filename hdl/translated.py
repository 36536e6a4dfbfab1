"""EPIC's Mode II (connection translated) in gateware: the per-worker PSN table and the slot rules.

``docs/protocol.md`` section 6.2 is the specification and
:class:`inagg.models.modes.TranslatedJob` its reference: hosts keep RC
queue pairs end to end, and the switch keeps per (job, worker) the
expected contribution PSN (:class:`PsnTable`, one block RAM) and per slot
the PSN, chunk, worker bitmap, count and a done flag
(:func:`translated_meta_layout`), slot ``p mod 2W`` for PSN ``p`` in the
job's region of ``2W`` slots. :class:`TranslatedRules` maps one RC
contribution, the slot's metadata and the worker's expected PSN to what the
slot does, combinationally, as :class:`~inagg.hdl.engine.SlotRules` does
for the UC mode; its counter strobes (:func:`translated_events`) are the
model's for the same frame. :class:`~inagg.hdl.reflect.AckReflector` sends a host's
ACK or NAK of a result back to it as the ACK of its contribution (step 5).

The slot engine uses them for Mode II frames (``SlotEngine(psn_jobs=...)``), and
:class:`~inagg.hdl.switch.Switch` for every job whose mode is II (``docs/rtl.md``, "Mode II").
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import In, Out

from inagg.models.protocol import MAX_WORKERS, QPN_JOB_BITS, QPN_WORKER_BITS, Counter
from inagg.hdl.ingress import PSN_BITS

__all__ = ["translated_meta_layout", "translated_desc_layout", "TranslatedOutcome",
           "TranslatedRules", "slot_after", "translated_events", "PsnTable"]

def translated_meta_layout(workers: int) -> data.StructLayout:
    """A Mode II slot: the PSN and chunk it holds, the bitmap of the workers in, their count, and ``done``."""
    return data.StructLayout({"psn": PSN_BITS, "chunk": 32, "bitmap": workers,
                              "count": range(MAX_WORKERS + 1), "done": 1})


def translated_desc_layout(slots: int) -> data.StructLayout:
    """An RC contribution that passed the frame checks: its worker, PSN and chunk; the job's ``workers`` (the
    contributions that complete a slot) and ``slots`` (its region, ``2W``, a power of two)."""
    return data.StructLayout({"worker": QPN_WORKER_BITS, "psn": PSN_BITS, "chunk": 32,
                              "workers": QPN_WORKER_BITS + 1, "slots": range(slots + 1)})


TranslatedOutcome = data.StructLayout({"add": 1, "store": 1, "complete": 1, "dup": 1, "resend": 1,
                                       "ahead": 1, "stale": 1, "window": 1, "bad_address": 1})
"""What Mode II makes of one contribution: ``add`` it (``store``: the slot starts with it), ``complete`` the
chunk, a ``dup``licate behind the expected PSN (``resend``: of the result, to this worker), or drop it: PSN
``ahead``, ``stale``, ``window`` (the slot holds another PSN), ``bad_address`` (another chunk for this PSN)."""


class TranslatedRules(wiring.Component):
    """Mode II's slot decision (``docs/protocol.md`` section 6.2, steps 2-4) for one contribution, combinationally.

    Parameters
    ----------
    workers:
        Most workers per job (bits of a slot's bitmap).
    slots:
        Most slots of a job's region.

    Members
    -------
    meta : In(translated_meta_layout(workers))
        Slot ``psn mod slots`` as read.
    desc : In(translated_desc_layout(slots))
        The contribution.
    expected : In(PSN_BITS)
        The worker's expected PSN, from the :class:`PsnTable`.
    outcome : Out(TranslatedOutcome)
    new : Out(translated_meta_layout(workers))
        The slot after the contribution (written when ``outcome.add``).
    next_expected : Out(PSN_BITS)
        The worker's expected PSN after it (written when ``outcome.add``).
    slot, shadow : Out(range(slots))
        The slot's index in the job's region, and the shadow slot's, ``(psn + slots / 2) mod slots``,
        whose bit of this worker an added contribution clears (step 2).
    """

    def __init__(self, workers: int, slots: int):
        self._workers = workers
        super().__init__({"meta": In(translated_meta_layout(workers)), "desc": In(translated_desc_layout(slots)),
                          "expected": In(PSN_BITS), "outcome": Out(TranslatedOutcome),
                          "new": Out(translated_meta_layout(workers)), "next_expected": Out(PSN_BITS),
                          "slot": Out(range(slots)), "shadow": Out(range(slots))})

    def elaborate(self, platform):
        m = Module()
        meta, desc, out = self.meta, self.desc, self.outcome
        # PSNs are 24-bit serial numbers (RFC 1982): the distance's top bit says "behind".
        dist = Signal(PSN_BITS)
        m.d.comb += dist.eq(desc.psn - self.expected)
        behind, ahead = dist[-1], (dist != 0) & ~dist[-1]
        mask = desc.slots - 1
        m.d.comb += [self.slot.eq(desc.psn & mask), self.shadow.eq((desc.psn + (desc.slots >> 1)) & mask)]
        mine = meta.bitmap.bit_select(desc.worker, 1)
        same = (meta.psn == desc.psn) & (meta.chunk == desc.chunk)
        held = meta.bitmap != 0
        with m.If(ahead):
            m.d.comb += out.ahead.eq(1)
        with m.Elif(behind):
            # Step 4: the slot still holds this (PSN, chunk) with the worker in, or its result.
            with m.If(same & (mine | meta.done)):
                m.d.comb += [out.dup.eq(1), out.resend.eq(meta.done)]
            with m.Else():
                m.d.comb += out.stale.eq(1)
        with m.Elif(held & (meta.psn != desc.psn)):
            m.d.comb += out.window.eq(1)
        with m.Elif(held & (meta.chunk != desc.chunk)):
            m.d.comb += out.bad_address.eq(1)  # the hosts disagree on which chunk this PSN carries
        with m.Else():
            m.d.comb += out.add.eq(1)
        m.d.comb += [*slot_after(out, self.new, meta, desc, held, self._workers), self.next_expected.eq(desc.psn + 1)]
        return m


def slot_after(out, new, meta, desc, held, workers: int) -> list:
    """The statements that set ``new`` (the slot after an added contribution, the fields of
    :func:`translated_meta_layout`) and ``out.store``/``out.complete`` from ``out.add``: the rule Modes II and
    III share (step 2), an empty slot starting with the contribution."""
    count = Mux(held, meta.count, 0) + 1
    complete = out.add & (count >= desc.workers)
    return [out.store.eq(out.add & ~held), out.complete.eq(complete),
            new.psn.eq(desc.psn), new.chunk.eq(desc.chunk),
            new.bitmap.eq(Mux(held, meta.bitmap, 0) | (Const(1, workers) << desc.worker)[:workers]),
            new.count.eq(count), new.done.eq(complete | (held & meta.done))]


def translated_events(outcome) -> dict:
    """The counter strobes of a :data:`TranslatedOutcome`, as the model counts them (``TX_RESULTS`` and
    ``PROMOTED`` are the emitters' and the lanes' to count)."""
    return {Counter.RX_CONTRIB: outcome.add, Counter.COMPLETED: outcome.complete,
            Counter.DUP_CONTRIB: outcome.dup, Counter.TX_RESENDS: outcome.resend,
            Counter.DROP_PSN_AHEAD: outcome.ahead, Counter.DROP_STALE: outcome.stale,
            Counter.DROP_WINDOW: outcome.window, Counter.DROP_BAD_ADDRESS: outcome.bad_address}


class PsnTable(wiring.Component):
    """Per (job, worker) the expected contribution PSN of Mode II, in one block RAM of ``jobs * 64`` entries.

    With ``nak`` (Mode III, :class:`~inagg.hdl.augmented.AugmentedRules`)
    each entry holds one more bit beside the PSN, the worker's "NAK sent",
    read and written with it (``nak_sent``, ``write_nak``) and cleared with it.

    Entry ``job * 64 + worker`` (the switch QPN's low bits). A read
    (``read_en``) shows the entry the next cycle in ``expected``; a write
    (``write_en``) lands at the clock edge, and a read of the entry written
    in the same cycle sees the new value. After reset, and after ``clear``
    for ``clear_job`` (a job set up again starts at PSN 0, as the model's
    does), ``busy`` is high while the table writes 0 into the entries, one a
    cycle; reads and writes wait for it.

    Members
    -------
    read_en : In(1)
    read_job : In(QPN_JOB_BITS)
    read_worker : In(QPN_WORKER_BITS)
    expected : Out(PSN_BITS)
    write_en : In(1)
    write_job : In(QPN_JOB_BITS)
    write_worker : In(QPN_WORKER_BITS)
    write_psn : In(PSN_BITS)
    clear : In(1)
    clear_job : In(QPN_JOB_BITS)
    busy : Out(1)
    nak_sent : Out(1)
        With ``nak`` only: the entry's "NAK sent" bit, beside ``expected``.
    write_nak : In(1)
        With ``nak`` only: the bit written with ``write_psn``.
    """

    def __init__(self, jobs: int, nak: bool = False):
        if not isinstance(jobs, int) or not 1 <= jobs <= 1 << QPN_JOB_BITS:
            raise ValueError(f"jobs must be an integer from 1 to {1 << QPN_JOB_BITS}, not {jobs!r}")
        if not isinstance(nak, bool):
            raise TypeError(f"nak must be a bool, not {nak!r}")
        self._jobs, self._nak = jobs, nak
        flags = {"nak_sent": Out(1), "write_nak": In(1)} if nak else {}
        super().__init__({**flags,
            "read_en": In(1), "read_job": In(QPN_JOB_BITS), "read_worker": In(QPN_WORKER_BITS),
            "expected": Out(PSN_BITS),
            "write_en": In(1), "write_job": In(QPN_JOB_BITS), "write_worker": In(QPN_WORKER_BITS),
            "write_psn": In(PSN_BITS),
            "clear": In(1), "clear_job": In(QPN_JOB_BITS), "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        depth = self._jobs << QPN_WORKER_BITS
        m.submodules.mem = mem = memory.Memory(shape=PSN_BITS + self._nak, depth=depth, init=[])
        wr = mem.write_port()
        rd = mem.read_port(transparent_for=(wr,))
        # The sweep: every entry after reset, a job's MAX_WORKERS entries after ``clear``.
        at, end = Signal(range(depth + 1)), Signal(range(depth + 1), init=depth)
        sweeping = at != end
        with m.If(sweeping):
            m.d.sync += at.eq(at + 1)
        with m.Elif(self.clear & (self.clear_job < self._jobs)):
            first = Cat(Const(0, QPN_WORKER_BITS), self.clear_job)
            m.d.sync += [at.eq(first), end.eq(first + MAX_WORKERS)]
        m.d.comb += [
            self.busy.eq(sweeping),
            rd.en.eq(self.read_en), rd.addr.eq(Cat(self.read_worker, self.read_job)), self.expected.eq(rd.data[:PSN_BITS]),
            wr.en.eq(sweeping | self.write_en),
            wr.addr.eq(Mux(sweeping, at, Cat(self.write_worker, self.write_job))),
            wr.data.eq(Mux(sweeping, 0, Cat(self.write_psn, self.write_nak) if self._nak else self.write_psn)),
        ]
        if self._nak:
            m.d.comb += self.nak_sent.eq(rd.data[PSN_BITS])
        return m


