"""The slot engine: direct-mapped slots and their read-modify-write pipeline, INT32 lanes promoted to FP32.

Slot ``s`` holds one chunk: its lanes in the lane memory (``beats`` words
of ``width`` bits at ``s * beats``, each with one promotion bit per lane,
:func:`lane_word_layout`) and its state in the metadata memory: ``state``
(FREE, AGG, DONE), the key (``job``, ``chunk``), the worker ``bitmap`` and
``count``. A contribution streams through the pipeline one beat per cycle,
never stalling once started:

* **A** reads the beat's lane word and, on the frame's first beat, the
  slot's metadata.
* **B** decides on the first beat what the frame does (the rules of
  ``docs/protocol.md`` section 3, fast path only: a slot held by another
  job is ``DROP_COLLISION``) and writes the metadata back. For every beat it
  adds the lanes in INT32 with the exact 33-bit sum beside it, and picks
  what each lane's :class:`~inagg.hdl.fp32.IntToFP32` converts: the
  contribution of a promoted lane, the exact sum of an unpromoted one. That
  choice hangs on the decision, so it is registered before the converter
  (one cycle), which keeps the converter off the decision's path.
* **FP** (``1 + convert_latency + add_latency`` cycles): a promoted lane
  adds the converted contribution to its word in its
  :class:`~inagg.hdl.fp32.FP32Adder`; every other lane waits beside it.
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
whatever the lanes hold. A read in A of the word W writes in the same cycle
sees the new value (the read port is transparent to the write port). A
frame to the slot of a frame still in flight would read a word before its
new value lands when frames are shorter than the pipeline
(``beats <= lag``): its first beat then waits until the earlier frame's
last beat is ``lag - beats + 2`` cycles past A (:attr:`SlotEngine.lag`).
A first beat also waits while a frame that sends a result is on its way
from B to the emitters, so that ``can_start`` has counted that result.

:class:`SlotRules` (stage B's slot decision) is the one place that maps a
contribution to what its slot does (the seam of the exception path);
:class:`SlotSweep` clears the metadata after reset and runs a teardown's
sweeps.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from inagg.models.protocol import MAX_WORKERS, QPN_JOB_BITS, QPN_WORKER_BITS, Counter
from inagg.models.switch import SlotState
from inagg.hdl.axis import check_chunk_bytes, check_slots, check_width, swap_lanes
from inagg.hdl.control import N_COUNTERS, event_vector
from inagg.hdl.fp32 import FP32Adder, IntToFP32
from inagg.hdl.ingress import frame_desc_layout, frame_signature

__all__ = ["check_fp32_latencies", "meta_layout", "SweepRequest", "Outcome", "SlotRules", "SlotSweep",
           "lane_word_layout", "result_desc_layout",
           "result_signature", "SlotEngine"]


def meta_layout(workers: int) -> data.StructLayout:
    """A slot's state, key, worker bitmap and count; ``guest``: another job's key diverted from it while held."""
    return data.StructLayout({"state": 2, "job": QPN_JOB_BITS, "chunk": 32, "bitmap": workers,
                              "count": range(MAX_WORKERS + 1), "guest": 1})


SweepRequest = data.StructLayout({"start": 1, "job": QPN_JOB_BITS, "first": 17, "count": 17, "check": 1})
"""A sweep over slots ``first .. first + count - 1`` for the slots ``job`` holds: with ``check``, whether one of
them is marked ``guest``; without, clear them to FREE (a job's teardown)."""


def lane_word_layout(width: int) -> data.StructLayout:
    """One word of the lane memory: ``width // 32`` native 32-bit lanes and their promotion bits."""
    return data.StructLayout({"words": width, "promoted": width // 32})


def result_desc_layout(slots: int) -> data.StructLayout:
    """Which result a beat belongs to: ``all`` workers of the job, or ``worker`` alone (a resend)."""
    return data.StructLayout({"job": QPN_JOB_BITS, "worker": QPN_WORKER_BITS, "all": 1,
                              "workers": QPN_WORKER_BITS + 1, "chunk": 32, "ring": range(slots)})


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

    Attributes
    ----------
    beats : int
        Beats per contribution.
    lag : int
        Cycles from a lane word's arrival in B to the write of its new value
        (``1 + convert_latency + add_latency``).
    slot_meta : Memory
        Every slot's :func:`meta_layout`; read by testbenches.

    Members
    -------
    i : In(frame_signature(width, slots + overflow))
        Accepted contributions. ``i.ready`` is low only on a first beat
        while ``can_start`` is low, while a result is on its way to the
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
    """

    def __init__(self, width: int, chunk_bytes: int, slots: int, workers: int, *, convert_latency: int = 1,
                 add_latency: int = 2, overflow: int = 0):
        self._width = check_width(width)
        self._chunk = check_chunk_bytes(chunk_bytes)
        self._slots = check_slots(slots)
        if not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
            raise ValueError(f"Workers per job must be an integer in 1..{MAX_WORKERS}, not {workers!r}")
        if not isinstance(overflow, int) or isinstance(overflow, bool) or not 0 <= overflow <= 1 << 16:
            raise ValueError(f"Overflow slots must be an integer in 0..65536, not {overflow!r}")
        self._workers = workers
        self._depth = slots + overflow
        self._convert, self._add = check_fp32_latencies(convert_latency, add_latency)
        self.beats = chunk_bytes * 8 // width
        self.lag = 1 + self._convert + self._add
        self.slot_meta = memory.Memory(shape=meta_layout(workers), depth=self._depth, init=[])
        super().__init__({
            "i": In(frame_signature(width, self._depth)),
            "can_start": In(1),
            "o": Out(result_signature(width, slots)),
            "events": Out(N_COUNTERS),
            "gone": In(1),
            "sweep": In(SweepRequest),
            "sweep_busy": Out(1),
            "sweep_hazard": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        beats, width, lag = self.beats, self._width, self.lag
        n_lanes = width // 32
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

        # -- stage A --
        j = Signal(range(beats))
        first = j == 0
        waits = Signal()
        m.d.comb += self.i.ready.eq(~clearing & ~sweeper.busy & ~self.sweep.start
                                    & (~first | (self.can_start & ~waits)))
        take = self.i.valid & self.i.ready
        desc = self.i.p.desc
        with m.If(take):
            m.d.sync += j.eq(Mux(self.i.p.last, 0, j + 1))
        m.d.comb += [l_rd.addr.eq(Cat(j, desc.slot)), m_rd.addr.eq(Mux(sweeper.read, sweeper.read_addr, desc.slot))]

        # -- stage B: the slot rules --
        b_valid, b_first, b_last, b_gone = Signal(), Signal(), Signal(), Signal()
        b_j = Signal.like(j)
        b_x = Signal(width)
        b_desc = Signal(frame_desc_layout(self._depth))
        m.d.sync += [b_valid.eq(take), b_first.eq(first), b_last.eq(self.i.p.last), b_j.eq(j),
                     b_x.eq(swap_lanes(self.i.p.data)), b_desc.eq(desc), b_gone.eq(self.gone)]
        m.submodules.rules = rules = SlotRules(self._workers, self._depth)
        m.d.comb += [rules.meta.eq(m_rd.data), rules.desc.eq(b_desc), rules.gone.eq(b_gone)]
        out, new_meta = rules.outcome, rules.new
        decide = b_valid & b_first
        # With overflow slots, a slot that another job's key diverted from is marked, so that
        # its holder's teardown can tell whether freeing it would leave keys with entries on a
        # FREE fast slot (docs/exception.md "Teardown").
        marks = decide & out.collision if self._depth > self._slots else Const(0, 1)
        marked = Signal(meta_layout(self._workers))
        m.d.comb += [marked.eq(m_rd.data), marked.guest.eq(1)]
        with m.If(clearing):
            m.d.comb += [m_wr.addr.eq(sweeper.clear_addr), m_wr.data.eq(0), m_wr.en.eq(1)]
        with m.Elif(sweeper.acts):
            m.d.comb += [m_wr.addr.eq(sweeper.write_addr), m_wr.data.eq(0), m_wr.en.eq(sweeper.write_en)]
        with m.Else():
            m.d.comb += [m_wr.addr.eq(b_desc.slot), m_wr.data.eq(Mux(marks, marked, new_meta)),
                         m_wr.en.eq(decide & (out.add | marks))]

        # What the frame does, held for its later beats.
        f_write, f_store, f_emit, f_all = Signal(), Signal(), Signal(), Signal()
        write = Mux(b_first, out.add, f_write)
        store = Mux(b_first, out.store, f_store)
        emit = Mux(b_first, out.complete | out.resend, f_emit)
        to_all = Mux(b_first, out.complete, f_all)
        with m.If(decide):
            m.d.sync += [f_write.eq(write), f_store.eq(store), f_emit.eq(emit), f_all.eq(to_all)]

        # -- stage B: the lanes --
        # Each lane has one converter: a promoted lane converts its contribution for the
        # adder; an unpromoted lane converts its exact sum, which is its new word when the
        # addition overflowed and its binary32 value for a result that goes out as FP32.
        acc, held = l_rd.data.words, l_rd.data.promoted
        int_word = Signal(width)                       # the word unless promoted
        promoted = Signal(n_lanes)                     # promoted before this contribution
        overflow = Signal(n_lanes)                     # promoted by this contribution
        convs = []
        for k in range(n_lanes):
            a, x = acc.word_select(k, 32), b_x.word_select(k, 32)
            total = a.as_signed() + x.as_signed()
            m.submodules[f"conv{k}"] = conv = IntToFP32(33, self._convert)
            convs.append(conv)
            p = held[k] & ~store
            m.d.comb += [
                promoted[k].eq(p),
                overflow[k].eq(write & ~store & ~p & (total[32] ^ total[31])),
                int_word.word_select(k, 32).eq(Mux(store, x, Mux(write, total[:32], a))),
            ]
            m.d.sync += [conv.i.eq(Mux(p | store, x.as_signed(), Mux(write, total, a.as_signed()))),
                         conv.i_valid.eq(b_valid)]

        # -- FP: the adders, and the rest of the beat waiting beside them --
        ctrl_layout = data.StructLayout({"first": 1, "last": 1, "j": range(beats), "write": 1, "emit": 1,
                                         "to_all": 1, "adds": n_lanes, "promoted": n_lanes, "overflow": n_lanes,
                                         "word": width, "desc": frame_desc_layout(self._depth)})
        ctrl = Signal(ctrl_layout)
        m.d.comb += [ctrl.first.eq(b_first), ctrl.last.eq(b_last), ctrl.j.eq(b_j), ctrl.write.eq(write),
                     ctrl.emit.eq(emit), ctrl.to_all.eq(to_all), ctrl.adds.eq(promoted & write.replicate(n_lanes)),
                     ctrl.promoted.eq(promoted), ctrl.overflow.eq(overflow), ctrl.word.eq(int_word),
                     ctrl.desc.eq(b_desc)]
        valids = _delay_line(m, b_valid, 1, lag, "fp_valid", reset_less=False)
        ctrls = _delay_line(m, ctrl, ctrl_layout, lag, "fp")
        acc_late = _delay_line(m, acc, width, 1 + self._convert, "fp_acc")[-1]
        converted = Cat(*[c.o for c in convs])
        conv_late = _delay_line(m, converted, width, self._add, "fp_conv")[-1]
        sums = []
        for k, conv in enumerate(convs):
            m.submodules[f"add{k}"] = adder = FP32Adder(self._add)
            m.d.comb += [adder.a.eq(acc_late.word_select(k, 32)), adder.b.eq(conv.o), adder.i_valid.eq(conv.o_valid)]
            sums.append(adder.o)

        # A frame's first beat waits while an earlier frame to its slot is too close ahead
        # (its last beat `lag - beats + 1` stages or fewer past B), or while a result is
        # between B and the emitters, which count it only once it arrives. A result's first beat
        # is looked for from one stage past B on: while it is in B, A holds its frame's second
        # beat (a chunk has 4 beats or more), never a first beat, and its `emit` there is still
        # the decision on the metadata read, which would put that read and the slot rules in
        # front of `i.ready` and the arbiter and ingress behind it (the switch's worst path).
        assert beats >= 2
        hazards = [valids[k] & ctrls[k].last & (ctrls[k].desc.slot == desc.slot) for k in range(lag - beats + 1)]
        results = [valids[k] & ctrls[k].first & ctrls[k].emit for k in range(1, lag + 1)]
        m.d.comb += waits.eq(Cat(*hazards, *results).any())

        # -- stage W --
        w_valid, w = valids[-1], ctrls[-1]
        word = Signal(width)
        fp = Signal(width)
        for k in range(n_lanes):
            lane = word.word_select(k, 32)
            late = conv_late.word_select(k, 32)
            m.d.comb += [lane.eq(Mux(w.adds[k], sums[k], Mux(w.overflow[k], late, w.word.word_select(k, 32)))),
                         fp.word_select(k, 32).eq(Mux(w.promoted[k], lane, late))]
        now = w.promoted | w.overflow
        m.d.comb += [l_wr.addr.eq(Cat(w.j, w.desc.slot)), l_wr.data.words.eq(word), l_wr.data.promoted.eq(now),
                     l_wr.en.eq(w_valid & w.write)]
        seen = Signal()                                # a lane of the frame's earlier beats is promoted
        so_far = now.any() | (~w.first & seen)
        with m.If(w_valid):
            m.d.sync += seen.eq(so_far)

        o = self.o.p
        m.d.comb += [
            self.o.valid.eq(w_valid & w.emit),
            o.data.eq(swap_lanes(word)), o.fp.eq(swap_lanes(fp)), o.promoted.eq(so_far),
            o.first.eq(w.first), o.last.eq(w.last),
            o.desc.job.eq(w.desc.job), o.desc.worker.eq(w.desc.worker), o.desc.all.eq(w.to_all),
            o.desc.workers.eq(w.desc.workers), o.desc.chunk.eq(w.desc.chunk),
            o.desc.ring.eq(w.desc.chunk & (w.desc.slots - 1)),
        ]
        ev = {Counter.RX_CONTRIB: out.add, Counter.DUP_CONTRIB: out.dup, Counter.TX_RESENDS: out.resend,
              Counter.COMPLETED: out.complete, Counter.DROP_UNKNOWN_QPN: out.unknown_qpn,
              Counter.DROP_COLLISION: out.collision, Counter.DROP_STALE: out.stale, Counter.DROP_WINDOW: out.window}
        strobes = {c: decide & sig for c, sig in ev.items()}
        strobes[Counter.PROMOTED] = w_valid & w.last & w.to_all & so_far
        m.d.comb += self.events.eq(event_vector(strobes))
        return m
