"""Several jobs at once over every rank of a depth-3 tree (``bench/tree.py --scale``, ``inagg demo --tree SPEC
--jobs N``), at a small size: the plan (``plan_tree_jobs``), the rank's mux (``RankMux``) and the run."""

from __future__ import annotations

import pytest

from inagg.host.controller import MAX_SLOTS, plan_tree, plan_tree_jobs
from inagg.host.demo_run import DemoConfig, run_demo
from inagg.host.memnet import RankMux
from inagg.models.frame import RESULT
from inagg.models.job import Mode


@pytest.mark.parametrize("mode", [Mode.UC, Mode.TRANSLATED, Mode.AUGMENTED])
def test_two_jobs_on_a_depth_3_tree_are_exact(mode):
    s = run_demo(DemoConfig(workers=16, tree="2x2x4", jobs=2, size=4096, window=4, mode=mode.value))
    r = s["tree"]
    assert (s["workers"], r["switches"], s["jobs"], s["exact"], r["misaddressed"]) == (16, 7, 2, True, 0)
    assert s["ok"] and sorted(s["exponents"]) == [1, 2]


def test_jobs_get_their_own_slots_and_qps():
    tp = plan_tree_jobs("2x2x4", 3, window=4)
    for p in tp.plans:
        assert [j.slot_base for j in p.jobs] == [0, 8, 16]
        assert p.switch.slots == 32  # 3 regions of 8 slots, up to a power of two
        qpns = [w.qpn for j in p.jobs for w in j.workers]
        assert len(set(qpns)) == len(qpns)
    # A child switch takes each job's results on the QPN its parent sends that job's results to.
    for s in tp.tree.switches[1:]:
        for child, parent in zip(tp.plans[s.index].jobs, tp.plans[s.parent].jobs):
            assert child.parent.result_qpn == parent.workers[s.position].qpn


def test_one_job_is_plan_trees_plan():
    assert plan_tree_jobs("2x2x4", 1, window=4, mode=Mode.AUGMENTED) == plan_tree("2x2x4", window=4,
                                                                                  mode=Mode.AUGMENTED)


@pytest.mark.parametrize("jobs", [0, -1, 1.0, True])
def test_jobs_must_be_positive(jobs):
    with pytest.raises(ValueError, match="jobs must be a positive integer"):
        plan_tree_jobs("2x2", jobs, window=4)


def test_jobs_must_fit_the_slot_memory():
    with pytest.raises(ValueError, match=f"2 jobs with window {MAX_SLOTS // 2} need {2 * MAX_SLOTS} slots"):
        plan_tree_jobs("2", 2, window=MAX_SLOTS // 2)


class _Op:
    done, deadline = False, None

    def __init__(self):
        self.got = []

    def receive(self, now, frame):
        self.got.append(frame)
        return []


def _frame(qpn: int) -> bytes:
    off, n = RESULT.span("bth.dqpn")
    f = bytearray(RESULT.size)
    f[off:off + n] = qpn.to_bytes(n, "big")
    return bytes(f)


def test_rank_mux_hands_frames_by_qp_and_counts_the_rest():
    tp = plan_tree_jobs("2x2", 2, window=1)
    ops = {job.workers[0].qpn: _Op() for job in tp.plans[1].jobs}
    a, b = ops
    mux = RankMux(ops)
    mux.receive(0.0, _frame(b))
    mux.receive(0.0, _frame(a))
    mux.receive(0.0, _frame(max(ops) + 1))
    mux.receive(0.0, _frame(a)[:20])
    assert [len(op.got) for op in ops.values()] == [1, 1]
    assert mux.dropped == 2


class _BatchOp(_Op):
    def __init__(self):
        super().__init__()
        self.batches = []

    def receive_batch(self, now, frames):
        self.batches.append(list(frames))
        return [b"out%d" % len(frames)]


def test_rank_mux_hands_a_batch_to_each_job_in_arrival_order_and_counts_the_rest():
    tp = plan_tree_jobs("2x2", 2, window=1)
    a, b = (job.workers[0].qpn for job in tp.plans[1].jobs)
    ops = {a: _BatchOp(), b: _Op()}  # one job takes batches, the other frames one by one
    mux = RankMux(ops)
    f1, f2 = _frame(a), _frame(a) + b"\x01"
    out = mux.receive_batch(0.0, [_frame(b), f1, _frame(max(ops) + 1), f2, _frame(a)[:20]])
    assert ops[a].batches == [[f1, f2]] and ops[b].got == [_frame(b)]
    assert out == [b"out2"]
    assert mux.dropped == 2


def test_tree_operations_give_each_rank_one_op_per_job():
    import numpy as np

    from inagg.host.collectives import tree_operations

    tp = plan_tree_jobs("2x2", 2, window=1)
    data = [[np.zeros(4, np.float32)] * 4] * 2
    assert [len(ops) for ops in tree_operations(tp, data).values()] == [2, 2, 2, 2]
    with pytest.raises(ValueError, match=r"the plan has 2 job\(s\), data for 1"):
        tree_operations(tp, data[:1])
