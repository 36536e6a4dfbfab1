"""Bad input gives clear errors."""

import numpy as np
import pytest

from inagg.host.schedules import (ALGORITHMS, Buffer, Collective, Schedule, ScheduleBuilder, ScheduleError, check,
                                  check_symbolic, evaluate, generate)
from inagg.host.schedules.registry import CONCRETE_ONLY
from inagg.host.schedules import allreduce as A
from inagg.host.schedules import topology as T


def test_unknown_algorithm_and_collective():
    with pytest.raises(ValueError, match="unknown algorithm 'nope'"):
        generate("nope", 4)
    with pytest.raises(ValueError, match="rd does not implement allgather"):
        generate("rd", 4, collective="allgather")
    with pytest.raises(ValueError, match="unknown collective"):
        generate("ring", 4, collective="gossip")
    with pytest.raises(TypeError, match="algorithm name must be a string"):
        generate(3, 4)


def test_bad_rank_counts():
    with pytest.raises(ValueError, match="needs at least 1 rank"):
        A.ring(0)
    with pytest.raises(TypeError, match="must be an integer"):
        A.ring(4.0)
    with pytest.raises(ValueError, match="torus has 16 ranks, not 12"):
        A.swing_bandwidth(12, dims=(4, 4))
    with pytest.raises(ValueError, match="power-of-two dimensions"):
        A.rabenseifner(24, dims=(6, 4))
    with pytest.raises(ValueError, match="torus dimensions must be even"):
        A.swing_bandwidth(15, dims=(5, 3))
    with pytest.raises(ValueError, match="power of 3"):
        A.trivance_latency(12, dims=(4, 3))
    with pytest.raises(ValueError, match="channels must be 1 or 2"):
        A.ring(4, channels=3)
    with pytest.raises(ValueError, match="does not match torus:4x4"):
        generate("ring", 8, topo=T.parse("torus:4x4"))
    with pytest.raises(ValueError, match="needs switches"):
        generate("ina", topo=T.parse("ring:8"))


def _builder():
    return ScheduleBuilder("t", Collective.ALLREDUCE, 2)


def test_malformed_schedules():
    b = _builder()
    b.transfer(0, [0], [0], np.array([[0]]))
    with pytest.raises(ValueError, match="a transfer needs two different nodes"):
        b.build(size_chunks=1, in_chunks=0, out_chunks=1)
    b = _builder()
    b.transfer(0, [0], [5], np.array([[0]]))
    with pytest.raises(ValueError, match=r"dst node 5 is not in 0\.\.1"):
        b.build(size_chunks=1, in_chunks=0, out_chunks=1)
    b = _builder()
    b.transfer(0, [0], [1], np.array([[3]]))
    with pytest.raises(ValueError, match="chunk 3 is outside buffer OUTPUT of node 0"):
        b.build(size_chunks=1, in_chunks=0, out_chunks=1)
    b = _builder()
    b.transfer(0, [0], [1], np.array([[0]]), src_buf=Buffer.INPUT)
    with pytest.raises(ValueError, match="in-place schedule must not use the input buffer"):
        b.build(size_chunks=1, in_chunks=1, out_chunks=1)
    b = _builder()
    b.transfer(0, [0, 1], [1, 0], np.array([[0], [0]]))
    b.transfer(0, [0], [1], np.array([[0]]))
    with pytest.raises(ValueError, match="both overwrite chunk 0 of buffer OUTPUT of node 1 in step 0"):
        b.build(size_chunks=1, in_chunks=0, out_chunks=1)
    b = _builder()
    with pytest.raises(ValueError, match="2 source chunks but 1 destination chunks"):
        b.transfer(0, [0], [1], np.array([[0, 1]]), np.array([[0]]))
    with pytest.raises(ValueError, match="needs a root rank"):
        ScheduleBuilder("t", Collective.BROADCAST, 2).build(size_chunks=1, in_chunks=0, out_chunks=1)
    b = _builder()
    b.copy(0, [0], np.array([[0]]), np.array([[0]]), src_buf=Buffer.SCRATCH)
    with pytest.raises(ValueError, match="buffer SCRATCH of node 0 has no chunks"):
        b.build(size_chunks=1, in_chunks=0, out_chunks=1)


def test_executor_input_errors():
    s = A.ring(4)
    with pytest.raises(TypeError, match="dtype must be"):
        check(s, dtype=np.complex64)
    with pytest.raises(ValueError, match="chunk_elems must be at least 1"):
        check(s, chunk_elems=0)
    a = A.ring(64, abstract=True)
    with pytest.raises(ValueError, match="abstract"):
        check(a)


def test_topology_specs():
    assert T.parse("ring:8").nhosts == 8
    assert T.parse("torus:4x4x2").dims == (4, 4, 2)
    assert T.parse("clos:4 x 8:2").shape == (4, 8, 4)
    assert T.parse("multirail:2x8").nhosts == 16
    for bad, msg in [("mesh:4", "unknown topology kind 'mesh'"), ("torus:4x0", "must be positive"),
                     ("clos:4x6:4", "not a whole number of uplinks"), ("ring", "bad topology spec"),
                     ("multirail:4", "expected multirail:SERVERSxGPUS"), ("torus:4xa", "must be an integer")]:
        with pytest.raises(ValueError, match=msg):
            T.parse(bad)
    with pytest.raises(ValueError, match="has 4 hosts"):
        evaluate(A.ring(8), T.parse("ring:4"), 1024)


def test_symbolic_check_passes_every_generator():
    for algo, (colls, _) in ALGORITHMS.items():
        for coll in colls:
            for n in (1, 5, 8, 9, 16):
                s = generate(algo, n, collective=coll, abstract=algo not in CONCRETE_ONLY)
                # direct all-to-all sends to everyone at once: n - 1 peers
                check_symbolic(s, peers=max(n - 1, 1) if algo == "direct" else 2)


def test_symbolic_check_catches_broken_schedules():
    s = A.recursive_doubling(8, abstract=True)
    keep = s.step != 2  # without the distance-4 step, rank 0 never hears from rank 4
    cols = {k: getattr(s, k)[keep] for k in ("kind", "step", "src", "dst", "channel", "src_buf", "dst_buf", "count")}
    broken = Schedule(name="rd", collective=s.collective, nranks=8, size_chunks=1, in_chunks=0, out_chunks=1, **cols)
    with pytest.raises(ScheduleError, match="rank 0 never hears from rank 4"):
        check_symbolic(broken)
    # the same step three times over: rank 0 sends three messages in one step
    cols = {k: np.concatenate([getattr(s, k)] * 3) for k in ("kind", "step", "src", "dst", "channel", "src_buf",
                                                             "dst_buf", "count")}
    swamped = Schedule(name="rd", collective=s.collective, nranks=8, size_chunks=1, in_chunks=0, out_chunks=1,
                       **cols)
    with pytest.raises(ScheduleError, match="rank 0 sends 3 messages on channel 0 in step 0, more than 2"):
        check_symbolic(swamped)
    with pytest.raises(ValueError, match="peers must be at least 1"):
        check_symbolic(s, peers=0)
