"""Job teardown in the switch (the ``TEARDOWN`` register) against ``ModelSwitch.remove_job``, in the Amaranth
simulator: frames, counters, the exception engine's table, stash and free list, and every slot's metadata."""

import dataclasses
import itertools

import numpy as np
import pytest
from amaranth.sim import Simulator

from inagg.hdl.exception import STATS
from inagg.hdl.switch import Switch
from inagg.models.cuckoo import make_key
from inagg.models import regmap as rm
from inagg.models.job import ExceptionSpec, Mode, SwitchSpec
from inagg.models.protocol import Counter
from inagg.models.switch import ModelSwitch, SlotState
from inagg.testbench.amaranth_switch import tear_down
from inagg.testbench.axil_sim import axil_read, axil_write
from inagg.testbench.collisions import model_state
from inagg.testbench.exception.state import decode
from inagg.testbench.replay import DIVERTED, GONE, AddJob, RemoveJob, replay
from inagg.testbench.streams import get_frame, put_frame
from inagg.testbench.traffic import contribution, lanes, make_job, rc_contribution

CHUNK, WIDTH, JOBS, WORKERS = 256, 512, 4, 2
_SLVERR = 0b10


def _run(spec, jobs, script, *, pause=None):
    """Install ``jobs``, then run ``script``: ``("send", traffic, wait)`` (then, with ``wait``, until the switch
    is quiet), ``("teardown", job)`` (write TEARDOWN, poll until not busy), ``("add", job_spec)``. Returns what
    each step saw, the RTL's and the model's frames, counters, exception state and slot metadata."""
    exc = spec.exception
    dut = Switch(ports=spec.ports, width=WIDTH, slots=spec.slots, chunk_bytes=CHUNK, jobs=JOBS, workers=WORKERS,
                 **({} if exc is None else dict(exc_table=exc.table, exc_max_kicks=exc.max_kicks,
                                                exc_stash=exc.stash)))
    regmap = rm.RegMap(JOBS, WORKERS)
    model = ModelSwitch(spec)
    for job in jobs:
        model.add_job(job)
    queues = {p: [] for p in range(spec.ports)}
    sent = {p: [] for p in range(spec.ports)}
    received = {p: [] for p in range(spec.ports)}
    order, steps, pending, seen, done = [], [], [0], [0], []
    out = {}

    async def quiet(ctx, cycles=200):
        limit = 20_000
        while pending[0]:
            await ctx.tick()
            limit -= 1
            assert limit, f"{pending[0]} frames were never taken"
        mark = seen[0]
        idle = 0
        while idle < cycles:
            await ctx.tick()
            idle = 0 if any(ctx.get(m.valid) for m in dut.m) or seen[0] != mark else idle + 1
            mark = seen[0]
            limit -= 1
            assert limit, "the switch never went quiet"

    async def control(ctx):
        for addr, value in regmap.switch_writes(spec) + [w for j in jobs for w in regmap.job_writes(j, spec)]:
            assert await axil_write(ctx, dut.axil, addr, value) == 0
        for step in script:
            if step[0] == "send":
                for port, frame in step[1]:
                    queues[port].append(frame)
                    sent[port].append(frame)
                    pending[0] += 1
                if step[2]:
                    await quiet(ctx)
            elif step[0] == "teardown":
                steps.append(await tear_down(ctx, dut.axil, step[1]))
            else:
                for addr, value in regmap.job_writes(step[1], spec):
                    assert await axil_write(ctx, dut.axil, addr, value) == 0
                order.append(AddJob(step[1]))
        await quiet(ctx)
        out["counters"] = {c: (await axil_read(ctx, dut.axil, regmap.counter(c)))[0] for c in Counter}
        meta = dut.engine.slot_meta
        out["meta"] = [ctx.get(meta.data[i]) for i in range(dut.space)]
        if dut.divert is not None:
            e = dut.divert.engine
            tables = tuple([ctx.get(mem.data[i]).as_bits() for i in range(e.table)] for mem in e.tables)
            count = ctx.get(e.stash_count) if e.stash else 0
            out["exception"] = decode(e, tables, [ctx.get(e.free_list.data[i]) for i in range(e.capacity)],
                                      ctx.get(e.free_first), ctx.get(e.free_count),
                                      [(ctx.get(e.stash_keys[i]), ctx.get(e.stash_ptrs[i])) for i in range(count)],
                                      {name: ctx.get(getattr(e.stats, name)) for name in STATS})
        done.append(True)

    def sender(p):
        async def run(ctx):
            while True:
                while not queues[p]:
                    await ctx.tick()
                await put_frame(ctx, dut.s[p], queues[p].pop(0), WIDTH)
                pending[0] -= 1
        return run

    def receiver(p):
        async def run(ctx):
            while True:
                received[p].append(await get_frame(ctx, dut.m[p], WIDTH, pause(p) if pause else None))
        return run

    async def watch(ctx):
        async for _, _, valid, port, diverted, gone, refused, torn, job in ctx.tick().sample(
                dut.order.valid, dut.order.p.port, dut.order.p.diverted, dut.order.p.gone, dut.refused, dut.torn,
                dut.control.teardown.job):
            if valid:
                order.append(port | (DIVERTED if diverted else 0) | (GONE if gone else 0))
                seen[0] += 1
            if refused:
                order.append(spec.ports)
                seen[0] += 1
            if torn:
                order.append(RemoveJob(job))

    sim = Simulator(dut)
    sim.add_clock(4e-9)
    sim.add_testbench(control)
    for p in range(spec.ports):
        sim.add_testbench(sender(p), background=True)
        sim.add_testbench(receiver(p), background=True)
    sim.add_process(watch)
    sim.run()
    expected = replay(model, sent, order)
    for p, want in expected.items():
        assert received[p] == want, f"port {p}: frames differ from the model's"
    diff = {c.name: (out["counters"][c], model.counters[c]) for c in Counter if out["counters"][c] != model.counters[c]}
    assert not diff, f"counters differ (rtl, model): {diff}"
    slots = model.fast + model.overflow
    # A Mode II job's slots are its own entries in the model (models/modes.py), not the fast slots.
    translated = {job.slot_base + k: e for job in (j.spec for j in model.jobs.values()) if job.mode is Mode.TRANSLATED
                  for k, e in enumerate(model.modes[job.job].entries)}
    for i, (got, want) in enumerate(zip(out["meta"], slots)):
        if i in translated:
            e = translated[i]
            assert (got.state == SlotState.DONE, got.psn, got.chunk, got.bitmap, got.count) == \
                (e.done, e.psn, e.chunk, e.bitmap, e.count), f"slot {i}"
            continue
        assert (got.state, got.job, got.chunk, got.bitmap, got.count) == \
            (want.state, want.job, want.chunk, want.bitmap, want.count), f"slot {i}"
    if "exception" in out:
        assert out["exception"].diff(model_state(model)) == "", out["exception"].diff(model_state(model))
    return steps, order, model, out


