"""Hosts on a named interface: a veth pair stands in for the cable, a model board in a namespace for the board.

One end of the pair is the hosts' interface, in this namespace; the other is port 0 of a
:class:`~inagg.testbench.mgmt.ModelBoard` served in a namespace of its own (``netns.serve_switch``): the model
switch, configured by management frames that its model bridge answers on that port.
"""

import ipaddress
import json
import multiprocessing as mp
import os
import uuid
from types import SimpleNamespace

import pytest

from inagg import cli

pytestmark = pytest.mark.netns

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create a veth pair and a namespace "
                                "(the memory transport covers the protocol without it)")

KEY = bytes(range(0x40, 0x50))
HOST_MAC = "02:00:00:00:0a:01"


class Cable:
    """A veth pair: ``name`` here (MAC ``HOST_MAC``), ``sw0`` in namespace ``ns`` with the plan's switch MAC."""

    def __init__(self):
        from pyroute2 import IPRoute, NetNS, netns

        from inagg.host.controller import SWITCH_MAC

        tag = uuid.uuid4().hex[:6]
        self.name, self.ns = f"inagg{tag}", f"inagg-{tag}-board"
        netns.create(self.ns)
        try:
            with IPRoute() as ipr:
                ipr.link("add", ifname=self.name, kind="veth", peer={"ifname": "sw0", "net_ns_fd": self.ns})
                i = ipr.link_lookup(ifname=self.name)[0]
                with open(f"/proc/sys/net/ipv6/conf/{self.name}/disable_ipv6", "w") as f:
                    f.write("1")  # no router solicitations on the cable
                ipr.link("set", index=i, address=HOST_MAC, state="up")
            with NetNS(self.ns) as ns:
                ns.link("set", index=ns.link_lookup(ifname="sw0")[0], address=SWITCH_MAC, state="up")
        except BaseException:
            self.remove()
            raise

    def set_state(self, state):
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname=self.name)[0], state=state)

    def remove(self):
        from pyroute2 import netns

        netns.remove(self.ns)  # takes the pair with it


def _board_proc(ns, key, stop, conn, configured=None, chunk_bytes=None, mac_ports=0, mac=None, ip=None):
    from inagg.host import netns
    from inagg.host.controller import Controller
    from inagg.models.frame import ETHERNET, IPV4
    from inagg.models.job import SwitchSpec
    from inagg.models.regmap import RegMap
    from inagg.models.switch import ModelSwitch
    from inagg.testbench.mgmt import ModelBoard, is_mgmt

    netns.enter(ns)
    addresses = {k: v for k, v in (("mac", mac), ("ip", ip)) if v is not None}
    spec = SwitchSpec(ports=2, slots=256, chunk_bytes=chunk_bytes or SwitchSpec().chunk_bytes, **addresses)
    board = ModelBoard(ModelSwitch(spec), RegMap(4, 8), key, mac_ports=mac_ports)
    if configured is not None:
        Controller(board.switch, configured).configure()
    # Where the workers' frames were addressed: (destination MAC, destination IP) of every data frame.
    sent_to = set()
    receive = board.receive

    def taking(port, frame):
        if not is_mgmt(frame):
            sent_to.add((ETHERNET.unpack(frame)["dst"].to_bytes(6, "big").hex(":"),
                         str(ipaddress.IPv4Address(IPV4.unpack(frame[ETHERNET.size:])["dst"]))))
        return receive(port, frame)

    board.receive = taking
    port = netns.PacketPort("sw0")
    conn.send("ready")
    netns.serve_switch(board, {0: port}, stop=stop.is_set)
    registers = {name: board.values[RegMap.switch(name)] for name in ("MAC_HI", "MAC_LO", "IP")}
    conn.send(SimpleNamespace(bridge=dict(board.bridge.counters), counters={c.name: v for c, v in
                              board.switch.counters.items()}, jobs=sorted(board.switch.jobs), registers=registers,
                              sent_to=sent_to, mac_stats=board.mac_stats))


