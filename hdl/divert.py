"""The switch's exception path: contributions whose direct-mapped slot another job holds go to overflow slots.

The slot engine finds out in its stage B, on a frame's first beat, that the
fast slot of a contribution is held by another job (its collision strobe).
:class:`Divert` watches the engine's input and that strobe. It copies a
colliding frame, beat by beat as the engine passes it by, into a queue of
its own, asks its :class:`~inagg.hdl.exception.ExceptionEngine` where the
key ``make_key(job, chunk % job.slots)`` lives (``LOCATE``: the entry, or a
new one), and when the answer is in sends the frame back to the slot
engine, through the frame arbiter, with ``desc.slot = slots + ptr``: the
overflow slots are slots ``slots .. slots + capacity - 1`` of the same slot
engine, so aggregation, dedup, resends, slot reuse, FP32 promotion and
result emission are the fast path's own. A refused contribution (table and
stash full) leaves the queue without going back, counted as
``EXC_REFUSED``; the host's retransmission recovers it.

Why the decision is ``ModelSwitch._locate``'s for the same order:

* A fast slot held by another job stays so until that job's teardown
  (a slot goes from FREE to AGG and then between AGG and DONE of the same
  job), and a teardown refuses to free a slot another job's key diverted
  from. So the collision strobe of a key is the same on every later frame
  of it, and an entry exists only for keys whose fast slot another job
  holds. A contribution whose fast slot is FREE therefore has no entry and
  takes the fast slot, as the model's LOOKUP would find.
* The engine answers in request order, which is the order the frames
  diverted; the frames go back in that order too. Frames of the fast path
  do not touch the table. The model, fed every diverted frame where it goes
  back (or is refused) and every other frame where the slot engine took
  it, makes the same table decisions in the same order.
* An overflow slot belongs to one key until the key's job is torn down,
  which clears the slot with no frame of the key left in the switch; so a
  frame sent back never collides again.

Admission: the slot engine may start a frame only while the queue has room
for one more whole frame, counting a frame whose first beat is in stage B
now (:attr:`Divert.room`); frames going back are exempt, as they never
divert and they are what frees the queue. Every request has a frame in the
queue, so at most ``frames`` requests are outstanding and the engine's
request queue (``frames`` entries) always takes a request at once.
"""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import data, fifo, wiring
from amaranth.lib.wiring import In, Out

from inagg.models.cuckoo import KEY_INDEX_BITS
from inagg.models.job import ExceptionSpec
from inagg.models.protocol import QPN_JOB_BITS
from inagg.hdl.axis import check_chunk_bytes, check_slots, check_width
from inagg.hdl.exception import ExceptionEngine, Op, Status, stats_layout
from inagg.hdl.ingress import frame_desc_layout, frame_signature

__all__ = ["Divert"]


