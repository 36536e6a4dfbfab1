"""The switch in the Amaranth simulator, compared with the model the same way the cocotb testbench does.

Slower per cycle than Verilator but with no build step, so the block tests
(``tests/hdl``) run whole scenarios at widths that have no Verilated build.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from amaranth.sim import Simulator

from inagg.hdl.exception import STATS
from inagg.hdl.switch import Switch
from inagg.models.geometry import SwitchGeometry
from inagg.models.job import JobSpec, SwitchSpec
from inagg.models.protocol import Counter
from inagg.models.switch import ModelSwitch
from inagg.testbench.axil_sim import axil_read, axil_write
from inagg.testbench.collisions import model_state
from inagg.testbench.exception.reference import State
from inagg.testbench.exception.state import decode
from inagg.models import regmap as rm
from inagg.testbench.replay import (DIVERTED, GONE, RESENT, SKIPPED, AckTaken, RemoveJob, TimerRanOut,
                                    assert_frames_match, replay)
from inagg.testbench.streams import get_frame, put_frame

__all__ = ["SimRun", "simulate", "tear_down", "cycle"]


@dataclass
class SimRun:
    """What one simulation saw and what the model says about it."""

    received: dict[int, list[bytes]]
    expected: dict[int, list[bytes]]
    counters: dict[Counter, int]
    model_counters: dict[Counter, int]
    order: list = field(default_factory=list)
    stalls: dict[int, int] = field(default_factory=dict)
    """Per port, the cycles in which its ingress held back a beat it was offered."""
    exception: State | None = None
    model_exception: State | None = None

    def assert_matches(self) -> None:
        """Every port's frames the model's (:func:`~inagg.testbench.replay.assert_frames_match`), and every
        counter the model's."""
        assert_frames_match(self.received, self.expected)
        diff = {c.name: (self.counters[c], self.model_counters[c]) for c in Counter
                if self.counters[c] != self.model_counters[c]}
        assert not diff, f"counters differ (rtl, model): {diff}"
        if self.exception is not None:
            assert self.exception.diff(self.model_exception) == "", self.exception.diff(self.model_exception)


