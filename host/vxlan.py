"""The VXLAN transport: each Ethernet frame in one UDP datagram behind an RFC 7348 header.

A worker in another process, or on another machine, reaches the switch with
an ordinary UDP socket, without root: :class:`VxlanPort` is a
:class:`~inagg.host.api.Port` that sends each RoCEv2 frame as::

    UDP(dport: the switch's) | VXLAN(8: flags 0x08, VNI) | Ethernet | IPv4 | UDP(4791) | BTH | ...

and unwraps what comes back. The switch side is :mod:`inagg.host.service`.
The VNI names one fabric (one switch): a datagram with another VNI, or
without the I flag, is not for this fabric and is dropped and counted, as
are datagrams too short to hold a header.

The switch listens on the UDP port it is given (:data:`VXLAN_PORT`, 4789,
the IANA port of VXLAN, or a free one: the service's default, since 4789
clashes with a kernel VXLAN device or a second service); a worker is a VTEP
on a port of its own (several share a host). With the switch on 4789
Wireshark or tshark decode VXLAN and then the inner RoCEv2 frame with no
options; on another port, ``tshark -d udp.port==PORT,vxlan``. :func:`outer_frame` and :class:`PcapWriter` record
datagrams as full Ethernet/IPv4/UDP frames so that a capture shows both
layers.

Per RFC 7348 section 5 the reserved bits are sent as zero and ignored on
receipt, and the inner frame carries no FCS.
"""

from __future__ import annotations

import enum
import math
import select
import socket
import struct
import sys
import time
from collections import Counter as Tally
from collections import deque
from collections.abc import Callable

from inagg.models import wire
from inagg.models.protocol import ETH_TYPE_IPV4, IP_PROTO_UDP, IPV4_LEN, UDP_LEN

__all__ = ["VXLAN_PORT", "VXLAN_HDR_LEN", "MAX_VNI", "VxlanDrop", "encap", "decap", "check_vni", "VxlanPort",
           "send_all", "recv_datagrams", "enable_gro", "outer_frame", "PcapWriter", "Capture"]

VXLAN_PORT = 4789
VXLAN_HDR_LEN = 8
MAX_VNI = (1 << 24) - 1
_I_FLAG = 0x08
# Larger than any jumbo frame a transport of ours carries.
_MAX_DATAGRAM = 65535


class VxlanDrop(enum.Enum):
    """Why a received datagram was not handed on."""

    NOT_VXLAN = "not_vxlan"     # shorter than the header, or I flag clear
    WRONG_VNI = "wrong_vni"     # another fabric's datagram


def check_vni(vni: object) -> int:
    """``vni`` if it is a valid VXLAN network identifier (0..2**24-1), else ``ValueError``."""
    if not isinstance(vni, int) or isinstance(vni, bool) or not 0 <= vni <= MAX_VNI:
        raise ValueError(f"VNI must be an integer in 0..{MAX_VNI}, not {vni!r}")
    return vni


def encap(frame: bytes, vni: int) -> bytes:
    """The VXLAN datagram payload carrying Ethernet frame ``frame`` on network ``vni``."""
    return struct.pack("!B3xI", _I_FLAG, vni << 8) + frame


def decap(datagram: bytes, vni: int) -> bytes | VxlanDrop:
    """The inner Ethernet frame of ``datagram``, or why it is not one of network ``vni``."""
    if len(datagram) < VXLAN_HDR_LEN or not datagram[0] & _I_FLAG:
        return VxlanDrop.NOT_VXLAN
    if int.from_bytes(datagram[4:7], "big") != vni:
        return VxlanDrop.WRONG_VNI
    return datagram[VXLAN_HDR_LEN:]


# linux/udp.h. Segmentation offload (4.18) sends a run of equal datagrams in one call, and the stack carries
# them as one buffer to a socket with receive offload (5.0), which reads them in one call too.
UDP_SEGMENT, UDP_GRO = 103, 104
# The most segments the kernel takes in one call (UDP_MAX_SEGMENTS: 64 in 4.18, 128 since 5.4), and the most
# bytes (a UDP payload in IPv4).
_GSO_SEGMENTS, _GSO_BYTES = 64, 65507
_GRO_CMSG = socket.CMSG_SPACE(4)


def enable_gro(sock: socket.socket) -> bool:
    """Ask the kernel to hand ``sock`` runs of datagrams as one buffer (``UDP_GRO``); whether it agreed."""
    try:
        sock.setsockopt(socket.SOL_UDP, UDP_GRO, 1)
    except OSError:  # a kernel before 5.0: one datagram per read, as before
        return False
    return True


