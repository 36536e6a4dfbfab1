"""The switch with its exception path in the Amaranth simulator: collisions against the model switch."""

import gc
import warnings

import numpy as np
import pytest
from amaranth.hdl import UnusedElaboratable
from amaranth.sim import Simulator

from inagg.hdl.control import Control
from inagg.hdl.exception import STATS
from inagg.hdl.switch import Switch, SwitchTop
from inagg.models import regmap as rm
from inagg.models.geometry import SwitchGeometry
from inagg.models.job import ExceptionSpec, SwitchSpec
from inagg.models.protocol import Counter
from inagg.models.switch import ModelSwitch
from inagg.testbench.amaranth_switch import cycle, simulate
from inagg.testbench.axil_sim import axil_read
from inagg.testbench.collisions import claim, collision_jobs, mixed
from inagg.testbench.replay import DIVERTED, replay
from inagg.testbench.traffic import contribution, lanes

CHUNK = 256


def test_collisions_aggregate_in_overflow_slots_or_are_refused():
    """A guest job on a host's region: two of its keys get overflow slots (one with a resend), the third finds
    both its positions taken (no kicks, no stash) and is refused, again when retransmitted."""
    spec = SwitchSpec(ports=2, slots=16, chunk_bytes=CHUNK, exception=ExceptionSpec(2, 0, 0))
    host, guest = collision_jobs(spec, 1, 1, 4, 1)
    rng = np.random.default_rng(11)
    chunks = (0, 1, 3)  # keys (1, 0) and (1, 1) take t0[0] and t1[1], where key (1, 3) hashes
    t = [(0, contribution(spec, job, 0, c, lanes(rng, spec))) for job in (host, guest) for c in chunks]
    t += [t[3], t[5]]  # a duplicate of a done chunk (resend) and the refused one retransmitted
    run = simulate(spec, [host, guest], t, width=512, pause=lambda p: cycle([0, 1, 1, 0]))
    run.assert_matches()  # frames, counters, and the table, stash, free list and engine counters
    assert [e & DIVERTED != 0 for e in run.order].count(True) == 5
    assert run.counters[Counter.EXC_INSERTS] == 2 and run.counters[Counter.EXC_REFUSED] == 2
    assert run.counters[Counter.TX_RESENDS] == 1 and run.counters[Counter.DROP_COLLISION] == 0
    assert run.exception.stats["refused"] == 2


def test_a_full_divert_queue_lets_the_diverted_frames_back_in():
    """A one-frame queue and most contributions colliding, from both ports: a port's frame never holds the
    arbiter in front of the full queue (which would keep the queue's frame from going back)."""
    spec = SwitchSpec(ports=2, slots=16, chunk_bytes=CHUNK, exception=ExceptionSpec(4, 4, 2))
    jobs = collision_jobs(spec, 1, 1, 2, 2)
    t = claim(spec, jobs, 1, np.random.default_rng(1))
    guests, n = mixed(spec, jobs, 1, 0.6, 12, 5, first_chunk=2)
    run = simulate(spec, jobs, t + guests, width=512, divert_frames=1)
    run.assert_matches()
    assert [e & DIVERTED != 0 for e in run.order].count(True) == n == 8


@pytest.mark.parametrize("table, stash, space", [(4, 2, 26), (256, 4, 532)])
def test_overflow_slots_follow_the_fast_slots(table, stash, space):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        sw = Switch(ports=1, width=64, slots=16, chunk_bytes=CHUNK, exc_table=table, exc_stash=stash)
        assert sw.exception == ExceptionSpec(table, 16, stash) and sw.space == space
        assert len(sw.order.p.port) == 1  # one port and the exception path
        del sw
        gc.collect()


def test_top_reports_diverted_and_refused_frames():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        top = SwitchTop(ports=2, width=64, slots=4, chunk_bytes=CHUNK, jobs=2, workers=2, exc_table=2, exc_stash=1)
        members = top.signature.members
        assert [members[n].shape for n in ("order_valid", "order_port", "order_diverted", "order_refused")] == \
            [1, 2, 1, 1]  # order_port: ports 0, 1 and the exception path
        del top
        gc.collect()


@pytest.mark.parametrize("exception", [None, ExceptionSpec(64, 5, 3)])
def test_registers_describe_the_exception_path_and_its_counters(exception):
    geometry = SwitchGeometry(ports=2, width=64, slots=16, chunk_bytes=CHUNK, jobs=2, workers=4, exception=exception)
    dut = Control(geometry, job_readers=1, event_sources=1)
    regmap = rm.RegMap(2, 4)
    seen = {}

    async def bench(ctx):
        if exception is not None:
            for i, name in enumerate(STATS):
                ctx.set(getattr(dut.exc_stats, name), 0x1000_0000 * (i + 1) + i)
        seen["EXCEPTION"] = await axil_read(ctx, dut.axil, regmap.switch("EXCEPTION"))
        seen["stats"] = [await axil_read(ctx, dut.axil, regmap.exc_stat(name)) for name in STATS]

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert rm.RegMap.decode_exception(seen["EXCEPTION"][0]) == exception and seen["EXCEPTION"][1] == 0
    if exception is None:
        assert all(resp == 0b10 for _, resp in seen["stats"])  # SLVERR: no exception path
    else:
        assert seen["stats"] == [(0x1000_0000 * (i + 1) + i, 0) for i in range(len(STATS))]


def test_replay_feeds_a_diverted_frame_where_it_came_back():
    spec = SwitchSpec(ports=2, slots=8, chunk_bytes=CHUNK, exception=ExceptionSpec(4, 4, 2))
    host, guest = collision_jobs(spec, 1, 1, 4, 2)
    rng = np.random.default_rng(0)
    sent = {p: [contribution(spec, job, p, 0, lanes(rng, spec)) for job in (host, guest)] for p in (0, 1)}

    def model():
        m = ModelSwitch(spec)
        m.add_job(host)
        m.add_job(guest)
        return m

    out = replay(model(), sent, [0, 1, 0 | DIVERTED, 1 | DIVERTED, 2, 2])
    assert [len(out[p]) for p in (0, 1)] == [2, 2]
    with pytest.raises(AssertionError, match=r"^1 diverted frames never came back$"):
        replay(model(), sent, [0, 1, 0 | DIVERTED, 1 | DIVERTED, 2])
    with pytest.raises(AssertionError, match=r"contribution #2 is a diverted frame the model does not have"):
        replay(model(), sent, [0, 1, 2])