def simulate(spec: SwitchSpec, jobs: list[JobSpec], traffic: list[tuple[int, bytes]], *, width: int,
             n_jobs: int = 4, workers: int = 8, gaps=None, pause=None, cycles: int = 400,
             divert_frames: int = 4, augmented: bool = False, hop_timeout: int | None = None,
             teardown: tuple[int, int] | None = None) -> SimRun:
    """Configure a :class:`Switch` for ``spec`` and ``jobs``, send ``traffic`` ((port, frame), sent in
    order per port, ports concurrently), and compare with :class:`ModelSwitch`.

    ``divert_frames`` sizes the exception path's queue (``spec.exception``);
    ``augmented`` builds the switch with Mode III, ``hop_timeout`` its ``HOP_TIMEOUT`` (cycles; None: as reset),
    written 0 once every frame went in so that the run can go quiet (a child that never ACKs would
    otherwise get its results again for good).
    ``teardown`` (job, cycles): that many cycles after the configuration, with the traffic running, the job
    is torn down (``TEARDOWN``) and the model's ``remove_job`` replayed where the switch's took effect.
    ``gaps`` and ``pause`` are functions of the port returning iterators of 0/1
    (idle cycles on ingress, ready low on egress). The run ends when every
    frame went in and no port offered a beat for ``cycles`` cycles.
    """
    geometry = SwitchGeometry.for_spec(spec, width=width, jobs=n_jobs, workers=workers, augmented=augmented)
    dut = Switch(geometry, divert_frames=divert_frames)
    regmap = geometry.regmap
    model = ModelSwitch(spec)
    for job in jobs:
        model.add_job(job)
    sent = {p: [f for q, f in traffic if q == p] for p in range(spec.ports)}
    received: dict[int, list[bytes]] = {p: [] for p in range(spec.ports)}
    order: list = []
    counters: dict[Counter, int] = {}
    configured = []
    finished = []
    exception: list[State] = []

    async def control(ctx):
        timer = [] if hop_timeout is None else [(regmap.switch("HOP_TIMEOUT"), hop_timeout)]
        for addr, value in regmap.switch_writes(spec) + timer + [w for j in jobs for w in regmap.job_writes(j, spec)]:
            assert await axil_write(ctx, dut.axil, addr, value) == 0, f"write to 0x{addr:x} refused"
        configured.append(True)
        if teardown is not None:
            await ctx.tick().repeat(teardown[1])
            assert (await tear_down(ctx, dut.axil, teardown[0]))[0] == 0
        while len(finished) < spec.ports:
            await ctx.tick()
        if hop_timeout is not None:
            assert await axil_write(ctx, dut.axil, regmap.switch("HOP_TIMEOUT"), 0) == 0
        quiet = 0
        while quiet < cycles:  # until no port has offered a beat for a while
            await ctx.tick()
            quiet = 0 if any(ctx.get(m.valid) for m in dut.m) else quiet + 1
        for c in Counter:
            counters[c], resp = await axil_read(ctx, dut.axil, regmap.counter(c))
            assert resp == 0
        if dut.divert is not None:
            exc = dut.divert.engine
            tables = tuple([ctx.get(mem.data[i]).as_bits() for i in range(exc.table)] for mem in exc.tables)
            free_list = [ctx.get(exc.free_list.data[i]) for i in range(exc.capacity)]
            count = ctx.get(exc.stash_count) if exc.stash else 0
            stash = [(ctx.get(exc.stash_keys[i]), ctx.get(exc.stash_ptrs[i])) for i in range(count)]
            stats = {name: ctx.get(getattr(exc.stats, name)) for name in STATS}
            exception.append(decode(exc, tables, free_list, ctx.get(exc.free_first), ctx.get(exc.free_count),
                                    stash, stats))

    def sender(p):
        async def run(ctx):
            while not configured:
                await ctx.tick()
            g = gaps(p) if gaps else None
            for frame in sent[p]:
                await put_frame(ctx, dut.s[p], frame, width, g)
            finished.append(p)
        return run

    def receiver(p):
        async def run(ctx):
            ps = pause(p) if pause else None
            while True:
                received[p].append(await get_frame(ctx, dut.m[p], width, ps))
        return run

    stalls = {p: 0 for p in range(spec.ports)}

    resend_port = spec.ports + (dut.divert is not None)
    hop = [dut.hop.valid, dut.hop.p] if augmented else [0, 0]

    async def watch(ctx):
        async for _, _, valid, port, diverted, gone, refused, torn, torn_job, hop_valid, h, *offered in \
                ctx.tick().sample(dut.order.valid, dut.order.p.port, dut.order.p.diverted, dut.order.p.gone,
                                  dut.refused, dut.torn, dut.control.teardown.job, *hop,
                                  *[s.valid & ~s.ready for s in dut.s]):
            if hop_valid:  # before the contribution of the same cycle
                order.append(AckTaken(h.port, bool(h.gone)) if h.ack else TimerRanOut(h.job, h.worker))
            if valid and augmented and port == resend_port:
                order.append(SKIPPED if gone else RESENT)
            elif valid:
                order.append(port | (DIVERTED if diverted else 0) | (GONE if gone else 0))
            if refused:
                order.append(spec.ports)
            if torn:
                order.append(RemoveJob(torn_job))
            for p, held in enumerate(offered):
                stalls[p] += held

    sim = Simulator(dut)
    sim.add_clock(4e-9)
    sim.add_testbench(control)
    for p in range(spec.ports):
        sim.add_testbench(sender(p))
        sim.add_testbench(receiver(p), background=True)
    sim.add_process(watch)
    sim.run()
    expected = replay(model, sent, order)
    return SimRun(received, expected, counters, {c: model.counters[c] for c in Counter}, order, stalls,
                  exception[0] if exception else None, model_state(model) if exception else None)


async def tear_down(ctx, bus, job: int) -> tuple[int, int]:
    """Write ``job`` to ``TEARDOWN`` on the AXI4-Lite ``bus`` and read it until it is not busy; returns the
    write's response and the last word read. Fails after 5,000 reads."""
    resp = await axil_write(ctx, bus, rm.RegMap.switch("TEARDOWN"), job)
    for _ in range(5_000):
        status, _ = await axil_read(ctx, bus, rm.RegMap.switch("TEARDOWN"))
        if not status & rm.TEARDOWN_BUSY:
            return resp, status
    raise AssertionError("the teardown never finished")


def cycle(pattern):
    """An endless 0/1 iterator repeating ``pattern`` (for ``gaps`` and ``pause``)."""
    return itertools.cycle(pattern)
