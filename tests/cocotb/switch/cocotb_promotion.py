"""cocotb tests of FP32 promotion in the switch top against the model switch (run by test_switch.py).

Every test ends in :meth:`SwitchTB.check`: every frame the RTL sent, FP32
results included, equals the model's byte for byte, per port and in order,
every counter (``PROMOTED`` among them) equals the model's, and nothing is
left in flight.
"""

from __future__ import annotations

import itertools
import random

import cocotb
import numpy as np

from inagg.models.job import SwitchSpec
from inagg.models.protocol import Counter
from inagg.testbench.promotion import adversarial
from inagg.testbench.sim import parameters, stimulus
from inagg.testbench.switch_tb import SwitchTB
from inagg.testbench.traffic import contribution, interleave, make_job, windowed

PARAMS = {**parameters(), **stimulus()}


async def _tb(dut) -> SwitchTB:
    return await SwitchTB.start(dut, SwitchSpec(ports=PARAMS["ports"], slots=PARAMS["slots"],
                                                chunk_bytes=PARAMS["chunk_bytes"]))


def _chunk_values(rng, n, lanes, c):
    """Chunk ``c``'s contributions: every pattern, INT32 only, or one promoted lane among INT32 ones."""
    if c % 3 == 1:
        return adversarial(rng, n, lanes, ("small",))
    values = adversarial(rng, n, lanes)
    if c % 3 == 2:
        values = adversarial(rng, n, lanes, ("small",))
        values[:, c % lanes] = adversarial(rng, n, 1, ("first", "middle", "last", "cancel"))[:, 0]
    return values


@cocotb.test()
async def adversarial_jobs(dut):
    """The most workers the build takes and two workers, every overflow pattern, losses and duplicates."""
    tb = await _tb(dut)
    spec = tb.spec
    pyrng = random.Random(PARAMS["width"])
    rng = np.random.default_rng(PARAMS["width"])
    half = spec.slots // 2
    jobs = [make_job(spec, 0, PARAMS["workers"], 0, half), make_job(spec, 1, 2, half, half)]
    await tb.configure(jobs)
    streams = [windowed(spec, job, range(chunks), lambda c, n=len(job.workers): _chunk_values(rng, n, spec.lanes, c),
                        pyrng, loss=0.05, dup=0.05, resend_done=True)
               for job, chunks in zip(jobs, (PARAMS["chunks"], 3 * PARAMS["chunks"]))]
    traffic = interleave(streams, pyrng)
    for p in range(tb.ports):
        tb.src[p].set_pause_generator(itertools.cycle([0] * (5 + p) + [1]))
        tb.snk[p].set_pause_generator(itertools.cycle([0, 0, 1]))
    await tb.send_all(traffic)
    await tb.check()
    counters = await tb.counters()
    assert 0 < counters[Counter.PROMOTED] < counters[Counter.COMPLETED]
    assert counters[Counter.DUP_CONTRIB] > 0 and counters[Counter.TX_RESENDS] > 0


@cocotb.test()
async def back_to_back(dut):
    """Contributions to one slot from every port with no idle cycle, every addition in FP32."""
    tb = await _tb(dut)
    spec = tb.spec
    n = PARAMS["workers"]
    job = make_job(spec, 0, n, 0, 2)
    await tb.configure([job])
    rng = np.random.default_rng(9)
    values = [adversarial(rng, n, spec.lanes, ("alternating", "random", "ties")) for _ in range(2)]
    await tb.send_all([(job.workers[w].port, contribution(spec, job, w, c, values[c][w]))
                         for c in range(2) for w in range(n)])
    await tb.check()
    assert (await tb.counters())[Counter.PROMOTED] == 2
