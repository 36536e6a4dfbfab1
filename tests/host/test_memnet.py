"""The in-memory network: exact sums under any seeded mix of faults, and clear errors when a run cannot end."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inagg.host.controller import Controller, plan
from inagg.host.link import Faults
from inagg.host.memnet import MemoryNetwork
from inagg.host.worker import AllReduce, Timing, Worker
from inagg.models.protocol import Counter
from inagg.models.switch import ModelSwitch


def network(p, **kw):
    sw = ModelSwitch(p.switch)
    Controller(sw, p).configure()
    return MemoryNetwork(sw, **kw)


rate = st.sampled_from([0.0, 0.02, 0.1, 0.3])


@settings(max_examples=30)
@given(seed=st.integers(0, 2**32 - 1), workers=st.integers(1, 3), window=st.sampled_from([1, 2, 4]),
       n=st.integers(0, 700), loss=rate, dup=rate, reorder=rate, corrupt=rate)
def test_every_worker_gets_the_same_sum_under_faults(seed, workers, window, n, loss, dup, reorder, corrupt):
    p = plan([workers], window=window, chunk_bytes=256)
    job = p.jobs[0]
    rng = np.random.default_rng(seed)
    # Integers on the grid of the agreed scale make the sum exact, so any wrong lane shows.
    data = [rng.integers(-50, 50, n).astype(np.float32) for _ in range(workers)]
    timing = Timing(timeout=1e-4, max_timeout=1e-3, tries=60)
    ops = {w.port: AllReduce(Worker(p.switch, job, r, timing=timing), data[r]) for r, w in enumerate(job.workers)}
    network(p, faults=Faults(loss=loss, dup=dup, reorder=reorder, corrupt=corrupt), seed=seed).run(ops)
    ref = np.sum(data, axis=0, dtype=np.float64) if n else np.zeros(0)
    for op in ops.values():
        assert np.array_equal(op.result(), ref.astype(np.float32))


class Silent:
    """An endpoint that never sends and never finishes."""

    done = False
    deadline = None

    def start(self, now):
        return []


def test_an_idle_network_with_unfinished_endpoints_is_an_error():
    with pytest.raises(RuntimeError, match="the network is idle but not every endpoint is done"):
        network(plan([1])).run({0: Silent()})


def test_virtual_time_is_bounded():
    p = plan([2], window=1, chunk_bytes=256)
    ops = {0: AllReduce(Worker(p.switch, p.jobs[0], 0, timing=Timing(timeout=1.0, max_timeout=1.0, tries=10**6)),
                        np.ones(3, np.float32))}
    with pytest.raises(RuntimeError, match=r"virtual time passed 50 s before every endpoint was done"):
        network(p).run(ops, max_time=50)


def test_latency_is_validated():
    with pytest.raises(ValueError, match="latency must be a positive number, not 0"):
        network(plan([1]), latency=0)


class Batches(ModelSwitch):
    """The model switch, recording how many frames each receive_batch brought."""

    def __init__(self, spec):
        super().__init__(spec)
        self.sizes = []

    def receive_batch(self, frames):
        frames = list(frames)
        self.sizes.append(len(frames))
        return super().receive_batch(frames)


def test_frames_due_together_reach_the_switch_in_one_batch_and_the_fast_switch_runs_alike():
    from inagg.models.fastswitch import FastSwitch

    p = plan([3], window=8, chunk_bytes=256)
    data = [np.arange(3000, dtype=np.float32) * (r + 1) for r in range(3)]
    faults = Faults(loss=0.05, dup=0.05, reorder=0.1, corrupt=0.02)
    links, switches = [], []
    for cls in (Batches, FastSwitch):
        sw = cls(p.switch)
        Controller(sw, p).configure()
        frames = []
        timing = Timing(timeout=1e-4, max_timeout=1e-3, tries=60)
        ops = {w.port: AllReduce(Worker(p.switch, p.jobs[0], r, timing=timing), data[r])
               for r, w in enumerate(p.jobs[0].workers)}
        MemoryNetwork(sw, faults=faults, seed=5, capture=lambda t, f: frames.append((t, f))).run(ops)
        assert all(np.array_equal(op.result(), np.sum(data, axis=0)) for op in ops.values())
        links.append(frames)
        switches.append(sw)
    assert max(switches[0].sizes) >= 8 and sum(switches[0].sizes) == switches[0].counters[Counter.RX_FRAMES]
    assert links[0] == links[1] and switches[0].counters == switches[1].counters