@pytest.fixture
def cable():
    c = Cable()
    try:
        yield c
    finally:
        c.remove()


@pytest.fixture
def board(cable, request):
    """Serves a model board keyed with ``KEY`` at the far end of ``cable``, built with ``_board_proc``'s keywords
    ``request.param`` when given (``configured``: the plan it holds); yields a function that stops it and
    returns what it saw (its bridge's and its switch's counters, the jobs left on it, its address registers,
    where the data frames were sent, its MACs' counters)."""
    ctx = mp.get_context("fork")
    stop = ctx.Event()
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_board_proc, args=(cable.ns, KEY, stop, child),
                       kwargs=getattr(request, "param", None) or {})
    proc.start()
    assert parent.recv() == "ready"

    def end():
        stop.set()
        out = parent.recv()
        proc.join()
        return out

    try:
        yield end
    finally:
        if proc.is_alive():
            stop.set()
            proc.join(5)
            if proc.is_alive():
                proc.terminate()


def _key_file(tmp_path, key):
    path = tmp_path / "board.key"
    path.write_text(key.hex() + "\n")
    return str(path)


def _demo(cable, *extra):
    return cli.main(["demo", "--net", f"iface:{cable.name}", "--switch", "remote", "--workers", "3",
                     "--size", "64KiB", "--window", "32", "--no-progress", *extra])


@needs_root
def test_demo_configures_the_board_by_frames_and_sums_exactly(cable, board, tmp_path, capsys):
    rc = _demo(cable, "--mgmt-key-file", _key_file(tmp_path, KEY), "--json")
    s = json.loads(capsys.readouterr().out)
    seen = board()
    assert rc == 0 and s["ok"] and s["switch"] == "remote" and s["board"]["configured"] == "by management frames"
    assert s["board"]["mac"] == HOST_MAC and s["worst_error_to_bound"] <= 1.0
    chunks = 64 + 2  # 64 KiB of 1 KiB chunks and the agreement round's two
    assert s["packets"]["results_placed"] == 3 * chunks
    # The run's counters, read from the board by frames, are the board's own.
    assert s["switch_counters"]["COMPLETED"] == seen.counters["COMPLETED"] == chunks
    assert seen.bridge["accepted"] > 0 and seen.bridge["bad_tag"] == seen.bridge["replayed"] == 0
    assert seen.jobs == []  # torn down by frames too
    # The plan's addresses, written to the board and used by every worker; this board has no MAC counters.
    assert seen.sent_to == {("02:00:00:00:00:fe", "10.0.0.254")}
    assert seen.registers == {"MAC_HI": 0x0200, "MAC_LO": 0x000000FE, "IP": 0x0A0000FE}
    assert s["board"]["mac_counters"] is None
    # The same tensors through the model switch in memory: the same scale and the same sums (the error to the
    # float64 reference, element for element, is a function of the sums).
    assert cli.main(["demo", "--switch", "model", "--workers", "3", "--size", "64KiB", "--window", "32", "--json"]) == 0
    mem = json.loads(capsys.readouterr().out)
    keys = ("exponents", "max_error", "bound_at_max_error", "worst_error_to_bound")
    assert {k: s[k] for k in keys} == {k: mem[k] for k in keys}


BOARD_MAC, BOARD_IP = "02:00:00:00:12:34", "10.9.0.1"


@needs_root
@pytest.mark.parametrize("board", [{"mac_ports": 2, "mac": BOARD_MAC, "ip": BOARD_IP}], indirect=True,
                         ids=["addresses-and-macs"])
