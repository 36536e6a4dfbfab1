"""cocotb tests of the switch top against the model switch (run by test_switch.py, one build per width).

Every test ends in :meth:`SwitchTB.check`: every frame the RTL sent equals
the model's byte for byte, per port and in order, every counter equals the
model's, and nothing is left in flight.
"""

from __future__ import annotations

import dataclasses
import itertools
import random

import cocotb
import numpy as np

from inagg.models import regmap as rm
from inagg.models.job import SwitchSpec
from inagg.models.protocol import Counter
from inagg.models.switch import _Job
from inagg.testbench.sim import parameters, stimulus
from inagg.testbench.switch_tb import SwitchTB
from inagg.testbench.traffic import bad_frames, contribution, interleave, lanes, make_job, strays, windowed

PARAMS = {**parameters(), **stimulus()}


def _spec(pkey: int | None = None) -> SwitchSpec:
    extra = {} if pkey is None else {"pkey": pkey}
    return SwitchSpec(ports=PARAMS["ports"], slots=PARAMS["slots"], chunk_bytes=PARAMS["chunk_bytes"], **extra)


async def _tb(dut, spec: SwitchSpec | None = None) -> SwitchTB:
    return await SwitchTB.start(dut, spec or _spec())


@cocotb.test()
async def one_chunk(dut):
    """One job, three workers, one chunk."""
    tb = await _tb(dut)
    job = make_job(tb.spec, 1, 3, 0, 4)
    await tb.configure([job])
    rng = np.random.default_rng(1)
    await tb.send_all([(job.workers[w].port, contribution(tb.spec, job, w, 0, lanes(rng, tb.spec)))
                         for w in range(3)])
    out = await tb.check()
    assert sum(len(v) for v in out.values()) == 3


