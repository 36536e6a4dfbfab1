"""The host library against the P4 profile switch: zero-ICRC results from Tofino, SATURATED results resent."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from inagg.host.api import Group
from inagg.host.controller import Controller, plan
from inagg.host.fastpath import ResultParser
from inagg.host.memnet import MemoryNetwork
from inagg.host.worker import MAX_RESCALES, AllReduce, ChunkTimeoutError, SaturatedResultError, Timing, Worker, \
    agreement_chunks
from inagg.models import icrc
from inagg.models.p4profile import TNA, V1MODEL, P4ProfileSwitch
from inagg.models.protocol import CONTRIB_HDR_LEN, ETH_LEN, IPV4_LEN, UDP_LEN, BTH_LEN, Counter

TIMING = Timing(timeout=1e-4, max_timeout=1e-3, tries=8)
AGREE = agreement_chunks(64)  # chunks of the agreement round at C = 256
_VA = ETH_LEN + IPV4_LEN + UDP_LEN + BTH_LEN


def setup(target, workers=3, out_of_bound=None):
    """A job's plan, its configured P4 profile switch (see :class:`OutOfBound`) and each rank's data."""
    p = plan([workers], window=4, chunk_bytes=256)
    sw = OutOfBound(target, p.switch, out_of_bound) if out_of_bound else P4ProfileSwitch(target, p.switch)
    Controller(sw, p).configure()
    rng = np.random.default_rng(7)
    # Integers on the grid of every scale used here: any wrong lane shows in the sum.
    data = [rng.integers(-50, 50, 300).astype(np.float32) for _ in range(workers)]
    return p, sw, data


def run(p, sw, data, **worker_kw):
    job = p.jobs[0]
    ops = {w.port: AllReduce(Worker(p.switch, job, r, timing=TIMING, **worker_kw), data[r])
           for r, w in enumerate(job.workers)}
    MemoryNetwork(sw).run(ops)
    return ops


def exact(data):
    return np.sum(data, axis=0, dtype=np.float64).astype(np.float32)


# -- results with an ICRC field of zero (Tofino) ------------------------------


def test_tofino_results_are_taken_and_counted_with_the_opt_in():
    p, sw, data = setup(TNA)
    ops = run(p, sw, data, accept_zero_icrc=True)
    for op in ops.values():
        assert np.array_equal(op.result(), exact(data))
        st = op.worker.stats
        assert st["zero_icrc"] == st["results"] + st["duplicate"] > 0
        assert st[Counter.DROP_BAD_ICRC] == 0


def test_tofino_results_are_dropped_by_default_and_the_worker_times_out():
    p, sw, data = setup(TNA)
    job = p.jobs[0]
    ops = {w.port: AllReduce(Worker(p.switch, job, r, timing=TIMING), data[r]) for r, w in enumerate(job.workers)}
    with pytest.raises(ChunkTimeoutError, match=r"no result for chunk 0 after 8 tries"):
        MemoryNetwork(sw).run(ops)
    assert ops[job.workers[0].port].worker.stats[Counter.DROP_BAD_ICRC] > 0


def test_bmv2_results_carry_a_real_icrc_and_need_no_opt_in():
    p, sw, data = setup(V1MODEL)
    for op in run(p, sw, data).values():
        assert np.array_equal(op.result(), exact(data))
        assert op.worker.stats["zero_icrc"] == 0


def result_frame():
    """One valid result for worker 0 of a single-worker job, from the model switch."""
    p, sw, _ = setup(V1MODEL, workers=1)
    job = p.jobs[0]
    frame = Worker(p.switch, job, 0).template.build(np.array([0]), np.ones((1, 64), np.int32))[0].tobytes()
    [(_, out)] = sw.receive(job.workers[0].port, frame)
    return p, job, out


def test_only_a_zero_icrc_field_is_accepted():
    p, job, out = result_frame()
    strict = ResultParser(p.switch, job, 0)
    lenient = ResultParser(p.switch, job, 0, accept_zero_icrc=True)
    good = strict.parse(out)
    assert not good.zero_icrc and not lenient.parse(out).zero_icrc
    zero = out[:-4] + bytes(4)
    assert strict.parse(zero) == Counter.DROP_BAD_ICRC
    r = lenient.parse(zero)
    assert r.zero_icrc and r.chunk30 == good.chunk30 and np.array_equal(r.words, good.words)
    wrong = out[:-4] + bytes([out[-4] ^ 1]) + out[-3:]
    assert lenient.parse(wrong) == Counter.DROP_BAD_ICRC
    # The opt-in skips the ICRC only: a zero-ICRC frame with a bad header is still refused.
    bad_rkey = bytearray(zero)
    bad_rkey[_VA + 8] ^= 1
    assert lenient.parse(bytes(bad_rkey)) == Counter.DROP_BAD_RKEY


def test_accept_zero_icrc_must_be_a_bool():
    p, job, _ = result_frame()
    with pytest.raises(TypeError, match="accept_zero_icrc must be a bool, not int"):
        ResultParser(p.switch, job, 0, accept_zero_icrc=1)
    with pytest.raises(TypeError, match="accept_zero_icrc must be a bool, not str"):
        Group(p.switch, job, 0, port=None, accept_zero_icrc="yes")


# -- SATURATED results: the operation is resent at a smaller scale -----------


class OutOfBound(P4ProfileSwitch):
    """The P4 profile switch, with worker 0's lane 0 of some chunks set to INT32_MAX on the way in.

    This is a rank whose data breaks the bound it agreed on (the only way an
    honest job's sum saturates): the switch's own arithmetic then pins the
    lane and flags the result.
    """

    def __init__(self, target, spec, chunks):
        super().__init__(target, spec)
        self.chunks = chunks

    def receive(self, port, frame):
        chunk = struct.unpack_from("!Q", frame, _VA)[0] // self.spec.chunk_bytes
        if port == 0 and self.chunks(chunk):
            f = bytearray(frame)
            f[CONTRIB_HDR_LEN:CONTRIB_HDR_LEN + 4] = (2**31 - 1).to_bytes(4, "big")
            frame = bytes(f[:-4]) + icrc.icrc(bytes(f[:-4]))
        return super().receive(port, frame)


@pytest.mark.parametrize("target", [V1MODEL, TNA], ids=lambda t: t.name)
def test_a_saturated_operation_is_resent_at_half_the_scale(target):
    p, sw, data = setup(target, out_of_bound=lambda c: c == AGREE + 1)
    ops = run(p, sw, data, accept_zero_icrc=not target.checks_icrc)
    n_data = -(-300 // 64)
    exps = set()
    for op in ops.values():
        assert np.array_equal(op.result(), exact(data))
        assert op.rescales == 1 and op.worker.stats["rescaled"] == 1
        exps.add(op.exponent)
        # The agreement round, the saturated data batch and its resend, each on chunk sequences of its own.
        assert op.worker.next_chunk == AGREE + 2 * n_data
    assert len(exps) == 1
    assert sw.counters[Counter.PROMOTED] == 1  # PROMOTED counts SATURATED completions in the P4 profile


def test_the_resent_operation_uses_the_agreed_scale_minus_one():
    p, sw, data = setup(V1MODEL)
    agreed = {op.exponent for op in run(p, sw, data).values()}
    assert len(agreed) == 1 and (agreed := agreed.pop()) > 0
    p, sw, data = setup(V1MODEL, out_of_bound=lambda c: c == AGREE)
    for op in run(p, sw, data).values():
        assert op.exponent == agreed - 1
        assert op.error_bound() == 3 * 2.0 ** -agreed


def test_saturation_that_does_not_go_away_is_an_error():
    p, sw, data = setup(V1MODEL, out_of_bound=lambda c: c >= AGREE)
    with pytest.raises(SaturatedResultError,
                       match=rf"saturated chunk \d+ at scale 2\*\*-?\d+, after {MAX_RESCALES} resends at smaller "
                             "scales: ranks or switch disagree with the agreed scale"):
        run(p, sw, data)


def test_a_saturated_agreement_round_is_an_error():
    p, sw, data = setup(V1MODEL, out_of_bound=lambda c: c == 0)
    with pytest.raises(SaturatedResultError, match="saturated chunk 0 of the agreement round, whose lanes count workers"):
        run(p, sw, data)
