"""The exception engine in the Amaranth simulator against the model switch's exception path.

Every test sends its requests through :func:`check`, which compares each
response and the engine's whole state at the end (table entries, stash
order, free list order, counters) with :class:`Reference`, then asserts that
the corner the test is about really happened in the model. The long seeded
random streams run on Verilator (``tests/cocotb/test_exception.py``).
"""

import dataclasses
import gc
import itertools
import warnings
import zlib

import numpy as np
import pytest
from amaranth.sim import Simulator

from inagg.hdl.exception import ExceptionEngine, KeyHash, Op, Status
from inagg.models.cuckoo import hashes, make_key
from inagg.testbench.exception.drive import simulate
from inagg.testbench.exception.reference import Reference
from inagg.testbench.exception.stimulus import keys_with, random_requests

JOBS, SLOTS = 1024, 64  # keys to choose from: 2**16, so every pair of positions has many


def check(table, max_kicks, stash, requests, depth=16, key_width=32, **drive):
    """Run ``requests`` ((op, key) pairs) on engine and reference; assert they agree; return both."""
    ops = np.array([op.value for op, _ in requests])
    keys = np.array([key for _, key in requests], np.uint32)
    ref = Reference(table, max_kicks, stash, JOBS, SLOTS)
    want = [ref.request(op, key) for op, key in requests]
    run = simulate(ExceptionEngine(table, max_kicks, stash, key_width=key_width, depth=depth), ops, keys, **drive)
    for i, ((status, ptr), got) in enumerate(zip(want, run.responses)):
        assert got == (status, ptr, int(keys[i])), f"request {i} {requests[i][0].name} 0x{keys[i]:08x}: " \
                                                   f"engine {got}, model {(status, ptr)}"
    diff = ref.state().diff(run.state)
    assert not diff, diff
    assert run.stalls == run.held
    return ref, run, want


def locate(*keys):
    return [(Op.LOCATE, int(k)) for k in keys]


def fill_until(table, max_kicks, stash, stop, tries=100):
    """Random LOCATEs of fresh keys and DELETEs of present ones (one in four) on an empty table, up to
    and including the first LOCATE for which ``stop(ref, before, answer)`` holds (``before``: the
    model's counters before it); a new seed whenever a key is refused first."""
    candidates = keys_with(table, JOBS, SLOTS)
    for seed in range(tries):
        rng = np.random.default_rng(seed)
        ref = Reference(table, max_kicks, stash, JOBS, SLOTS)
        requests, present = [], []
        for key in rng.choice(candidates, 8 * table + stash, replace=False):
            if present and rng.random() < 0.25:
                gone = present.pop(rng.integers(len(present)))
                ref.request(Op.DELETE, gone)
                requests.append((Op.DELETE, gone))
            before = dataclasses.asdict(ref.switch.exception.stats)
            answer = ref.request(Op.LOCATE, int(key))
            requests.append((Op.LOCATE, int(key)))
            if stop(ref, before, answer):
                return requests
            if answer[0] == Status.REFUSED:
                break
            present.append(int(key))
    raise AssertionError(f"no such insertion in {tries} tries")


# -- parameters --

@pytest.mark.parametrize("kwargs, message", [
    ({"table": 3}, "Table size must be a power of two from 2 to 65536, not 3"),
    ({"table": 1}, "Table size must be a power of two from 2 to 65536, not 1"),
    ({"table": 131072}, "Table size must be a power of two from 2 to 65536, not 131072"),
    ({"table": 8.0}, "Table size must be a power of two from 2 to 65536, not 8.0"),
    ({"max_kicks": -1}, "Kick-out bound must be an integer from 0 to 1024, not -1"),
    ({"max_kicks": True}, "Kick-out bound must be an integer from 0 to 1024, not True"),
    ({"stash": 65}, "Stash size must be an integer from 0 to 64, not 65"),
    ({"key_width": 22}, "Key width must be an integer from 23 to 32, not 22"),
    ({"key_width": 33}, "Key width must be an integer from 23 to 32, not 33"),
    ({"depth": 3}, "Queue depth must be an integer from 4 to 4096, not 3"),
    ({"domain": ""}, "Domain must be the name of a clock domain, not ''"),
])
def test_parameters_are_checked(kwargs, message):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the refused engine is, rightly, never elaborated
        with pytest.raises(ValueError, match=f"^{message}$"):
            ExceptionEngine(**kwargs)
        gc.collect()