def recv_datagrams(sock: socket.socket) -> tuple[list[bytes], object]:
    """The datagrams of one read of UDP socket ``sock`` (several on a socket with :func:`enable_gro`), and
    their source address; never blocks (``BlockingIOError`` when none is queued).

    A run read at once came from one source, and all its datagrams but the last have the segment size the
    kernel reports; a read without that report is one datagram.
    """
    data, ancillary, _, src = sock.recvmsg(_MAX_DATAGRAM, _GRO_CMSG, socket.MSG_DONTWAIT)
    for level, kind, value in ancillary:
        if level == socket.SOL_UDP and kind == UDP_GRO:
            size = int.from_bytes(value[:4], sys.byteorder)
            if 0 < size < len(data):
                return [data[i:i + size] for i in range(0, len(data), size)], src
    return [data], src


def _run_end(datagrams: list[bytes], i: int) -> int:
    """The end of the run from ``i`` that one segmented send can carry: datagrams of ``datagrams[i]``'s size, and at
    most one shorter one last, within the kernel's segment and byte limits."""
    size, n = len(datagrams[i]), len(datagrams)
    most = min(_GSO_SEGMENTS, _GSO_BYTES // size) if size else 1
    j, total = i + 1, size
    while j < n and j - i < most and len(datagrams[j]) <= size and total + len(datagrams[j]) <= _GSO_BYTES:
        total += len(datagrams[j])
        j += 1
        if len(datagrams[j - 1]) < size:
            break
    return j


def _send_one(sock: socket.socket, datagram: bytes, address) -> OSError | None:
    try:
        if address is None:
            sock.send(datagram)
        else:
            sock.sendto(datagram, address)
    except OSError as e:
        return e
    return None


def send_all(sock: socket.socket, datagrams: list[bytes], address=None, *, segment: bool = True
             ) -> list[OSError | None]:
    """Send ``datagrams`` in order on ``sock`` (to ``address``, or to the socket's peer when None); what became of
    each: None (sent) or its error.

    With ``segment`` (the default) each run of datagrams of one size goes in one ``sendmsg`` with the kernel's
    segmentation offload (``UDP_SEGMENT``): on the wire they are the same datagrams, but the stack is crossed
    once per run, not once per datagram (``bench/scaleout.py --only gso`` measures both ways). ``segment=False``
    sends one datagram per call. A datagram the kernel refuses (a full buffer, an ICMP error of an earlier one)
    is reported and the rest are still sent: a refused run is sent again one datagram per call, except that an
    earlier datagram's ICMP error, which refuses one call whatever it carries, costs its first datagram alone,
    as it would one call per datagram.
    """
    fates: list[OSError | None] = []
    i, n = 0, len(datagrams)
    while i < n:
        j = _run_end(datagrams, i) if segment else i + 1
        if j - i == 1:
            fates.append(_send_one(sock, datagrams[i], address))
            i = j
            continue
        size = struct.pack("=H", len(datagrams[i]))
        try:
            if address is None:
                sock.sendmsg(datagrams[i:j], [(socket.SOL_UDP, UDP_SEGMENT, size)])
            else:
                sock.sendmsg(datagrams[i:j], [(socket.SOL_UDP, UDP_SEGMENT, size)], 0, address)
        except ConnectionRefusedError as e:
            fates.append(e)
            i += 1
            continue
        except OSError:  # no offload here (a kernel before 4.18, a device without it), or a full buffer
            fates.extend(_send_one(sock, d, address) for d in datagrams[i:j])
        else:
            fates.extend([None] * (j - i))
        i = j
    return fates


class VxlanPort:
    """A worker's :class:`~inagg.host.api.Port` to a switch over VXLAN on UDP.

    Parameters
    ----------
    switch:
        ``(host, port)`` of the switch's VXLAN endpoint.
    vni:
        The fabric's VXLAN network identifier.
    bind:
        Local ``(host, port)``; port 0 takes a free one. By default the
        socket binds where the route to ``switch`` leaves the host.

    segment:
        Use the kernel's UDP segmentation and receive offloads (see
        :func:`send_all`): :meth:`send_batch` sends a run of frames in one
        call, and one read takes a run the switch sent so. False: one
        datagram per call both ways (the path before them, kept to measure
        against).

    The socket is connected to the switch, so the kernel delivers datagrams
    from the switch only. ``stats`` counts datagrams sent and received,
    drops by :class:`VxlanDrop`, and ``"unreachable"`` for every ICMP port
    unreachable the kernel reported (no switch listening).
    """

    def __init__(self, switch: tuple[str, int], vni: int, *, bind: tuple[str, int] | None = None,
                 segment: bool = True):
        self.vni = check_vni(vni)
        self.stats: Tally = Tally()
        self.segment = segment
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            if bind is not None:
                self.sock.bind(bind)
            self.sock.connect(switch)
        except BaseException:
            self.sock.close()
            raise
        self.switch = self.sock.getpeername()
        self._gro = segment and enable_gro(self.sock)
        self._pending: deque[bytes] = deque()  # frames of a read that brought several, not yet taken
        self._poll = select.poll()
        self._poll.register(self.sock, select.POLLIN)

    @property
    def address(self) -> tuple[str, int]:
        """The local ``(host, port)``: the endpoint the switch sends this worker's results to."""
        return self.sock.getsockname()

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, frame: bytes) -> None:
        try:
            self.sock.send(encap(frame, self.vni))
        except ConnectionRefusedError:
            # An earlier datagram met a closed port; the protocol's timers retry.
            self.stats["unreachable"] += 1
            return
        self.stats["sent"] += 1

    def send_batch(self, frames: list[bytes]) -> None:
        """Send ``frames`` in order, as :meth:`send` would one by one, in as few calls as the kernel allows.

        An error other than a refused datagram is raised once the rest of the batch is sent.
        """
        failure = None
        for e in send_all(self.sock, [encap(f, self.vni) for f in frames], segment=self.segment):
            if e is None:
                self.stats["sent"] += 1
            elif isinstance(e, ConnectionRefusedError):
                self.stats["unreachable"] += 1
            elif failure is None:
                failure = e
        if failure is not None:
            raise failure

    @property
    def pending(self) -> bool:
        """Whether a frame already read waits to be taken: :meth:`recv` returns it without a system call, and
        the socket need not be readable meanwhile."""
        return bool(self._pending)

    def recv(self, timeout: float) -> bytes | None:
        """The next frame, or None when ``timeout`` seconds pass without one.

        The socket stays blocking: a datagram already queued (the common case while results stream in) costs
        one read with ``MSG_DONTWAIT``, and waiting one ``poll`` more, where a socket timeout set per call
        costs an ``ioctl`` and a ``poll`` before every read.
        """
        if self._pending:
            return self._pending.popleft()
        end = None
        while True:
            try:
                if self._gro:
                    datagrams, _ = recv_datagrams(self.sock)
                else:
                    datagrams = [self.sock.recv(_MAX_DATAGRAM, socket.MSG_DONTWAIT)]
            except BlockingIOError:
                now = time.monotonic()
                end = now + timeout if end is None else end
                if now >= end or not self._poll.poll(math.ceil((end - now) * 1000)):
                    return None
                continue
            except ConnectionRefusedError:
                self.stats["unreachable"] += 1
                end = time.monotonic() + timeout if end is None else end
                if time.monotonic() >= end:
                    return None
                continue
            for datagram in datagrams:
                inner = decap(datagram, self.vni)
                if isinstance(inner, VxlanDrop):
                    self.stats[inner.value] += 1
                    continue
                self.stats["received"] += 1
                self._pending.append(inner)
            if self._pending:
                return self._pending.popleft()

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "VxlanPort":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_MAC_SRC = wire.mac_bytes("02:00:00:00:7e:01")
_MAC_DST = wire.mac_bytes("02:00:00:00:7e:02")


