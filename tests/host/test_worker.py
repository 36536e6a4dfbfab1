"""The sans-IO worker: window rule, retransmission with backoff, duplicates, FP32 results, chunk sequence."""

import numpy as np
import pytest

from inagg.host.controller import Controller, plan
from inagg.host.link import Faults
from inagg.host.memnet import MemoryNetwork
from inagg.host.worker import (
    AllReduce, ChunkTimeoutError, LengthMismatchError, RttEstimator, Timing, Worker, agreement_chunks,
)
from inagg.models import arith
from inagg.models.protocol import Counter
from inagg.models.switch import ModelSwitch

PLAN = plan([2], window=2, chunk_bytes=256)
SW, JOB = PLAN.switch, PLAN.jobs[0]
L = SW.lanes


class Batch:
    """A Worker with one batch, as a MemoryNetwork endpoint."""

    def __init__(self, worker, lanes):
        self.worker, self.lanes = worker, lanes

    done = property(lambda self: self.worker.done)
    deadline = property(lambda self: self.worker.deadline)

    def start(self, now):
        return self.worker.submit(now, self.lanes)

    def receive(self, now, frame):
        return self.worker.receive(now, frame)

    def on_timer(self, now):
        return self.worker.on_timer(now)


def switch():
    sw = ModelSwitch(SW)
    Controller(sw, PLAN).configure()
    return sw


def lanes(k, seed):
    return np.random.default_rng(seed).integers(-1000, 1000, (k, L)).astype(np.int32)


def test_window_limits_outstanding_chunks():
    w = Worker(SW, JOB, 0)
    assert len(w.submit(0.0, lanes(5, 0))) == JOB.window == 2
    assert w.deadline == pytest.approx(Timing().timeout)


def test_results_free_the_window_in_order():
    sw = switch()
    ws = [Worker(SW, JOB, r) for r in range(2)]
    data = [lanes(3, r) for r in range(2)]
    sent = [w.submit(0.0, d) for w, d in zip(ws, data)]
    results = [f for r in range(2) for f in sw.receive(r, sent[r][0])]
    assert len(results) == 2
    more = ws[0].receive(1.0, results[0][1])
    assert len(more) == 1 and ws[0]._low == 1


def test_timeout_resends_with_backoff_then_fails_naming_chunk_and_worker():
    t = Timing(timeout=1.0, backoff=2.0, max_timeout=3.0, tries=4)
    w = Worker(SW, JOB, 1, timing=t, first_chunk=41)
    first = w.submit(0.0, lanes(1, 0))
    deadlines = [w.deadline]
    for _ in range(3):
        assert w.on_timer(deadlines[-1] - 1e-9) == []
        assert w.on_timer(deadlines[-1]) == first  # the same frame, byte for byte
        deadlines.append(w.deadline)
    assert np.diff([0.0] + deadlines).tolist() == [1.0, 2.0, 3.0, 3.0]
    with pytest.raises(ChunkTimeoutError, match=r"job 1 worker 1: no result for chunk 41 after 4 tries"):
        w.on_timer(deadlines[-1])
    assert w.stats["resent"] == 3


def test_the_rtt_estimator_follows_rfc_6298_within_its_floor_and_cap():
    e = RttEstimator(Timing(timeout=1.0, max_timeout=4.0, min_timeout=0.01))
    assert e.rto == 1.0 and e.srtt is None
    e.sample(0.1)  # the first sample: SRTT = R, RTTVAR = R / 2
    assert (e.srtt, e.rttvar, e.rto) == pytest.approx((0.1, 0.05, 0.3))
    e.sample(0.2)  # then RTTVAR = 3/4 RTTVAR + 1/4 |SRTT - R|, SRTT = 7/8 SRTT + 1/8 R
    assert (e.srtt, e.rttvar, e.rto) == pytest.approx((0.1125, 0.0625, 0.3625))
    e.sample(10.0)
    assert e.rto == 4.0  # max_timeout caps it
    for _ in range(200):
        e.sample(0.0)
    assert e.rto == 0.01  # min_timeout is the floor
    fixed = RttEstimator(Timing(timeout=1.0, max_timeout=4.0, estimate=False))
    fixed.sample(0.1)
    assert fixed.rto == 1.0 and fixed.srtt is None


def test_a_sample_rearms_chunks_sent_once_and_a_resent_chunk_gives_none():
    sw = switch()
    t = Timing(timeout=1.0, max_timeout=4.0, min_timeout=0.01)
    ws = [Worker(SW, JOB, r, timing=t) for r in range(2)]
    sent = [w.submit(0.0, lanes(2, r)) for r, w in enumerate(ws)]
    res = dict(f for r in range(2) for f in sw.receive(r, sent[r][0]))
    assert ws[0].receive(0.002, res[0]) == []
    # SRTT 2 ms, RTTVAR 1 ms: RTO 6 ms, raised to the 10 ms floor; chunk 1, sent at 0, now times out then.
    assert ws[0].rtt.srtt == pytest.approx(0.002) and ws[0].deadline == pytest.approx(0.01)
    # Karn's rule: worker 1 resent both chunks, so the result of chunk 0 measures nothing.
    assert ws[1].deadline == 1.0 and ws[1].on_timer(1.0) == sent[1]
    ws[1].receive(1.5, res[1])
    assert ws[1].rtt.srtt is None and ws[1].deadline == pytest.approx(1.0 + 2.0)


