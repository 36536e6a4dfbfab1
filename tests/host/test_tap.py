"""TAP ports: workers in namespaces all-reduce through a switch that holds the TAP devices."""

import multiprocessing as mp
import os

import numpy as np
import pytest

from inagg.host.controller import Controller, plan
from inagg.host.link import Faults
from inagg.models.job import Mode
from inagg.models.switch import ModelSwitch

pytestmark = pytest.mark.netns
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create TAP devices and namespaces "
                                "(the memory transport covers the protocol without it)")


def worker(ns, ifname, switch, job, rank, data, go, conn):
    from inagg.host.api import Group, allreduce
    from inagg.host.netns import PacketPort, enter
    from inagg.host.worker import Timing

    enter(ns)
    group = Group(switch, job, rank, PacketPort(ifname), timing=Timing(timeout=0.2, max_timeout=1.0, tries=20))
    conn.send("ready")
    go.wait()
    conn.send(allreduce(data, group))


@needs_root
@pytest.mark.parametrize("mode", [Mode.UC, Mode.TERMINATED, Mode.AUGMENTED], ids=["uc", "I", "III"])
def test_model_switch_behind_tap_ports(mode):
    """The API's group over a PacketPort, in each mode; Modes I and III need the switch's timers, which
    ``serve_switch`` runs in real time."""
    from pyroute2 import netns as pnetns

    from inagg.host.netns import serve_switch
    from inagg.host.tap import TapTopology

    p = plan([3], window=8, mode=mode)
    job = p.jobs[0]
    rng = np.random.default_rng(0)
    data = [rng.standard_normal(3000).astype(np.float32) for _ in range(3)]
    sw = ModelSwitch(p.switch, hop_timeout=0.05)
    Controller(sw, p).configure()
    ctx = mp.get_context("fork")
    before = set(pnetns.listnetns())
    with TapTopology(p) as topo:
        go = ctx.Event()
        conns, procs = [], []
        for r, w in enumerate(job.workers):
            parent, child = ctx.Pipe()
            procs.append(ctx.Process(target=worker, args=(topo.worker_ns(w.port), topo.worker_if, p.switch, job, r,
                                                          data[r], go, child)))
            procs[-1].start()
            conns.append(parent)
        assert [c.recv() for c in conns] == ["ready"] * 3
        go.set()
        link = serve_switch(sw, topo.taps, faults=Faults(loss=0.02), seed=1, stop=lambda: all(c.poll() for c in conns))
        results = [c.recv() for c in conns]
        for proc in procs:
            proc.join()
    assert set(pnetns.listnetns()) == before
    ref = sum(d.astype(np.float64) for d in data)
    for out in results:
        assert np.allclose(out, ref, atol=1e-5)
    assert link.get("lost", 0) > 0


def test_tap_name_is_validated():
    from inagg.host.tap import TapPort

    with pytest.raises(ValueError, match="a TAP interface name has 1 to 15 bytes, not 'sixteen-bytes-xx'"):
        TapPort("sixteen-bytes-xx")
