"""One ingress port: verdicts, dropped frames drained from the buffer, and backpressure when it is full."""

import numpy as np
import pytest
from amaranth.sim import Simulator

import dataclasses

from inagg.hdl.ingress import IngressPort
from inagg.models.job import SwitchSpec
from inagg.models.protocol import Counter
from inagg.testbench.streams import put_frame
from inagg.testbench.traffic import bad_frames, contribution, lanes, make_job

SPEC = SwitchSpec(ports=2, slots=16, chunk_bytes=256)
JOB = make_job(SPEC, 1, 2, 4, 4, ports=[0])


def _run(width, frames, hold_output_until=0, ready=None, job=JOB, port=0):
    """Port ``port`` with ``job`` configured; ``ready(n)``, if given, is o.ready in cycle n (after
    ``hold_output_until``)."""
    dut = IngressPort(width, SPEC.chunk_bytes, SPEC.slots, port)
    out, events, stalls, held = [], [], [], []

    async def feed(ctx):
        ctx.set(dut.pkey, SPEC.pkey)
        for frame in frames:
            await put_frame(ctx, dut.i, frame, width)

    async def table(ctx):  # the job table of one configured job, read combinationally
        async for (index,) in ctx.changed(dut.job.index):
            known = index == job.job
            ctx.set(dut.job.entry.valid, known)
            ctx.set(dut.job.entry.workers, len(job.workers))
            ctx.set(dut.job.entry.slot_base, job.slot_base)
            ctx.set(dut.job.entry.slots, job.slots)

    async def workers(ctx):  # the worker table's contribution R_Keys and ports, read combinationally
        async for index, worker in ctx.changed(dut.worker.job, dut.worker.worker):
            if index == job.job and worker < len(job.workers):
                ctx.set(dut.worker.entry.rkey, job.contrib_rkey(worker))
                ctx.set(dut.worker.entry.port, job.workers[worker].port)

    async def drain(ctx):
        beats, offered = [], None
        for n in range(3000):
            ctx.set(dut.o.ready, n >= hold_output_until and (ready is None or ready(n)))
            _, _, valid, o_ready, data, last, slot, ev, iv, ir = await ctx.tick().sample(
                dut.o.valid, dut.o.ready, dut.o.p.data, dut.o.p.last, dut.o.p.desc.slot, dut.events,
                dut.i.valid, dut.i.ready)
            if offered is not None:  # a beat offered and not taken stays as it was
                held.append(offered == (valid, data, last, slot))
            offered = (valid, data, last, slot) if valid and not o_ready else None
            if iv and not ir:
                stalls.append(n)
            if ev:
                events.append([c for c in Counter if ev >> c & 1])
            if valid and o_ready:
                beats.append(data)
                if last:
                    out.append((slot, b"".join(d.to_bytes(width // 8, "little") for d in beats)))
                    beats = []

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(feed)
    sim.add_process(table)
    sim.add_process(workers)
    sim.add_testbench(drain, background=False)
    sim.run()
    assert all(held)
    return out, events, stalls, held


@pytest.mark.parametrize("width", [64, 512])
def test_takes_good_drops_bad(width):
    rng = np.random.default_rng(width)
    good = [contribution(SPEC, JOB, w, 5, lanes(rng, SPEC)) for w in range(2)]
    bad = good[0][:-1] + bytes([good[0][-1] ^ 1])
    out, events, _, _ = _run(width, [good[0], bad, good[1][:200], good[1]])
    assert [payload for _, payload in out] == [good[0][70:70 + 256], good[1][70:70 + 256]]
    assert [slot for slot, _ in out] == [JOB.slot_base + 5 % JOB.slots] * 2
    assert events == [[Counter.RX_FRAMES], [Counter.RX_FRAMES, Counter.DROP_BAD_ICRC],
                      [Counter.RX_FRAMES, Counter.DROP_BAD_LENGTH], [Counter.RX_FRAMES]]


@pytest.mark.parametrize("width", [64, 512])
def test_reserved_ip_flag_is_a_bad_header(width):
    """Check 4 (protocol.md section 1.2): DF may be set, the reserved flag bit may not, whatever else is right."""
    rng = np.random.default_rng(width)
    flagged = next(f for name, f, _ in bad_frames(SPEC, JOB, rng) if name == "ip reserved flag")
    good = contribution(SPEC, JOB, 1, 5, lanes(rng, SPEC))
    assert flagged[20] & 0xC0 == 0xC0 and good[20] & 0xC0 == 0x40  # the flags: reserved and DF, DF only
    out, events, _, _ = _run(width, [flagged, good])
    assert [payload for _, payload in out] == [good[70:70 + 256]]
    assert events == [[Counter.RX_FRAMES, Counter.DROP_BAD_HEADER], [Counter.RX_FRAMES]]


def test_full_buffer_holds_the_port():
    rng = np.random.default_rng(0)
    frames = [contribution(SPEC, JOB, c % 2, c, lanes(rng, SPEC)) for c in range(4)]
    out, _, stalls, _ = _run(64, frames, hold_output_until=600)
    assert stalls and stalls[0] < 600  # two payloads buffered, then tready low
    assert [payload for _, payload in out] == [f[70:70 + 256] for f in frames]


@pytest.mark.parametrize("width", [64, 512])
def test_random_backpressure_loses_no_beat(width):
    # The skid register between the payload buffer and o: every beat once, in order, and a beat
    # offered while o.ready is low stays on offer unchanged.
    rng = np.random.default_rng(width + 1)
    frames = [contribution(SPEC, JOB, c % 2, c, lanes(rng, SPEC)) for c in range(5)]
    pattern = rng.random(3000) < 0.4
    out, _, _, held = _run(width, frames, ready=lambda n: bool(pattern[n]))
    assert [payload for _, payload in out] == [f[70:70 + 256] for f in frames]
    assert len(held) > 10  # the pattern did hold beats back


@pytest.mark.parametrize("width", [64, 512])
def test_each_worker_only_with_its_key_on_its_port(width):
    """Checks 14 and 15 per worker: worker 0 of port 0 and worker 1 of port 1, each with a contribution R_Key
    of its own; another worker's key is DROP_BAD_RKEY, the job's too, and a worker's frame on the other port
    DROP_UNKNOWN_QPN, whatever its key."""
    job = make_job(SPEC, 1, 2, 4, 4)
    job = dataclasses.replace(job, workers=tuple(dataclasses.replace(w, contrib_rkey=0xA000_0000 + i)
                                                 for i, w in enumerate(job.workers)))
    assert [w.port for w in job.workers] == [0, 1]
    rng = np.random.default_rng(width)

    def frame(worker, rkey):
        return contribution(SPEC, job, worker, 5, lanes(rng, SPEC), rkey=rkey)

    own = [frame(0, job.contrib_rkey(0)), frame(1, job.contrib_rkey(1))]
    for port in (0, 1):
        frames = [frame(port, job.contrib_rkey(1 - port)), frame(port, job.rkey), own[port], own[1 - port]]
        out, events, _, _ = _run(width, frames, job=job, port=port)
        assert [payload for _, payload in out] == [own[port][70:70 + 256]]
        assert events == [[Counter.RX_FRAMES, Counter.DROP_BAD_RKEY]] * 2 + [
            [Counter.RX_FRAMES], [Counter.RX_FRAMES, Counter.DROP_UNKNOWN_QPN]]
