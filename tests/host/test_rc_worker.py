"""RC hosts (host/rc_worker.py) against the model switch in Modes I, II and III, end to end over the memory network."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inagg import cli
from inagg.host.controller import Controller, TreeController, plan, plan_tree
from inagg.host.link import Faults
from inagg.host.memnet import MemoryNetwork, TreeNetwork
from inagg.host.rc_worker import RcRetryError, RcWorker
from inagg.host.worker import AllReduce, Timing, Worker
from inagg.models import arith
from inagg.models.job import Mode
from inagg.models.protocol import Counter
from inagg.models.switch import ModelSwitch

TIMING = Timing(timeout=200e-6, max_timeout=20e-3, tries=30)


def setup(mode, workers=3, window=4):
    p = plan([workers], window=window, chunk_bytes=256)
    p = dataclasses.replace(p, jobs=tuple(dataclasses.replace(j, mode=mode) for j in p.jobs))
    sw = ModelSwitch(p.switch)
    Controller(sw, p).configure()
    return p, sw


class Chunks(RcWorker):
    """An RcWorker that sends one batch of int32 chunks when the network starts it."""

    def __init__(self, lanes, *args, **kw):
        super().__init__(*args, **kw)
        self.lanes = lanes

    def start(self, now):
        return self.submit(now, self.lanes)


@pytest.mark.parametrize("mode", [Mode.TERMINATED, Mode.TRANSLATED, Mode.AUGMENTED])
@pytest.mark.parametrize("faults", [Faults(), Faults(loss=0.05), Faults(dup=0.1), Faults(reorder=0.2),
                                    Faults(loss=0.03, dup=0.03, reorder=0.1)], ids=str)
def test_every_worker_gets_the_exact_sum_under_faults(mode, faults):
    p, sw = setup(mode)
    job = p.jobs[0]
    rng = np.random.default_rng(7)
    data = rng.integers(-2**28, 2**28, (3, 40, p.switch.lanes), dtype=np.int32)
    data[:, 5, 0] = 2**31 - 1  # one promoted chunk: FP32 results travel too
    eps = {w.port: Chunks(data[r], p.switch, job, r, timing=TIMING) for r, w in enumerate(job.workers)}
    MemoryNetwork(sw, faults=faults, seed=11).run(eps)
    expect = [arith.aggregate(data[:, c]) for c in range(40)]
    for ep in eps.values():
        words, fp32, _ = ep.results()
        assert fp32.tolist() == [c == 5 for c in range(40)]
        for c in range(40):
            assert (words[c].view(expect[c].dtype) == expect[c]).all()
    assert sw.counters[Counter.COMPLETED] == 40


@pytest.mark.parametrize("mode", [Mode.TERMINATED, Mode.AUGMENTED])
def test_modes_i_and_iii_repair_losses_on_the_hop(mode):
    p, sw = setup(mode)
    data = np.ones((3, 40, p.switch.lanes), np.int32)
    eps = {w.port: Chunks(data[r], p.switch, p.jobs[0], r, timing=TIMING) for r, w in enumerate(p.jobs[0].workers)}
    MemoryNetwork(sw, faults=Faults(loss=0.05), seed=2).run(eps)
    assert sw.counters[Counter.HOP_RESENDS] > 0 and sw.counters[Counter.ACK_REFLECTED] == 0


@pytest.mark.parametrize("mode", [Mode.TERMINATED, Mode.TRANSLATED, Mode.AUGMENTED])
def test_allreduce_over_rc_matches_the_uc_mode_bit_for_bit(mode):
    rng = np.random.default_rng(3)
    data = [rng.standard_normal(3000).astype(np.float32) for _ in range(3)]
    out = {}
    for m, kind in ((Mode.UC, Worker), (mode, RcWorker)):
        p, sw = setup(m)
        ops = {w.port: AllReduce(kind(p.switch, p.jobs[0], r, timing=TIMING), data[r])
               for r, w in enumerate(p.jobs[0].workers)}
        MemoryNetwork(sw, faults=Faults(loss=0.02, reorder=0.05), seed=5).run(ops)
        out[m] = [op.result() for op in ops.values()]
    for a, b in zip(out[Mode.UC], out[mode]):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


@settings(max_examples=30, deadline=None)
@given(loss=st.floats(0, 0.3), dup=st.floats(0, 0.1), reorder=st.floats(0, 0.2), corrupt=st.floats(0, 0.05),
       window=st.sampled_from([1, 2, 4]), seed=st.integers(0, 2**16))
def test_mode_i_under_random_faults_is_exact_or_fails_with_a_typed_error(loss, dup, reorder, corrupt, window, seed):
    p, sw = setup(Mode.TERMINATED, workers=2, window=window)
    job = p.jobs[0]
    data = np.random.default_rng(seed).integers(-2**20, 2**20, (2, 12, p.switch.lanes), dtype=np.int32)
    eps = {w.port: Chunks(data[r], p.switch, job, r, timing=Timing(timeout=200e-6, tries=6))
           for r, w in enumerate(job.workers)}
    try:
        MemoryNetwork(sw, faults=Faults(loss=loss, dup=dup, reorder=reorder, corrupt=corrupt), seed=seed).run(eps)
    except RcRetryError:
        return  # a clear error: a host's QP ran out of retries
    for ep in eps.values():
        words, fp32, _ = ep.results()
        assert ep.done and not fp32.any() and (words.view(np.int32) == data.sum(axis=0)).all()


def test_a_missing_worker_exhausts_the_retries_with_a_typed_error():
    p, sw = setup(Mode.TRANSLATED, workers=2)
    ep = Chunks(np.ones((2, p.switch.lanes), np.int32), p.switch, p.jobs[0], 0, timing=Timing(timeout=1e-3, tries=3))
    with pytest.raises(RcRetryError, match=r"job 1 worker 0: RC retry count exceeded: PSN 0 unacknowledged "
                                           r"after 2 retries \(ACK timeout\)"):
        MemoryNetwork(sw).run({p.jobs[0].workers[0].port: ep})


class LateChunks(Chunks):
    """A :class:`Chunks` that sends its batch ``late`` seconds after the network starts it: a rank that calls
    late."""

    def __init__(self, late, *args, **kw):
        super().__init__(*args, **kw)
        self.at = late

    def start(self, now):
        self.at += now
        return []

    @property
    def done(self):
        return self.at is None and super().done

    @property
    def deadline(self):
        return super().deadline if self.at is None else self.at

    def on_timer(self, now):
        if self.at is None:
            return super().on_timer(now)
        self.at = None
        return self.submit(now, self.lanes)


# Patience (timeout * tries) 3 ms of virtual time; 12 chunks are more than the job's 8 slots.
PATIENT = Timing(timeout=1e-3, max_timeout=1e-3, tries=3)
LONG = 12


@pytest.mark.parametrize("mode", [Mode.TERMINATED, Mode.TRANSLATED, Mode.AUGMENTED])
def test_a_missing_worker_fails_the_others_when_the_switch_refuses_their_chunks(mode):
    """Worker 2 never sends: the switch takes chunks 0-7 into the job's slots. Mode I then refuses chunk 8
    with RNR NAKs, which spend no retry, for as long as slot 0 holds chunk 0: the worker gives up after
    its patience. Modes II and III do not ACK it, and the retries run out."""
    p, sw = setup(mode)
    data = np.ones((LONG, p.switch.lanes), np.int32)
    eps = {w.port: Chunks(data, p.switch, p.jobs[0], r, timing=PATIENT) for r, w in enumerate(p.jobs[0].workers[:2])}
    cause = (r"no progress: the switch refused chunk 8 as not ready for 0\.003\d* s \(another rank of the job "
             r"is missing or failed\)" if mode is Mode.TERMINATED else "RC retry count exceeded")
    with pytest.raises(RcRetryError, match=rf"^job 1 worker [01]: {cause}"):
        MemoryNetwork(sw).run(eps, max_time=0.1)
    assert (sw.counters[Counter.RNR_NAK_SENT] > 0) == (mode is Mode.TERMINATED)


@pytest.mark.parametrize("late, ok", [(0.5, True), (2.0, False)])
def test_a_late_worker_within_the_patience_completes_the_job(late, ok):
    """Worker 2 starts ``late`` patiences after the others, whose chunk 8 the switch refuses meanwhile: within
    the patience the job completes, past it the others give up."""
    p, sw = setup(Mode.TERMINATED)
    job = p.jobs[0]
    data = np.arange(3 * LONG * p.switch.lanes, dtype=np.int32).reshape(3, LONG, p.switch.lanes)
    eps = {w.port: Chunks(data[r], p.switch, job, r, timing=PATIENT) for r, w in enumerate(job.workers[:2])}
    eps[job.workers[2].port] = LateChunks(late * PATIENT.timeout * PATIENT.tries, data[2], p.switch, job, 2,
                                          timing=PATIENT)
    if not ok:
        with pytest.raises(RcRetryError, match="no progress: the switch refused chunk 8 as not ready"):
            MemoryNetwork(sw).run(eps, max_time=0.1)
        return
    MemoryNetwork(sw).run(eps, max_time=0.1)
    assert sw.counters[Counter.RNR_NAK_SENT] > 0
    for ep in eps.values():
        words, fp32, _ = ep.results()
        assert not fp32.any() and (words.view(np.int32) == data.sum(axis=0)).all()


def test_a_missing_rank_of_a_mode_i_tree_fails_the_others():
    """Rank 3 of a 2x2 tree never sends: its leaf holds the slots rank 2 filled, the other leaf those whose
    result never comes, and each refuses its ranks' chunk 8 with RNR NAKs until the ranks give up."""
    tp = plan_tree("2x2", window=4, chunk_bytes=256, mode=Mode.TERMINATED)
    switches = [ModelSwitch(q.switch) for q in tp.plans]
    TreeController(switches, tp).configure()
    eps = {}
    for r in range(3):
        s, w = tp.rank(r)
        q = tp.plans[s]
        eps[r] = Chunks(np.ones((LONG, q.switch.lanes), np.int32), q.switch, q.jobs[0], w, timing=PATIENT)
    with pytest.raises(RcRetryError, match=r"^job 1 worker \d: no progress: the switch refused chunk 8 as not "
                                           r"ready for 0\.003\d* s"):
        TreeNetwork(tp.tree, switches).run(eps, max_time=0.1)
    assert all(s.counters[Counter.RNR_NAK_SENT] > 0 for s in switches[1:])


