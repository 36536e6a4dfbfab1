"""The Linux network-namespace transport: one namespace per worker and one for the switch.

:class:`Topology` creates, with pyroute2, a namespace per worker and one for
the switch, and a veth pair per worker: ``eth0`` in the worker's namespace,
``sw<port>`` in the switch's. Each end carries the MAC of the plan
(:mod:`inagg.host.controller`), IPv6 is off (no router solicitations on the
links) and no IPv4 address is assigned: frames are sent and received whole on
AF_PACKET sockets (:class:`PacketPort`), as a RoCE NIC would, and the kernel
stack, having no address, ignores them instead of answering with ICMP.
Destroying the topology removes the namespaces, which removes the veths; it
runs on errors and on Ctrl-C too (``with Topology(...)``).

:func:`serve_switch` is the switch process's loop: the model switch behind
one AF_PACKET socket per port, with the lossy link applied on the switch
side in both directions (this kernel has no netem).
"""

from __future__ import annotations

import abc
import ctypes
import os
import selectors
import socket
import struct
import time
import uuid
from collections import Counter as Tally
from collections.abc import Callable, Mapping

from inagg.host.controller import Plan
from inagg.host.link import Faults, HeldFrames, LossyLink, clocked_receive, idle_wait
from inagg.models.frame import RESULT
from inagg.models.protocol import ETH_TYPE_IPV4, IP_PROTO_UDP, ROCE_UDP_PORT

__all__ = ["NetnsUnavailable", "Namespaces", "Topology", "TreeTopology", "PacketPort", "serve_switch", "enter",
           "require_root", "qp_filter", "ether_type_filter"]

_ETH_P_ALL = 0x0003
_SO_ATTACH_FILTER = 26
_PACKET_OUTGOING = 4
_SOL_SOCKET_RCVBUFFORCE = 33
_SO_SNDBUFFORCE = 32
_MTU = 9000


class NetnsUnavailable(RuntimeError):
    """The namespace transport cannot run here."""


def require_root() -> None:
    """Raise :class:`NetnsUnavailable` unless this process may create namespaces."""
    if os.geteuid() != 0:
        raise NetnsUnavailable("the netns transport needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) to create network "
                               "namespaces and veth pairs; run as root, or use the memory transport (--net memory)")


def enter(name: str) -> None:
    """Move this (single-threaded) process into namespace ``name``."""
    from pyroute2 import netns

    netns.setns(name)


class Namespaces(abc.ABC):
    """Namespaces joined by veth pairs: :meth:`create` makes what :meth:`_layout` names and :meth:`destroy`
    removes every namespace made (their veths go with them), also when :meth:`create` fails part way; a
    ``with`` block does both. A subclass sets ``_created`` to an empty list and gives :meth:`_layout`
    (``p4/tests/run_bmv2.py`` wires simple_switch's ports with one)."""

    _created: list[str]

    @abc.abstractmethod
    def _layout(self) -> tuple[list[str], list[tuple[tuple[str, str, str], tuple[str, str, str]]]]:
        """The namespaces to make, and the veth pairs: ``((namespace, interface, MAC), (namespace, ...))``."""

    def create(self):
        from pyroute2 import IPRoute, NetNS, netns

        names, pairs = self._layout()
        try:
            for name in names:
                netns.create(name)
                self._created.append(name)
                _disable_ipv6(name)
            ends: dict[str, list[tuple[str, str, str]]] = {}  # namespace -> (interface now, its name, MAC)
            with IPRoute() as ipr:
                for n, ((near_ns, near_if, near_mac), (far_ns, far_if, far_mac)) in enumerate(pairs):
                    # The far end is made here under a name unique in this namespace, then moved and
                    # renamed: far ends may share a name (every rank's eth0).
                    tmp = f"inagg{os.getpid() % 100000}x{n}"[:15]
                    ipr.link("add", ifname=tmp, kind="veth", peer={"ifname": near_if, "net_ns_fd": near_ns})
                    ipr.link("set", index=ipr.link_lookup(ifname=tmp)[0], net_ns_fd=far_ns)
                    ends.setdefault(near_ns, []).append((near_if, near_if, near_mac))
                    ends.setdefault(far_ns, []).append((tmp, far_if, far_mac))
            for ns_name, links in ends.items():
                with NetNS(ns_name) as ns:
                    for now, name, mac in links:
                        i = ns.link_lookup(ifname=now)[0]
                        if now != name:
                            ns.link("set", index=i, ifname=name)
                        ns.link("set", index=i, address=mac, mtu=_MTU)
                        ns.link("set", index=i, state="up")
        except BaseException:
            self.destroy()
            raise
        return self

    def destroy(self) -> None:
        """Remove every namespace this topology created (their veths go with them)."""
        from pyroute2 import netns

        while self._created:
            name = self._created.pop()
            try:
                netns.remove(name)
            except OSError:
                pass  # already gone

    def __enter__(self):
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.destroy()


