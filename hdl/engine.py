"""The slot engine: direct-mapped slots and their read-modify-write pipeline (INT32 fast path).

Slot ``s`` holds one chunk: its lanes in the lane memory (``beats`` words
of ``width`` bits at ``s * beats``) and its state in the metadata memory:
``state`` (FREE, AGG, DONE), the key (``job``, ``chunk``), the worker
``bitmap`` and ``count``. A contribution streams through two stages, one
beat per cycle, never stalling once started:

* **A** reads the beat's lane word and, on the frame's first beat, the
  slot's metadata.
* **B** decides on the first beat what the frame does (the rules of
  ``docs/protocol.md`` section 3, fast path only: a slot held by another
  job is ``DROP_COLLISION``), writes the metadata back, and for every beat
  writes the sum (or, for a slot's first contribution, the lanes as they
  came) and, when the frame completes the chunk or asks for a resend, sends
  the beat on to the result emitters.

A read in A of the word B writes in the same cycle sees the new value (the
read port is transparent to the write port), so back-to-back beats on one
word add correctly; words written by one frame are re-read by the next only
``beats`` cycles later.

Seams for the promotion and exception paths (issue 4): the lane addition is
:func:`lane_add` alone, and :meth:`SlotEngine.decide` is the one place that
maps a contribution to its slot.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ..models.protocol import MAX_WORKERS, QPN_JOB_BITS, QPN_WORKER_BITS, Counter
from ..models.switch import SlotState
from .axis import check_chunk_bytes, check_slots, check_width, swap_lanes
from .control import N_COUNTERS, event_vector
from .ingress import frame_signature

__all__ = ["meta_layout", "result_desc_layout", "result_signature", "lane_add", "SlotEngine"]


def meta_layout(workers: int) -> data.StructLayout:
    """A slot's state, key, worker bitmap and count."""
    return data.StructLayout({"state": 2, "job": QPN_JOB_BITS, "chunk": 32, "bitmap": workers,
                              "count": range(MAX_WORKERS + 1)})


def result_desc_layout(slots: int) -> data.StructLayout:
    """Which result a beat belongs to: ``all`` workers of the job, or ``worker`` alone (a resend)."""
    return data.StructLayout({"job": QPN_JOB_BITS, "worker": QPN_WORKER_BITS, "all": 1,
                              "workers": QPN_WORKER_BITS + 1, "chunk": 32, "ring": range(slots)})


def result_signature(width: int, slots: int) -> stream.Signature:
    """Result payloads, in wire order, with their descriptor; never stalled (emitters keep room)."""
    return stream.Signature(data.StructLayout({"data": width, "first": 1, "last": 1,
                                               "desc": result_desc_layout(slots)}), always_ready=True)


