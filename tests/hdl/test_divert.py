"""The exception path's divert block in the Amaranth simulator, against the model switch's exception path.

A small arbiter in the testbench plays the slot engine: it takes one beat per
cycle, a frame sent back first, a new frame only while ``room`` is high, and
raises ``collide`` the cycle after the first beat of a frame that collides.
"""

import gc
import warnings
from collections import deque

import numpy as np
import pytest
from amaranth.hdl import UnusedElaboratable
from amaranth.sim import Simulator

from inagg.hdl.divert import Divert
from inagg.hdl.exception import STATS, Op, Status
from inagg.models.cuckoo import make_key
from inagg.models.job import ExceptionSpec
from inagg.testbench.exception.reference import Reference
from inagg.testbench.exception.state import decode

SLOTS, SPACE, CHUNK, JOBS, REGION = 16, 64, 256, 4, 8


def _frames(rng, n, width, collide_share):
    beats = CHUNK * 8 // width
    out = []
    for _ in range(n):
        desc = dict(job=int(rng.integers(JOBS)), worker=int(rng.integers(8)), chunk=int(rng.integers(1 << 32)),
                    slot=int(rng.integers(SLOTS)), workers=8, slots=REGION)
        data = [int.from_bytes(rng.bytes(width // 8), "little") for _ in range(beats)]
        out.append((desc, data, bool(rng.random() < collide_share)))
    return out


def _run(width, frames, exception, *, queue=4, o_pause=lambda n: False, limit=4000):
    dut = Divert(width=width, chunk_bytes=CHUNK, slots=SLOTS, space=SPACE, jobs=JOBS, exception=exception,
                 frames=queue)
    back, strobes, result = [], {"inserted": 0, "refused": 0}, {"room_low": 0}

    async def engine(ctx):
        todo = deque(frames)
        cur, beat, collide_next, n, idle = None, 0, False, 0, 0
        while n < limit and idle < 200:  # the longest answer (a failed chain) takes far fewer cycles
            ctx.set(dut.collide, collide_next)
            collide_next = False
            ctx.set(dut.o.ready, 0)
            ctx.set(dut.taken, 0)
            result["room_low"] += not ctx.get(dut.room)
            if cur is None:
                if ctx.get(dut.o.valid) and not o_pause(n):
                    cur, beat = "back", 0
                elif todo and ctx.get(dut.room):
                    cur, beat = todo.popleft(), 0
            if cur == "back":
                ctx.set(dut.o.ready, 1)
                ctx.set(dut.taken, 1)
                ctx.set(dut.beat, ctx.get(dut.o.p))
                if beat == 0:
                    desc = ctx.get(dut.o.p.desc)
                    back.append(({k: int(getattr(desc, k)) for k in ("job", "worker", "chunk", "slot", "workers",
                                                                      "slots")}, []))
                back[-1][1].append(ctx.get(dut.o.p.data))
                assert ctx.get(dut.o.valid), "a frame on its way back has no gap"
                beat += 1
                if ctx.get(dut.o.p.last):
                    cur = None
            elif cur is not None:
                desc, data, collides = cur
                ctx.set(dut.taken, 1)
                ctx.set(dut.beat.data, data[beat])
                ctx.set(dut.beat.last, beat == len(data) - 1)
                for k, v in desc.items():
                    ctx.set(getattr(dut.beat.desc, k), v)
                collide_next = collides and beat == 0
                beat += 1
                if beat == len(data):
                    cur = None
            strobes["inserted"] += ctx.get(dut.inserted)
            strobes["refused"] += ctx.get(dut.refused)
            idle = idle + 1 if cur is None and not todo and not ctx.get(dut.o.valid) else 0
            await ctx.tick()
            n += 1
        ctx.set(dut.taken, 0)
        await ctx.tick()
        exc = dut.engine
        tables = tuple([ctx.get(mem.data[i]).as_bits() for i in range(exc.table)] for mem in exc.tables)
        free_list = [ctx.get(exc.free_list.data[i]) for i in range(exc.capacity)]
        count = ctx.get(exc.stash_count) if exc.stash else 0
        stash = [(ctx.get(exc.stash_keys[i]), ctx.get(exc.stash_ptrs[i])) for i in range(count)]
        stats = {name: ctx.get(getattr(dut.stats, name)) for name in STATS}
        result["state"] = decode(exc, tables, free_list, ctx.get(exc.free_first), ctx.get(exc.free_count), stash, stats)
        result["stalls"] = stats["stalls"]
        result["room"] = ctx.get(dut.room)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(engine)
    sim.run()
    return back, strobes, result


def _expect(frames, exception):
    ref = Reference(exception.table, exception.max_kicks, exception.stash, JOBS, REGION)
    back, refused, inserted = [], 0, 0
    for desc, data, collides in frames:
        if not collides:
            continue
        status, ptr = ref.request(Op.LOCATE, make_key(desc["job"], desc["chunk"] % REGION))
        if status == Status.REFUSED:
            refused += 1
            continue
        inserted += status == Status.INSERTED
        back.append(({**desc, "slot": SLOTS + ptr}, data))
    return back, {"inserted": inserted, "refused": refused}, ref.state()


@pytest.mark.parametrize("width, exception, queue", [
    (64, ExceptionSpec(4, 4, 2), 4),
    (512, ExceptionSpec(4, 4, 2), 2),
    (512, ExceptionSpec(4, 16, 0), 1),
])
def test_diverted_frames_come_back_at_their_overflow_slot(width, exception, queue):
    """Half the frames collide: each comes back whole, in order, at slot ``slots + ptr`` of the model's pointer;
    refused ones are dropped and counted; the table ends as the model's."""
    frames = _frames(np.random.default_rng(width + queue), 40 if width > 64 else 20, width, 0.5)
    back, strobes, result = _run(width, frames, exception, queue=queue)
    want_back, want_strobes, want_state = _expect(frames, exception)
    assert want_strobes["refused"] and want_strobes["inserted"]  # the case covers both
    assert back == want_back
    assert strobes == want_strobes
    assert result["state"].diff(want_state) == ""
    assert result["stalls"] == 0, "the engine's request queue always has room"
    assert result["room"] == 1


def test_a_full_queue_holds_new_frames_until_one_went_back():
    """One frame of room, every frame collides, and the way back is slow: nothing is lost, nothing deadlocks."""
    exception = ExceptionSpec(8, 4, 2)
    frames = _frames(np.random.default_rng(5), 12, 512, 1.0)
    back, strobes, result = _run(512, frames, exception, queue=1, o_pause=lambda n: n % 7 < 5)
    want_back, want_strobes, want_state = _expect(frames, exception)
    assert result["room_low"] > 0
    assert back == want_back and strobes == want_strobes
    assert result["state"].diff(want_state) == ""


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(exception=None), TypeError, r"^Exception path must be an ExceptionSpec, not None$"),
    (dict(space=20), ValueError, r"^Slot space must be an integer of at least 26 \(16 slots and 10 overflow slots\), "
                                 r"not 20$"),
    (dict(jobs=0), ValueError, r"^Job count must be an integer in 1\.\.1024, not 0$"),
    (dict(frames=65), ValueError, r"^Divert queue must hold an integer 1\.\.64 frames, not 65$"),
    (dict(width=32), ValueError, r"^Data width must be one of \(64, 256, 512\), not 32$"),
])
def test_parameters_are_checked(kwargs, error, message):
    params = dict(width=64, chunk_bytes=CHUNK, slots=SLOTS, space=SPACE, jobs=JOBS, exception=ExceptionSpec(4, 4, 2))
    params.update(kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(error, match=message) as refused:
            Divert(**params)
        del refused
        gc.collect()
