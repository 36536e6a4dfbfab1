"""Several jobs at once over every rank of a depth-3 tree (``bench/tree.py --scale``), at a small size."""

from __future__ import annotations

import pytest

from bench.tree import RankMux, plan_tree_jobs, run_jobs
from inagg.models.frame import RESULT
from inagg.models.job import Mode


@pytest.mark.parametrize("mode", [Mode.UC, Mode.TRANSLATED, Mode.AUGMENTED])
def test_two_jobs_on_a_depth_3_tree_are_exact(mode):
    r = run_jobs("2x2x4", 2, elements=1024, window=4, mode=mode)
    assert (r.ranks, r.switches, r.jobs, r.exact, r.dropped) == (16, 7, 2, True, 0)


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


def test_jobs_must_be_positive():
    with pytest.raises(ValueError, match="jobs must be a positive integer"):
        plan_tree_jobs("2x2", 0, window=4)


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
