"""Mode II's gateware blocks (hdl/translated.py) against the model's TranslatedJob (models/modes.py), frame by frame."""

import dataclasses
import gc
import random
import warnings

import numpy as np
import pytest
from amaranth import Array, Module
from amaranth.hdl import UnusedElaboratable
from amaranth.sim import Simulator

from inagg.hdl.emitter import ResultEmitter
from inagg.hdl.engine import SlotEngine
from inagg.hdl.ingress import IngressPort
from inagg.hdl.reflect import AckReflector, AckRouter, FrameMux
from inagg.hdl.translated import PsnTable, TranslatedRules, translated_events
from inagg.testbench.streams import EngineResults, get_frame, put_frame
from inagg.models import rc, wire
from inagg.models.frame import AETH, BTH
from inagg.models.job import Mode, SwitchSpec
from inagg.models.protocol import Counter, Opcode, encode_imm, qp_udp_sport
from inagg.models.rc import PSN_MOD, Packet
from inagg.models.regmap import MODE_CODES
from inagg.models.switch import ModelSwitch, SlotState
from inagg.testbench.traffic import make_job, rc_contribution

CHUNK = 256
OUTCOMES = ("add", "store", "complete", "dup", "resend", "ahead", "stale", "window", "bad_address")
META = ("psn", "chunk", "bitmap", "count", "done")


def _sim(dut, *testbenches, processes=(), period=1e-6):
    """Run ``testbenches`` (and the background ``processes``) on ``dut`` to their end, on a clock when it has one."""
    sim = Simulator(dut)
    sim.add_clock(period, if_exists=True)
    for bench in testbenches:
        sim.add_testbench(bench)
    for process in processes:
        sim.add_process(process)
    sim.run()


def _decide(meta, desc, expected):
    dut = TranslatedRules(workers=4, slots=8)
    seen = {}

    async def bench(ctx):
        ctx.set(dut.meta, meta)
        ctx.set(dut.desc, desc)
        ctx.set(dut.expected, expected)
        seen["outcome"] = {name for name in OUTCOMES if ctx.get(getattr(dut.outcome, name))}
        seen["new"] = {name: ctx.get(getattr(dut.new, name)) for name in META}
        seen["next"], seen["slot"], seen["shadow"] = ctx.get(dut.next_expected), ctx.get(dut.slot), ctx.get(dut.shadow)

    _sim(dut, bench)
    return seen


DESC = dict(worker=1, psn=9, chunk=9, workers=2, slots=8)


@pytest.mark.parametrize("meta, expected, outcome", [
    ({}, 9, {"add", "store"}),                                                      # in order, empty slot
    (dict(psn=9, chunk=9, bitmap=0b1, count=1), 9, {"add", "complete"}),
    (dict(psn=1, chunk=1, bitmap=0b1, count=1, done=1), 9, {"window"}),             # the slot holds PSN 1
    (dict(psn=9, chunk=17, bitmap=0b1, count=1), 9, {"bad_address"}),
    ({}, 8, {"ahead"}),
    ({}, PSN_MOD - 1, {"ahead"}),                                                   # across the PSN wrap
    (dict(psn=9, chunk=9, bitmap=0b10, count=1), 10, {"dup"}),                       # result not made yet
    (dict(psn=9, chunk=9, bitmap=0b1, count=2, done=1), 10, {"dup", "resend"}),      # done: sent again
    (dict(psn=9, chunk=9, bitmap=0b1, count=1), 10, {"stale"}),                      # never in, not done
    (dict(psn=1, chunk=1, bitmap=0b11, count=2, done=1), 10, {"stale"}),
    (dict(psn=9, chunk=9, bitmap=0b10, count=1), 9 + 2**23, {"dup"}),               # 2**23 behind
])
def test_translated_rules(meta, expected, outcome):
    seen = _decide(meta, DESC, expected)
    assert seen["outcome"] == outcome
    assert (seen["slot"], seen["shadow"]) == (1, 5)
    if "add" in outcome:
        assert seen["next"] == 10 and seen["new"]["psn"] == 9 and seen["new"]["bitmap"] & 0b10


