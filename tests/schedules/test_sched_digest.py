"""Pins the 4,096-rank swing-bw schedule and its cost, so that speed work on the generators, the IR and
the cost model cannot change a single row or step time unnoticed."""

import hashlib

import numpy as np

from inagg.host.schedules import evaluate, generate
from inagg.host.schedules import topology as T

#: sha256 of the row columns (int64, in row order) and of the step times in femtoseconds
ROWS_SHA256 = "29396335189bcd461c2f9f932141ce4a82fa8be00f1d0950069524e247567ecb"
STEP_TIMES_SHA256 = "22145af370b18324c451edc3778330d5ba8e80013567b99d2e5ce234c60f2844"
XI = 1.184615384615


def _digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
    return h.hexdigest()


def test_swing_bw_4096_schedule_and_cost_are_unchanged():
    topo = T.parse("torus:64x64")
    s = generate("swing-bw", topo=topo, abstract=True)
    assert (s.nrows, s.num_steps) == (393216, 24)
    assert _digest(s.kind, s.step, s.src, s.dst, s.channel, s.src_buf, s.dst_buf, s.count) == ROWS_SHA256
    c = evaluate(s, topo, 64 << 20)
    assert _digest(np.rint(c.step_time_s * 1e15)) == STEP_TIMES_SHA256
    assert round(c.xi, 12) == XI