class Topology(Namespaces):
    """Namespaces and veth pairs for every worker port of a :class:`~inagg.host.controller.Plan`."""

    def __init__(self, plan: Plan, *, tag: str | None = None):
        require_root()
        self.plan = plan
        tag = tag or uuid.uuid4().hex[:6]
        self.switch_ns = f"inagg-{tag}-sw"
        self.ports = [w.port for j in plan.jobs for w in j.workers]
        self._created: list[str] = []

    def worker_ns(self, port: int) -> str:
        return f"{self.switch_ns[:-3]}-w{port}"

    @staticmethod
    def switch_if(port: int) -> str:
        return f"sw{port}"

    worker_if = "eth0"

    def _layout(self):
        macs = {w.port: w.mac for j in self.plan.jobs for w in j.workers}
        pairs = [((self.switch_ns, self.switch_if(p), self.plan.switch.mac), (self.worker_ns(p), self.worker_if,
                                                                              macs[p])) for p in self.ports]
        return [self.switch_ns] + [self.worker_ns(p) for p in self.ports], pairs


class TreeTopology(Namespaces):
    """Namespaces and veth pairs for a :class:`~inagg.host.controller.TreePlan`: one namespace per switch and
    per rank, one veth pair per hop of the tree.

    Switch ``s``'s port ``p`` is ``sw<p>`` in :meth:`switch_ns` ``(s)``
    (its uplink too: the port after its children's), with the switch's
    MAC; rank ``r``'s end is ``eth0`` in :meth:`rank_ns` ``(r)``, with the
    rank's MAC of the plan.
    """

    def __init__(self, plan, *, tag: str | None = None):
        require_root()
        self.plan = plan
        self._prefix = f"inagg-{tag or uuid.uuid4().hex[:6]}"
        self._created: list[str] = []

    def switch_ns(self, s: int) -> str:
        return f"{self._prefix}-s{s}"

    def rank_ns(self, r: int) -> str:
        return f"{self._prefix}-r{r}"

    switch_if = staticmethod(Topology.switch_if)
    rank_if = Topology.worker_if

    def _layout(self):
        tp = self.plan
        tree = tp.tree
        pairs = []
        for s in tree.switches:
            mac = tp.plans[s.index].switch.mac
            for p, child in enumerate(s.children):
                if child.switch:
                    c = tree.switches[child.index]
                    far = (self.switch_ns(c.index), self.switch_if(c.uplink_port), tp.plans[c.index].switch.mac)
                else:
                    leaf, w = tp.rank(child.index)
                    far = (self.rank_ns(child.index), self.rank_if, tp.plans[leaf].jobs[0].workers[w].mac)
                pairs.append(((self.switch_ns(s.index), self.switch_if(p), mac), far))
        return [self.switch_ns(s.index) for s in tree.switches] + [self.rank_ns(r) for r in range(tree.ranks)], pairs