def test_a_board_at_other_addresses_and_its_mac_counters(cable, board, tmp_path, capsys):
    rc = _demo(cable, "--mgmt-key-file", _key_file(tmp_path, KEY), "--switch-mac", BOARD_MAC.upper(),
               "--switch-ip", BOARD_IP, "--json")
    s = json.loads(capsys.readouterr().out)
    seen = board()
    assert rc == 0 and s["ok"] and (s["board"]["switch_mac"], s["board"]["switch_ip"]) == (BOARD_MAC, BOARD_IP)
    # The controller wrote them, and every worker's frame went to them.
    assert seen.registers == {"MAC_HI": 0x0200, "MAC_LO": 0x00001234, "IP": 0x0A090001}
    assert seen.sent_to == {(BOARD_MAC, BOARD_IP)}
    # The cabled port's MAC counters of the run: the data frames and the management requests between the two
    # reads (both reads take len(Counter) + len(MAC_STATS) requests; a request sent again counts once more).
    from inagg.models.protocol import Counter
    from inagg.models.regmap import MAC_STATS

    mac, run = s["board"]["mac_counters"], s["switch_counters"]
    assert list(mac) == list(MAC_STATS)
    assert mac["rx_good"] >= run["RX_FRAMES"] + len(Counter) + len(MAC_STATS)
    assert mac["tx_frames"] >= run["TX_RESULTS"] + len(Counter) + len(MAC_STATS)
    assert mac["rx_good"] <= seen.mac_stats[0]["rx_good"] and mac["tx_frames"] <= seen.mac_stats[0]["tx_frames"]
    assert all(v == 0 for k, v in mac.items() if k not in ("rx_good", "tx_frames"))
    assert seen.mac_stats[1] == dict.fromkeys(MAC_STATS, 0)  # the other port carried nothing


def _demo_plan():
    """The jobs ``_demo`` runs, as the board holds them: every worker at port 0 with the interface's MAC."""
    import dataclasses

    from inagg.host.demo_run import DemoConfig

    p = DemoConfig(workers=3, size=64 << 10, window=32).plan()
    return dataclasses.replace(p, jobs=tuple(dataclasses.replace(j, workers=tuple(
        dataclasses.replace(w, port=0, mac=HOST_MAC) for w in j.workers)) for j in p.jobs))


@needs_root
@pytest.mark.parametrize("board", [{"configured": _demo_plan()}], indirect=True, ids=["configured"])
def test_without_a_key_the_demo_runs_on_the_jobs_the_board_holds(cable, board, capsys):
    rc = _demo(cable, "--json")
    out = capsys.readouterr()
    seen = board()
    assert "no --mgmt-key-file: assuming the board at 02:00:00:00:00:fe (10.0.0.254)" in out.err
    s = json.loads(out.out)
    assert rc == 0 and s["ok"] and s["board"]["configured"] == "assumed" and "mac_counters" not in s["board"]
    assert seen.counters["COMPLETED"] == 64 + 2 and seen.bridge["accepted"] == 0 and seen.jobs == [1]


@needs_root
def test_a_wrong_key_fails_with_one_line_and_is_counted(cable, board, tmp_path, capsys):
    rc = _demo(cable, "--mgmt-key-file", _key_file(tmp_path, bytes(16)))
    err = capsys.readouterr().err
    seen = board()
    assert rc == 1 and err.count("\n") == 1
    assert "inagg demo: error: no answer from the management bridge of 02:00:00:00:00:fe" in err and "wrong key" in err
    assert seen.bridge["bad_tag"] == 5 and seen.bridge["accepted"] == 0 and seen.jobs == []


@needs_root
@pytest.mark.parametrize("board", [{"chunk_bytes": 256}], indirect=True, ids=["chunks-256"])
def test_a_board_built_for_other_chunks_is_refused_before_configuring(cable, board, tmp_path, capsys):
    rc = _demo(cable, "--mgmt-key-file", _key_file(tmp_path, KEY))
    err = capsys.readouterr().err
    seen = board()
    assert rc == 1 and err.count("\n") == 1, err
    assert err.startswith(f"inagg demo: error: the board behind {cable.name} cannot run this plan: it is built for "
                          "2 ports, 256 slots of 256-byte chunks, 64-bit beats; the plan's chunks are 1024 bytes"), err
    assert seen.jobs == [] and seen.counters["RX_FRAMES"] == 0