def _chunks(spec, job, chunks, rng, workers=None):
    return [(job.workers[w].port, contribution(spec, job, w, c, lanes(rng, spec)))
            for c in chunks for w in (range(len(job.workers)) if workers is None else workers)]


def _jobs(spec):
    # A holds slots 0..7; B's region 0..15 collides with A's on indices 0..7 and B holds 8..15;
    # C's region is A's slots 0..3; D comes later on B's slots 8..15.
    return [make_job(spec, 0, WORKERS, 0, 8), make_job(spec, 1, WORKERS, 0, 16), make_job(spec, 2, WORKERS, 0, 4),
            make_job(spec, 3, WORKERS, 8, 8)]


def test_a_refused_contribution_is_recovered_after_a_teardown_and_the_slots_are_reused():
    """The table and stash fill with B's and C's keys and C is refused; B is torn down with partial sums in its
    fast slots; C's retransmissions go into B's freed overflow slots, every chunk complete exactly once; a new
    job D aggregates in B's cleared fast slots."""
    spec = SwitchSpec(ports=2, slots=16, chunk_bytes=CHUNK, exception=ExceptionSpec(2, 0, 1))
    a, b, c, d = _jobs(spec)
    rng = np.random.default_rng(5)
    claim = _chunks(spec, a, range(8), rng) + _chunks(spec, b, range(8, 16), rng, workers=[0])
    guests = _chunks(spec, b, range(4), rng) + _chunks(spec, c, range(4), rng)
    resent = guests[8:]  # all of C: the placed ones are duplicates, the refused ones now find room
    steps, order, model, out = _run(spec, [a, b, c], [
        ("send", claim, True), ("send", guests, True), ("teardown", 1), ("send", resent, True),
        ("add", d), ("send", _chunks(spec, d, range(8), rng), True)])
    assert steps == [(0, 0)]  # accepted, done, not refused
    assert [e for e in order if isinstance(e, RemoveJob)] == [RemoveJob(1)]
    assert out["counters"][Counter.EXC_REFUSED] > 0
    # Every key of C has its overflow slot now, each chunk complete; D's chunks are in B's old fast slots.
    ptrs = [model.exception.lookup(make_key(2, i)) for i in range(4)]
    assert None not in ptrs and all(model.overflow[p].state == SlotState.DONE for p in ptrs)
    assert model.exception.stats.deletes > 0
    assert all(s.state == SlotState.DONE and s.job == 3 for s in model.fast[8:16])