def test_psn_table_sweeps_after_reset_keeps_each_entry_and_clears_a_job():
    dut = PsnTable(jobs=2)

    async def bench(ctx):
        cycles = 0
        while ctx.get(dut.busy):
            await ctx.tick()
            cycles += 1
        assert cycles == 2 * 64

        async def write(job, worker, psn):
            ctx.set(dut.write_en, 1)
            ctx.set(dut.write_job, job)
            ctx.set(dut.write_worker, worker)
            ctx.set(dut.write_psn, psn)
            await ctx.tick()
            ctx.set(dut.write_en, 0)

        async def read(job, worker):
            ctx.set(dut.read_en, 1)
            ctx.set(dut.read_job, job)
            ctx.set(dut.read_worker, worker)
            await ctx.tick()
            ctx.set(dut.read_en, 0)
            return ctx.get(dut.expected)

        await write(0, 5, 7)
        await write(1, 5, PSN_MOD - 1)
        await write(1, 63, 3)
        assert [await read(0, 5), await read(1, 5), await read(1, 63), await read(0, 4)] == [7, PSN_MOD - 1, 3, 0]
        # A read of the entry written in the same cycle sees the new value.
        ctx.set(dut.read_en, 1)
        ctx.set(dut.read_job, 0)
        ctx.set(dut.read_worker, 5)
        await write(0, 5, 8)
        assert ctx.get(dut.expected) == 8
        ctx.set(dut.read_en, 0)
        ctx.set(dut.clear, 1)
        ctx.set(dut.clear_job, 1)
        await ctx.tick()
        ctx.set(dut.clear, 0)
        cycles = 0
        while ctx.get(dut.busy):
            await ctx.tick()
            cycles += 1
        assert cycles == 64
        assert [await read(0, 5), await read(1, 5), await read(1, 63)] == [8, 0, 0]
        ctx.set(dut.clear, 1)
        ctx.set(dut.clear_job, 2)  # no such job: nothing to clear
        await ctx.tick()
        assert not ctx.get(dut.busy)

    _sim(dut, bench)


def test_psn_table_refuses_a_bad_size():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)  # refused, never to be elaborated
        with pytest.raises(ValueError, match="jobs must be an integer from 1 to 1024, not 0") as e:
            PsnTable(jobs=0)
        del e
        gc.collect()


# -- the rules and the PSN table against the model switch, frame by frame ------------------------------

def _switch(n, slots):
    sw = ModelSwitch(SwitchSpec(ports=4, slots=16, chunk_bytes=CHUNK))
    job = dataclasses.replace(make_job(sw.spec, 1, n, 0, slots), mode=Mode.TRANSLATED)
    sw.add_job(job)
    return sw, job


