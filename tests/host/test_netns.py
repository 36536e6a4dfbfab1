"""The namespace transport: topology set-up and teardown, AF_PACKET ports, the demo over veth."""

import json
import os

import pytest

from inagg import cli
from inagg.host.controller import plan, plan_tree

pytestmark = pytest.mark.netns

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create network namespaces "
                                "(the memory transport covers the protocol without it)")


def namespaces():
    from pyroute2 import netns

    return set(netns.listnetns())


@needs_root
def test_topology_is_torn_down_also_on_errors():
    from inagg.host.netns import Topology

    before = namespaces()
    with pytest.raises(KeyboardInterrupt):
        with Topology(plan([2])) as topo:
            assert {topo.switch_ns, topo.worker_ns(0), topo.worker_ns(1)} <= namespaces()
            raise KeyboardInterrupt
    assert namespaces() == before


@needs_root
def test_packet_ports_carry_frames_across_a_veth():
    import multiprocessing as mp

    from inagg.host.netns import PacketPort, Topology, enter

    frame = bytes.fromhex("0200000000fe" "020000000100" "0800") + bytes(range(100))

    def echo(ns, ifname, conn):
        enter(ns)
        port = PacketPort(ifname)
        conn.send("ready")
        got = port.recv(5.0)
        port.send(got[:14] + got[14:][::-1])

    def worker(ns, ifname, conn):
        enter(ns)
        port = PacketPort(ifname)
        port.send(frame)
        conn.send(port.recv(5.0))  # its own frame is not reported back: the echo is

    ctx = mp.get_context("fork")
    with Topology(plan([1])) as topo:
        to_switch, child = ctx.Pipe()
        switch_side = ctx.Process(target=echo, args=(topo.switch_ns, topo.switch_if(0), child))
        switch_side.start()
        assert to_switch.recv() == "ready"
        to_worker, child = ctx.Pipe()
        worker_side = ctx.Process(target=worker, args=(topo.worker_ns(0), topo.worker_if, child))
        worker_side.start()
        assert to_worker.recv() == frame[:14] + frame[14:][::-1]
        worker_side.join()
        switch_side.join()


@needs_root
def test_demo_over_namespaces_with_loss(capsys):
    before = namespaces()
    rc = cli.main(["demo", "--net", "netns", "--size", "64KiB", "--workers", "3", "--loss", "0.02", "--json"])
    s = json.loads(capsys.readouterr().out)
    assert rc == 0 and s["ok"] and s["net"] == "netns"
    assert s["packets"]["results_placed"] == 3 * (64 + 2)
    assert namespaces() == before


def test_without_root_the_message_points_to_the_memory_transport(monkeypatch):
    from inagg.host import netns

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(netns.NetnsUnavailable, match=r"needs root .* or use the memory transport \(--net memory\)"):
        netns.Topology(plan([2]))


def test_demo_without_root_exits_with_the_message(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert cli.main(["demo", "--net", "netns", "--size", "4KiB"]) == 1
    assert "use the memory transport (--net memory)" in capsys.readouterr().err


@needs_root
def test_tree_topology_has_a_namespace_per_node_and_is_torn_down_also_on_errors():
    from pyroute2 import NetNS

    from inagg.host.netns import TreeTopology

    before = namespaces()
    tp = plan_tree("2x2")
    with pytest.raises(KeyboardInterrupt):
        with TreeTopology(tp) as topo:
            assert namespaces() - before == {topo.switch_ns(s) for s in range(3)} | {topo.rank_ns(r) for r in range(4)}
            with NetNS(topo.switch_ns(1)) as ns:  # two children and the uplink, with the switch's MAC
                links = {x.get_attr("IFLA_IFNAME"): x.get_attr("IFLA_ADDRESS") for x in ns.get_links()}
            assert links == {"lo": "00:00:00:00:00:00", **dict.fromkeys(("sw0", "sw1", "sw2"), tp.plans[1].switch.mac)}
            raise KeyboardInterrupt
    assert namespaces() == before


@needs_root
@pytest.mark.parametrize("mode", ["uc", "I", "II", "III"])
def test_demo_runs_a_tree_in_namespaces_exactly_under_loss(capsys, mode):
    before = namespaces()
    rc = cli.main(["demo", "--net", "netns", "--tree", "2x2", "--mode", mode, "--size", "32KiB", "--loss", "0.02",
                   "--seed", "1", "--json"])
    s = json.loads(capsys.readouterr().out)
    assert rc == 0 and s["ok"] and s["exact"] and s["net"] == "netns" and s["tree"]["switches"] == 3
    rows = s["tree"]["repairs"]
    assert sum(r["lost"] for r in rows) == s["drops"]["link"]["lost"] > 0
    hop = sum(r["repaired_on_hop"] for r in rows)
    assert hop > 0 if mode in ("I", "III") else hop == 0
    assert namespaces() == before


def test_a_tree_in_namespaces_needs_root(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert cli.main(["demo", "--net", "netns", "--tree", "2x2", "--mode", "II", "--size", "4KiB"]) == 1
    assert "use the memory transport (--net memory)" in capsys.readouterr().err
