"""Across network stacks: `inagg switch serve` in one namespace, workers in another, over a routed veth."""

import json
import os
import re
import subprocess
import sys
import uuid

import pytest

pytestmark = pytest.mark.netns

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create network namespaces "
                                "(the loopback tests cover the service without it)")

WORKERS = r"""
import json, threading
import numpy as np
from inagg.host import allreduce
from inagg.host.service import SwitchClient, join

with SwitchClient() as client:                  # INAGG_SWITCH, in the other namespace
    ticket = client.create_job(2, window=8)
    groups = [join(ticket, r) for r in range(2)]
    out = {}
    data = [np.arange(3000, dtype=np.float32) * (r + 1) for r in range(2)]
    threads = [threading.Thread(target=lambda r: out.__setitem__(r, allreduce(data[r], groups[r])), args=(r,))
               for r in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    print(json.dumps({"ok": all(np.array_equal(out[r], data[0] + data[1]) for r in range(2)),
                      "vxlan": list(ticket.vxlan), "endpoints": [list(g.port.address) for g in groups]}))
"""


@needs_root
def test_workers_in_another_namespace_reach_the_switch_on_4789():
    from pyroute2 import IPRoute, NetNS, netns

    tag = uuid.uuid4().hex[:6]
    sw, wk = f"inagg-{tag}-vsw", f"inagg-{tag}-vwk"
    created = []
    serve = None
    try:
        for name in (sw, wk):
            netns.create(name)
            created.append(name)
        with IPRoute() as ipr:
            ipr.link("add", ifname=f"vx{tag}w", kind="veth", peer={"ifname": f"vx{tag}s", "net_ns_fd": sw})
            ipr.link("set", index=ipr.link_lookup(ifname=f"vx{tag}w")[0], net_ns_fd=wk)
        for name, ifname, addr in ((sw, f"vx{tag}s", "192.168.77.1"), (wk, f"vx{tag}w", "192.168.77.2")):
            with NetNS(name) as ns:
                i = ns.link_lookup(ifname=ifname)[0]
                ns.addr("add", index=i, address=addr, prefixlen=24)
                ns.link("set", index=i, state="up")
        serve = subprocess.Popen(["ip", "netns", "exec", sw, sys.executable, "-m", "inagg.cli", "switch", "serve",
                                  "--listen", "192.168.77.1:7000", "--vxlan", "192.168.77.1:4789", "--ports", "2",
                                  "--slots", "64"],
                                 stderr=subprocess.PIPE, text=True)
        line = serve.stderr.readline()
        assert re.search(r"listening: control 192\.168\.77\.1:7000, vxlan 192\.168\.77\.1:4789", line), line
        p = subprocess.run(["ip", "netns", "exec", wk, sys.executable, "-c", WORKERS], capture_output=True,
                           text=True, timeout=120, env={**os.environ, "INAGG_SWITCH": "192.168.77.1:7000"})
        assert p.returncode == 0, p.stderr
        got = json.loads(p.stdout)
        assert got["ok"] and got["vxlan"] == ["192.168.77.1", 4789]
        assert all(ep[0] == "192.168.77.2" for ep in got["endpoints"])
    finally:
        if serve is not None:
            serve.terminate()
            assert serve.wait(30) == 0
        for name in created:
            netns.remove(name)