def lane_add(acc, x):
    """INT32 lane sums of two vectors of native 32-bit lanes, wrapping."""
    return Cat(*[(acc.word_select(i, 32) + x.word_select(i, 32))[:32] for i in range(len(acc) // 32)])


class SlotEngine(wiring.Component):
    """Direct-mapped INT32 slots (see the module docstring).

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

    Members
    -------
    i : In(frame_signature(width, slots))
        Accepted contributions. ``i.ready`` is low only on a first beat
        while ``can_start`` is low, and for ``slots`` cycles after reset
        while the engine marks every slot FREE.
    can_start : In(1)
        Every result emitter can take one more result.
    o : Out(result_signature(width, slots))
        Results to send.
    events : Out(N_COUNTERS)
        Counter strobes of the slot rules.
    """

    def __init__(self, width: int, chunk_bytes: int, slots: int, workers: int):
        self._width = check_width(width)
        self._chunk = check_chunk_bytes(chunk_bytes)
        self._slots = check_slots(slots)
        if not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
            raise ValueError(f"Workers per job must be an integer in 1..{MAX_WORKERS}, not {workers!r}")
        self._workers = workers
        self.beats = chunk_bytes * 8 // width
        super().__init__({
            "i": In(frame_signature(width, slots)),
            "can_start": In(1),
            "o": Out(result_signature(width, slots)),
            "events": Out(N_COUNTERS),
        })

    def decide(self, m, meta, desc):
        """The slot rules for one contribution: (outcome signals, new metadata)."""
        fresh, proceed = Signal(), Signal()
        code = {c: Signal(name=f"is_{c.name.lower()}") for c in
                (Counter.DROP_COLLISION, Counter.DROP_STALE, Counter.DROP_WINDOW)}
        ahead = Signal(32)
        m.d.comb += ahead.eq(desc.chunk - meta.chunk)
        with m.If(meta.state == SlotState.FREE):
            m.d.comb += [fresh.eq(1), proceed.eq(1)]
        with m.Elif(meta.job != desc.job):
            m.d.comb += code[Counter.DROP_COLLISION].eq(1)
        with m.Elif(meta.chunk == desc.chunk):
            m.d.comb += proceed.eq(1)
        with m.Elif(ahead[31]):
            m.d.comb += code[Counter.DROP_STALE].eq(1)
        with m.Elif((ahead != desc.slots) | (meta.state != SlotState.DONE)):
            m.d.comb += code[Counter.DROP_WINDOW].eq(1)
        with m.Else():
            # The job's next generation: every worker holds the old result (protocol.md "Slot reuse").
            m.d.comb += [fresh.eq(1), proceed.eq(1)]
        bitmap = Mux(fresh, 0, meta.bitmap)
        count = Mux(fresh, 0, meta.count)
        done_before = ~fresh & (meta.state == SlotState.DONE)
        dup = proceed & bitmap.bit_select(desc.worker, 1)
        add = proceed & ~dup
        new = Signal(meta.shape())
        complete = add & (count + 1 == desc.workers)
        m.d.comb += [
            new.state.eq(Mux(complete, SlotState.DONE, SlotState.AGG)), new.job.eq(desc.job),
            new.chunk.eq(desc.chunk), new.bitmap.eq(bitmap | (Const(1, self._workers) << desc.worker)[:self._workers]),
            new.count.eq(count + 1),
        ]
        out = {"add": add, "store": add & (count == 0), "dup": dup, "resend": dup & done_before,
               "complete": complete, "codes": code}
        return out, new

    def elaborate(self, platform):
        m = Module()
        beats = self.beats
        m.submodules.lanes = lanes = memory.Memory(shape=self._width, depth=self._slots * beats, init=[])
        m.submodules.meta = metas = memory.Memory(shape=meta_layout(self._workers), depth=self._slots, init=[])
        l_wr = lanes.write_port()
        l_rd = lanes.read_port(transparent_for=(l_wr,))
        m_wr = metas.write_port()
        m_rd = metas.read_port(transparent_for=(m_wr,))

        # After reset every slot is FREE: sweep the metadata before taking a contribution
        # (the lanes need no clearing, a slot's first contribution is stored as it comes).
        sweep = Signal(range(self._slots + 1))
        clearing = sweep != self._slots
        with m.If(clearing):
            m.d.sync += sweep.eq(sweep + 1)

        # -- stage A --
        j = Signal(range(beats))
        first = j == 0
        m.d.comb += self.i.ready.eq(~clearing & (~first | self.can_start))
        take = self.i.valid & self.i.ready
        desc = self.i.p.desc
        with m.If(take):
            m.d.sync += j.eq(Mux(self.i.p.last, 0, j + 1))
        m.d.comb += [l_rd.addr.eq(Cat(j, desc.slot)), m_rd.addr.eq(desc.slot)]

        # -- stage B --
        b_valid, b_first, b_last = Signal(), Signal(), Signal()
        b_j = Signal.like(j)
        b_x = Signal(self._width)
        b_desc = Signal.like(desc)
        m.d.sync += [b_valid.eq(take), b_first.eq(first), b_last.eq(self.i.p.last), b_j.eq(j),
                     b_x.eq(swap_lanes(self.i.p.data)), b_desc.eq(desc)]
        out, new_meta = self.decide(m, m_rd.data, b_desc)
        decide = b_valid & b_first
        with m.If(clearing):
            m.d.comb += [m_wr.addr.eq(sweep), m_wr.data.eq(0), m_wr.en.eq(1)]
        with m.Else():
            m.d.comb += [m_wr.addr.eq(b_desc.slot), m_wr.data.eq(new_meta), m_wr.en.eq(decide & out["add"])]

        # What the frame does, held for its later beats.
        f_write, f_store, f_emit, f_all = Signal(), Signal(), Signal(), Signal()
        write = Mux(b_first, out["add"], f_write)
        store = Mux(b_first, out["store"], f_store)
        emit = Mux(b_first, out["complete"] | out["resend"], f_emit)
        to_all = Mux(b_first, out["complete"], f_all)
        with m.If(decide):
            m.d.sync += [f_write.eq(write), f_store.eq(store), f_emit.eq(emit), f_all.eq(to_all)]

        total = Signal(self._width)
        m.d.comb += total.eq(Mux(store, b_x, lane_add(l_rd.data, b_x)))
        m.d.comb += [l_wr.addr.eq(Cat(b_j, b_desc.slot)),
                     l_wr.data.eq(total), l_wr.en.eq(b_valid & write)]

        o = self.o.p
        m.d.comb += [
            self.o.valid.eq(b_valid & emit),
            o.data.eq(swap_lanes(Mux(write, total, l_rd.data))), o.first.eq(b_first), o.last.eq(b_last),
            o.desc.job.eq(b_desc.job), o.desc.worker.eq(b_desc.worker), o.desc.all.eq(to_all),
            o.desc.workers.eq(b_desc.workers), o.desc.chunk.eq(b_desc.chunk),
            o.desc.ring.eq(b_desc.chunk & (b_desc.slots - 1)),
        ]
        ev = {Counter.RX_CONTRIB: out["add"], Counter.DUP_CONTRIB: out["dup"], Counter.TX_RESENDS: out["resend"],
              Counter.COMPLETED: out["complete"], **out["codes"]}
        m.d.comb += self.events.eq(event_vector({c: decide & sig for c, sig in ev.items()}))
        return m