def test_answer_late_drops_a_frame_no_qp_takes_and_counts_it():
    """Between calls only a frame of this QP's next batch ends the answering (None); a misaddressed or
    corrupted one is dropped and counted, as during a call."""
    p, _ = setup(Mode.TERMINATED)
    w = RcWorker(p.switch, p.jobs[0], 0, timing=TIMING)
    chunk = w.submit(0.0, np.ones((1, p.switch.lanes), np.int32))[0]  # addressed to the switch's QP
    corrupted = chunk[:-1] + bytes([chunk[-1] ^ 1])
    assert w.answer_late(0.0, chunk) == [] and w.answer_late(0.0, corrupted) == []
    assert w.stats[Counter.DROP_UNKNOWN_QPN] == 1 and w.stats[Counter.DROP_BAD_ICRC] == 1


@pytest.mark.parametrize("mode, collective, ranks", [
    (Mode.TERMINATED, "allreduce", [0, 1, 2]), (Mode.AUGMENTED, "allreduce", [0, 1, 2]),
    (Mode.TRANSLATED, "allreduce", []), (Mode.TERMINATED, "reduce", [1]), (Mode.TRANSLATED, "reduce", [1]),
    (Mode.TERMINATED, "broadcast", [0, 1, 2]), (Mode.TRANSLATED, "broadcast", [0, 2])])