@pytest.mark.parametrize("early", [0, 1, 3])
def test_a_chunk_overtaken_by_later_results_is_resent_once_before_its_timer(early):
    p = plan([2], window=8, chunk_bytes=256)
    sw = ModelSwitch(p.switch)
    Controller(sw, p).configure()
    ws = [Worker(p.switch, p.jobs[0], r, timing=Timing(timeout=1.0, max_timeout=4.0, early=early)) for r in range(2)]
    sent = [w.submit(0.0, np.zeros((6, p.switch.lanes), np.int32)) for w in ws]
    # Worker 0's contribution of chunk 0 is lost; chunks 1..5 complete and their results reach worker 0.
    results = [f for c in range(1, 6) for r in range(2) for port, f in sw.receive(r, sent[r][c]) if port == 0]
    again = [ws[0].receive(0.1, f) for f in results]
    resent_at = [i + 1 for i, out in enumerate(again) if out]
    assert resent_at == ([] if not early else [early]) and ws[0].stats["resent_early"] == (1 if early else 0)
    if early:  # the resend is chunk 0's contribution itself, and its timer moved on with a doubled timeout
        assert again[early - 1] == [sent[0][0]] and ws[0].deadline == pytest.approx(0.1 + 2.0)
        assert sw.receive(1, sent[1][0]) == []
        assert [port for port, _ in sw.receive(0, again[early - 1][0])] == [0, 1]


def test_duplicate_and_unexpected_results_are_ignored_and_counted():
    sw = switch()
    ws = [Worker(SW, JOB, r) for r in range(2)]
    first = [w.submit(0.0, lanes(2, r)) for r, w in enumerate(ws)]
    res = [f for r in range(2) for f in sw.receive(r, first[r][0])]
    ws[0].receive(0.0, res[0][1])
    ws[0].receive(0.0, res[0][1])
    assert ws[0].stats["duplicate"] == 1
    # The result of chunk 0 is not expected by a worker whose batch starts at chunk 5.
    late = Worker(SW, JOB, 0, first_chunk=5)
    late.submit(0.0, lanes(1, 0))
    late.receive(0.0, res[0][1])
    assert late.stats["unexpected"] == 1 and late.stats["results"] == 0
    ws[1].receive(0.0, res[0][1])  # addressed to worker 0
    assert ws[1].stats[Counter.DROP_UNKNOWN_QPN] == 1


def run(endpoints, **kw):
    return MemoryNetwork(switch(), **kw).run(endpoints)


def test_fp32_results_are_accepted():
    big = np.full((2, L), 2**31 - 10, np.int32)
    eps = {r: Batch(Worker(SW, JOB, r), big) for r in range(2)}
    run(eps)
    words, fp32, _ = eps[0].worker.results()
    assert fp32.all() and eps[0].worker.stats["fp32_results"] == 2
    for row in words.view(np.float32):
        assert np.array_equal(row, arith.aggregate(np.stack([big[0], big[0]])))


@pytest.mark.parametrize("first", [0, 2**32 - 3])
def test_chunk_sequence_runs_on_across_batches_and_wraps(first):
    data = [[lanes(3, 10 * r + b) for b in range(2)] for r in range(2)]
    ws = [Worker(SW, JOB, r, first_chunk=first) for r in range(2)]
    for b in range(2):
        run({r: Batch(ws[r], data[r][b]) for r in range(2)})
        assert ws[0].base == (first + 3 * b) % 2**32
        assert np.array_equal(ws[0].results()[0].view(np.int32), data[0][b] + data[1][b])
    assert ws[0].next_chunk == (first + 6) % 2**32


def test_exact_sums_under_faults():
    data = [lanes(40, r) for r in range(2)]
    eps = {r: Batch(Worker(SW, JOB, r, timing=Timing(timeout=1e-4)), data[r]) for r in range(2)}
    stats = run(eps, faults=Faults(loss=0.1, dup=0.1, reorder=0.2, corrupt=0.05), seed=3)
    assert stats.link["lost"] and stats.link["duplicated"] and stats.link["corrupted"]
    for r in range(2):
        assert np.array_equal(eps[r].worker.results()[0].view(np.int32), data[0] + data[1])


