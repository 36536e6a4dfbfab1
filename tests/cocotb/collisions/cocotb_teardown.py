"""cocotb tests of job teardown (the TEARDOWN register) against ``ModelSwitch.remove_job`` (run by test_teardown.py).

Every test ends in :meth:`SwitchTB.check` (every frame byte for byte, every counter, in the replayed order with
the teardown where the RTL's ``order_teardown`` put it) and compares the exception engine's table, stash, free
list and counters with the model switch's.
"""

from __future__ import annotations

import cocotb
import numpy as np
from cocotb.triggers import RisingEdge

from inagg.models import regmap as rm
from inagg.models.cuckoo import make_key
from inagg.models.job import ExceptionSpec, SwitchSpec
from inagg.models.protocol import Counter
from inagg.models.switch import SlotState
from inagg.testbench.collisions import engine_state, model_state
from inagg.testbench.replay import AddJob, RemoveJob
from inagg.testbench.sim import parameters
from inagg.testbench.switch_tb import SwitchTB
from inagg.testbench.traffic import contribution, lanes, make_job

PARAMS = parameters()
EXC = ExceptionSpec(PARAMS["exc_table"], PARAMS["exc_max_kicks"], PARAMS["exc_stash"])
_OKAY, _SLVERR = 0, 2


def _spec() -> SwitchSpec:
    return SwitchSpec(ports=PARAMS["ports"], slots=PARAMS["slots"], chunk_bytes=PARAMS["chunk_bytes"], exception=EXC)


def _chunks(spec, job, chunks, rng, workers=None):
    return [(job.workers[w].port, contribution(spec, job, w, c, lanes(rng, spec)))
            for c in chunks for w in (range(len(job.workers)) if workers is None else workers)]


async def _watch_teardown(tb: SwitchTB) -> None:
    """Put the model's ``remove_job`` into the replayed order where the RTL's teardown took effect."""
    while True:
        await RisingEdge(tb.dut.clk)
        if tb.dut.order_teardown.value:
            tb.order.append(RemoveJob(tb.torn.pop(0)))


async def _teardown(tb: SwitchTB, job: int) -> tuple[int, int]:
    """Write TEARDOWN; (BRESP, TEARDOWN once no longer busy)."""
    addr = rm.RegMap.switch("TEARDOWN")
    tb.torn.append(job)
    resp = (await tb.axil.write(addr, job.to_bytes(4, "little"))).resp
    if resp != _OKAY:
        tb.torn.remove(job)
    while (status := await tb.read(addr)) & rm.TEARDOWN_BUSY:
        pass
    if status & rm.TEARDOWN_REFUSED:
        tb.torn.remove(job)
    return int(resp), status


async def _start(dut):
    tb = SwitchTB(dut, _spec())
    tb.torn = []
    await tb.reset()
    cocotb.start_soon(_watch_teardown(tb))
    return tb


async def _check_exception(tb: SwitchTB) -> None:
    state, stalls = engine_state(tb.dut.core.divert.engine, EXC, 22 + max(1, (PARAMS["jobs"] - 1).bit_length()))
    want = model_state(tb.model)
    assert state.diff(want) == "", state.diff(want)
    assert stalls == 0


@cocotb.test()
async def refused_then_recovered_after_a_teardown(dut):
    """Host A holds half the slots; B (whose upper half it holds itself, with partial sums), C and E collide
    with A until table and stash are full and contributions are refused. B is torn down; the refused
    contributions retransmitted take B's freed overflow slots and complete exactly once; D takes B's fast slots."""
    tb = await _start(dut)
    spec, workers, half = tb.spec, PARAMS["workers"], PARAMS["slots"] // 2
    a, b, c, e = (make_job(spec, 0, workers, 0, half), make_job(spec, 1, workers, 0, 2 * half),
                  make_job(spec, 2, workers, 0, half), make_job(spec, 4, workers, 0, half // 2))
    d = make_job(spec, 3, workers, half, half)
    await tb.configure([a, b, c, e])
    rng = np.random.default_rng(3)
    claim = _chunks(spec, a, range(half), rng) + _chunks(spec, b, range(half, 2 * half), rng, workers=[0])
    guests = _chunks(spec, b, range(half), rng) + _chunks(spec, c, range(half), rng) + \
        _chunks(spec, e, range(half // 2), rng)
    await tb.send_all(claim)
    await tb.settle(quiet=50)
    await tb.send_all(guests)
    await tb.settle(quiet=50)
    refused = (await tb.counters())[Counter.EXC_REFUSED]
    assert refused > 0, "the scenario must refuse contributions"
    assert await _teardown(tb, 1) == (_OKAY, 0)
    # All of C and E again: the placed ones are duplicates, the refused ones now find room.
    await tb.send_all(guests[half * workers:])
    await tb.settle(quiet=50)
    for addr, value in tb.regmap.job_writes(d, spec):
        await tb.write(addr, value)
    tb.order.append(AddJob(d))
    await tb.send_all(_chunks(spec, d, range(half), rng))
    await tb.check()
    await _check_exception(tb)
    assert (await tb.counters())[Counter.EXC_REFUSED] == refused  # none refused again
    model = tb.model
    for job, n in ((2, half), (4, half // 2)):
        ptrs = [model.exception.lookup(make_key(job, i)) for i in range(n)]
        assert None not in ptrs and all(model.overflow[p].state == SlotState.DONE for p in ptrs)
    assert all(s.state == SlotState.DONE and s.job == 3 for s in model.fast[half:])


@cocotb.test()
async def teardowns_refused(dut):
    """SLVERR for a job past the table and for one not enabled; a host whose slots other keys diverted from is
    not torn down (TEARDOWN reads refused) and goes on aggregating."""
    tb = await _start(dut)
    spec, workers, half = tb.spec, PARAMS["workers"], PARAMS["slots"] // 2
    a, c = make_job(spec, 0, workers, 0, half), make_job(spec, 2, workers, 0, half)
    await tb.configure([a, c])
    rng = np.random.default_rng(4)
    await tb.send_all(_chunks(spec, a, range(half), rng) + _chunks(spec, c, range(2), rng))
    await tb.settle(quiet=50)
    assert await _teardown(tb, PARAMS["jobs"]) == (_SLVERR, 0)
    assert await _teardown(tb, 5) == (_SLVERR, 0)
    assert await _teardown(tb, 0) == (_OKAY, rm.TEARDOWN_REFUSED)
    await tb.send_all(_chunks(spec, a, range(half, 2 * half), rng))
    await tb.check()
    await _check_exception(tb)
    assert not any(isinstance(x, RemoveJob) for x in tb.order)