def test_teardown_of_a_job_that_does_not_exist_or_hosts_other_keys():
    """SLVERR for a job number past the table and for one not enabled; a job whose slots other jobs' keys
    diverted from is not torn down (TEARDOWN reads refused) and keeps aggregating."""
    spec = SwitchSpec(ports=2, slots=16, chunk_bytes=CHUNK, exception=ExceptionSpec(4, 4, 2))
    a, b, c, d = _jobs(spec)
    rng = np.random.default_rng(6)
    steps, order, model, out = _run(spec, [a, c], [
        ("send", _chunks(spec, a, range(8), rng) + _chunks(spec, c, range(2), rng), True),
        ("teardown", 9), ("teardown", 3), ("teardown", 0),
        ("send", _chunks(spec, a, range(8, 12), rng), True)])
    assert steps == [(_SLVERR, 0), (_SLVERR, 0), (0, rm.TEARDOWN_REFUSED)]
    assert not any(isinstance(e, RemoveJob) for e in order)
    assert out["counters"][Counter.COMPLETED] == 14


@pytest.mark.parametrize("exception", [None, ExceptionSpec(4, 4, 2)])
def test_frames_of_a_job_torn_down_while_they_travel_are_dropped_as_the_model_drops_them(exception):
    """B's frames keep coming while B is torn down: those already past their port's checks reach the engine
    after the teardown and are dropped as DROP_UNKNOWN_QPN, later ones at the port; A's frames are not lost."""
    spec = SwitchSpec(ports=2, slots=16, chunk_bytes=CHUNK, exception=exception)
    a = make_job(spec, 0, WORKERS, 0, 4)
    b = make_job(spec, 1, WORKERS, 8, 8)
    rng = np.random.default_rng(7)
    burst = _chunks(spec, b, range(8, 16), rng) + _chunks(spec, a, range(4), rng)
    steps, order, model, out = _run(spec, [a, b], [
        ("send", _chunks(spec, b, range(8), rng), True), ("send", burst, False), ("teardown", 1)],
        pause=lambda p: itertools.chain(itertools.repeat(1, 60), itertools.repeat(0)))
    assert steps == [(0, 0)]
    assert any(isinstance(e, int) and e & GONE for e in order), "no frame was past its checks at the teardown"
    assert out["counters"][Counter.DROP_UNKNOWN_QPN] > 0
    assert out["counters"][Counter.COMPLETED] == 8 + 4


def test_a_mode_ii_job_set_up_again_starts_from_psn_0_in_empty_slots():
    """A Mode II job is torn down with a partial sum in a slot and every worker's expected PSN past 0; set up
    again, its workers' PSNs start at 0 (the engine's PSN table cleared) in slots the sweep freed."""
    spec = SwitchSpec(ports=2, slots=16, chunk_bytes=CHUNK)
    uc = make_job(spec, 0, WORKERS, 0, 4)
    ii = dataclasses.replace(make_job(spec, 1, WORKERS, 8, 4), mode=Mode.TRANSLATED)
    rng = np.random.default_rng(8)

    def psns(psns, workers=range(WORKERS)):
        return [(ii.workers[w].port, rc_contribution(spec, ii, w, p, p, lanes(rng, spec))) for p in psns for w in workers]

    steps, order, model, out = _run(spec, [uc, ii], [
        ("send", psns(range(3)) + psns([3], [0]) + _chunks(spec, uc, range(2), rng), True), ("teardown", 1),
        ("add", ii), ("send", psns(range(2)), True)])
    assert steps == [(0, 0)] and [e for e in order if isinstance(e, RemoveJob)] == [RemoveJob(1)]
    assert out["counters"][Counter.COMPLETED] == 3 + 2 + 2
    assert out["counters"][Counter.DROP_PSN_AHEAD] == out["counters"][Counter.DUP_CONTRIB] == 0