def _disable_ipv6(name: str) -> None:
    from pyroute2 import netns

    netns.pushns(name)
    try:
        for conf in ("all", "default"):
            with open(f"/proc/sys/net/ipv6/conf/{conf}/disable_ipv6", "w") as f:
                f.write("1")
    finally:
        netns.popns()


# Classic BPF (linux/filter.h): the instruction codes the filters below use.
_LD_W, _LD_H, _LD_B = 0x20, 0x28, 0x30  # BPF_LD | BPF_W/H/B | BPF_ABS: load the frame's bytes at k
_AND = 0x54                             # BPF_ALU | BPF_AND | BPF_K
_JEQ = 0x15                             # BPF_JMP | BPF_JEQ | BPF_K
_RET = 0x06                             # BPF_RET | BPF_K: keep k bytes of the frame (0: drop it)
_KEEP = 0x40000


def _compare_all(tests: list[tuple]) -> list[tuple[int, int, int, int]]:
    """A program that keeps a frame when every ``(load, offset, value)`` test holds (a ``load`` of ``(_LD_W,
    mask)`` masks the word), and drops it otherwise."""
    prog: list[tuple[int, int, int, int]] = []
    jumps = []
    for load, offset, value in tests:
        if isinstance(load, tuple):
            prog += [(load[0], 0, 0, offset), (_AND, 0, 0, load[1])]
        else:
            prog.append((load, 0, 0, offset))
        jumps.append(len(prog))
        prog.append((_JEQ, 0, 0, value))
    prog.append((_RET, 0, 0, _KEEP))
    drop = len(prog)
    prog.append((_RET, 0, 0, 0))
    for i in jumps:  # a failed test jumps to the drop (jf counts the instructions after the jump)
        prog[i] = (_JEQ, 0, drop - i - 1, prog[i][3])
    return prog


def qp_filter(qpn: int) -> list[tuple[int, int, int, int]]:
    """A socket filter that keeps only RoCEv2 frames to QP ``qpn``: IPv4 without options, UDP port 4791, BTH
    destination QP ``qpn``. Processes sharing one interface each take their own QP's frames, as a NIC hands
    each QP its own, and the kernel drops the rest (other QPs' results, ARP, IPv6) before they are copied."""
    if not isinstance(qpn, int) or not 0 <= qpn < 1 << 24:
        raise ValueError(f"a QPN is an integer in 0..2**24-1, not {qpn!r}")
    eth_off, _ = RESULT.span("ethernet.ether_type")
    proto_off, _ = RESULT.span("ipv4.protocol")
    dport_off, _ = RESULT.span("udp.dport")
    qpn_off, qpn_len = RESULT.span("bth.dqpn")
    version_ihl = RESULT.offset("ipv4")  # version 4 and IHL 5 share the header's first byte
    return _compare_all([(_LD_H, eth_off, ETH_TYPE_IPV4), (_LD_B, version_ihl, 0x45), (_LD_B, proto_off, IP_PROTO_UDP),
                         (_LD_H, dport_off, ROCE_UDP_PORT),
                         ((_LD_W, (1 << 8 * qpn_len) - 1), qpn_off + qpn_len - 4, qpn)])


def ether_type_filter(ether_type: int) -> list[tuple[int, int, int, int]]:
    """A socket filter that keeps only frames of EtherType ``ether_type`` (management frames: 0x88B5)."""
    eth_off, _ = RESULT.span("ethernet.ether_type")
    return _compare_all([(_LD_H, eth_off, ether_type)])


def _attach(sock: socket.socket, prog: list[tuple[int, int, int, int]]) -> None:
    code = b"".join(struct.pack("HBBI", *insn) for insn in prog)
    buf = ctypes.create_string_buffer(code)
    # struct sock_fprog { unsigned short len; struct sock_filter *filter; }: the kernel copies the program.
    sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, struct.pack("HP", len(prog), ctypes.addressof(buf)))


