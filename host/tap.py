"""The TAP transport: each switch port is a TAP device, for a switch that lives outside the kernel.

A switch implementation that is not a Linux network stack -- the Verilated
RTL under cocotb, or the model switch -- attaches to the hosts through one
:class:`TapPort` per switch port. :class:`TapTopology` creates the TAP devices
in the calling (bridge) process, keeps their file descriptors, and moves each
device into its worker's namespace as ``eth0`` with the worker's MAC. A
worker there uses :class:`~inagg.host.netns.PacketPort` as over veth; what it
sends comes out of :meth:`TapPort.recv` on the bridge side, and what the
bridge passes to :meth:`TapPort.send` arrives at the worker.

A bridge loop needs only ``fileno()``, ``recv_nowait()`` and ``send()``:
:func:`inagg.host.netns.serve_switch` runs the model switch on TAP ports as
it does on AF_PACKET ports, and a cocotb bridge drives an RTL port's AXI
stream source with ``recv_nowait()`` and feeds ``send()`` from its sink.
"""

from __future__ import annotations

import fcntl
import os
import select
import struct

from inagg.host.controller import Plan
from inagg.host.netns import Topology

__all__ = ["TapPort", "TapTopology"]

_TUNSETIFF = 0x400454CA
_IFF_TAP = 0x0002
_IFF_NO_PI = 0x1000
_MAX_FRAME = 65536


class TapPort:
    """The bridge side of TAP device ``ifname`` (created in the current namespace).

    :meth:`recv` returns what hosts sent into the device; :meth:`send` hands a
    frame to the hosts. Frames are whole Ethernet frames without FCS.
    """

    def __init__(self, ifname: str):
        if not isinstance(ifname, str) or not 1 <= len(ifname.encode()) <= 15:
            raise ValueError(f"a TAP interface name has 1 to 15 bytes, not {ifname!r}")
        self.ifname = ifname
        self._fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
        try:
            fcntl.ioctl(self._fd, _TUNSETIFF, struct.pack("16sH", ifname.encode(), _IFF_TAP | _IFF_NO_PI))
        except BaseException:
            os.close(self._fd)
            raise

    def fileno(self) -> int:
        return self._fd

    def send(self, frame: bytes) -> None:
        os.write(self._fd, frame)

    def recv_nowait(self) -> bytes | None:
        """A frame if one is queued, else None."""
        try:
            return os.read(self._fd, _MAX_FRAME)
        except BlockingIOError:
            return None

    def recv(self, timeout: float) -> bytes | None:
        if select.select([self._fd], [], [], timeout)[0]:
            return self.recv_nowait()
        return None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class TapTopology(Topology):
    """A namespace per worker whose ``eth0`` is a TAP device; the bridge holds ``taps[port]``.

    There is no switch namespace: the switch is the process holding the TAP
    file descriptors. Closing them and removing the namespaces removes the
    devices.
    """

    def __init__(self, plan: Plan, *, tag: str | None = None):
        super().__init__(plan, tag=tag)
        self.taps: dict[int, TapPort] = {}

    def create(self) -> "TapTopology":
        from pyroute2 import IPRoute, NetNS, netns

        from inagg.host.netns import _MTU, _disable_ipv6

        try:
            macs = {w.port: w.mac for j in self.plan.jobs for w in j.workers}
            with IPRoute() as ipr:
                for p in self.ports:
                    name = self.worker_ns(p)
                    netns.create(name)
                    self._created.append(name)
                    _disable_ipv6(name)
                    tmp = f"inaggtap{os.getpid() % 10000}x{p}"[:15]
                    self.taps[p] = TapPort(tmp)
                    ipr.link("set", index=ipr.link_lookup(ifname=tmp)[0], net_ns_fd=name)
                    with NetNS(name) as ns:
                        i = ns.link_lookup(ifname=tmp)[0]
                        ns.link("set", index=i, ifname=self.worker_if, address=macs[p], mtu=_MTU)
                        ns.link("set", index=i, state="up")
        except BaseException:
            self.destroy()
            raise
        return self

    def destroy(self) -> None:
        while self.taps:
            self.taps.popitem()[1].close()
        super().destroy()
