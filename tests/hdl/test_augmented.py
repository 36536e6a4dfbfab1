"""Mode III's gateware blocks (hdl/augmented.py) against the model's AugmentedJob (models/modes.py), frame by frame."""

import dataclasses
import gc
import itertools
import warnings

import numpy as np
import pytest
from amaranth import Module
from amaranth.hdl import UnusedElaboratable
from amaranth.lib import wiring
from amaranth.sim import Simulator
from hypothesis import given, settings, strategies as st

from inagg.hdl.arbiter import FrameArbiter
from inagg.hdl.augmented import AugmentedRules, ResendFrames, ResultAcks, augmented_events
from inagg.hdl.engine import SlotEngine
from inagg.hdl.translated import PsnTable
from inagg.models import rc
from inagg.models.job import Mode, SwitchSpec
from inagg.models.protocol import Counter
from inagg.models.rc import PSN_MOD, Ack
from inagg.models.switch import ModelSwitch
from inagg.testbench.streams import EngineResults
from inagg.testbench.traffic import make_job, rc_ack, rc_contribution

CHUNK = 256
OUTCOMES = ("add", "store", "complete", "dup", "ahead", "busy", "bad_address", "ack", "nak")
META = ("psn", "chunk", "bitmap", "count", "done")  # the rules' slot fields; the model's entry has "acked" too
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
            e.psn, e.chunk, e.bitmap, e.count, e.done, e.acked = (meta[k] for k in (*META, "acked"))
            e.held = bool(meta["done"])
            ctx.set(dut.meta, {k: meta[k] for k in META})
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
            after = {k: ctx.get(getattr(dut.new, k)) if "add" in outcome else meta[k] for k in META}
            assert after == dict(psn=e.psn, chunk=e.chunk, bitmap=e.bitmap, count=e.count, done=int(e.done)), case
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


def _acks_follow_the_model(n, slots, base, actions):
    """Run ``actions`` through the model switch and :class:`ResultAcks`: ("round",) sends every child's next
    PSN (the model completes it: the block sees ``done``), ("ack", w, d, nak) child ``w``'s ACK (or NAK
    sequence error) of its oldest unACKed result PSN plus ``d``. After each, every slot that holds a result
    must have the model's ACK bitmap and be free exactly when the model's is, and a NAK must ask for the
    results the model sends again. Returns how many results went again."""
    spec = SwitchSpec(ports=4, slots=16, chunk_bytes=CHUNK)
    sw = ModelSwitch(spec)
    job = dataclasses.replace(make_job(spec, 1, n, base, slots), mode=Mode.AUGMENTED)
    sw.add_job(job)
    model = sw.modes[job.job]
    dut = ResultAcks(jobs=2, workers=n, depth=16)
    everyone = (1 << n) - 1
    resent = []

    async def settle(ctx):
        while not ctx.get(dut.ack.ready) or ctx.get(dut.resend.valid):
            if ctx.get(dut.resend.valid):
                resent.append({k: ctx.get(getattr(dut.resend.p, k)) for k in ("job", "worker", "first", "end")})
            await ctx.tick()

    async def bench(ctx):
        ctx.set(dut.resend.ready, 1)
        await settle(ctx)
        psn = 0
        for action in actions:
            if action[0] == "round":
                if model.entries[psn % slots].bitmap:
                    continue  # the slot is busy: the model would drop the round
                out = []
                for w in range(n):
                    out += sw.receive(job.workers[w].port, _contribution(sw, job, w, psn, psn))
                assert model.next_result == psn + 1
                ctx.set(dut.done.valid, 1)
                ctx.set(dut.done.p, dict(job=job.job, psn=psn, slot=base + psn % slots, workers=n, base=base, slots=slots))
                await ctx.tick()
                ctx.set(dut.done.valid, 0)
                psn += 1
            else:
                _, w, d, nak = action
                q = (model.acked[w] + d) % PSN_MOD
                syndrome = rc.Syndrome.NAK_SEQ if nak else rc.Syndrome.ACK
                before = sw.counters[Counter.HOP_RESENDS]
                sw.receive(job.workers[w].port, rc_ack(spec, job, w, Ack(q, syndrome, q)))
                again = sw.counters[Counter.HOP_RESENDS] - before
                ctx.set(dut.ack.valid, 1)
                ctx.set(dut.ack.p, dict(job=job.job, worker=w, psn=q, syndrome=syndrome))
                await ctx.tick()
                ctx.set(dut.ack.valid, 0)
                resent.clear()
                await settle(ctx)
                want = [dict(job=job.job, worker=w, first=q, end=model.next_result)] if again else []
                assert resent == want, (action, resent, again)
                if again:
                    assert (want[0]["end"] - q) % PSN_MOD == again
            await ctx.tick()
            for s, e in enumerate(model.entries):
                if not e.held:
                    continue
                ctx.set(dut.look_addr, base + s)
                await ctx.tick()
                word = {k: ctx.get(getattr(dut.look, k)) for k in ("psn", "acked")}
                assert word == dict(psn=e.psn, acked=e.acked), (action, s, word)
                assert (word["acked"] == everyone) == (e.bitmap == 0), (action, s)

    _sim(dut, bench)
    return sw.counters[Counter.HOP_RESENDS]


