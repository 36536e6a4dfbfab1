"""cocotb tests of the switch's exception path against the model switch (run by test_collisions.py).

Host jobs hold the slots of their regions, guest jobs share them, so every
guest contribution collides; the share of guest traffic is the collision
rate. Every test ends in :meth:`SwitchTB.check` (every frame byte for byte,
every counter) and compares the exception engine's table, stash, free list
and counters with the model switch's.
"""

from __future__ import annotations

import itertools

import cocotb
import numpy as np

from inagg.models.job import ExceptionSpec, SwitchSpec
from inagg.models.protocol import Counter
from inagg.models.regmap import EXC_STATS, RegMap
from inagg.testbench.collisions import claim, collision_jobs, engine_state, mixed, model_state
from inagg.testbench.replay import DIVERTED
from inagg.testbench.sim import parameters, stimulus
from inagg.testbench.switch_tb import SwitchTB

PARAMS = {**parameters(), **stimulus()}
EXC = ExceptionSpec(PARAMS["exc_table"], PARAMS["exc_max_kicks"], PARAMS["exc_stash"])


def _spec(exc: ExceptionSpec = EXC) -> SwitchSpec:
    return SwitchSpec(ports=PARAMS["ports"], slots=PARAMS["slots"], chunk_bytes=PARAMS["chunk_bytes"], exception=exc)


async def _check_exception(tb: SwitchTB) -> None:
    state, stalls = engine_state(tb.dut.core.divert.engine, EXC, 22 + max(1, (PARAMS["jobs"] - 1).bit_length()))
    want = model_state(tb.model)
    assert state.diff(want) == "", state.diff(want)
    assert stalls == 0
    registers = {name: await tb.read(RegMap.exc_stat(name)) for name in EXC_STATS}
    assert registers == {**state.stats, "stalls": 0}
    assert RegMap.decode_exception(await tb.read(RegMap.switch("EXCEPTION"))) == EXC


async def _rate(dut, rate: float) -> None:
    tb = await SwitchTB.start(dut, _spec())
    spec = tb.spec
    hosts, guests = 4, 4
    jobs = collision_jobs(spec, hosts, guests, spec.slots // hosts, PARAMS["workers"])
    await tb.configure(jobs)
    await tb.send_all(claim(spec, jobs, hosts, np.random.default_rng(1)))
    await tb.settle(quiet=50)
    traffic, guest = mixed(spec, jobs, hosts, rate, PARAMS["contributions"], int(rate * 1000) + PARAMS["width"],
                           first_chunk=spec.slots // hosts, loss=0.05, dup=0.05)
    for p in range(tb.ports):
        tb.src[p].set_pause_generator(itertools.cycle([0] * (5 + p) + [1]))
        tb.snk[p].set_pause_generator(itertools.cycle([0, 0, 0, 1]))
    await tb.send_all(traffic)
    await tb.check()
    await _check_exception(tb)
    diverted = sum(e & DIVERTED != 0 for e in tb.order)
    assert diverted == guest, f"{diverted} frames diverted, {guest} guest frames sent"
    counters = await tb.counters()
    assert counters[Counter.DROP_COLLISION] == 0
    dut._log.info("rate %.2f: %d of %d contributions diverted, %d inserts", rate, diverted, len(traffic),
                  counters[Counter.EXC_INSERTS])


@cocotb.test()
@cocotb.parametrize(rate=[0.0, 0.01, 0.02, 0.05, 0.1, 0.2])
async def collision_rate(dut, rate):
    """Guest traffic at a share ``rate``, with losses retransmitted, duplicates, idle gaps and slow egress."""
    await _rate(dut, rate)


@cocotb.test()
async def refused_when_full(dut):
    """More guest keys than overflow slots: the refused contributions are counted as the model counts them, and
    retransmitted they are refused again while the keys already placed aggregate exactly."""
    tb = await SwitchTB.start(dut, _spec())
    spec = tb.spec
    region = spec.slots // 2
    hosts = 2
    guests = (EXC.capacity + region - 1) // region + 1   # more guest keys than overflow slots
    jobs = collision_jobs(spec, hosts, min(guests, PARAMS["jobs"] - hosts), region, PARAMS["workers"])
    await tb.configure(jobs)
    await tb.send_all(claim(spec, jobs, hosts, np.random.default_rng(2)))
    await tb.settle(quiet=50)
    traffic, _ = mixed(spec, jobs, hosts, 1.0, len(jobs[hosts:]) * region * PARAMS["workers"], 9,
                       first_chunk=region)
    await tb.send_all(traffic + traffic)
    await tb.check()
    await _check_exception(tb)
    counters = await tb.counters()
    assert counters[Counter.EXC_REFUSED] > 0 and counters[Counter.EXC_INSERTS] > 0
    assert counters[Counter.COMPLETED] > 2 * region