def _contribution(sw, job, w, psn, chunk):
    return rc_contribution(sw.spec, job, w, psn, chunk, np.full(CHUNK // 4, w + 1))


def _frame(rng, sent, expected, w, slots, back=0.1):
    """(offset, chunk) of worker ``w``'s next frame, for hosts that mostly keep the rules; offset ``k`` is chunk
    ``k``'s PSN less the first PSN. In order (a host sends a new offset only while it is less than W ahead of
    the slowest host, as its window lets it, but now and then one more), a re-send of an older offset, a PSN
    ahead, now and then another chunk for the PSN; after a drop the host goes back to the expected PSN (its
    Go-Back-N, with probability ``back`` on any frame)."""
    r = rng.random()
    if r < back:
        sent[w] = expected
    if r < 0.6:
        off = sent[w]
        if off - min(sent) < slots // 2 or r < 0.03:
            sent[w] += 1
        else:
            off -= 1
    elif r < 0.85:
        off = sent[w] - rng.randrange(1, slots + 2)
    else:
        off = sent[w] + rng.randrange(1, 3)
    chunk = off if rng.random() > 0.05 else off + slots
    return off, chunk % (1 << 30)


@pytest.mark.parametrize("n, slots, start, seed", [(3, 4, 0, 1), (2, 8, PSN_MOD - 5, 2), (4, 2, 0, 3)])
def test_rules_and_psn_table_follow_the_model(n, slots, start, seed):
    sw, job = _switch(n, slots)
    model = sw.modes[job.job]
    model.expected = [start] * n
    rules, table = TranslatedRules(workers=n, slots=slots), PsnTable(jobs=2)
    top = Module()
    top.submodules.rules, top.submodules.table = rules, table
    top.d.comb += rules.expected.eq(table.expected)
    counted = [c for c in Counter if c not in (Counter.TX_RESULTS, Counter.PROMOTED, Counter.RX_FRAMES)]
    seen = set()

    async def bench(ctx):
        # The table starts at 0 after reset: bring it to ``start`` as the model was.
        while ctx.get(table.busy):
            await ctx.tick()
        for w in range(n):
            ctx.set(table.write_en, 1)
            ctx.set(table.write_job, job.job)
            ctx.set(table.write_worker, w)
            ctx.set(table.write_psn, start)
            await ctx.tick()
        ctx.set(table.write_en, 0)
        hdl = [dict(psn=0, chunk=0, bitmap=0, count=0, done=0) for _ in range(slots)]
        rng, sent = random.Random(seed), [0] * n
        for _ in range(400):
            w = rng.randrange(n)
            off, chunk = _frame(rng, sent, (model.expected[w] - start) % PSN_MOD, w, slots)
            psn = (start + off) % PSN_MOD
            ctx.set(table.read_en, 1)
            ctx.set(table.read_job, job.job)
            ctx.set(table.read_worker, w)
            await ctx.tick()
            ctx.set(table.read_en, 0)
            s = psn % slots
            for name, value in hdl[s].items():
                ctx.set(getattr(rules.meta, name), value)
            for name, value in dict(worker=w, psn=psn, chunk=chunk, workers=n, slots=slots).items():
                ctx.set(getattr(rules.desc, name), value)
            outcome = {name for name in OUTCOMES if ctx.get(getattr(rules.outcome, name))}
            strobes = {c for c, v in translated_events(rules.outcome).items() if ctx.get(v)}
            before = {c: sw.counters[c] for c in Counter}
            out = sw.receive(job.workers[w].port, _contribution(sw, job, w, psn, chunk))
            delta = {c for c in counted if sw.counters[c] != before[c]}
            assert all(sw.counters[c] - before[c] == 1 for c in delta), {c: sw.counters[c] - before[c] for c in delta}
            assert strobes == delta, (w, psn, chunk, outcome)
            assert sw.counters[Counter.TX_RESULTS] - before[Counter.TX_RESULTS] == len(out) == \
                ("resend" in outcome) + n * ("complete" in outcome)
            seen.update(outcome)
            assert ctx.get(rules.slot) == s
            if "add" in outcome:
                hdl[s] = {name: ctx.get(getattr(rules.new, name)) for name in META}
                hdl[ctx.get(rules.shadow)]["bitmap"] &= ~(1 << w)
                ctx.set(table.write_en, 1)
                ctx.set(table.write_job, job.job)
                ctx.set(table.write_worker, w)
                ctx.set(table.write_psn, ctx.get(rules.next_expected))
                await ctx.tick()
                ctx.set(table.write_en, 0)
            assert hdl == [dict(psn=e.psn, chunk=e.chunk, bitmap=e.bitmap, count=e.count, done=int(e.done))
                           for e in model.entries]
            got = []
            for v in range(n):
                ctx.set(table.read_en, 1)
                ctx.set(table.read_worker, v)
                await ctx.tick()
                got.append(ctx.get(table.expected))
            ctx.set(table.read_en, 0)
            assert got == model.expected

    _sim(top, bench)
    assert seen == set(OUTCOMES), seen


# -- ACK reflection --------------------------------------------------------------------------------------

@pytest.mark.parametrize("width", [64, 256, 512])
def test_ack_reflector_sends_the_models_frames_with_backpressure(width):
    sw, job = _switch(3, 4)
    top = Module()
    top.submodules.dut = dut = AckReflector(width=width, workers=4)
    fields = ("mac", "ip", "qpn")
    value = {"mac": lambda w: int.from_bytes(wire.mac_bytes(w.mac), "big"),
             "ip": lambda w: int.from_bytes(wire.ip_bytes(w.ip), "big"), "qpn": lambda w: w.qpn}
    table = {f: Array([value[f](w) for w in job.workers] + [0]) for f in fields}
    for f in fields:
        top.d.comb += getattr(dut.worker.entry, f).eq(table[f][dut.worker.index - job.job * 4])
    rng = random.Random(width)
    acks = [(rng.randrange(3), rc.Ack(rng.randrange(PSN_MOD), rng.choice([rc.Syndrome.ACK, rc.Syndrome.NAK_SEQ]),
                                      rng.randrange(PSN_MOD))) for _ in range(12)]
    expected = []
    for w, a in acks:
        before = sw.counters[Counter.ACK_REFLECTED]
        ws = job.workers[w]
        frame = rc.encode(a, rc.Address(eth_dst=wire.mac_bytes(sw.spec.mac), eth_src=wire.mac_bytes(ws.mac),
                                        ip_src=wire.ip_bytes(ws.ip), ip_dst=wire.ip_bytes(sw.spec.ip),
                                        udp_sport=qp_udp_sport(ws.qpn), dest_qpn=job.qpn(w), rkey=job.rkey))
        ((port, out),) = sw.receive(ws.port, frame)
        assert port == ws.port and sw.counters[Counter.ACK_REFLECTED] == before + 1
        expected.append(out)
    got, strobes = [], []

    async def source(ctx):
        ctx.set(dut.switch.mac, int.from_bytes(wire.mac_bytes(sw.spec.mac), "big"))
        ctx.set(dut.switch.ip, int.from_bytes(wire.ip_bytes(sw.spec.ip), "big"))
        ctx.set(dut.switch.pkey, sw.spec.pkey)
        for k, (w, a) in enumerate(acks):
            ctx.set(dut.i.valid, 1)
            ctx.set(dut.i.p.job, job.job)
            ctx.set(dut.i.p.worker, w)
            ctx.set(dut.i.p.psn, a.psn)
            ctx.set(dut.i.p.syndrome, a.syndrome)
            ctx.set(dut.i.p.msn, a.msn)
            # Every third one as the slot engine's own Mode III answer: the same frame, not reflected.
            ctx.set(dut.i.p.augmented, int(k % 3 == 2))
            await ctx.tick().until(dut.i.ready)
            ctx.set(dut.i.valid, 0)
            for _ in range(rng.randrange(3)):
                await ctx.tick()

    async def sink(ctx):
        pause = iter(lambda: int(rng.random() < 0.4), 2)
        for _ in acks:
            got.append(await get_frame(ctx, dut.o, width, pause))

    async def count(ctx):
        async for _, _, ev in ctx.tick().sample(dut.events):
            strobes.append(ev >> Counter.ACK_REFLECTED & 1)

    _sim(top, source, sink, processes=[count])
    assert got == expected
    assert sum(strobes) == len(acks) - len(acks) // 3


# -- the ingress port's checks of Mode II frames --------------------------------------------------------

_CHECKS = {Counter.DROP_NON_ROCE, Counter.DROP_BAD_HEADER, Counter.DROP_BAD_LENGTH, Counter.DROP_BAD_ICRC,
           Counter.DROP_BAD_OPCODE, Counter.DROP_UNKNOWN_QPN, Counter.DROP_BAD_RKEY, Counter.DROP_BAD_ADDRESS}


def _mode_ii_frames(sw, job, uc):
    """(frame, what the port must make of it): ``("contribution", worker, psn)``, ``("ack", worker, Ack)``, or
    a drop counter, for a Mode II job and a UC job ``uc`` on ``sw``."""
    def to(j, w, **kw):
        ws = j.workers[w]
        return rc.Address(**{**dict(eth_dst=wire.mac_bytes(sw.spec.mac), eth_src=wire.mac_bytes(ws.mac),
                                    ip_src=wire.ip_bytes(ws.ip), ip_dst=wire.ip_bytes(sw.spec.ip),
                                    udp_sport=qp_udp_sport(ws.qpn), dest_qpn=j.qpn(w), rkey=j.rkey), **kw})

    lanes = bytes(range(CHUNK))
    write = Packet(Opcode.RC_RDMA_WRITE_ONLY, 0, lanes, True, 0, CHUNK)
    a = rc.Ack(7, rc.Syndrome.NAK_SEQ, 5)
    ack_frame = rc.encode(a, to(job, 1))
    t = to(job, 1)
    transport = BTH.pack(opcode=Opcode.RC_ACK, pkey=t.pkey, dqpn=t.dest_qpn, psn=7) + AETH.pack(syndrome=0, msn=1)
    long_ack = wire.encapsulate(transport + bytes(4), eth_dst=t.eth_dst, eth_src=t.eth_src, ip_src=t.ip_src,
                                ip_dst=t.ip_dst, udp_sport=t.udp_sport)
    return [
        (rc.encode(write, to(job, 0)), ("contribution", 0, 0)),
        (ack_frame, ("ack", 1, a)),
        (rc.encode(rc.Ack(3, rc.Syndrome.ACK, 4), to(job, 0)), ("ack", 0, rc.Ack(3, rc.Syndrome.ACK, 4))),
        (rc.encode(dataclasses.replace(write, psn=1, opcode=Opcode.UC_RDMA_WRITE_ONLY), to(job, 1)),
         Counter.DROP_BAD_OPCODE),
        (rc.encode(dataclasses.replace(write, psn=1, va=3), to(job, 1)), Counter.DROP_BAD_ADDRESS),
        (rc.encode(dataclasses.replace(write, psn=1), to(job, 1, rkey=1)), Counter.DROP_BAD_RKEY),
        # An ACK has no RETH: what the port captured of the frame before stands where its R_Key would be.
        (rc.encode(rc.Ack(8, rc.Syndrome.ACK, 6), to(job, 1)), ("ack", 1, rc.Ack(8, rc.Syndrome.ACK, 6))),
        (long_ack, Counter.DROP_BAD_LENGTH),
        (ack_frame[:-1] + bytes([ack_frame[-1] ^ 1]), Counter.DROP_BAD_ICRC),
        (rc.encode(a, to(uc, 0)), Counter.DROP_BAD_OPCODE),                     # an ACK to a UC job
        (rc.encode(a, to(job, 1, dest_qpn=job.qpn(3))), Counter.DROP_BAD_OPCODE),  # no such worker: UC rules
        (rc.encode(dataclasses.replace(write, psn=2, va=5 * CHUNK), to(job, 1)), ("contribution", 1, 2)),  # slot by PSN
    ]


@pytest.mark.parametrize("width, mode", [(64, Mode.TRANSLATED), (512, Mode.TRANSLATED), (64, Mode.AUGMENTED),
                                         (512, Mode.AUGMENTED)])
def test_ingress_checks_mode_ii_frames_as_the_model(width, mode):
    """Modes II and III take the same frames; a Mode III job's descriptors and ACKs say ``augmented``."""
    sw, job = _switch(2, 4)
    sw.remove_job(job.job)  # every worker on the port under test, port 0
    job = dataclasses.replace(job, mode=mode, workers=tuple(dataclasses.replace(w, port=0) for w in job.workers))
    uc = dataclasses.replace(job, job=2, mode=Mode.UC, slot_base=8)
    sw.add_job(job)
    sw.add_job(uc)
    frames = _mode_ii_frames(sw, job, uc)
    for frame, verdict in frames:  # the model agrees with what the port must do
        before = {c: sw.counters[c] for c in Counter}
        sw.receive(0, frame)
        drops = {c for c in _CHECKS if sw.counters[c] != before[c]}
        assert drops == ({verdict} if isinstance(verdict, Counter) else set()), verdict
    dut = IngressPort(width, CHUNK, 16, 0)
    jobs = {j.job: j for j in (job, uc)}
    taken, acks, drops = [], [], []

    async def feed(ctx):
        ctx.set(dut.pkey, sw.spec.pkey)
        for frame, _ in frames:
            await put_frame(ctx, dut.i, frame, width)

    async def table(ctx):
        async for (index,) in ctx.changed(dut.job.index):
            j = jobs.get(index)
            ctx.set(dut.job.entry.valid, j is not None)
            if j is not None:
                ctx.set(dut.job.entry.workers, len(j.workers))
                ctx.set(dut.job.entry.slot_base, j.slot_base)
                ctx.set(dut.job.entry.slots, j.slots)
                ctx.set(dut.job.entry.mode, MODE_CODES[j.mode])

    async def workers(ctx):
        async for index, worker in ctx.changed(dut.worker.job, dut.worker.worker):
            j = jobs.get(index)
            if j is not None and worker < len(j.workers):
                ctx.set(dut.worker.entry.rkey, j.contrib_rkey(worker))
                ctx.set(dut.worker.entry.port, j.workers[worker].port)

    async def drain(ctx):
        ctx.set(dut.o.ready, 1)
        for _ in range(800):
            _, _, valid, last, desc, ack_valid, ack, ev = await ctx.tick().sample(
                dut.o.valid, dut.o.p.last, dut.o.p.desc, dut.ack.valid, dut.ack.p, dut.events)
            if valid and last:
                taken.append(("contribution", desc.worker, desc.psn, desc.translated, desc.augmented, desc.slot))
            if ack_valid:
                acks.append(("ack", ack.worker, rc.Ack(ack.psn, ack.syndrome, ack.msn), ack.augmented))
            drops.extend(c for c in Counter if ev >> c & 1 and c is not Counter.RX_FRAMES)

    _sim(dut, feed, drain, processes=[table, workers])
    iii = int(mode is Mode.AUGMENTED)
    assert taken == [(*v, 1, iii, job.slot_base + v[2] % job.slots) for _, v in frames
                     if isinstance(v, tuple) and v[0] == "contribution"]
    assert acks == [(*v, iii) for _, v in frames if isinstance(v, tuple) and v[0] == "ack"]
    assert drops == [v for _, v in frames if isinstance(v, Counter)]


# -- results as RC frames ----------------------------------------------------------------------------------

@pytest.mark.parametrize("width, port", [(64, 0), (512, 1)])
def test_emitter_sends_mode_ii_results_as_the_model(width, port):
    sw, job = _switch(2, 4)
    model = sw.modes[job.job]
    nb = width // 8
    dut = ResultEmitter(width=width, chunk_bytes=CHUNK, slots=16, jobs=2, workers=4, port=port, port_bits=2)
    top = Module()
    top.submodules.dut = dut
    value = {"mac": lambda w: int.from_bytes(wire.mac_bytes(w.mac), "big"),
             "ip": lambda w: int.from_bytes(wire.ip_bytes(w.ip), "big"), "qpn": lambda w: w.qpn,
             "rkey": lambda w: w.rkey, "va": lambda w: w.result_va, "psn": lambda w: 0x123}
    for f, get in value.items():
        table = Array([get(w) for w in job.workers] + [0])
        top.d.comb += getattr(dut.worker.entry, f).eq(table[dut.worker.index - job.job * 4])
    rng = random.Random(width)
    # (all workers?, worker, PSN, chunk): a completed chunk, then one sent again to one worker.
    results = [(1, 0, 5, 5), (0, port, 2, 6), (1, 0, PSN_MOD - 1, 3)]
    payloads = [rng.randbytes(CHUNK) for _ in results]
    expected = [model._result_frame(port, psn, chunk, p, encode_imm(chunk, False))[1]
                for (every, w, psn, chunk), p in zip(results, payloads) if every or w == port]
    got, incs = [], []

    async def source(ctx):
        ctx.set(dut.ports, sum(w.port << 2 * (job.job * 4 + k) for k, w in enumerate(job.workers)))
        ctx.set(dut.switch.mac, int.from_bytes(wire.mac_bytes(sw.spec.mac), "big"))
        ctx.set(dut.switch.ip, int.from_bytes(wire.ip_bytes(sw.spec.ip), "big"))
        ctx.set(dut.switch.pkey, sw.spec.pkey)
        for (every, w, psn, chunk), p in zip(results, payloads):
            while not ctx.get(dut.space):
                await ctx.tick()
            beats = [p[k:k + nb] for k in range(0, CHUNK, nb)]
            for k, b in enumerate(beats):
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.p, {"data": int.from_bytes(b, "little"), "fp": 0, "promoted": 0, "first": k == 0,
                                  "last": k == len(beats) - 1,
                                  "desc": {"job": job.job, "worker": w, "all": every, "workers": 2, "chunk": chunk,
                                           "ring": chunk % job.slots, "translated": 1, "psn": psn}})
                await ctx.tick()
            ctx.set(dut.i.valid, 0)

    async def sink(ctx):
        pause = iter(lambda: int(rng.random() < 0.3), 2)
        for _ in expected:
            got.append(await get_frame(ctx, dut.o, width, pause))

    async def watch(ctx):
        async for _, _, inc in ctx.tick().sample(dut.worker.psn_inc):
            incs.append(inc)

    _sim(top, source, sink, processes=[watch])
    assert got == expected
    assert not any(incs)  # Mode II keeps no result PSN per worker


# -- the slot engine with Mode II frames ----------------------------------------------------------------------

def _engine_traffic(n, slots, seed, frames):
    """Mode II frames (worker, PSN, chunk, lanes) for hosts that mostly keep the rules, run through the model
    switch: the frames, what the model sent (worker, PSN, VA, payload), its counters and its job."""
    sw, job = _switch(n, slots)
    model = sw.modes[job.job]
    rng, sent = random.Random(seed), [0] * n
    out, sent_frames = [], []
    for _ in range(frames):
        w = rng.randrange(n)
        psn, chunk = _frame(rng, sent, model.expected[w], w, slots, back=0.4)
        psn %= PSN_MOD
        lanes = np.array([rng.randrange(-1000, 1000) for _ in range(CHUNK // 4)], ">i4")
        ws = job.workers[w]
        to = rc.Address(eth_dst=wire.mac_bytes(sw.spec.mac), eth_src=wire.mac_bytes(ws.mac),
                        ip_src=wire.ip_bytes(ws.ip), ip_dst=wire.ip_bytes(sw.spec.ip),
                        udp_sport=qp_udp_sport(ws.qpn), dest_qpn=job.qpn(w), rkey=job.rkey)
        pkt = Packet(Opcode.RC_RDMA_WRITE_ONLY, psn, lanes.tobytes(), True, chunk * CHUNK, CHUNK)
        for _, f in sw.receive(ws.port, rc.encode(pkt, to)):
            qpn, r = rc.decode(f)
            out.append((next(v for v, x in enumerate(job.workers) if x.qpn == qpn), r.psn, r.va, r.payload))
        sent_frames.append((w, psn, chunk, lanes))
    return sent_frames, out, sw, job


@pytest.mark.parametrize("width, n, slots, seed", [(512, 3, 4, 1), (64, 2, 8, 2), (256, 4, 2, 3)])
def test_engine_takes_mode_ii_frames_as_the_model(width, n, slots, seed):
    frames, expected, sw, job = _engine_traffic(n, slots, seed, 150)
    dut = SlotEngine(width, CHUNK, 8, 4, psn_jobs=2)
    nb = width // 8
    got, counted = EngineResults(job, CHUNK, width), {c: 0 for c in Counter}

    async def feed(ctx):
        ctx.set(dut.can_start, 1)
        while not ctx.get(dut.i.ready):
            await ctx.tick()
        for w, psn, chunk, lanes in frames:
            raw = lanes.tobytes()
            ctx.set(dut.i.p.desc, {"job": job.job, "worker": w, "chunk": chunk, "slot": job.slot_base + psn % slots,
                                   "workers": n, "slots": slots, "translated": 1, "psn": psn})
            for k in range(0, CHUNK, nb):
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.p.data, int.from_bytes(raw[k:k + nb], "little"))
                ctx.set(dut.i.p.last, k + nb == CHUNK)
                await ctx.tick().until(dut.i.ready)
            ctx.set(dut.i.valid, 0)
        await ctx.tick().repeat(dut.lag + 8)
        for e, k in zip(sw.modes[job.job].entries, range(job.slot_base, job.slot_base + slots)):
            meta = ctx.get(dut.slot_meta.data[k])
            assert (meta.psn, meta.chunk, meta.bitmap, meta.count, meta.state == SlotState.DONE) == \
                (e.psn, e.chunk, e.bitmap, e.count, e.done), k

    async def watch(ctx):
        async for _, _, valid, p, events in ctx.tick().sample(dut.o.valid, dut.o.p, dut.events):
            for c in Counter:
                counted[c] += events >> c & 1
            if valid:
                got.take(p)

    _sim(dut, feed, processes=[watch])
    assert got.results == expected
    for c in (Counter.RX_CONTRIB, Counter.COMPLETED, Counter.DUP_CONTRIB, Counter.TX_RESENDS, Counter.DROP_PSN_AHEAD,
              Counter.DROP_STALE, Counter.DROP_WINDOW, Counter.DROP_BAD_ADDRESS):
        assert counted[c] == sw.counters[c], c


@pytest.mark.parametrize("width, idle", [(64, 0.2), (512, 0.2), (64, 0.0)])
def test_frame_mux_keeps_frames_whole_and_in_order_and_takes_turns(width, idle):
    dut = FrameMux(width)
    rng = random.Random(width)
    frames = {name: [bytes([k]) * rng.randrange(60, 200) for k in range(base, base + 12)]
              for name, base in (("a", 0), ("b", 100))}
    got = []

    def feeder(name):
        async def feed(ctx):
            gaps = iter(lambda: int(rng.random() < idle), 2)
            for frame in frames[name]:
                await put_frame(ctx, getattr(dut, name), frame, width, gaps)
        return feed

    async def sink(ctx):
        pause = iter(lambda: int(rng.random() < 0.3), 2)
        for _ in range(24):
            frame = await get_frame(ctx, dut.o, width, pause)
            assert len(set(frame)) == 1  # one input's frame, whole
            got.append(frame)

    _sim(dut, feeder("a"), feeder("b"), sink)
    assert [f for f in got if f[0] < 100] == frames["a"] and [f for f in got if f[0] >= 100] == frames["b"]
    if not idle:  # both inputs always have a frame waiting: they take turns
        sides = [f[0] < 100 for f in got]
        assert all(x != y for x, y in zip(sides, sides[1:])), sides


@pytest.mark.parametrize("ports, engine", [(1, False), (3, False), (1, True), (3, True)])
def test_ack_router_brings_each_ack_to_its_workers_port_in_order(ports, engine):
    """With ``engine``: the ports' Mode III ACKs (``augmented``) go to the slot engine, and the engine's own
    answers (source ``ports``) to their workers' ports; every source's ACKs keep their order at each output."""
    workers, jobs, bits = 4, 2, 2
    where = {(j, w): (j + w) % ports for j in range(jobs) for w in range(workers)}
    dut = AckRouter(ports=ports, jobs=jobs, workers=workers, port_bits=bits, engine=engine)
    rng = random.Random(ports + 10 * engine)
    sources = ports + engine
    sent = {k: [(rng.randrange(jobs), rng.randrange(workers), 100 * k + n,
                 int(engine and (k == ports or rng.random() < 0.4))) for n in range(40)] for k in range(sources)}
    outputs = ports + engine
    got = {q: [] for q in range(outputs)}
    outs = [dut.o[q] for q in range(ports)] + ([dut.engine] if engine else [])

    def dest(k, a):
        return ports if a[3] and k < ports else where[a[:2]]

    def source(k):
        async def feed(ctx):
            ctx.set(dut.ports_of, sum(p << bits * (j * workers + w) for (j, w), p in where.items()))
            port = dut.own if k == ports else dut.i[k]
            for job, worker, psn, augmented in sent[k]:
                while (k < ports and not ctx.get(dut.room[k])) or rng.random() < 0.3:
                    await ctx.tick()
                ctx.set(port.valid, 1)
                ctx.set(port.p, {"job": job, "worker": worker, "psn": psn, "augmented": augmented})
                await ctx.tick()
                if k == ports:
                    while not ctx.get(port.ready):
                        await ctx.tick()
                ctx.set(port.valid, 0)
        return feed

    async def sink(ctx):
        for _ in range(1500):
            for o in outs:
                ctx.set(o.ready, int(rng.random() < 0.5))
            await ctx.tick()
        assert sum(map(len, got.values())) == sum(map(len, sent.values()))

    async def watch(ctx):
        async for _, _, *xs in ctx.tick().sample(*[o.valid for o in outs], *[o.ready for o in outs],
                                                 *[o.p for o in outs]):
            for q in range(outputs):
                if xs[q] and xs[outputs + q]:
                    p = xs[2 * outputs + q]
                    got[q].append((p.job, p.worker, p.psn, p.augmented))

    _sim(dut, *[source(k) for k in range(sources)], sink, processes=[watch])
    for q in range(outputs):
        mine = [a for k in range(sources) for a in sent[k] if dest(k, a) == q]
        assert sorted(got[q], key=lambda a: a[2]) == sorted(mine, key=lambda a: a[2])
        for k in range(sources):  # each source's ACKs keep their order
            assert [a for a in got[q] if a in sent[k]] == [a for a in sent[k] if dest(k, a) == q]
    if engine:
        assert got[ports] and any(a[3] for q in range(ports) for a in got[q])