def outer_frame(datagram: bytes, src: tuple[str, int], dst: tuple[str, int]) -> bytes:
    """``datagram`` (UDP payload) as the Ethernet/IPv4/UDP frame it travels in, for a capture.

    The IPv4 header is DF with a valid checksum, the UDP checksum 0 (RFC 7348
    section 5 allows it for IPv4); the Ethernet addresses are placeholders, the
    kernel hides the real ones of a UDP socket (on loopback there are none).
    """
    udp = struct.pack("!HHHH", src[1], dst[1], UDP_LEN + len(datagram), 0)
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, IPV4_LEN + len(udp) + len(datagram), 0, 0x4000, 64,
                               IP_PROTO_UDP, 0, wire.ip_bytes(src[0]), wire.ip_bytes(dst[0])))
    struct.pack_into("!H", ip, 10, wire.ipv4_checksum(ip))
    return _MAC_DST + _MAC_SRC + struct.pack("!H", ETH_TYPE_IPV4) + bytes(ip) + udp + datagram


class PcapWriter:
    """Writes datagrams to a pcap file (Ethernet link type) as :func:`outer_frame` frames.

    Use as ``capture`` of :class:`~inagg.host.service.SwitchService`:
    ``writer(src, dst, datagram)``.
    """

    def __init__(self, path: str):
        from scapy.utils import RawPcapWriter

        self._w = RawPcapWriter(path, linktype=1, nano=True, sync=False)  # 1: DLT_EN10MB
        self._w.write_header(None)  # an empty capture is still a valid pcap file

    def __call__(self, src: tuple[str, int], dst: tuple[str, int], datagram: bytes) -> None:
        t = time.time()
        self._w.write_packet(outer_frame(datagram, src, dst), sec=int(t), usec=round((t % 1) * 1e9))

    def close(self) -> None:
        self._w.close()


Capture = Callable[[tuple[str, int], tuple[str, int], bytes], None]