@needs_root
def test_a_missing_interface_fails_with_one_line(capsys):
    assert cli.main(["demo", "--net", "iface:inaggnosuch", "--switch", "remote", "--size", "4KiB"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("inagg demo: error: interface inaggnosuch does not exist") and err.count("\n") == 1


@needs_root
def test_a_down_interface_fails_with_one_line(cable, capsys):
    cable.set_state("down")
    assert _demo(cable) == 1
    err = capsys.readouterr().err
    assert f"interface {cable.name} is down; bring it up: ip link set {cable.name} up" in err and err.count("\n") == 1


@needs_root
def test_an_interface_without_link_fails(cable):
    from pyroute2 import NetNS

    from inagg.host.iface import Interface, InterfaceError

    with NetNS(cable.ns) as ns:
        ns.link("set", index=ns.link_lookup(ifname="sw0")[0], state="down")
    with pytest.raises(InterfaceError, match="is up but has no link: check the cable"):
        Interface(cable.name)


@needs_root
def test_without_cap_net_raw_the_message_names_the_capability(cable):
    from inagg.host.iface import Interface, InterfaceError

    def child(conn):
        os.setuid(65534)  # nobody: no capabilities
        try:
            Interface(cable.name)
            conn.send(None)
        except InterfaceError as e:
            conn.send(str(e))

    ctx = mp.get_context("fork")
    parent, end = ctx.Pipe()
    proc = ctx.Process(target=child, args=(end,))
    proc.start()
    message = parent.recv()
    proc.join()
    assert message is not None and "lacks CAP_NET_RAW" in message and "setcap cap_net_raw+ep" in message


@needs_root
def test_plan_and_interface_macs_are_checked(cable):
    from inagg.host.controller import plan
    from inagg.host.iface import Interface, InterfaceError

    nic = Interface(cable.name)
    p = plan([2])
    with pytest.raises(InterfaceError, match=f"worker at MAC 02:00:00:00:01:00, but interface {cable.name} has "
                                             f"MAC {HOST_MAC}"):
        nic.check(p)
    bound = nic.bind(p, port=1)
    nic.check(bound)
    assert {(w.port, w.mac) for w in bound.jobs[0].workers} == {(1, HOST_MAC)}
    assert [w.qpn for w in bound.jobs[0].workers] == [w.qpn for w in p.jobs[0].workers]


def _result(qpn):
    from inagg.models import wire
    from inagg.models.protocol import Opcode

    return wire.build(eth_dst=wire.mac_bytes(HOST_MAC), eth_src=wire.mac_bytes("02:00:00:00:00:fe"),
                      ip_src=wire.ip_bytes("10.0.0.254"), ip_dst=wire.ip_bytes("10.0.0.1"), udp_sport=0xC000,
                      opcode=Opcode.UC_RDMA_WRITE_ONLY_IMM, dest_qpn=qpn, psn=0, va=0, rkey=1, payload=bytes(256),
                      imm=0)


@needs_root
def test_each_port_takes_only_its_own_frames(cable):
    from inagg.host import netns
    from inagg.host.iface import Interface
    from inagg.models.mgmt import Op, request_frame

    nic = Interface(cable.name)
    ports = {qpn: nic.port(qpn) for qpn in (0x10000, 0x10001, 0xABCDEF)}
    mgmt = nic.mgmt_port()
    mgmt_frame = request_frame(KEY, dst=HOST_MAC, src="02:00:00:00:00:fe", op=Op.READ, seq=1, addr=0)
    other = bytes.fromhex(HOST_MAC.replace(":", "") + "0200000000fe" + "0806") + bytes(46)  # ARP
    sent = [_result(0x10001), other, mgmt_frame, _result(0x10000), _result(0xABCDEF), _result(0x10001)]

    def far_end(conn):
        netns.enter(cable.ns)
        port = netns.PacketPort("sw0")
        for f in sent:
            port.send(f)
        conn.send("sent")

    ctx = mp.get_context("fork")
    parent, end = ctx.Pipe()
    proc = ctx.Process(target=far_end, args=(end,))
    proc.start()
    assert parent.recv() == "sent"
    proc.join()

    def drain(port):
        got = []
        while (f := port.recv(0.2)) is not None:
            got.append(f)
        return got

    try:
        for qpn, port in ports.items():
            assert drain(port) == [f for f in sent if f == _result(qpn)], hex(qpn)
        assert drain(mgmt) == [mgmt_frame]
    finally:
        for port in (*ports.values(), mgmt):
            port.close()


def test_qp_filter_checks_the_qpn():
    from inagg.host.netns import qp_filter

    with pytest.raises(ValueError, match="a QPN is an integer in 0..2\\*\\*24-1, not 16777216"):
        qp_filter(1 << 24)


@pytest.mark.parametrize("argv, message", [
    (["--switch", "remote"], "--switch remote is the board at the far end of an interface: it needs --net iface:NAME"),
    (["--net", "iface:eth1", "--switch", "model"], "--net iface:eth1 reaches the board at the far end of the cable: "
                                                   "--switch remote, not model"),
    (["--net", "iface:eth1", "--loss", "0.1"], "--loss, --dup, --reorder, --corrupt and --pcap act at a software "
                                               "switch; the board's link has only its own faults"),
    (["--net", "iface:eth1", "--mode", "II"], "--switch remote runs UC AllReduce jobs on one switch (the board's "
                                              "gateware)"),
    (["--net", "iface:eth1", "--board-port", "256"], "board port must be an integer in 0..255, not 256"),
    (["--switch-mac", "02:00:00:00:00:01"], "--switch-mac and --switch-ip are the board's addresses: they need "
                                            "--net iface:NAME --switch remote"),
    (["--net", "iface:eth1", "--switch-mac", "02:00:00:00:00"],
     "switch MAC must be six hex bytes joined by ':' (02:00:00:00:00:fe), not '02:00:00:00:00'"),
    (["--net", "iface:eth1", "--switch-mac", "01:00:5e:00:00:01"],
     "switch MAC must be a unicast address (the first byte even, not all zeros), not 01:00:5e:00:00:01"),
    (["--net", "iface:eth1", "--switch-ip", "10.0.0.300"],
     "switch IP must be an IPv4 address (10.0.0.254), not '10.0.0.300'"),
    (["--net", "iface:eth1", "--switch-ip", "224.0.0.1"], "switch IP must be a unicast address, not 224.0.0.1"),
    (["--net", "iface:eth1", "--switch-ip", "10.0.0.2"],
     "switch IP 10.0.0.2 is a worker's address in this plan (workers take 10.0.0.1 and up)"),
    (["--net", "iface:eth1", "--mgmt-key-file", "/nonexistent/board.key"],
     "cannot read the management key file /nonexistent/board.key: No such file or directory"),
])
def test_options_of_a_remote_switch_are_checked(argv, message, capsys):
    assert cli.main(["demo", "--size", "4KiB", *argv]) == 2
    assert capsys.readouterr().err == f"inagg demo: error: {message}\n"


def test_a_key_file_holds_32_hex_digits(tmp_path):
    from inagg.host.mgmt import read_key_file

    path = tmp_path / "k"
    path.write_text(KEY.hex().upper() + "\n")
    assert read_key_file(str(path)) == KEY
    path.write_text(KEY.hex()[:30])
    with pytest.raises(ValueError, match=f"^the management key file {path} must hold the board's key as 32 hex "
                                         "digits$"):
        read_key_file(str(path))
