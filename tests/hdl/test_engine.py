"""The slot engine alone (Amaranth simulator): when a frame may start, and what its results carry."""

import gc
import warnings

import numpy as np
import pytest
from amaranth.hdl import UnusedElaboratable
from amaranth.sim import Simulator

from inagg.hdl.engine import SlotEngine
from inagg.models import arith
from inagg.models.protocol import Counter
from inagg.testbench.promotion import adversarial

WIDTH, CHUNK, SLOTS = 512, 256, 4


def _beats(values, width):
    """A contribution's lanes (int32) as the engine's input beats: wire order, byte 0 in the low bits."""
    raw = np.asarray(values, ">i4").tobytes()
    nb = width // 8
    return [int.from_bytes(raw[o:o + nb], "little") for o in range(0, len(raw), nb)]


def _run(frames, width=WIDTH, watch_events=None, **latencies):
    """Feed ``frames`` (slot, worker, workers, int32 lanes[, job]) back to back; return the engine, the cycle
    of each frame's first beat, and the result beats (data, fp, promoted, last) per result.

    With a list ``watch_events``, append to it ``(cycle, counter)`` for every strobe of ``events`` and
    ``(cycle, "passing")`` for every cycle in which ``passing`` shows a frame's first beat."""
    dut = SlotEngine(width, CHUNK, SLOTS, 64, **latencies)
    starts, results = [], []

    async def feed(ctx):
        ctx.set(dut.can_start, 1)
        for slot, worker, workers, values, *job in frames:
            ctx.set(dut.i.p.desc.job, job[0] if job else 0)
            ctx.set(dut.i.p.desc.slot, slot)
            ctx.set(dut.i.p.desc.worker, worker)
            ctx.set(dut.i.p.desc.workers, workers)
            ctx.set(dut.i.p.desc.slots, SLOTS)
            beats = _beats(values, width)
            for n, beat in enumerate(beats):
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.p.data, beat)
                ctx.set(dut.i.p.last, n == len(beats) - 1)
                await ctx.tick().until(dut.i.ready)
            ctx.set(dut.i.valid, 0)
        await ctx.tick().repeat(dut.lag + 4)

    async def watch(ctx):
        cycle, first, passing_first = 0, True, True
        async for _, _, valid, ready, last, o_valid, data, fp, promoted, o_last, p_valid, p_last, events in \
                ctx.tick().sample(dut.i.valid, dut.i.ready, dut.i.p.last, dut.o.valid, dut.o.p.data, dut.o.p.fp,
                                  dut.o.p.promoted, dut.o.p.last, dut.passing_valid, dut.passing.last, dut.events):
            if valid and ready:
                if first:
                    starts.append(cycle)
                first = bool(last)
            if watch_events is not None:
                watch_events.extend((cycle, c) for i, c in enumerate(Counter) if events >> i & 1)
                if p_valid:
                    if passing_first:
                        watch_events.append((cycle, "passing"))
                    passing_first = bool(p_last)
            if o_valid:
                if not results or results[-1][-1][3]:
                    results.append([])
                results[-1].append((data, fp, promoted, o_last))
            cycle += 1

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(feed)
    sim.add_process(watch)
    sim.run()
    return dut, starts, results


def _lanes(result, dtype, width=WIDTH):
    nb = width // 8
    return [np.frombuffer(b"".join(beat[k].to_bytes(nb, "little") for beat in result), dtype) for k in (0, 1)]


def test_frames_to_one_slot_wait_for_the_write():
    """With lag 6 and 4 beats a frame, a frame to the slot of the one before waits until its words are written."""
    rng = np.random.default_rng(1)
    lanes = CHUNK // 4
    slots = [0, 0, 1, 0, 1, 1, 2, 3, 0]
    frames = [(s, n, 64, adversarial(rng, 1, lanes)[0]) for n, s in enumerate(slots)]
    dut, starts, _ = _run(frames, convert_latency=2, add_latency=3)
    beats, lag = dut.beats, dut.lag
    assert (beats, lag) == (4, 6)
    want, ends = [], {}
    for s, *_ in frames:
        t = want[-1] + beats if want else starts[0]
        if s in ends:
            t = max(t, ends[s] + lag - beats + 2)  # after the earlier frame's last beat
        want.append(t)
        ends[s] = t + beats - 1
    assert starts == want
    assert starts[1] - starts[0] == lag + 1 and starts[2] - starts[1] == beats