def _ack_actions(n):
    act = st.one_of(st.just(("round",)),
                    st.tuples(st.just("ack"), st.integers(0, n - 1), st.integers(-2, 4), st.booleans()))
    return st.lists(act, min_size=1, max_size=30)


def test_result_acks_free_a_slot_only_when_the_slowest_child_acked():
    actions = [("round",), ("round",), ("ack", 0, 1, False), ("round",),   # child 0 ACKs PSNs 0 and 1 at once
               ("ack", 1, 0, False), ("round",), ("round",),               # PSN 0 free: PSN 2's slot again
               ("ack", 1, 1, True),                                        # NAK of 2: PSNs 2 and 3 again
               ("ack", 1, 5, False), ("ack", 0, -1, False),                # beyond the results, behind: nothing
               ("ack", 0, 1, False), ("ack", 1, 0, True), ("ack", 1, 1, False), ("round",)]
    assert _acks_follow_the_model(2, 2, 4, actions) > 0


@settings(max_examples=20, deadline=None)
@given(_ack_actions(3))
def test_result_acks_follow_the_model_on_random_runs(actions):
    _acks_follow_the_model(3, 4, 0, actions)


async def _completed(ctx, dut, n):
    """:class:`ResultAcks` of one job (two children, eight slots from 0) out of its sweep, its resend requests
    taken, with results 0 to ``n - 1`` completed two cycles apart."""
    ctx.set(dut.resend.ready, 1)
    while not ctx.get(dut.ack.ready):
        await ctx.tick()
    for p in range(n):
        ctx.set(dut.done.valid, 1)
        ctx.set(dut.done.p, dict(job=0, psn=p, slot=p, workers=2, base=0, slots=8))
        await ctx.tick()
        ctx.set(dut.done.valid, 0)
        await ctx.tick()