class Divert(wiring.Component):
    """Diverted contributions, their exception-engine requests and their way back (see the module docstring).

    Parameters
    ----------
    width, chunk_bytes:
        Of the slot engine's frames.
    slots:
        Direct-mapped slots; overflow slot ``ptr`` is slot ``slots + ptr``.
    space:
        Slot numbers of the frame streams (their ``desc.slot`` is ``range(space)``),
        at least ``slots + exception.capacity``.
    jobs:
        Job numbers ``0 .. jobs - 1``; the keys take ``22 + log2(jobs)`` bits.
    exception:
        The cuckoo table: ``table``, ``max_kicks``, ``stash``.
    frames:
        Frames the queue holds, 1..64.

    Members
    -------
    taken : In(1)
        The slot engine takes a beat this cycle ...
    beat : In(frame layout)
        ... this one.
    collide : In(1)
        The frame whose first beat was taken the cycle before has its fast slot
        held by another job (the engine's ``DROP_COLLISION`` strobe).
    room : Out(1)
        A frame that may divert can start now.
    o : Out(frame_signature(width, space))
        Diverted frames on their way back, with their overflow slot.
    inserted, refused : Out(1)
        ``EXC_INSERTS`` and ``EXC_REFUSED`` strobes, when an answer leaves the queue.
    stats : Out(stats_layout())
        The exception engine's counters.
    idle : Out(1)
        No diverted frame is held, none is being copied, no request is outstanding.
    teardown : In(1)
        Send ``TEARDOWN`` for job ``teardown_job``'s indices ``0 .. teardown_slots - 1``
        (only while ``idle``, with no frame coming: its answer is then the next).
    teardown_job, teardown_slots : In
    teardown_done : Out(1)
        The engine answered the ``TEARDOWN``: the job's keys are deleted and their
        pointers at the end of the free list, in key order.
    """

    def __init__(self, *, width: int, chunk_bytes: int, slots: int, space: int, jobs: int,
                 exception: ExceptionSpec, frames: int = 4):
        self._width = check_width(width)
        self.beats = check_chunk_bytes(chunk_bytes) * 8 // width
        self._slots = check_slots(slots)
        if not isinstance(exception, ExceptionSpec):
            raise TypeError(f"Exception path must be an ExceptionSpec, not {exception!r}")
        if not isinstance(space, int) or isinstance(space, bool) or space < slots + exception.capacity:
            raise ValueError(f"Slot space must be an integer of at least {slots + exception.capacity} "
                             f"({slots} slots and {exception.capacity} overflow slots), not {space!r}")
        if not isinstance(jobs, int) or isinstance(jobs, bool) or not 1 <= jobs <= 1 << 10:
            raise ValueError(f"Job count must be an integer in 1..1024, not {jobs!r}")
        if not isinstance(frames, int) or isinstance(frames, bool) or not 1 <= frames <= 64:
            raise ValueError(f"Divert queue must hold an integer 1..64 frames, not {frames!r}")
        self._space, self.frames = space, frames
        self._job_bits = max(1, (jobs - 1).bit_length())
        self.engine = ExceptionEngine(exception.table, exception.max_kicks, exception.stash,
                                      key_width=KEY_INDEX_BITS + self._job_bits, depth=max(4, frames))
        sig = frame_signature(width, space)
        super().__init__({
            "taken": In(1), "beat": In(sig.members["payload"].shape), "collide": In(1), "room": Out(1),
            "o": Out(sig), "inserted": Out(1), "refused": Out(1), "stats": Out(stats_layout()),
            "idle": Out(1), "teardown": In(1), "teardown_job": In(QPN_JOB_BITS), "teardown_slots": In(17),
            "teardown_done": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.engine = exc = self.engine
        beats, desc_layout = self.beats, frame_desc_layout(self._space)
        # Block-RAM queues: a pushed entry reads two cycles later. A frame goes back only after its
        # first pass through the arbiter, whose last beat is written the cycle after; with at least
        # 4 beats a frame (256-byte chunks at 512 bits) each beat is readable before it is wanted.
        m.submodules.lanes = lanes = fifo.SyncFIFOBuffered(width=self._width, depth=self.frames * beats)
        m.submodules.descs = descs = fifo.SyncFIFOBuffered(width=desc_layout.size, depth=self.frames)

        # -- the beat the engine took last cycle, in step with its stage B --
        first = Signal(init=1)
        with m.If(self.taken):
            m.d.sync += first.eq(self.beat.last)
        b_valid, b_first, b_last = Signal(), Signal(), Signal()
        b_data = Signal(self._width)
        b_desc = Signal(desc_layout)
        m.d.sync += [b_valid.eq(self.taken), b_first.eq(first), b_last.eq(self.beat.last),
                     b_data.eq(self.beat.data), b_desc.eq(self.beat.desc)]
        diverts = b_valid & b_first & self.collide
        capturing = Signal()  # the later beats of a diverted frame
        with m.If(b_valid):
            m.d.sync += capturing.eq((diverts | (~b_first & capturing)) & ~b_last)
        index = (b_desc.chunk & (b_desc.slots - 1))[:KEY_INDEX_BITS]
        last_index = Signal(KEY_INDEX_BITS)  # all 22 bits: the job's bits go above them
        m.d.comb += last_index.eq(self.teardown_slots - 1)
        m.d.comb += [
            lanes.w_data.eq(b_data), lanes.w_en.eq(b_valid & (diverts | (~b_first & capturing))),
            descs.w_data.eq(b_desc), descs.w_en.eq(diverts),
            exc.req.valid.eq(diverts | self.teardown), exc.req.p.op.eq(Mux(self.teardown, Op.TEARDOWN, Op.LOCATE)),
            exc.req.p.key.eq(Mux(self.teardown, Cat(last_index, self.teardown_job[:self._job_bits]),
                                 Cat(index, b_desc.job[:self._job_bits]))),
        ]

        # -- frames held, from their first beat in the queue until their last leaves it --
        held = Signal(range(self.frames + 1))
        leaves = Signal()
        m.d.sync += held.eq(held + diverts - leaves)
        m.d.comb += [self.room.eq(held + (b_valid & b_first) < self.frames),
                     self.idle.eq((held == 0) & ~b_valid)]

        # -- the head frame: back to the engine at its overflow slot, or dropped when refused --
        k = Signal(range(beats))
        answer = exc.resp.p
        ready = exc.resp.valid & descs.r_rdy & lanes.r_rdy
        refuse = answer.status == Status.REFUSED
        head = data.View(desc_layout, descs.r_data)
        m.d.comb += [
            self.o.valid.eq(ready & ~refuse), self.o.p.data.eq(lanes.r_data), self.o.p.last.eq(k == beats - 1),
            self.o.p.desc.eq(head), self.o.p.desc.slot.eq(self._slots + answer.ptr),
        ]
        step = (self.o.valid & self.o.ready) | (ready & refuse)
        with m.If(step):
            m.d.sync += k.eq(k + 1)  # beats is a power of two: k wraps at the frame's end
        # A teardown's DONE comes when no frame is held, so it is never a frame's answer.
        done = exc.resp.valid & (answer.status == Status.DONE)
        m.d.comb += [
            leaves.eq(step & (k == beats - 1)), lanes.r_en.eq(step), descs.r_en.eq(leaves),
            exc.resp.ready.eq(leaves | done), self.teardown_done.eq(done),
            self.inserted.eq(leaves & (answer.status == Status.INSERTED)), self.refused.eq(leaves & refuse),
            self.stats.eq(exc.stats),
        ]
        return m