class PacketPort:
    """A :class:`~inagg.host.api.Port` on an AF_PACKET socket bound to ``ifname`` in the current namespace.

    Frames this host sends itself (which AF_PACKET also reports) are skipped.
    ``filter``: a socket filter (:func:`qp_filter`, :func:`ether_type_filter`)
    that the kernel applies before a frame reaches the socket; without one
    every frame on the interface arrives.
    """

    def __init__(self, ifname: str, *, buffer: int = 8 << 20, filter: list[tuple[int, int, int, int]] | None = None):
        self.ifname = ifname
        # Protocol 0 receives nothing until bind() names the interface and ETH_P_ALL: no frame of another
        # interface, nor one the filter would drop, is queued before both are set.
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        try:
            # Root may exceed rmem_max: a window of results arrives in one burst. A process with CAP_NET_RAW
            # alone (a host on a NIC) may not, and gets what rmem_max allows.
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, _SOL_SOCKET_RCVBUFFORCE, buffer)
                self.sock.setsockopt(socket.SOL_SOCKET, _SO_SNDBUFFORCE, buffer)
            except PermissionError:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer)
            if filter is not None:
                _attach(self.sock, filter)
            self.sock.bind((ifname, _ETH_P_ALL))
        except BaseException:
            self.sock.close()
            raise

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, frame: bytes) -> None:
        self.sock.send(frame)

    def recv(self, timeout: float) -> bytes | None:
        end = time.monotonic() + timeout
        while True:
            self.sock.settimeout(max(0.0, end - time.monotonic()))
            try:
                frame, addr = self.sock.recvfrom(65536)
            except (TimeoutError, BlockingIOError):
                return None
            if addr[2] != _PACKET_OUTGOING:
                return frame

    def recv_nowait(self) -> bytes | None:
        """A frame if one is queued, else None."""
        while True:
            try:
                frame, addr = self.sock.recvfrom(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return None
            if addr[2] != _PACKET_OUTGOING:
                return frame

    def close(self) -> None:
        self.sock.close()


def serve_switch(switch, ports: dict[int, PacketPort], *, faults: Faults | None = None, seed: int = 0,
                 stop: Callable[[], bool], capture: Callable[[float, bytes], None] | None = None,
                 links: Mapping[int, LossyLink] | None = None) -> dict:
    """Run ``switch`` (a ModelSwitch) on ``ports`` until ``stop()`` is true; returns the links' fault counts.

    Every frame crosses the lossy link of its port on its way in and again on
    its way out; frames a link holds back are released when their delay has
    passed. By default every port crosses one link of ``faults`` and
    ``seed``; ``links`` names each port's own instead (a port it does not
    name has none: on a tree the upper end of each hop applies its faults).
    The switch's timers (Mode III's) run on the monotonic clock: it sees the
    time before every frame, and its due timers fire between frames.
    """
    if links is None:
        links = dict.fromkeys(ports, LossyLink(faults, seed))
    clean = LossyLink()
    held = HeldFrames()
    sel = selectors.DefaultSelector()
    for p, port in ports.items():
        sel.register(port, selectors.EVENT_READ, p)

    def cross(direction: int, port: int, frame: bytes) -> None:
        held.cross(links.get(port, clean), direction, port, frame, arrive)

    def send(frames: list[tuple[int, bytes]]) -> None:
        for out_port, out in frames:
            cross(1, out_port, out)

    def arrive(direction: int, port: int, frame: bytes) -> None:
        if direction == 0:
            send(clocked_receive(switch, port, frame))
        else:
            if capture is not None:
                capture(time.time(), frame)
            ports[port].send(frame)

    try:
        while not stop():
            for key, _ in sel.select(idle_wait(held, switch, 0.05, time.monotonic())):
                p = key.data
                while (frame := ports[p].recv_nowait()) is not None:
                    if capture is not None:
                        capture(time.time(), frame)
                    cross(0, p, frame)
            for direction, port, f in held.due():
                arrive(direction, port, f)
            send(switch.on_timer(time.monotonic()))
    finally:
        sel.close()
    return dict(sum((link.stats for link in {id(k): k for k in links.values()}.values()), Tally()))
