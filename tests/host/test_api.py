"""``inagg.host.allreduce`` on threads over the in-process fabric, in real time."""

import numpy as np
import pytest

from inagg import host
from inagg.host.controller import plan
from inagg.host.link import Faults

PLAN = plan([3], window=4, chunk_bytes=256)
SW, JOB = PLAN.switch, PLAN.jobs[0]
FAST = host.Timing(timeout=0.02, max_timeout=0.1, tries=20)


@pytest.fixture
def run_ranks(on_threads):
    """``run_ranks(arrays, faults=None, timing=FAST, ranks=None)``: rank r all-reduces each array of
    ``arrays[r]`` in turn; ``(sums, errors)`` by rank."""
    def run(arrays, faults=None, timing=FAST, ranks=None):
        return on_threads(PLAN, timing, lambda r, g: [host.allreduce(a, g) for a in arrays[r]],
                          ranks=ranks, faults=faults)
    return run


def test_repeated_allreduce_keeps_shape_and_sums(run_ranks):
    rng = np.random.default_rng(0)
    arrays = [[rng.standard_normal((7, 50)).astype(np.float32), rng.standard_normal(130).astype(np.float32)]
              for _ in range(3)]
    out, errors = run_ranks(arrays, faults=Faults(loss=0.05, dup=0.05, reorder=0.05))
    assert not errors
    for call in range(2):
        ref = sum(arrays[r][call].astype(np.float64) for r in range(3))
        for r in range(3):
            assert out[r][call].shape == arrays[r][call].shape
            assert np.allclose(out[r][call], ref, atol=1e-5)


def test_missing_rank_times_out_naming_chunk_and_worker(run_ranks):
    timing = host.Timing(timeout=0.01, max_timeout=0.01, tries=3)
    arrays = [[np.ones(10, np.float32)]] * 3
    _, errors = run_ranks(arrays, timing=timing, ranks=[0, 1])
    assert isinstance(errors[0], host.ChunkTimeoutError) and isinstance(errors[0], TimeoutError)
    assert str(errors[0]) == ("job 1 worker 0: no result for chunk 0 after 3 tries (switch unreachable, or "
                              "another worker of the job is missing)")


def test_mismatched_lengths_are_detected(run_ranks):
    _, errors = run_ranks([[np.ones(n, np.float32)] for n in (5, 5, 6)])
    assert set(errors) == {0, 1, 2} and all(isinstance(e, host.LengthMismatchError) for e in errors.values())


def test_allreduce_refuses_non_float32():
    with pytest.raises(TypeError, match="allreduce takes a float32 array, not int64"):
        host.allreduce(np.arange(3), host.Group(SW, JOB, 0, port=None))