def test_submit_checks_its_input_and_the_previous_batch():
    w = Worker(SW, JOB, 0)
    with pytest.raises(ValueError, match=r"lanes must be int32 of shape \(k, 64\), not float32 \(1, 64\)"):
        w.submit(0.0, np.zeros((1, L), np.float32))
    w.submit(0.0, lanes(1, 0))
    with pytest.raises(RuntimeError, match="worker 0: the previous batch is not complete"):
        w.submit(0.0, lanes(1, 0))
    with pytest.raises(ValueError, match=r"first_chunk must be an integer in 0..2\*\*32-1, not -1"):
        Worker(SW, JOB, 0, first_chunk=-1)


@pytest.mark.parametrize("kw, match", [
    (dict(timeout=0), "timeout must be a positive number, not 0"),
    (dict(backoff=0.5), "backoff must be a number >= 1, not 0.5"),
    (dict(timeout=2.0, max_timeout=1.0), r"max_timeout must be a number >= timeout \(2.0\), not 1.0"),
    (dict(tries=0), "tries must be a positive integer, not 0"),
    (dict(early=-1), "early must be a non-negative integer, not -1"),
    (dict(min_timeout=0), r"min_timeout must be None or a number in \(0, max_timeout\], not 0"),
    (dict(min_timeout=1.0, max_timeout=0.5), r"min_timeout must be None or a number in \(0, max_timeout\], not 1.0"),
])
def test_timing_is_validated(kw, match):
    with pytest.raises(ValueError, match=match):
        Timing(**kw)


def test_timing_estimate_must_be_a_bool():
    with pytest.raises(TypeError, match="estimate must be a bool, not int"):
        Timing(estimate=1)


def allreduce(data, **kw):
    ops = {r: AllReduce(Worker(SW, JOB, r), d) for r, d in enumerate(data)}
    run(ops, **kw)
    return ops


@pytest.mark.parametrize("n", [0, 1, L - 1, L, 3 * L + 5])
def test_allreduce_sums_any_length(n):
    rng = np.random.default_rng(n)
    data = [(rng.standard_normal(n) * 100).astype(np.float32) for _ in range(2)]
    ops = allreduce(data)
    ref = data[0].astype(np.float64) + data[1]
    for op in ops.values():
        assert op.result().shape == (n,)
        assert np.all(np.abs(op.result() - ref) <= op.error_bound() + 2.0**-24 * np.abs(ref))
    assert ops[0].worker.next_chunk == agreement_chunks(L) + -(-n // L)


def test_allreduce_of_zeros_and_tiny_values():
    tiny = np.float32(2.0**-100)  # the scale goes up to its ceiling, 2**126, and the sum is exact
    ops = allreduce([np.zeros(5, np.float32), np.full(5, tiny)])
    assert ops[1].exponent == 126 and np.array_equal(ops[1].result(), np.full(5, tiny))
    assert allreduce([np.zeros(3, np.float32)] * 2)[0].exponent == 0


def test_mismatched_lengths_fail_on_every_rank():
    ops = {r: AllReduce(Worker(SW, JOB, r), np.ones(n, np.float32)) for r, n in enumerate((10, 12))}
    with pytest.raises(LengthMismatchError, match=r"job 1 worker 0: the ranks passed arrays of different lengths "
                                                  r"\(this rank 10 elements; they differ in bit 1\)"):
        run(ops)


@pytest.mark.parametrize("data, err, match", [
    (np.ones(3, np.float64), TypeError, "allreduce takes a float32 array, not float64"),
    (np.ones((2, 2), np.float32), ValueError, r"allreduce takes a 1-D array, not shape \(2, 2\)"),
    (np.array([1, np.nan, np.inf], np.float32), ValueError, r"data holds NaN or infinity \(first at index 1\)"),
])
def test_allreduce_refuses_bad_data(data, err, match):
    with pytest.raises(err, match=match):
        AllReduce(Worker(SW, JOB, 0), data)



def test_quantized_chunks_match_whole_tensor_quantization():
    from inagg.host.worker import QuantizedChunks
    from inagg.models import quant

    data = np.random.default_rng(1).standard_normal(3 * L + 7).astype(np.float32)
    q = QuantizedChunks(data, 20, L)
    padded = np.zeros(4 * L, np.float32)
    padded[:data.size] = data
    whole = quant.quantize(padded, 20).reshape(4, L)
    assert q.shape == (4, L)
    assert np.array_equal(np.concatenate([q[0:1], q[1:4]]), whole)
    with pytest.raises(ValueError, match="QuantizedChunks takes contiguous row slices"):
        q[0:4:2]


@pytest.mark.parametrize("amax, lane", [(1.0, 127), (np.nextafter(np.float32(2), np.float32(0)), 127),
                                        (2.0**-149, 0), (3e38, 254)])
def test_agreement_lane_is_the_exponent_of_amax(amax, lane):
    flat = AllReduce(Worker(SW, JOB, 0), np.array([0, -amax], np.float32))._agreement_lanes().ravel()
    assert np.flatnonzero(flat[:256]).tolist() == [lane]