def test_key_hash_parameters_are_checked():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="^Table size must be a power of two from 2 to 65536, not 0$"):
            KeyHash(0)
        with pytest.raises(ValueError, match="^Key width must be an integer from 1 to 32, not 0$"):
            KeyHash(8, 0)
        gc.collect()


# -- hashing --

@pytest.mark.parametrize("table", [2, 256, 65536])
def test_key_hash_is_the_model_hash(table):
    rng = np.random.default_rng(table)
    keys = [0, 1, 0xFFFFFFFF, 0x80000000, make_key(1, 5)] + [int(k) for k in rng.integers(0, 2**32, 300)]
    dut = KeyHash(table)
    got = []

    async def bench(ctx):
        for key in keys:
            ctx.set(dut.key, key)
            ctx.set(dut.load, 1)
            await ctx.tick()
            # Held while load is low, whatever the key input does.
            ctx.set(dut.load, 0)
            ctx.set(dut.key, key ^ 0x5A5A5A5A)
            await ctx.tick()
            got.append((ctx.get(dut.h0), ctx.get(dut.h1)))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert got == [hashes(k, table) for k in keys]
    crc = zlib.crc32(make_key(1, 5).to_bytes(4, "big"))
    assert got[4] == (crc & (table - 1), (crc >> 16) & (table - 1))


# -- lookups and direct inserts --

def test_miss_then_table0_then_table1_then_hits():
    a, b, c = (int(k) for k in keys_with(8, JOBS, SLOTS, h0=3)[:3])
    ref, _, want = check(8, 3, 2, [(Op.LOOKUP, a), (Op.LOCATE, a), (Op.LOOKUP, a), (Op.LOCATE, a),
                                   (Op.LOCATE, b), (Op.LOOKUP, b), (Op.LOOKUP, c)])
    assert [s for s, _ in want] == [Status.MISS, Status.INSERTED, Status.HIT, Status.HIT, Status.INSERTED,
                                    Status.HIT, Status.MISS]
    assert ref.switch.exception.where(a) == ("t0", 3) and ref.switch.exception.where(b)[0] == "t1"
    assert [p for _, p in want[:6]] == [0, 0, 0, 0, 1, 1]


def test_stash_hit_and_lookup_does_not_insert():
    # max_kicks 0: a key whose positions are both taken goes straight to the stash.
    a, b, c = (int(k) for k in keys_with(8, JOBS, SLOTS, h0=1, h1=6)[:3])
    ref, _, want = check(8, 0, 2, [*locate(a, b), (Op.LOOKUP, c), *locate(c), (Op.LOOKUP, c), *locate(c)])
    assert [s for s, _ in want] == [Status.INSERTED, Status.INSERTED, Status.MISS, Status.INSERTED, Status.HIT,
                                    Status.HIT]
    assert [ref.switch.exception.where(k) for k in (a, b, c)] == [("t0", 1), ("t1", 6), ("stash", 0)]
    assert want[4][1] == 2


# -- kick-out chains --

@pytest.mark.parametrize("kicks", range(1, 7))
def test_kick_chain_of_each_length(kicks):
    requests = fill_until(8, 6, 2, lambda ref, before, a: a[0] == Status.INSERTED
                          and ref.switch.exception.stats.kicks - before["kicks"] == kicks)
    check(8, 6, 2, requests)


def test_failed_chain_goes_to_the_stash_with_the_table_unchanged():
    requests = fill_until(8, 4, 2, lambda ref, before, a: ref.switch.exception.stats.stashed > before["stashed"])
    ref = Reference(8, 4, 2, JOBS, SLOTS)
    for op, key in requests[:-1]:
        ref.request(op, key)
    tables_before = ref.state().tables
    ref.request(*requests[-1])
    assert ref.state().tables == tables_before  # the walk was undone in the model too
    check(8, 4, 2, requests)


