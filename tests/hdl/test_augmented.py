"""Mode III's gateware blocks (hdl/augmented.py) against the model's AugmentedJob (models/modes.py), frame by frame."""

import dataclasses
import gc
import itertools
import warnings

import numpy as np
import pytest
from amaranth.hdl import UnusedElaboratable
from amaranth.sim import Simulator
from hypothesis import given, settings, strategies as st

from inagg.hdl.augmented import AugmentedRules, augmented_events
from inagg.hdl.translated import PsnTable
from inagg.models import rc
from inagg.models.job import Mode, SwitchSpec
from inagg.models.protocol import Counter
from inagg.models.rc import PSN_MOD, Ack
from inagg.models.switch import ModelSwitch
from inagg.testbench.traffic import make_job, rc_contribution

CHUNK = 256
OUTCOMES = ("add", "store", "complete", "dup", "ahead", "busy", "bad_address", "ack", "nak")
META = ("psn", "chunk", "bitmap", "count", "done", "acked")
# The emitters and the lanes count these, not the rules.
UNCOUNTED = (Counter.TX_RESULTS, Counter.PROMOTED, Counter.RX_FRAMES)


def _sim(dut, *testbenches):
    sim = Simulator(dut)
    sim.add_clock(1e-6, if_exists=True)
    for bench in testbenches:
        sim.add_testbench(bench)
    sim.run()


def _switch(n, slots):
    sw = ModelSwitch(SwitchSpec(ports=4, slots=16, chunk_bytes=CHUNK))
    job = dataclasses.replace(make_job(sw.spec, 1, n, 0, slots), mode=Mode.AUGMENTED)
    sw.add_job(job)
    return sw, job