def test_frames_longer_than_the_pipeline_never_wait_on_one_slot():
    """At the default lag of 4, frames of 8 beats to one slot follow back to back."""
    rng = np.random.default_rng(3)
    frames = [(0, w, 64, adversarial(rng, 1, CHUNK // 4)[0]) for w in range(6)]
    dut, starts, _ = _run(frames, width=256)
    assert dut.lag == 4 and dut.beats == 8
    assert np.all(np.diff(starts) == dut.beats)


@pytest.mark.parametrize("latencies", [dict(), dict(convert_latency=1, add_latency=1),
                                       dict(convert_latency=4, add_latency=6)])
def test_result_lanes_follow_the_model(latencies):
    """Promoted and INT32 results: the slot's words, every lane as binary32, and the promotion flag."""
    rng = np.random.default_rng(2)
    lanes = CHUNK // 4
    n = 4
    chunks = [adversarial(rng, n, lanes), adversarial(rng, n, lanes, ("small",))]
    frames = [(c, w, n, chunks[c][w]) for w in range(n) for c in range(2)]
    frames.append((0, 1, n, chunks[0][1]))  # a duplicate in a done slot: the result again
    dut, starts, results = _run(frames, **latencies)
    assert dut.lag == 1 + latencies.get("convert_latency", 1) + latencies.get("add_latency", 2)
    assert len(results) == 3
    for result, c in zip(results, (0, 1, 0)):
        state = arith.LaneState(lanes)
        for w in range(n):
            arith.accumulate(state, chunks[c][w], first=(w == 0))
        promoted = bool(state.promoted.any())
        assert [beat[2] for beat in result][-1] == promoted
        words, fp = _lanes(result, ">u4")
        assert np.array_equal(words, state.words)
        assert np.array_equal(fp.view(">f4"), np.where(state.promoted, state.words.view(np.float32),
                                                        state.words.view(np.int32).astype(np.float32)))
        assert promoted == (c == 0)
    # A result frame waits until the one before it reached the emitters.
    assert starts[7] - starts[6] >= dut.lag + 2


@pytest.mark.parametrize("kwargs, message", [
    (dict(convert_latency=0), r"^Conversion latency must be an integer from 1 to 4, not 0$"),
    (dict(convert_latency=5), r"^Conversion latency must be an integer from 1 to 4, not 5$"),
    (dict(add_latency=7), r"^Adder latency must be an integer from 1 to 6, not 7$"),
    (dict(add_latency=True), r"^Adder latency must be an integer from 1 to 6, not True$"),
    (dict(workers=0), r"^Workers per job must be an integer in 1\.\.64, not 0$"),
])
def test_parameters_are_checked(kwargs, message):
    params = dict(width=64, chunk_bytes=CHUNK, slots=SLOTS, workers=8)
    params.update(kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(ValueError, match=message) as refused:
            SlotEngine(**params)
        del refused
        gc.collect()



def test_strobes_come_strobe_lag_cycles_after_the_first_beat():
    """A frame's slot-rule strobes come ``strobe_lag`` cycles after its first beat is taken, one cycle after
    ``passing`` shows that beat: the step Divert and the switch's order rely on."""
    values = np.arange(CHUNK // 4)
    seen = []
    dut, starts, _ = _run([(0, 0, 2, values, 1), (0, 0, 2, values, 2)], watch_events=seen)
    assert dut.strobe_lag == 3
    # The second frame finds its slot held by the first's job.
    assert seen == [(starts[0] + 2, "passing"), (starts[0] + 3, Counter.RX_CONTRIB),
                    (starts[1] + 2, "passing"), (starts[1] + 3, Counter.DROP_COLLISION)]