def test_stash_full_is_refused_and_nothing_changes():
    requests = fill_until(8, 4, 1, lambda ref, before, a: ref.switch.exception.stats.refused > before["refused"])
    ref, run, want = check(8, 4, 1, requests[:-1])
    ref2, run2, want2 = check(8, 4, 1, requests)
    assert want2[-1] == (Status.REFUSED, 0)
    after = dict(run2.state.stats, refused=run2.state.stats["refused"] - 1)
    assert (run2.state.tables, run2.state.stash, run2.state.free, after) == \
           (run.state.tables, run.state.stash, run.state.free, run.state.stats)


def test_no_kicks_and_no_stash():
    # T = 2 without a stash: a key whose two positions are taken is refused at once, with room elsewhere.
    requests = fill_until(2, 0, 0, lambda ref, before, a: a[0] == Status.REFUSED and not ref.full)
    ref, _, want = check(2, 0, 0, requests)
    assert want[-1] == (Status.REFUSED, 0) and len(ref.switch.exception) < 4


# -- the free list --

def test_full_refusal_and_a_freed_pointer_reused_at_once():
    # Fill T = 2 with a stash of 1 (5 entries), then refuse, delete, and insert back to back.
    rng = np.random.default_rng(3)
    keys = [int(k) for k in rng.permutation(keys_with(2, JOBS, SLOTS))[:400]]
    ref = Reference(2, 8, 1, JOBS, SLOTS)
    placed, requests = [], []
    for k in keys:
        if len(placed) == ref.switch.exception.capacity:
            break
        requests.append((Op.LOCATE, k))
        if ref.request(Op.LOCATE, k)[0] == Status.INSERTED:
            placed.append(k)
    fresh = next(k for k in keys if k not in placed)
    requests += [*locate(fresh), (Op.DELETE, placed[2]), *locate(placed[2]), (Op.DELETE, placed[0]),
                 (Op.DELETE, placed[1]), *locate(placed[0])]
    ref, run, want = check(2, 8, 1, requests)
    assert want[-6][0] == Status.REFUSED and ref.full >= 1
    assert want[-4] == (Status.INSERTED, want[-5][1])  # the pointer freed by the request before
    assert want[-1] == (Status.INSERTED, want[-3][1])
    assert run.state.stats["full"] == ref.full


# -- delete and teardown --

def test_delete_from_each_place_and_the_stash_closes_up():
    requests = fill_until(8, 0, 3, lambda ref, before, a: len(ref.switch.exception.stash_entries) == 3)
    ref = Reference(8, 0, 3, JOBS, SLOTS)
    for r in requests:
        ref.request(*r)
    cuckoo = ref.switch.exception
    t0 = next(e[0] for e in cuckoo.tables[0] if e)
    t1 = next(e[0] for e in cuckoo.tables[1] if e)
    middle = cuckoo.stash_entries[1][0]
    last = cuckoo.stash_entries[2][0]
    requests += [(Op.DELETE, middle), (Op.DELETE, middle), (Op.DELETE, t0), (Op.DELETE, t1),
                 (Op.LOOKUP, last), *locate(middle)]
    ref, run, want = check(8, 0, 3, requests)
    assert [s for s, _ in want[-6:]] == [Status.DELETED, Status.MISS, Status.DELETED, Status.DELETED, Status.HIT,
                                         Status.INSERTED]
    assert ref.switch.exception.where(last) == ("stash", 1)


def test_teardown_frees_a_job_in_index_order():
    rng = np.random.default_rng(7)
    job = 5
    own = [make_key(job, int(i)) for i in rng.permutation(SLOTS)[:20]]
    others = [int(k) for k in rng.permutation(keys_with(8, JOBS, SLOTS))[:6]]
    requests = locate(*rng.permutation(own + others).tolist())
    ref = Reference(8, 4, 3, JOBS, SLOTS)
    for r in requests:
        ref.request(*r)
    where = {ref.switch.exception.where(k)[0] for k in own if ref.switch.exception.where(k)}
    assert where == {"t0", "t1", "stash"}
    fresh = [make_key(job + 1, i) for i in range(8)]
    requests += [(Op.TEARDOWN, make_key(job, SLOTS - 1)), *[(Op.LOOKUP, k) for k in own[:3]], *locate(*fresh)]
    ref, run, want = check(8, 4, 3, requests)
    n = len(requests) - 8 - 3 - 1
    assert want[n] == (Status.DONE, 0)
    assert all(s == Status.MISS for s, _ in want[n + 1:n + 4])
    assert not any(k >> 22 == job for k, _ in ref.switch.exception_entries())