def test_result_acks_hold_a_completion_that_meets_a_walk():
    """A completion in a walk's write cycle waits a cycle and still lands (two children, eight slots)."""
    dut = ResultAcks(jobs=1, workers=2, depth=8)

    async def bench(ctx):
        await _completed(ctx, dut, 3)
        ctx.set(dut.ack.valid, 1)
        ctx.set(dut.ack.p, dict(job=0, worker=0, psn=2, syndrome=rc.Syndrome.ACK))
        await ctx.tick()
        ctx.set(dut.ack.valid, 0)
        # IDLE, CHECK, RANGE, then READ/WRITE per slot: a completion at every cycle of the walk's parity.
        for k in range(8):
            if k % 2 == 1:
                ctx.set(dut.done.valid, 1)
                ctx.set(dut.done.p, dict(job=0, psn=3 + k // 2, slot=3 + k // 2, workers=2, base=0, slots=8))
            await ctx.tick()
            ctx.set(dut.done.valid, 0)
        for _ in range(4):
            await ctx.tick()
        # Once the held one has landed, a completion outside any walk goes straight in.
        ctx.set(dut.done.valid, 1)
        ctx.set(dut.done.p, dict(job=0, psn=7, slot=7, workers=2, base=0, slots=8))
        await ctx.tick()
        ctx.set(dut.done.valid, 0)
        await ctx.tick()
        words = []
        for s in range(8):
            ctx.set(dut.look_addr, s)
            await ctx.tick()
            words.append((ctx.get(dut.look.psn), ctx.get(dut.look.acked)))
        assert words == [(0, 1), (1, 1), (2, 1), (3, 0), (4, 0), (5, 0), (6, 0), (7, 0)], words

    _sim(dut, bench)


# -- the slot engine with Mode III frames ---------------------------------------------------------------------

def _engine_actions(n, slots, seed, count):
    """Mode III traffic for hosts that mostly keep the rules, run through the model switch: per action the
    input (("frame", w, psn, chunk, lanes) or ("ack", w, psn, syndrome)) and what the model sent for it:
    the ACKs and NAKs (worker, PSN, syndrome, MSN), the results (worker, PSN, VA, payload), and after an ACK
    the results sent again (worker, PSN)."""
    sw, job = _switch(n, slots)
    model = sw.modes[job.job]
    rng, sent = np.random.default_rng(seed), [0] * n
    qpns = {ws.qpn: v for v, ws in enumerate(job.workers)}
    actions = []
    for _ in range(count):
        w = int(rng.integers(n))
        if rng.random() < 0.3 and model.next_result != model.acked[w]:
            q = (model.acked[w] + int(rng.integers(-1, 3))) % PSN_MOD
            syndrome = rc.Syndrome.NAK_SEQ if rng.random() < 0.25 else rc.Syndrome.ACK
            inp = ("ack", w, q, syndrome)
            frame = rc_ack(sw.spec, job, w, Ack(q, syndrome, q))
        else:
            r = rng.random()
            if r < 0.15:
                sent[w] = model.expected[w]  # the host's Go-Back-N after a drop
            off = sent[w] + (0 if r < 0.75 else -int(rng.integers(1, 3)) if r < 0.9 else int(rng.integers(1, 3)))
            if off == sent[w] and sent[w] - min(sent) < slots:
                sent[w] += 1
            psn = off % PSN_MOD
            chunk = (off + (slots if rng.random() < 0.04 else 0)) % (1 << 30)
            lanes = rng.integers(-1000, 1000, CHUNK // 4).astype(">i4")
            inp = ("frame", w, psn, chunk, lanes)
            frame = rc_contribution(sw.spec, job, w, psn, chunk, lanes)
        acks, results = [], []
        for _, f in sw.receive(job.workers[w].port, frame):
            qpn, r = rc.decode(f)
            if isinstance(r, Ack):
                acks.append((qpns[qpn], r.psn, r.syndrome, r.msn))
            else:
                results.append((qpns[qpn], r.psn, r.va, r.payload))
        actions.append((inp, acks, results))
    return actions, sw, job


def test_result_acks_free_an_acks_slots_all_at_once():
    """A slot freed by an ACK that walks three slots shows as free only when the walk is over, not once its own
    word is written: the ACK takes effect in one cycle, as the model's does."""
    dut = ResultAcks(jobs=1, workers=2, depth=8)
    seen = []

    async def bench(ctx):
        await _completed(ctx, dut, 3)
        for w in (0, 1):
            while not ctx.get(dut.ack.ready):
                await ctx.tick()
            ctx.set(dut.ack.valid, 1)
            ctx.set(dut.ack.p, dict(job=0, worker=w, psn=2, syndrome=rc.Syndrome.ACK))
            await ctx.tick()
            ctx.set(dut.ack.valid, 0)
        ctx.set(dut.look_addr, 0)
        for _ in range(14):
            await ctx.tick()
            seen.append((ctx.get(dut.look.acked) == 3 and not ctx.get(dut.look_held), ctx.get(dut.ack.ready)))

    _sim(dut, bench)
    free = [f for f, _ in seen]
    first = free.index(True)
    assert not any(free[:first]) and all(free[first:]), seen
    assert seen[first + 2][1], seen  # the walk was over: two cycles on (SETTLE, NAK) the block takes an ACK


@pytest.mark.parametrize("at, included", [(4, True), (5, True), (6, False)])
def test_result_acks_nak_sends_again_up_to_the_results_completed_when_it_takes_effect(at, included):
    """A NAK that walks one slot takes effect the cycle its walk ends (5 cycles after it was taken: CHECK,
    RANGE, READ, WRITE, SETTLE), which ``took`` tells two cycles later; its Go-Back-N reaches every result
    completed by then, one completing in that very cycle too, and none after."""
    dut = ResultAcks(jobs=1, workers=2, depth=8)
    seen = {}

    async def bench(ctx):
        await _completed(ctx, dut, 2)
        ctx.set(dut.ack.valid, 1)
        ctx.set(dut.ack.p, dict(job=0, worker=0, psn=1, syndrome=rc.Syndrome.NAK_SEQ))  # ACKs 0, NAKs 1
        took = []
        for k in range(12):
            ctx.set(dut.done.valid, k == at)
            ctx.set(dut.done.p, dict(job=0, psn=2, slot=2, workers=2, base=0, slots=8))
            if ctx.get(dut.resend.valid):
                seen["resend"] = (ctx.get(dut.resend.p.first), ctx.get(dut.resend.p.end))
            took.append(ctx.get(dut.took))
            await ctx.tick()
            ctx.set(dut.ack.valid, 0)
        seen["took"] = [k for k, t in enumerate(took) if t]

    _sim(dut, bench)
    assert seen["resend"] == (1, 3 if included else 2), seen
    assert seen["took"] == [7], seen


def _first_timer(done_at=None):
    """Child 0 ACKs result 0 at once, child 1 never (timeout 40 cycles): the cycle of the first timer request
    (child 1's) and its range, with result 1 completing at cycle ``done_at``."""
    dut = ResultAcks(jobs=1, workers=2, depth=8)
    seen, expired = [], []

    async def bench(ctx):
        ctx.set(dut.timeout, 40)
        await _completed(ctx, dut, 1)
        ctx.set(dut.ack.valid, 1)
        ctx.set(dut.ack.p, dict(job=0, worker=0, psn=0, syndrome=rc.Syndrome.ACK))
        await ctx.tick().until(dut.ack.ready)
        ctx.set(dut.ack.valid, 0)
        for k in range(400):
            ctx.set(dut.done.valid, k == done_at)
            ctx.set(dut.done.p, dict(job=0, psn=1, slot=1, workers=2, base=0, slots=8))
            if ctx.get(dut.resend.valid) and not seen:
                seen.append((k, ctx.get(dut.resend.p.first), ctx.get(dut.resend.p.end), ctx.get(dut.resend.p.timer)))
            if ctx.get(dut.expired):
                expired.append((k, ctx.get(dut.expired_job), ctx.get(dut.expired_worker)))
            await ctx.tick()

    _sim(dut, bench)
    assert expired[0] == (seen[0][0] + 1, 0, 1), (expired, seen)  # AGE + 2: child 1, the one that never ACKed
    return seen[0]


def test_result_acks_timer_sends_again_up_to_the_results_completed_when_it_decided():
    """A timer decides in the cycle before its request (AGE), which ``expired`` tells two cycles later: its
    Go-Back-N reaches a result completing in that cycle, not one completing the cycle after."""
    k, first, end, timer = _first_timer()
    assert (first, end, timer) == (0, 1, 1)
    assert _first_timer(k - 1)[1:] == (0, 2, 1)
    assert _first_timer(k)[1:] == (0, 1, 1)


def _timers_follow_the_model(n, slots, timeout, actions):
    """Run ``actions`` (("round",), ("ack", w, d, nak) as :func:`_acks_follow_the_model`, and ("wait", k): k
    cycles) through the model switch on the cycle clock and through :class:`ResultAcks` with ``timeout``.
    Every result request must be the model's: a NAK's at once, a timer's no earlier than the model's
    deadline for that child and no later than one round of the block's visits after it, each then run out in
    the model (``expire``); no model deadline may pass that long unserved. Returns the timers run out."""
    spec = SwitchSpec(ports=4, slots=16, chunk_bytes=CHUNK)
    sw = ModelSwitch(spec)
    job = dataclasses.replace(make_job(spec, 1, n, 0, slots), mode=Mode.AUGMENTED)
    sw.add_job(job)
    model = sw.modes[job.job]
    model.timeout = timeout
    jobs = 2
    dut = ResultAcks(jobs=jobs, workers=n, depth=16)
    late = 3 * (jobs << 6) + 2 * slots + 16  # a round of visits, and an ACK's walk before its stamp
    fired, naks, cycle = [], [], 0

    async def step(ctx, cycles=1):
        nonlocal cycle
        for _ in range(cycles):
            sw.now = cycle
            if ctx.get(dut.resend.valid):
                r = {k: ctx.get(getattr(dut.resend.p, k)) for k in ("worker", "first", "end", "timer")}
                w = r["worker"]
                if r["timer"]:
                    t = model.timers[w]
                    assert t is not None and t <= cycle <= t + late, (r, t, cycle)
                    assert (r["first"], r["end"]) == (model.acked[w], model.next_result), r
                    assert len(model.expire(w)) == (r["end"] - r["first"]) % PSN_MOD
                    fired.append(w)
                else:
                    naks.append(r)
            for w, t in enumerate(model.timers):
                assert t is None or cycle <= t + late, ("missed", w, t, cycle)
            await ctx.tick()
            cycle += 1

    async def bench(ctx):
        ctx.set(dut.resend.ready, 1)
        ctx.set(dut.timeout, timeout)
        while ctx.get(dut.busy):
            await step(ctx)
        psn = 0
        for action in actions:
            if action[0] == "round":
                if model.entries[psn % slots].bitmap:
                    continue
                sw.now = cycle
                for w in range(n):
                    sw.receive(job.workers[w].port, _contribution(sw, job, w, psn, psn))
                ctx.set(dut.done.valid, 1)
                ctx.set(dut.done.p, dict(job=job.job, psn=psn, slot=psn % slots, workers=n, base=0, slots=slots))
                await step(ctx)
                ctx.set(dut.done.valid, 0)
                psn += 1
            elif action[0] == "ack":
                _, w, d, nak = action
                q = (model.acked[w] + d) % PSN_MOD
                syndrome = rc.Syndrome.NAK_SEQ if nak else rc.Syndrome.ACK
                sw.now = cycle
                before = sw.counters[Counter.HOP_RESENDS]
                sw.receive(job.workers[w].port, rc_ack(spec, job, w, Ack(q, syndrome, q)))
                again = sw.counters[Counter.HOP_RESENDS] - before
                ctx.set(dut.ack.valid, 1)
                ctx.set(dut.ack.p, dict(job=job.job, worker=w, psn=q, syndrome=syndrome))
                while True:
                    ready = ctx.get(dut.ack.ready)
                    await step(ctx)
                    if ready:
                        break
                ctx.set(dut.ack.valid, 0)
                naks.clear()
                await step(ctx, 2 * slots + 8)
                assert [(r["worker"], r["first"], r["end"]) for r in naks] == \
                    ([(w, q, model.next_result)] if again else [])
            else:
                await step(ctx, action[1])

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return fired


def test_result_acks_time_out_as_the_model():
    """A child that never ACKs is sent its results again every timeout; one that ACKs stops its timer."""
    # The timeout is longer than a round of visits (3 cycles for each of 128 entries), so a timer that
    # did not start again when it ran out would run out again too early.
    actions = [("round",), ("round",), ("ack", 0, 1, False), ("wait", 2500), ("ack", 1, 0, False),
               ("wait", 2500), ("ack", 1, 0, True), ("wait", 2000), ("ack", 1, 0, False), ("round",),
               ("wait", 4000), ("ack", 0, 0, False), ("ack", 1, 0, False), ("wait", 4000),
               ("round",), ("wait", 300), ("ack", 1, 0, True), ("wait", 2500)]  # a NAK's resend restarts it
    fired = _timers_follow_the_model(2, 2, 800, actions)
    assert fired.count(1) >= 3 and 0 in fired, fired


@settings(max_examples=15, deadline=None)
@given(st.lists(st.one_of(st.just(("round",)),
                          st.tuples(st.just("ack"), st.integers(0, 2), st.integers(-1, 3), st.booleans()),
                          st.tuples(st.just("wait"), st.integers(1, 1500))), min_size=1, max_size=25))
def test_result_acks_time_out_as_the_model_on_random_runs(actions):
    _timers_follow_the_model(3, 4, 700, actions + [("wait", 2500)])


class _EngineTop(wiring.Component):
    """The slot engine behind a two-input FrameArbiter, its Go-Back-N requests back in as ResendFrames: the
    place the switch gives them (input 0 stands for the ports)."""

    def __init__(self, width):
        self.engine = SlotEngine(width, CHUNK, 16, 4, psn_jobs=2, augmented=True)
        self.arbiter = FrameArbiter(width, 16, 2)
        self.again = ResendFrames(width, CHUNK, 16)
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.engine, m.submodules.arbiter, m.submodules.again = self.engine, self.arbiter, self.again
        wiring.connect(m, self.arbiter.o, self.engine.i)
        wiring.connect(m, self.again.o, self.arbiter.i[1])
        wiring.connect(m, self.engine.resend, self.again.i)
        return m


@pytest.mark.parametrize("width, n, slots, seed", [(512, 3, 4, 1), (64, 2, 2, 2), (256, 4, 4, 3)])
def test_engine_takes_mode_iii_frames_as_the_model(width, n, slots, seed):
    """Contributions and the children's ACKs of results, with the reply queue's reader pausing: every ACK and
    NAK, result (those sent again on a NAK too), Go-Back-N request and counter is the model's; a slot is
    taken again only once the slowest child ACKed its result (``DROP_BUFFER_BUSY`` until then)."""
    actions, sw, job = _engine_actions(n, slots, seed, 160)
    top = _EngineTop(width)
    dut, port = top.engine, top.arbiter.i[0]
    nb = width // 8
    replies, results, resends = [], EngineResults(job, CHUNK, width), []
    counted = {c: 0 for c in Counter}
    rng = np.random.default_rng(seed)

    async def feed(ctx):
        ctx.set(dut.can_start, 1)
        while not ctx.get(port.ready):
            await ctx.tick()
        for (inp, *_), nxt in itertools.zip_longest(actions, actions[1:]):
            if inp[0] == "frame":
                _, w, psn, chunk, lanes = inp
                raw = lanes.tobytes()
                ctx.set(port.p.desc, {"job": job.job, "worker": w, "chunk": chunk, "slot": job.slot_base + psn % slots,
                                      "workers": n, "slots": slots, "translated": 1, "augmented": 1, "psn": psn})
                for k in range(0, CHUNK, nb):
                    ctx.set(port.valid, 1)
                    ctx.set(port.p.data, int.from_bytes(raw[k:k + nb], "little"))
                    ctx.set(port.p.last, k + nb == CHUNK)
                    await ctx.tick().until(port.ready)
                ctx.set(port.valid, 0)
            else:
                _, w, q, syndrome = inp
                ctx.set(dut.result_ack.valid, 1)
                ctx.set(dut.result_ack.p, dict(job=job.job, worker=w, psn=q, syndrome=syndrome))
                await ctx.tick().until(dut.result_ack.ready)
                ctx.set(dut.result_ack.valid, 0)
            if inp[0] == "ack" or nxt is None or nxt[0][0] == "ack":
                # A child ACKs a result only once it has it, and the model sends results again at once: let
                # the frames before, and those sent again, finish.
                await ctx.tick().repeat(dut.lag + 8)
                while not ctx.get(dut.result_ack.ready) or ctx.get(dut.resend.valid) or ctx.get(top.again.o.valid):
                    await ctx.tick()
                await ctx.tick().repeat(dut.lag + 8)
        await ctx.tick().repeat(dut.lag + 40)

    async def watch(ctx):
        async for _, _, valid, p, events, r_valid, r_ready, r, s_valid, s_ready, s in ctx.tick().sample(
                dut.o.valid, dut.o.p, dut.events, dut.reply.valid, dut.reply.ready, dut.reply.p, dut.resend.valid,
                dut.resend.ready, dut.resend.p):
            for c in Counter:
                counted[c] += events >> c & 1
            if valid:
                results.take(p)
            if r_valid and r_ready:
                replies.append((r.worker, r.psn, r.syndrome, r.msn))
            if s_valid and s_ready:
                resends.extend((s.worker, (s.first + k) % PSN_MOD) for k in range((s.end - s.first) % PSN_MOD))

    async def reader(ctx):
        async for _ in ctx.tick():
            ctx.set(dut.reply.ready, int(rng.random() < 0.2))

    sim = Simulator(top)
    sim.add_clock(1e-6)
    sim.add_testbench(feed)
    sim.add_process(watch)
    sim.add_process(reader)
    sim.run()
    assert replies == [a for _, acks, _ in actions for a in acks]
    assert results.results == [r for _, _, rs in actions for r in rs]
    again = [(v, psn) for inp, _, rs in actions if inp[0] == "ack" for v, psn, _, _ in rs]
    assert resends == again
    for c in (Counter.RX_CONTRIB, Counter.COMPLETED, Counter.DUP_CONTRIB, Counter.DROP_PSN_AHEAD,
              Counter.DROP_BUFFER_BUSY, Counter.DROP_BAD_ADDRESS, Counter.ACK_SENT, Counter.NAK_SENT,
              Counter.HOP_RESENDS):
        assert counted[c] == sw.counters[c], c
    # The traffic took every path: busy slots, gaps, duplicates, a slot reused after its ACKs, resends.
    for c in (Counter.DROP_BUFFER_BUSY, Counter.NAK_SENT, Counter.DUP_CONTRIB, Counter.HOP_RESENDS):
        assert sw.counters[c] > 0, c
    assert sw.counters[Counter.COMPLETED] > slots
