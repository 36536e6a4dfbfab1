"""The VXLAN transport: header bytes against scapy, the port on real UDP sockets, captures, faults."""

import shutil
import socket
import struct
import subprocess
import threading
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.layers.vxlan import VXLAN
from scapy.utils import rdpcap

from inagg.host import allreduce
from inagg.host.controller import plan
from inagg.host.link import Faults
from inagg.host.roce import RETH, contribution
from inagg.host.service import SwitchClient, SwitchService, join
from inagg.host import vxlan
from inagg.host.vxlan import (
    VXLAN_PORT, PcapWriter, VxlanDrop, VxlanPort, check_vni, decap, enable_gro, encap, outer_frame, recv_datagrams,
    send_all,
)
from inagg.host.worker import Timing
from inagg.models.job import SwitchSpec

PLAN = plan([2], window=4, chunk_bytes=256)
FRAME = bytes(contribution(PLAN.switch, PLAN.jobs[0], 1, 7, bytes(range(256))))


def test_header_is_rfc7348_as_scapy_builds_it():
    for vni in (0, 1, 0x123456, (1 << 24) - 1):
        # flags given: scapy otherwise sets VXLAN-GPE's P bit for an Ethernet payload.
        assert encap(FRAME, vni) == bytes(VXLAN(flags="Instance", vni=vni) / Ether(FRAME))
        assert encap(FRAME, vni)[:8] == bytes([0x08, 0, 0, 0]) + vni.to_bytes(3, "big") + b"\0"


def test_scapy_decodes_the_inner_roce_frame():
    pkt = VXLAN(encap(FRAME, 42))
    assert pkt.vni == 42
    assert pkt[BTH].opcode == 0x2A and pkt[BTH].dqpn == PLAN.jobs[0].qpn(1)
    assert pkt[RETH].va == 7 * 256 and pkt[RETH].rkey == PLAN.jobs[0].rkey


def test_decap_drops_what_is_not_this_fabric_and_ignores_reserved_bits():
    d = encap(FRAME, 5)
    assert decap(d, 5) == FRAME
    assert decap(d, 6) is VxlanDrop.WRONG_VNI
    assert decap(d[:7], 5) is VxlanDrop.NOT_VXLAN
    assert decap(b"\x00" + d[1:], 5) is VxlanDrop.NOT_VXLAN  # I flag clear
    reserved = bytes([0xFF, 0xAB, 0xCD, 0xEF]) + d[4:7] + b"\x99" + FRAME
    assert decap(reserved, 5) == FRAME


@given(st.binary(max_size=9300), st.integers(0, (1 << 24) - 1), st.integers(0, (1 << 24) - 1))
def test_decap_inverts_encap_and_tells_fabrics_apart(frame, vni, other):
    d = encap(frame, vni)
    assert len(d) == 8 + len(frame) and decap(d, vni) == frame
    if other != vni:
        assert decap(d, other) is VxlanDrop.WRONG_VNI


@pytest.mark.parametrize("vni", [-1, 1 << 24, 1.0, True, "1"])
def test_vni_is_validated(vni):
    with pytest.raises(ValueError, match=rf"^VNI must be an integer in 0..16777215, not {vni!r}$"):
        check_vni(vni)


@pytest.fixture
def peer():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.settimeout(2)
    yield s
    s.close()


def test_port_round_trip_on_udp(peer):
    with VxlanPort(peer.getsockname(), 9) as port:
        port.send(FRAME)
        datagram, src = peer.recvfrom(65535)
        assert datagram == encap(FRAME, 9) and src == port.address
        peer.sendto(encap(FRAME[::-1], 8), src)   # another fabric: dropped
        peer.sendto(b"\x08\x00", src)             # too short: dropped
        peer.sendto(encap(FRAME[::-1], 9), src)
        assert port.recv(2.0) == FRAME[::-1]
        assert port.recv(0.01) is None
        assert port.stats == {"sent": 1, "received": 1, "wrong_vni": 1, "not_vxlan": 1}


def test_port_counts_datagrams_from_elsewhere_not_at_all(peer):
    """The socket is connected to the switch: the kernel keeps other senders out."""
    with VxlanPort(peer.getsockname(), 9) as port, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as other:
        other.sendto(encap(FRAME, 9), port.address)
        assert port.recv(0.05) is None
        assert not port.stats


