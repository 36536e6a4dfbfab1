"""Hosts on a named Linux interface: the workers' ports on a NIC cabled to a board.

A board (an FPGA running the switch behind its Ethernet MACs) sits at the
far end of a cable; the hosts are processes on a Linux machine whose
interface ``name`` is that cable's end. :class:`Interface` checks that the
interface can carry the job (it exists, it is up, it has a link, this
process may open AF_PACKET sockets) and opens the workers' ports on it:
:class:`~inagg.host.netns.PacketPort`, as in namespaces, each filtered to
its worker's QP (:func:`~inagg.host.netns.qp_filter`), so processes sharing
the one interface each take their own results, as a RoCE NIC hands each QP
its own. The switch's MAC and IP come from the job description
(``SwitchSpec``); the workers' MAC is the interface's (:meth:`Interface.bind`
puts it in a plan, :meth:`Interface.check` refuses a plan that names
another). No IPv4 address or neighbour entry is needed: frames go out
whole, addressed from the job description.
"""

from __future__ import annotations

import dataclasses
import socket
from pathlib import Path

from inagg.host.controller import Plan
from inagg.host.netns import PacketPort, ether_type_filter, qp_filter
from inagg.models.frame import MGMT_ETHER_TYPE
from inagg.models.wire import mac_bytes

__all__ = ["InterfaceError", "Interface"]

_IFF_UP = 0x1
_SYS = Path("/sys/class/net")


class InterfaceError(RuntimeError):
    """The named interface cannot carry the job; the message names the cause and the fix, on one line."""


class Interface:
    """The Linux interface ``name``, checked for the job (see the module docstring).

    Raises :class:`InterfaceError` when the interface does not exist, is
    down, has no link (no cable, or the far end is off), or this process may
    not open AF_PACKET sockets (it lacks CAP_NET_RAW).

    Attributes
    ----------
    name : str
    mac : str
        The interface's MAC address, lower case.
    """

    def __init__(self, name: str):
        if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
            raise InterfaceError(f"an interface name is a name such as eth1, not {name!r}")
        sys = _SYS / name
        if not sys.exists():
            have = ", ".join(sorted(p.name for p in _SYS.iterdir())) if _SYS.is_dir() else "none"
            raise InterfaceError(f"interface {name} does not exist (this namespace has {have}); name the "
                                 "interface cabled to the board (ip link)")
        self.name = name
        self.mac = (sys / "address").read_text().strip().lower()
        if not int((sys / "flags").read_text(), 16) & _IFF_UP:
            raise InterfaceError(f"interface {name} is down; bring it up: ip link set {name} up")
        if (sys / "carrier").read_text().strip() != "1":
            raise InterfaceError(f"interface {name} is up but has no link: check the cable and that the board is "
                                 "powered and programmed")
        try:
            socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0).close()
        except PermissionError:
            raise InterfaceError(f"this process may not send raw frames on {name} (it lacks CAP_NET_RAW); run as "
                                 "root, or grant the interpreter the capability: setcap cap_net_raw+ep "
                                 "$(readlink -f $(which python3))") from None

    def check(self, plan: Plan) -> None:
        """Raise :class:`InterfaceError` when a worker of ``plan`` has a MAC other than this interface's: the
        board would send its results where this interface does not take them."""
        for job in plan.jobs:
            for w in job.workers:
                if mac_bytes(w.mac) != mac_bytes(self.mac):
                    raise InterfaceError(f"job {job.job} puts a worker at MAC {w.mac}, but interface {self.name} "
                                         f"has MAC {self.mac}; give the workers the interface's MAC")

    def bind(self, plan: Plan, *, port: int) -> Plan:
        """``plan`` with every worker behind this interface: at the board's switch port ``port`` (the one
        cabled here) and at this interface's MAC. Workers keep their IPs and QPNs, which tell them apart."""
        jobs = tuple(dataclasses.replace(j, workers=tuple(dataclasses.replace(w, port=port, mac=self.mac)
                                                          for w in j.workers)) for j in plan.jobs)
        switch = dataclasses.replace(plan.switch, ports=max(plan.switch.ports, port + 1))
        return dataclasses.replace(plan, switch=switch, jobs=jobs)

    def port(self, qpn: int) -> PacketPort:
        """A worker's port: frames to QP ``qpn`` only."""
        return PacketPort(self.name, filter=qp_filter(qpn))

    def mgmt_port(self) -> PacketPort:
        """A port for management frames (EtherType 0x88B5) only."""
        return PacketPort(self.name, filter=ether_type_filter(MGMT_ETHER_TYPE))