@cocotb.test()
async def random_jobs(dut):
    """Several jobs, 2 to the most workers per job, random orders, duplicates, losses, idle gaps, slow egress."""
    tb = await _tb(dut)
    spec = tb.spec
    pyrng = random.Random(PARAMS["width"])
    rng = np.random.default_rng(PARAMS["width"])
    most = PARAMS["most_workers"]
    sizes = [2, most, max(2, most // 4)][:PARAMS["jobs"]]
    region = spec.slots >> (len(sizes) - 1).bit_length()  # a power of two per job
    jobs = [make_job(spec, j, n, j * region, region // 2 if j else region) for j, n in enumerate(sizes)]
    await tb.configure(jobs)
    streams = [windowed(spec, j, range(PARAMS["chunks"] // (1 + (len(j.workers) > 8))),
                        lambda c, n=len(j.workers): np.stack([lanes(rng, spec) for _ in range(n)]),
                        pyrng, loss=0.08, dup=0.07)
               for j in jobs]
    traffic = interleave(streams, pyrng)
    for p in range(tb.ports):
        tb.src[p].set_pause_generator(itertools.cycle([0] * (3 + p) + [1]))
        tb.snk[p].set_pause_generator(itertools.cycle([0, 1, 0, 0, 1] if p % 2 else [0, 0, 0, 1]))
    await tb.send_all(traffic)
    await tb.check()
    counters = await tb.counters()
    assert counters[Counter.COMPLETED] > 0 and counters[Counter.DUP_CONTRIB] > 0
    assert counters[Counter.RX_FRAMES] == len(traffic)


@cocotb.test()
async def bad_input(dut):
    """Every frame check fails once between the contributions of one chunk; the sum stays exact."""
    tb = await _tb(dut)
    spec = tb.spec
    job = make_job(spec, 1, 2, 0, 4)
    await tb.configure([job])
    rng = np.random.default_rng(11)
    bad = bad_frames(spec, job, rng)
    good = [contribution(spec, job, w, 0, lanes(rng, spec)) for w in range(2)]
    # On worker 0's port each walks the check order (bad_frames); on another, worker 0 is not known there.
    on = [w.port for w in job.workers]
    traffic = ([(on[0], good[0])] + [(on[0], f) for _, f, _ in bad]
               + [(on[1], contribution(spec, job, 0, 1, lanes(rng, spec))), (on[1], good[1])])
    await tb.send_all(traffic)
    await tb.check()
    counters = await tb.counters()
    for name, _, counter in bad:
        assert counters[counter] > 0, name
    assert counters[Counter.COMPLETED] == 1


@cocotb.test()
async def worker_keys_and_ports(dut):
    """Issue 21: each worker's own contribution R_Key (CONTRIB_RKEY), on its own port only, as the model checks:
    another worker's key and the job's are DROP_BAD_RKEY, the right key on another port DROP_UNKNOWN_QPN."""
    tb = await _tb(dut)
    spec = tb.spec
    job = make_job(spec, 1, 2, 0, 4, ports=[0, 1])
    job = dataclasses.replace(job, workers=tuple(dataclasses.replace(w, contrib_rkey=0x6B00_0000 + 0x111 * i)
                                                 for i, w in enumerate(job.workers)))
    await tb.configure([job])
    rng = np.random.default_rng(13)
    traffic = []
    for w, ws in enumerate(job.workers):
        def frame(**kw):
            return contribution(spec, job, w, 0, lanes(rng, spec), **kw)
        traffic += [(ws.port, frame(rkey=job.contrib_rkey(1 - w))), (ws.port, frame(rkey=job.rkey)),
                    (1 - ws.port, frame()), (ws.port, frame())]
    for port, f in traffic:  # one at a time: the last of each worker completes the chunk
        await tb.send(port, f)
        await tb.settle(quiet=20)
    out = await tb.check()
    counters = await tb.counters()
    assert counters[Counter.DROP_BAD_RKEY] == 4 and counters[Counter.DROP_UNKNOWN_QPN] == 2
    assert counters[Counter.RX_CONTRIB] == 2 and counters[Counter.COMPLETED] == 1
    assert sum(len(v) for v in out.values()) == 2


@cocotb.test()
async def stray_chunks(dut):
    """Stray chunks on FREE slots do not hold them: the job's chunks take them back and complete."""
    tb = await _tb(dut)
    job = make_job(tb.spec, 1, 2, 4, 4)
    await tb.configure([job])
    traffic, counts = strays(tb.spec, job, np.random.default_rng(12))
    await tb.send_all(traffic)
    await tb.check()
    counters = await tb.counters()
    assert {c: counters[c] for c in counts} == counts


@cocotb.test()
async def collision(dut):
    """Regions that overlap (the controller should refuse them; the RTL copes): DROP_COLLISION, no slot changes."""
    tb = await _tb(dut)
    spec = tb.spec
    a, b = make_job(spec, 0, 2, 0, 4), make_job(spec, 1, 2, 0, 2)
    await tb.configure([a])
    for addr, value in tb.regmap.job_writes(b, spec):
        await tb.write(addr, value)
    tb.model.jobs[b.job] = _Job.of(b)  # past add_job's overlap check, on purpose
    rng = np.random.default_rng(4)
    traffic = [(a.workers[0].port, contribution(spec, a, 0, 0, lanes(rng, spec))),
               (b.workers[0].port, contribution(spec, b, 0, 0, lanes(rng, spec))),
               (a.workers[1].port, contribution(spec, a, 1, 0, lanes(rng, spec))),
               (b.workers[1].port, contribution(spec, b, 1, 1, lanes(rng, spec)))]
    for port, frame in traffic:  # one at a time: the order decides which job holds slot 0
        await tb.send(port, frame)
        await tb.settle(quiet=20)
    await tb.check()
    counters = await tb.counters()
    assert counters[Counter.DROP_COLLISION] == 1 and counters[Counter.COMPLETED] == 1


@cocotb.test()
async def registers(dut):
    """Geometry reads back, unmapped accesses answer SLVERR, and a new P_Key is checked and sent."""
    tb = await _tb(dut, _spec(pkey=0x8001))
    await tb.configure([])
    assert await tb.read(rm.RegMap.switch("GEOMETRY")) == tb.regmap.geometry(tb.spec, PARAMS["width"])
    assert await tb.read(rm.RegMap.switch("PKEY")) == 0x8001
    assert (await tb.axil.read(0x0F00, 4)).resp == 2
    assert (await tb.axil.write(rm.RegMap.switch("ID"), b"\0\0\0\0")).resp == 2
    job = make_job(tb.spec, 1, 2, 4, 4)
    await tb.add_job(job)
    assert await tb.read(tb.regmap.job(1, "SLOT_BASE")) == job.slot_base
    assert (await tb.axil.read(tb.regmap.worker(1, 0, "CONTRIB_RKEY"), 4)).resp == 2  # write-only
    rng = np.random.default_rng(2)
    traffic = [(job.workers[w].port, contribution(tb.spec, job, w, 5, lanes(rng, tb.spec))) for w in range(2)]
    traffic.append((0, contribution(tb.spec, job, 0, 6, lanes(rng, tb.spec), pkey=0xFFFF)))
    await tb.send_all(traffic)
    await tb.check()
    assert (await tb.counters())[Counter.DROP_BAD_HEADER] == 1