def _contribution(sw, job, w, psn, chunk):
    return rc_contribution(sw.spec, job, w, psn, chunk, np.full(CHUNK // 4, w + 1))


def _follow_the_model(n, slots, cases):
    """Decide each case (worker, its expected PSN and "NAK sent", the frame's PSN and chunk, the slot's metadata)
    with :class:`AugmentedRules` and with the model switch in the same state; both must do the same. Returns the
    outcomes seen."""
    sw, job = _switch(n, slots)
    model = sw.modes[job.job]
    dut = AugmentedRules(workers=n, slots=slots)
    counted = [c for c in Counter if c not in UNCOUNTED]
    seen = set()

    async def bench(ctx):
        for w, expected, nak_sent, psn, chunk, meta in cases:
            model.expected[w], model.nak_sent[w] = expected, bool(nak_sent)
            e = model.entries[psn % slots]
            e.psn, e.chunk, e.bitmap, e.count, e.done, e.acked = (meta[k] for k in META)
            e.held = bool(meta["done"])
            ctx.set(dut.meta, meta)
            ctx.set(dut.desc, dict(worker=w, psn=psn, chunk=chunk, workers=n, slots=slots))
            ctx.set(dut.expected, expected)
            ctx.set(dut.nak_sent, nak_sent)
            outcome = {name for name in OUTCOMES if ctx.get(getattr(dut.outcome, name))}
            strobes = {c for c, v in augmented_events(dut.outcome).items() if ctx.get(v)}
            before = {c: sw.counters[c] for c in Counter}
            out = sw.receive(job.workers[w].port, _contribution(sw, job, w, psn, chunk))
            case = (w, expected, nak_sent, psn, chunk, meta, outcome)
            delta = {c for c in counted if sw.counters[c] != before[c]}
            assert all(sw.counters[c] - before[c] == 1 for c in delta), case
            assert strobes == delta, case
            decoded = [rc.decode(f) for _, f in out]
            acks = [(qpn, a) for qpn, a in decoded if isinstance(a, Ack)]
            results = [a for _, a in decoded if not isinstance(a, Ack)]
            if outcome & {"ack", "nak"}:
                r = {k: ctx.get(getattr(dut.reply, k)) for k in ("psn", "syndrome", "msn")}
                assert acks == [(job.workers[w].qpn, Ack(r["psn"], r["syndrome"], r["msn"]))], case
            else:
                assert acks == [], case
            assert len(results) == n * ("complete" in outcome), case
            assert ctx.get(dut.slot) == psn % slots
            after = {k: ctx.get(getattr(dut.new, k)) for k in META} if "add" in outcome else meta
            assert after == dict(psn=e.psn, chunk=e.chunk, bitmap=e.bitmap, count=e.count, done=int(e.done),
                                 acked=e.acked), case
            entry = (ctx.get(dut.next_expected), ctx.get(dut.next_nak_sent)) if ctx.get(dut.write) \
                else (expected, nak_sent)
            assert entry == (model.expected[w], int(model.nak_sent[w])), case
            seen.update(outcome)

    _sim(dut, bench)
    return seen


def _metas(n, slots, psn, chunk):
    """Every slot state that matters to a contribution of (``psn``, ``chunk``): empty, or holding this PSN or
    the one ``slots`` ahead, this chunk or another, with any workers in, aggregating or done, ACKed or not."""
    yield dict(psn=0, chunk=0, bitmap=0, count=0, done=0, acked=0)
    for other, bitmap, done, wrong_chunk in itertools.product((0, 1), range(1, 1 << n), (0, 1), (0, 1)):
        yield dict(psn=(psn + other * slots) % PSN_MOD, chunk=chunk + wrong_chunk, bitmap=bitmap,
                   count=bitmap.bit_count(), done=done, acked=bitmap & 1 if done else 0)


@pytest.mark.parametrize("n, slots", [(2, 2), (3, 4)])
def test_rules_follow_the_model_over_every_small_case(n, slots):
    cases = [(w, expected, nak, (expected + d) % PSN_MOD, 7, meta)
             for w in range(n) for expected in (0, PSN_MOD - 1) for d in (-1, 0, 1, 2) for nak in (0, 1)
             for meta in _metas(n, slots, (expected + d) % PSN_MOD, 7)]
    assert _follow_the_model(n, slots, cases) == set(OUTCOMES)


def _cases(n, slots):
    psn = st.integers(0, PSN_MOD - 1)
    dist = st.one_of(st.integers(-3, 3), st.integers(-(1 << 23), (1 << 23) - 1))

    @st.composite
    def case(draw):
        w, expected, d = draw(st.integers(0, n - 1)), draw(psn), draw(dist)
        p = (expected + d) % PSN_MOD
        bitmap = draw(st.integers(0, (1 << n) - 1))
        done = draw(st.booleans()) and bitmap != 0
        meta = dict(psn=(p + slots * draw(st.sampled_from((0, 0, 1, -1)))) % PSN_MOD if bitmap else 0,
                    chunk=draw(st.sampled_from((p, p, p + slots))) % (1 << 30) if bitmap else 0,
                    bitmap=bitmap, count=bitmap.bit_count(), done=int(done),
                    acked=draw(st.integers(0, (1 << n) - 1)) & bitmap if done else 0)
        return w, expected, int(draw(st.booleans())), p, p % (1 << 30), meta

    return st.lists(case(), min_size=1, max_size=40)


@settings(max_examples=15, deadline=None)
@given(_cases(3, 8))
def test_rules_follow_the_model_on_random_cases_3_workers(cases):
    _follow_the_model(3, 8, cases)


@settings(max_examples=15, deadline=None)
@given(_cases(5, 2))
def test_rules_follow_the_model_on_random_cases_5_workers(cases):
    _follow_the_model(5, 2, cases)


@pytest.mark.parametrize("workers, slots, message", [
    (0, 4, "workers must be an integer from 1 to 64, not 0"),
    (65, 4, "workers must be an integer from 1 to 64, not 65"),
    (2, 6, r"slots must be a power of two from 2 to 2\*\*24, not 6"),
    (2, 1, r"slots must be a power of two from 2 to 2\*\*24, not 1"),
    (2, 1 << 25, r"slots must be a power of two from 2 to 2\*\*24, not 33554432"),
])
def test_rules_refuse_a_bad_size(workers, slots, message):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(ValueError, match=message):
            AugmentedRules(workers=workers, slots=slots)
        gc.collect()


@pytest.mark.parametrize("jobs", [1, 3])
def test_psn_table_keeps_the_nak_bit_beside_the_psn_and_clears_both(jobs):
    dut = PsnTable(jobs=jobs, nak=True)
    job = jobs - 1

    async def bench(ctx):
        while ctx.get(dut.busy):
            await ctx.tick()

        async def write(worker, psn, nak):
            ctx.set(dut.write_en, 1)
            ctx.set(dut.write_job, job)
            ctx.set(dut.write_worker, worker)
            ctx.set(dut.write_psn, psn)
            ctx.set(dut.write_nak, nak)
            await ctx.tick()
            ctx.set(dut.write_en, 0)

        async def read(worker):
            ctx.set(dut.read_en, 1)
            ctx.set(dut.read_job, job)
            ctx.set(dut.read_worker, worker)
            await ctx.tick()
            ctx.set(dut.read_en, 0)
            return ctx.get(dut.expected), ctx.get(dut.nak_sent)

        await write(3, PSN_MOD - 1, 1)
        await write(4, 5, 0)
        await write(5, 0, 1)
        assert [await read(3), await read(4), await read(5), await read(6)] == \
            [(PSN_MOD - 1, 1), (5, 0), (0, 1), (0, 0)]
        ctx.set(dut.clear, 1)
        ctx.set(dut.clear_job, job)
        await ctx.tick()
        ctx.set(dut.clear, 0)
        while ctx.get(dut.busy):
            await ctx.tick()
        assert [await read(3), await read(5)] == [(0, 0), (0, 0)]

    _sim(dut, bench)


def test_psn_table_without_the_nak_bit_has_no_such_member_and_refuses_a_non_bool():
    assert not hasattr(PsnTable(jobs=1), "nak_sent")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(TypeError, match="nak must be a bool, not 1"):
            PsnTable(jobs=1, nak=1)
        gc.collect()