def test_ranks_that_answer_between_calls(mode, collective, ranks):
    """Those whose ACKs someone waits on after the call: every receiver where the switch's result requester
    does (Modes I and III), only those whose ACKs complete other ranks' chunks in Mode II."""
    p = plan([3], window=4, chunk_bytes=256, collective=collective, root=1, mode=mode)
    assert [r for r in range(3) if RcWorker(p.switch, p.jobs[0], r).answers_between_calls] == ranks


def test_rc_worker_refuses_a_uc_job():
    p, _ = setup(Mode.UC)
    with pytest.raises(ValueError, match="RcWorker runs Modes I, II and III"):
        RcWorker(p.switch, p.jobs[0], 0)


@pytest.mark.parametrize("mode", ["I", "II", "III"])
def test_demo_runs_each_mode_under_faults(mode, capsys):
    import json
    rc = cli.main(["demo", "--mode", mode, "--size", "64KiB", "--window", "16", "--loss", "0.02", "--dup", "0.02",
                   "--reorder", "0.05", "--json", "--no-progress"])
    s = json.loads(capsys.readouterr().out)
    assert rc == 0 and s["ok"] and s["mode"] == mode and s["switch_counters"]["COMPLETED"] > 0


def test_demo_refuses_a_mode_the_setup_cannot_run(capsys):
    message = ("runs on the model switch, over the memory network or with --tree in namespaces, and modes II and "
               "III on the RTL switch")
    assert cli.main(["demo", "--mode", "III", "--switch", "fast"]) == 2
    assert f"mode III {message}" in capsys.readouterr().err
    assert cli.main(["demo", "--mode", "II", "--net", "netns"]) == 2
    assert f"mode II {message}" in capsys.readouterr().err