# -- rate and backpressure --

def test_one_lookup_per_cycle_and_its_latency():
    keys = [int(k) for k in keys_with(16, JOBS, SLOTS)[:12]]
    requests = locate(*keys) + [(Op.LOOKUP, keys[i % 12]) for i in range(200)] + [(Op.DELETE, k) for k in keys]
    gap = itertools.chain([0] * 12, [1] * 40, itertools.repeat(0))  # past the sweep, then back to back
    _, run, _ = check(16, 4, 2, requests, gaps=gap)
    assert np.all(np.diff(run.accepted[12:]) == 1) and np.all(np.diff(run.answered[12:]) == 1)
    assert {b - a for a, b in zip(run.accepted[12:], run.answered[12:])} == {6}


def test_backpressure_both_ways_is_counted_and_loses_nothing():
    ops, keys = random_requests(np.random.default_rng(11), 400, 4, SLOTS, phase=100)
    rng = np.random.default_rng(12)
    pause = iter(rng.random(100_000) < 0.6)
    gaps = iter(rng.random(100_000) < 0.2)
    requests = [(Op(int(o)), int(k)) for o, k in zip(ops, keys)]
    _, run, _ = check(8, 4, 2, requests, depth=4, gaps=gaps, pause=pause)
    assert run.stalls > 100  # the queue filled up: the stream was held, and counted


def test_narrow_keys():
    # 24-bit keys (jobs 0 to 3): stored narrower, hashed as the model's 32-bit keys.
    ops, keys = random_requests(np.random.default_rng(51), 300, 4, SLOTS, phase=75)
    check(8, 4, 2, [(Op(int(o)), int(k)) for o, k in zip(ops, keys)], key_width=24)


def test_random_stream_past_saturation():
    ops, keys = random_requests(np.random.default_rng(21), 1200, 8, SLOTS, phase=300)
    ref, run, _ = check(16, 6, 2, [(Op(int(o)), int(k)) for o, k in zip(ops, keys)])
    s = run.state.stats
    assert s["kicks"] and s["stashed"] and s["refused"] and s["full"] and s["deletes"]


@pytest.mark.parametrize("period", [2.3e-8, 0.7e-8])
def test_engine_in_a_clock_domain_of_its_own(period):
    # The same answers and state whether the engine's clock is slower or faster than the streams'.
    ops, keys = random_requests(np.random.default_rng(31), 300, 4, SLOTS, phase=100)
    requests = [(Op(int(o)), int(k)) for o, k in zip(ops, keys)]
    ref = Reference(8, 4, 2, JOBS, SLOTS)
    want = [ref.request(*r) for r in requests]
    engine = ExceptionEngine(8, 4, 2, depth=8, domain="exc")
    pause = iter(np.random.default_rng(32).random(100_000) < 0.3)
    run = simulate(engine, ops, keys, pause=pause, engine_period=period)
    assert [(s, p) for s, p, _ in run.responses] == want
    diff = ref.state().diff(run.state)
    assert not diff, diff
    assert run.stalls == run.held


@pytest.mark.parametrize("domain", ["sync", "exc"])
def test_reset_leaves_the_engine_as_new(domain):
    # A full table, a stash in use and counters running, then a reset: the requests after it are
    # answered as by a new engine (the sweep empties the tables and refills the free list).
    rng = np.random.default_rng(41)
    fill = rng.permutation(keys_with(8, JOBS, SLOTS))[:40]
    before = (np.full(len(fill), Op.LOCATE.value), fill)
    ops, keys = random_requests(np.random.default_rng(42), 200, 4, SLOTS, phase=50)
    ref = Reference(8, 4, 2, JOBS, SLOTS)
    want = [ref.request(Op(int(o)), int(k)) for o, k in zip(ops, keys)]
    run = simulate(ExceptionEngine(8, 4, 2, domain=domain), ops, keys, before=before)
    assert [(s, p) for s, p, _ in run.responses] == want
    diff = ref.state().diff(run.state)
    assert not diff, diff