def test_port_counts_an_unreachable_switch():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    closed = s.getsockname()
    s.close()
    with VxlanPort(closed, 1) as port:
        port.send(FRAME)
        assert port.recv(0.05) is None
        port.send(FRAME)
        assert port.stats["unreachable"] >= 1


def test_outer_frame_is_a_valid_ipv4_udp_vxlan_frame():
    d = encap(FRAME, 3)
    f = Ether(outer_frame(d, ("127.0.0.1", 50000), ("127.0.0.2", VXLAN_PORT)))
    assert f[IP].src == "127.0.0.1" and f[IP].dst == "127.0.0.2" and f[IP].flags == "DF"
    ip = bytes(f[IP])[:20]
    assert sum(struct.unpack("!10H", ip)) % 0xFFFF == 0  # the header checksum verifies
    assert f[UDP].sport == 50000 and f[UDP].dport == VXLAN_PORT and f[UDP].len == 8 + len(d)
    assert f[VXLAN].vni == 3 and bytes(f[VXLAN].payload) == FRAME


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed (apt-get install tshark)")
def test_tshark_decodes_vxlan_then_roce_on_the_default_port(tmp_path):
    path = tmp_path / "default.pcap"
    writer = PcapWriter(str(path))
    writer(("127.0.0.1", 50000), ("127.0.0.1", VXLAN_PORT), encap(FRAME, 77))
    writer.close()
    out = subprocess.run(["tshark", "-r", str(path), "-T", "fields", "-E", "separator=,", "-e", "frame.protocols",
                          "-e", "vxlan.vni", "-e", "infiniband.bth.opcode", "-e", "infiniband.bth.destqp",
                          "-e", "infiniband.reth.dmalen"], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == [f"eth:ethertype:ip:udp:vxlan:eth:ethertype:ip:udp:infiniband:data,77,42,"
                                  f"{PLAN.jobs[0].qpn(1):#08x},256"]


def _sum_over_service(service: SwitchService, n: int, arrays, timing=None):
    with SwitchClient(service.control_address) as client:
        ticket = client.create_job(n, window=4)
        out, errors = {}, {}

        def rank(r):
            g = join(ticket, r, timing=timing)
            try:
                out[r] = [allreduce(a, g) for a in arrays[r]]
            except Exception as e:  # collected for the test to inspect
                errors[r] = e
            finally:
                g.port.close()

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        counters = client.counters(ticket.job.job, ticket.token)
    return out, errors, counters


def test_capture_decodes_as_vxlan_then_roce(tmp_path):
    path = tmp_path / "vxlan.pcap"
    writer = PcapWriter(str(path))
    spec = SwitchSpec(ports=2, slots=16, chunk_bytes=256)
    with SwitchService(spec, vxlan=("127.0.0.1", 0), vni=77, capture=writer) as service:
        out, errors, _ = _sum_over_service(service, 2, [[np.ones(64, np.float32)]] * 2)
    writer.close()
    assert not errors and all(np.array_equal(o[0], np.full(64, 2, np.float32)) for o in out.values())
    pkts = rdpcap(str(path))
    inner = {id(p): VXLAN(bytes(p[UDP].payload)) for p in pkts}  # an ephemeral test port: VXLAN is bound to 4789
    assert all(x.vni == 77 for x in inner.values())
    # One proof of receipt to each rank's endpoint (its own EtherType), from the VXLAN address; then RoCEv2 only.
    probes = [p for p in pkts if inner[id(p)][Ether].type == 0x88B5]
    assert len(probes) == 2 and len({p[UDP].dport for p in probes}) == 2
    (job_port,) = {p[UDP].sport for p in probes}
    to_switch = [p for p in pkts if p[UDP].dport == job_port]
    from_switch = [p for p in pkts if p[UDP].sport == job_port]
    assert to_switch and from_switch and len(to_switch) + len(from_switch) == len(pkts)
    from_switch = [p for p in from_switch if p not in probes]
    assert all(inner[id(p)][UDP].dport == 4791 for p in to_switch + from_switch)
    assert {inner[id(p)][BTH].opcode for p in to_switch} == {0x2A}
    assert {inner[id(p)][BTH].opcode for p in from_switch} == {0x2B}


def test_faults_on_the_vxlan_link_leave_sums_exact():
    spec = SwitchSpec(ports=3, slots=16, chunk_bytes=256)
    rng = np.random.default_rng(1)
    arrays = [[rng.integers(-1000, 1000, 3000).astype(np.float32) for _ in range(2)] for _ in range(3)]
    faults = Faults(loss=0.05, dup=0.05, reorder=0.05, corrupt=0.02, reorder_delay=2e-3)
    timing = Timing(timeout=0.01, max_timeout=0.1, tries=30)
    with SwitchService(spec, vxlan=("127.0.0.1", 0), faults=faults, seed=3) as service:
        out, errors, counters = _sum_over_service(service, 3, arrays, timing)
    assert not errors
    for call in range(2):
        ref = sum(arrays[r][call] for r in range(3))
        for r in range(3):
            assert np.array_equal(out[r][call], ref)
    assert set(service.link.stats) == {"lost", "duplicated", "reordered", "corrupted"}
    assert counters["switch"]["DUP_CONTRIB"] > 0


def test_send_all_sends_in_order_and_reports_a_refused_datagram():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        rx.bind(("127.0.0.1", 0))
        rx.settimeout(5)
        tx.connect(rx.getsockname())
        assert send_all(tx, [b"a", b"bb", b"ccc"]) == [None, None, None]
        assert [rx.recv(16) for _ in range(3)] == [b"a", b"bb", b"ccc"]
        rx.close()  # nobody listens now: the kernel's ICMP error comes back on the next send
        assert send_all(tx, [b"x"]) == [None]
        deadline = time.monotonic() + 5
        while (fates := send_all(tx, [b"y", b"z"]))[0] is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert isinstance(fates[0], ConnectionRefusedError) and fates[1] is None


def _pair(gro: bool):
    rx, tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    rx.bind(("127.0.0.1", 0))
    if gro:
        assert enable_gro(rx)  # this project's kernels (5.0 and later) all offer it
    tx.connect(rx.getsockname())
    return rx, tx


def _read_all(rx, n: int) -> tuple[list[bytes], int]:
    """``n`` datagrams from ``rx`` and the reads they took."""
    got, reads, deadline = [], 0, time.monotonic() + 5
    while len(got) < n and time.monotonic() < deadline:
        try:
            got += recv_datagrams(rx)[0]
            reads += 1
        except BlockingIOError:
            time.sleep(0.001)
    return got, reads


# Runs of one size, a shorter one that ends a run, a longer one that starts one, more than a call's segments,
# and sizes whose run the byte limit cuts before the segment limit.
DATAGRAMS = ([bytes([i]) * 1100 for i in range(70)] + [b"short"] + [b"L" * 1200, b"M" * 1200]
             + [bytes([i]) * 9000 for i in range(9)] + [b"z"])


@pytest.mark.parametrize("gro", [True, False], ids=["receive offload", "one datagram per read"])
@pytest.mark.parametrize("segment", [True, False], ids=["segmented", "one per call"])
def test_send_all_delivers_every_datagram_intact_and_in_order(gro, segment):
    rx, tx = _pair(gro)
    with rx, tx:
        assert send_all(tx, DATAGRAMS, segment=segment) == [None] * len(DATAGRAMS)
        got, reads = _read_all(rx, len(DATAGRAMS))
    assert got == DATAGRAMS
    # Segmented sends to a socket with receive offload arrive as runs: far fewer reads than datagrams.
    assert (reads < len(DATAGRAMS) // 4) == (gro and segment)


def test_send_all_to_an_address_on_an_unconnected_socket():
    rx, tx = _pair(True)
    with rx, tx, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as shared:
        assert send_all(shared, DATAGRAMS[:5], rx.getsockname()) == [None] * 5
        assert _read_all(rx, 5) == (DATAGRAMS[:5], 1)


@pytest.mark.parametrize("sizes, end", [
    ([100] * 70, 64),                    # the kernel's segments per call
    ([9000] * 9, 7),                     # its bytes per call: 7 * 9000 <= 65507 < 8 * 9000
    ([100, 100, 40, 100], 3),            # a shorter datagram ends a run
    ([100, 200], 1),                     # a longer one starts the next
    ([0, 0], 1),                         # an empty datagram travels alone
])
def test_a_run_is_what_one_segmented_call_can_carry(sizes, end):
    assert vxlan._run_end([bytes(n) for n in sizes], 0) == end


class _Refusing:
    """A connected socket whose segmented sends fail with ``error``; single sends are recorded."""

    def __init__(self, error: OSError):
        self.error, self.sent = error, []

    def sendmsg(self, buffers, ancillary, *rest):
        raise self.error

    def send(self, datagram):
        self.sent.append(datagram)


def test_a_refused_segmented_send_goes_again_one_datagram_per_call():
    sock = _Refusing(OSError(5, "Input/output error"))  # what a device without the offload answers
    assert send_all(sock, [b"ab", b"cd", b"e"]) == [None] * 3
    assert sock.sent == [b"ab", b"cd", b"e"]


def test_an_earlier_icmp_error_costs_the_first_datagram_of_a_run_only():
    """As one call per datagram would: the error refuses the call it comes back on, whatever that carries."""
    sock = _Refusing(ConnectionRefusedError(111, "Connection refused"))
    fates = send_all(sock, [b"ab", b"cd"])
    assert isinstance(fates[0], ConnectionRefusedError) and fates[1:] == [None] and sock.sent == [b"cd"]


@pytest.mark.parametrize("segment", [True, False])
def test_port_sends_a_batch_and_takes_a_run_frame_by_frame(peer, segment):
    frames = [FRAME[:-1] + bytes([i]) for i in range(40)] + [FRAME[:60]]
    with VxlanPort(peer.getsockname(), 9, segment=segment) as port:
        port.send_batch(frames)
        got = [peer.recvfrom(65535) for _ in frames]
        assert [d for d, _ in got] == [encap(f, 9) for f in frames]
        assert send_all(peer, [encap(f, 9) for f in frames[::-1]] + [b"\x08"], port.address) == [None] * 42
        assert [port.recv(2.0) for _ in frames] == frames[::-1]
        assert not port.pending and port.recv(0.01) is None
        assert port.stats == {"sent": 41, "received": 41, "not_vxlan": 1}


def test_port_keeps_the_rest_of_a_run_for_the_next_calls(peer):
    with VxlanPort(peer.getsockname(), 9) as port:
        send_all(peer, [encap(FRAME, 9)] * 3, port.address)
        assert port.recv(2.0) == FRAME
        assert port.pending  # the socket is empty now: a caller that waits on it must take these first
        assert [port.recv(0.0), port.recv(0.0)] == [FRAME, FRAME] and not port.pending


def test_port_batch_counts_refused_datagrams_and_raises_other_errors(peer, monkeypatch):
    with VxlanPort(peer.getsockname(), 9) as port:
        monkeypatch.setattr(vxlan, "send_all", lambda *a, **k: [None, ConnectionRefusedError(), OSError(105, "x")])
        with pytest.raises(OSError, match="x"):
            port.send_batch([FRAME] * 3)
        assert port.stats == {"sent": 1, "unreachable": 1}


@pytest.mark.parametrize("segment", [True, False], ids=["offload", "one datagram per call"])
def test_service_sums_are_exact_with_and_without_the_offloads(segment):
    with SwitchService(SwitchSpec(ports=2, slots=64), segment=segment) as service, \
            SwitchClient(service.control_address) as client:
        ticket = client.create_job(2, window=16)
        groups = [join(ticket, r, segment=segment) for r in range(2)]
        arrays = [np.arange(40_000, dtype=np.float32) * (r + 1) for r in range(2)]
        out = [None, None]
        threads = [threading.Thread(target=lambda r=r: out.__setitem__(r, allreduce(arrays[r], groups[r])))
                   for r in range(2)]
        [t.start() for t in threads]
        [t.join(60) for t in threads]
        for g in groups:
            g.port.close()
    assert all(np.array_equal(o, arrays[0] + arrays[1]) for o in out)
    assert service.stats["tx_datagrams"] >= 2 * 40 and not service.stats["tx_errors"]


def test_service_segment_flag_is_a_bool():
    with pytest.raises(TypeError, match="segment must be a bool, not str"):
        SwitchService(SwitchSpec(ports=2, slots=64), segment="yes")
