"""The switch as a service: the model switch behind VXLAN, with a control endpoint for jobs.

:class:`SwitchService` runs one switch for many clients, in one thread and
one ``selectors`` loop:

* **data**: one UDP address (the VXLAN endpoint, a free UDP port by default:
  tickets carry it) for every switch port. A switch port is bound to the worker's UDP endpoint
  (its VTEP) when the worker attaches, and the endpoint gets a socket of its
  own on the address; a datagram from an endpoint that is
  bound to no port is dropped and counted. Each turn of the loop reads and
  hands the switch at most ``Limits.job_frames`` frames of each endpoint and
  job (a flood fills its sender's socket, and gets its share of the turns:
  the excess is dropped and counted). A job's frames of one turn go to the
  switch in one ``receive_batch`` call, and what it sends back goes out in
  one pass over the endpoints' sockets (``docs/scaleout.md``, "Batches").
  Frames cross the same
  :class:`~inagg.host.link.LossyLink` as on every other transport, on the
  way in and again on the way out, so loss, duplication, reordering and
  corruption can be injected here too.
* **control**: a TCP endpoint speaking JSON lines, one request and one
  answer per line (``docs/scaleout.md`` lists the requests). A client
  creates a job and receives its :class:`Ticket`: the switch and job
  descriptions, the VXLAN address and VNI, and the job's **token**. Every
  later request on that job (attach a worker, read counters, remove the job)
  is signed with the token (HMAC over the request, the connection's nonce
  and a rising sequence number: the token is never sent, a request cannot
  be replayed) and so is its answer; a wrong signature is refused, logged
  and counted. With an admin token ``create_job`` is signed with it. An
  endpoint is bound only after it echoed a nonce sent to it. A job
  lives as long as the control connection that created it, so a training
  run that dies does not leak switch ports or slots.
  What one client may cost is bounded (:class:`Limits`: request size,
  nesting and rate, unread answers, idle time, connections, jobs and ports
  per source address); no input, however malformed, stops the service.

Jobs get disjoint ports and slot regions and random R_Keys; data frames of
one job carrying another job's QPN or R_Key are dropped and counted by the
switch itself (``DROP_UNKNOWN_QPN``, ``DROP_BAD_RKEY``).

The switch is any :class:`~inagg.models.backend.SwitchBackend`: the fast
software switch by default (:data:`~inagg.models.backend.DEFAULT_BACKEND`), or a registered backend (``inagg switch serve --backend
rtl``: the Verilated RTL switch, which sends its results later than the
frames that cause them, through ``fileno`` / ``poll``).

The client side is :class:`SwitchClient`, :func:`join` (a
:class:`~inagg.host.api.Group` over VXLAN for one rank of a ticket) and
:func:`group_from_env` (the same from ``INAGG_TICKET`` and ``INAGG_RANK``).
"""

from __future__ import annotations

import dataclasses
import hmac
import ipaddress
import json
import logging
import os
import secrets
import selectors
import socket
import ssl
import threading
import time
from collections import Counter as Tally
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from inagg import __version__
from inagg.models.backend import DEFAULT_BACKEND, SwitchBackend, SwitchBackendError, load_backend
from inagg.models.job import Collective, ExceptionSpec, JobSpec, Mode, SwitchSpec, Uplink, WorkerSpec
from inagg.models.frame import CONTRIBUTION
from inagg.models.protocol import MAX_JOBS, MAX_WORKERS, Counter, switch_qpn

from inagg.host.api import Group
from inagg.host.controller import RESULT_VA, worker_ip, worker_mac
from inagg.host.link import Faults, HeldFrames, LossyLink, clocked_receive, idle_wait
from inagg.host.vxlan import (Capture, VxlanDrop, VxlanPort, check_vni, decap, enable_gro, encap,
                              recv_datagrams, send_all)
from inagg.host.worker import ProtocolError, Timing

__all__ = [
    "ENV_SWITCH", "ENV_TICKET", "ENV_RANK", "MAX_SERVICE_PORTS", "MAX_REQUEST_BYTES", "SERVICE_TIMING",
    "ServiceError", "SwitchUnavailableError", "SwitchBackendError", "Ticket", "Limits", "SwitchService", "SwitchClient",
    "parse_address", "join", "group_from_env", "SwitchGoneError", "PeerFailedError", "WatchedPort", "ENV_ADMIN_TOKEN",
    "ENV_TLS_CA", "tls_server_context",
]

log = logging.getLogger("inagg.switch")

ENV_SWITCH = "INAGG_SWITCH"   # HOST:PORT of the control endpoint
ENV_TICKET = "INAGG_TICKET"   # a ticket's JSON, or @FILE holding it
ENV_RANK = "INAGG_RANK"       # this worker's rank in the ticket's job
ENV_ADMIN_TOKEN = "INAGG_ADMIN_TOKEN"  # the service's admin token, which create_job is signed with
ENV_TLS_CA = "INAGG_TLS_CA"  # the CA certificate (PEM) that a TLS control endpoint's certificate is checked against
# Worker addresses are 10.0.0.(port+1) in the switch's /24, the switch is .254.
MAX_SERVICE_PORTS = 253
MAX_REQUEST_BYTES = 1 << 16
_WORKER_QPN = 0x01_0000
_SESSION_CHARS = 64
# The probe that asks an endpoint to prove it receives: an Ethernet frame of the IEEE 802 local experimental
# EtherType 1, which no switch port takes for RoCE, carrying a marker and a nonce.
_PROBE_TYPE = 0x88B5
_PROBE_MARK = b"inagg probe "
_NONCE_BYTES = 16
# Where a frame names the switch QPN, i.e. the (job, worker) it contributes as.
_QPN_AT = slice(CONTRIBUTION.span("bth.dqpn")[0], sum(CONTRIBUTION.span("bth.dqpn")))
# The worker's default timer suits one process. A service shared by many workers takes milliseconds
# to drain all their windows, and a timer shorter than that resends frames that were only queued,
# which queues more: start at 0.1 s (loopback and a LAN hardly lose a frame).
SERVICE_TIMING = Timing(timeout=0.1, max_timeout=1.0, tries=12)
# Datagrams read per wake-up before the loop looks at control and timers again.
_BURST = 256
# Probes an attach waits for (each within a share of the client's timeout) before it gives up.
_PROBE_TRIES = 3
_SOCKET_BUFFER = 8 << 20
# An attached endpoint's own socket holds a few windows; a flood beyond that is the kernel's to drop (socket_drops).
_ENDPOINT_SOCKET_BUFFER = 1 << 20


@dataclass(frozen=True)
class Limits:
    """What one control client may cost a :class:`SwitchService`; ``inagg switch serve --NAME`` sets each field.

    A *source* is a client's IP address: every connection from it counts
    towards its connections, jobs and ports.
    """

    request_bytes: int = field(default=MAX_REQUEST_BYTES, metadata={
        "help": "longest request line in bytes; a longer one is refused and the connection closed"})
    request_depth: int = field(default=8, metadata={
        "help": "deepest nesting of arrays and objects in a request"})
    requests_per_second: float = field(default=200.0, metadata={
        "help": "requests a connection may send a second (a burst of as many); more are refused"})
    output_bytes: int = field(default=1 << 20, metadata={
        "help": "answers waiting for a connection that does not read; more close it"})
    idle_timeout: float = field(default=60.0, metadata={
        "help": "seconds a connection that owns no job may stay silent before it is closed"})
    connections: int = field(default=256, metadata={
        "help": "control connections open at once"})
    # Half the connections: every rank of a 64-worker job on one host joins at once, beside its owner.
    connections_per_source: int = field(default=128, metadata={
        "help": "control connections open at once from one IP address"})
    jobs_per_source: int = field(default=16, metadata={
        "help": "jobs that connections from one IP address may own at once"})
    ports_per_source: int = field(default=MAX_SERVICE_PORTS, metadata={
        "help": "switch ports that the jobs of one IP address may hold at once"})
    # A turn of the loop serves every job with frames waiting, each at most job_frames of them: a job that sends
    # faster than its share waits for its next turn, not its co-tenants.
    job_frames: int = field(default=32, metadata={
        "help": "data frames of one job the switch takes per turn of the service's loop (its fair share)"})
    job_backlog: int = field(default=256, metadata={
        "help": "data frames of one job waiting for their turn; more are dropped and counted (fair_share_drops)"})

    def __post_init__(self):
        for f in dataclasses.fields(self):
            x = getattr(self, f.name)
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not x > 0:
                raise ValueError(f"limit {f.name} must be a positive number, not {x!r}")


class ServiceError(Exception):
    """The switch service refused a request; the message is the service's."""


class SwitchUnavailableError(ServiceError, ConnectionError):
    """The switch service cannot be reached."""


def parse_address(text: str) -> tuple[str, int]:
    """``"HOST:PORT"`` as ``(host, port)``; host an IPv4 address or a name, port 0..65535."""
    host, sep, port = str(text).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"address must be HOST:PORT with a port in 0..65535, not {text!r}")
    return host, int(port)


def _switch_dict(s: SwitchSpec) -> dict:
    return dataclasses.asdict(s)


def _switch_from(d: dict) -> SwitchSpec:
    d = dict(d)
    if d.get("exception") is not None:
        d["exception"] = ExceptionSpec(**d["exception"])
    return SwitchSpec(**d)


def _job_dict(j: JobSpec) -> dict:
    d = dataclasses.asdict(j)
    d.update(mode=j.mode.value, collective=j.collective.value, subswitches=sorted(j.subswitches))
    return d


def _job_from(d: dict) -> JobSpec:
    d = dict(d)
    d["workers"] = tuple(WorkerSpec(**w) for w in d["workers"])
    d["mode"] = Mode(d.get("mode", Mode.UC.value))
    d["collective"] = Collective(d.get("collective", Collective.ALLREDUCE.value))
    d["subswitches"] = frozenset(d.get("subswitches", ()))
    d["parent"] = None if d.get("parent") is None else Uplink(**d["parent"])
    return JobSpec(**d)


@dataclass(frozen=True)
class Ticket:
    """Everything a rank needs to take part in a job on a switch service.

    ``token`` authorizes control requests on the job: share the ticket with
    the job's ranks only (``to_json`` / ``from_json``, e.g. through the torch
    store).
    """

    switch: SwitchSpec
    job: JobSpec
    token: str
    vxlan: tuple[str, int]
    vni: int
    control: tuple[str, int]

    def to_json(self) -> str:
        return json.dumps({"switch": _switch_dict(self.switch), "job": _job_dict(self.job), "token": self.token,
                           "vxlan": list(self.vxlan), "vni": self.vni, "control": list(self.control)})

    @classmethod
    def from_json(cls, text: str) -> "Ticket":
        try:
            d = json.loads(text)
            return cls(switch=_switch_from(d["switch"]), job=_job_from(d["job"]), token=str(d["token"]),
                       vxlan=(d["vxlan"][0], int(d["vxlan"][1])), vni=check_vni(d["vni"]),
                       control=(d["control"][0], int(d["control"][1])))
        except (ValueError, KeyError, TypeError, IndexError) as e:
            raise ValueError(f"not an inagg job ticket: {e}") from None


# -- the service -----------------------------------------------------------


class _Refused(Exception):
    """A control request the service answers with an error."""


@dataclass
class _Job:
    """A job of the service: ``number`` names it in requests and tickets, ``spec`` is its current incarnation.

    An incarnation is one run of the job's ranks. Every incarnation is a
    switch job of its own (its own job number, so its own QPNs, R_Key and
    wiped slots): a frame or a slot of an earlier run can never meet a later
    run's chunks. ``sessions`` holds, by rank, the :class:`SwitchClient`
    session that attached the rank in this incarnation.
    """

    number: int
    spec: JobSpec
    token: str
    owner: "_Conn"
    incarnation: int = 1
    sessions: dict[int, str] = field(default_factory=dict)
    # What the job's counters request answers: the service's counts for datagrams from and to the job's endpoints,
    # and the switch's and backend's counts for the frames that came in on the job's ports.
    service: Tally = field(default_factory=Tally)
    switch: Tally = field(default_factory=Tally)
    backend: Tally = field(default_factory=Tally)


class _Conn:
    def __init__(self, sock: socket.socket, addr: tuple[str, int], burst: float):
        self.sock, self.source, self.name = sock, addr[0], f"{addr[0]}:{addr[1]}"
        self.handshaking = isinstance(sock, ssl.SSLSocket)  # TLS: no request before the handshake is done
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.jobs: set[int] = set()
        self.watched: set[tuple[int, int]] = set()  # (job, rank) this connection attached with watch
        self.closing = False  # close once the answers are out
        self.closed = False
        self.heard = time.monotonic()  # the last bytes received
        self.allowance, self.refilled = burst, self.heard  # the request rate's token bucket
        # Signed requests: bound to this nonce (no replay on another connection), their seq rising (none here).
        self.nonce, self.seq = secrets.token_hex(16), 0
        self.signed: tuple[str, int] | None = None  # (key, seq) of the request being answered, once verified
        self.events = 0  # the seq of the last event pushed here, which every event raises (no replay)


def tls_server_context(cert: str, key: str) -> ssl.SSLContext:
    """The TLS context of a control endpoint serving certificate file ``cert`` (PEM, its chain) with key ``key``."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    return ctx


def _mac(key: str, nonce: str, direction: str, body: dict) -> str:
    """HMAC-SHA256 of a control message ``body`` (its ``mac`` left out) under ``key``, bound to the connection's
    ``nonce`` and to its direction (``request`` or ``answer``), over the message's canonical JSON."""
    text = json.dumps({k: v for k, v in body.items() if k != "mac"}, sort_keys=True, separators=(",", ":"))
    return hmac.new(key.encode(), f"{nonce}\n{direction}\n{text}".encode(), "sha256").hexdigest()


def _job_key(admin_token: str, salt: str) -> str:
    """The key of a job created under an admin token: derived on both sides, it never crosses the wire."""
    return hmac.new(admin_token.encode(), f"inagg job key\n{salt}".encode(), "sha256").hexdigest()[:32]


def _unheld(address: tuple[str, int]) -> tuple[str, int]:
    """``address`` (port 0: a free port) once a plain bind showed that no socket holds it, even one sharing it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(address)
        return probe.getsockname()


def _add_growth(mine: Tally, before: dict, after) -> None:
    """Add to ``mine`` (by name) what each counter of ``after`` grew by since ``before``."""
    for c, n in after.items():
        if n != before.get(c, 0):
            mine[getattr(c, "name", c)] += n - before.get(c, 0)


def _socket_drops(sock: socket.socket) -> int:
    """Datagrams the kernel dropped for UDP socket ``sock`` because its buffer was full (``/proc/net/udp``; 0 where
    there is none)."""
    inode = str(os.fstat(sock.fileno()).st_ino)
    try:
        with open("/proc/net/udp", encoding="ascii") as f:
            return next((int(cols[-1]) for cols in map(str.split, f) if cols[9] == inode), 0)
    except OSError:
        return 0


def _depth(value: object) -> int:
    """How deep arrays and objects nest in a parsed JSON value; a walk, not a recursion, for any depth."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        x, d = todo.pop()
        if isinstance(x, (dict, list)):
            deepest = max(deepest, d)
            todo.extend((y, d + 1) for y in (x.values() if isinstance(x, dict) else x))
    return deepest


def _endpoint(ep: object) -> tuple[str, int]:
    """A worker's VXLAN endpoint from a request: a unicast IPv4 address and a UDP port 1..65535."""
    def refuse(why: str):
        return _Refused(f"endpoint must be [IPv4 address, UDP port], not {ep!r} ({why})")

    if not isinstance(ep, list) or len(ep) != 2:
        raise refuse("a list of two")
    host, port = ep
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise refuse("a UDP port is an integer in 1..65535")
    try:
        ip = ipaddress.IPv4Address(host if isinstance(host, str) else None)  # not an int: 5 is 0.0.0.5
    except ValueError:
        raise refuse("not an IPv4 address") from None
    if ip.is_multicast or ip.is_unspecified or ip.is_reserved:
        raise refuse("not a unicast address")
    return str(ip), port


def _int(req: dict, name: str, lo: int, hi: int, default: int | None = None) -> int:
    x = req.get(name, default)
    if not isinstance(x, int) or isinstance(x, bool) or not lo <= x <= hi:
        raise _Refused(f"{name} must be an integer in {lo}..{hi}, not {x!r}")
    return x


def _session(req: dict) -> str:
    x = req.get("session")
    if not isinstance(x, str) or not 1 <= len(x) <= _SESSION_CHARS or not x.isalnum():
        raise _Refused(f"session must be 1..{_SESSION_CHARS} letters and digits, not {x!r}")
    return x


class SwitchService:
    """A switch serving many clients over VXLAN, with a token-checked control endpoint.

    Parameters
    ----------
    spec:
        The switch (ports, slots, chunk size, addresses). Its ports are the
        workers the service can hold at once, at most 253.
    control:
        ``(host, port)`` the control endpoint listens on (port 0: a free one).
    vxlan:
        ``(host, port)`` of the VXLAN endpoint; port 0 (the default) takes
        a free one, which every ticket carries (4789, the IANA port, clashes
        with a kernel VXLAN device or a second service on the host).
    vni:
        The fabric's VXLAN network identifier.
    faults, seed:
        Faults of the lossy link between the VXLAN endpoint and the switch.
    capture:
        Called as ``capture(src, dst, datagram)`` for every datagram received
        and sent (e.g. :class:`~inagg.host.vxlan.PcapWriter`).
    switch:
        The :class:`~inagg.models.backend.SwitchBackend`; the
        :data:`~inagg.models.backend.DEFAULT_BACKEND` opened for ``spec`` when None. The
        service waits on its ``fileno()`` where it has one and then takes
        its results from ``poll()``; no later job gets a region of its
        ``retired_slots``; the ``counters`` answer includes its ``drops``;
        the service calls its ``close()`` when it stops. A switch that
        raises :class:`~inagg.models.backend.SwitchBackendError` has failed:
        from then on the service drops every datagram (``switch_failed``)
        and refuses every request with the switch's reason; ``failure``
        holds it.
    switch_batch:
        True (the default): a job's frames of one turn reach the switch in
        one ``receive_batch`` call. False: one ``receive`` call per frame,
        as before the batches; ``bench/scaleout.py`` compares the two.
    segment:
        True (the default): the VXLAN sockets use the kernel's UDP
        segmentation and receive offloads (:func:`~inagg.host.vxlan.send_all`),
        so a port's results of one pass leave in one call and a worker's run
        of contributions is read in one. False: one datagram per call, as
        before them (``bench/scaleout.py --only gso`` compares the two).
    limits:
        What one control client may cost (:class:`Limits`; its defaults
        when None). No request, however malformed, stops the service: it
        gets an error answer and a count in ``stats``.
    tls:
        A server :class:`ssl.SSLContext` (:func:`tls_server_context`): the
        control endpoint then speaks TLS only, so requests, answers, events
        and a job's token in a ``create_job`` answer are confidential on the
        way (clients: ``SwitchClient(tls_ca=)`` or ``INAGG_TLS_CA``). A
        connection that fails its handshake is closed (``tls_failed``).
    admin_token:
        When given (at least 16 characters), ``create_job`` must be signed
        with it (:class:`SwitchClient`'s ``admin_token``), and each job's
        token is derived from it and a salt, so it never crosses the wire;
        when None, anyone may create jobs within the quotas of ``limits``.

    :meth:`serve` runs the loop in the calling thread until :meth:`shutdown`
    (callable from any thread or a signal handler); :meth:`start` runs it
    in a thread. ``stats`` counts datagrams, drops by reason and refused
    requests.
    """

    def __init__(self, spec: SwitchSpec, *, control: tuple[str, int] = ("127.0.0.1", 0),
                 vxlan: tuple[str, int] = ("127.0.0.1", 0), vni: int = 1, faults: Faults | None = None,
                 seed: int = 0, capture: Capture | None = None, switch=None, limits: Limits | None = None,
                 admin_token: str | None = None, tls: ssl.SSLContext | None = None, switch_batch: bool = True,
                 segment: bool = True):
        if not isinstance(spec, SwitchSpec):
            raise TypeError(f"spec must be a SwitchSpec, not {type(spec).__name__}")
        if spec.ports > MAX_SERVICE_PORTS:
            raise ValueError(f"a switch service has at most {MAX_SERVICE_PORTS} ports (one /24 of worker "
                             f"addresses beside the switch), not {spec.ports}")
        self.vni = check_vni(vni)
        if limits is None:
            limits = Limits()
        elif not isinstance(limits, Limits):
            raise TypeError(f"limits must be Limits, not {type(limits).__name__}")
        self.limits = limits
        if admin_token is not None and (not isinstance(admin_token, str) or len(admin_token) < 16):
            raise ValueError("admin_token must be a string of at least 16 characters")
        self.admin_token = admin_token
        if tls is not None and not isinstance(tls, ssl.SSLContext):
            raise TypeError(f"tls must be an ssl.SSLContext, not {type(tls).__name__}")
        self.tls = tls
        for name, flag in (("switch_batch", switch_batch), ("segment", segment)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, not {type(flag).__name__}")
        if switch is None:
            switch = load_backend(DEFAULT_BACKEND).open(spec)
        elif not isinstance(switch, SwitchBackend):
            raise TypeError(f"switch must be a SwitchBackend, not {type(switch).__name__}")
        self.spec, self.switch, self.capture = spec, switch, capture
        self.switch_batch, self.segment = switch_batch, segment
        self._vxlan_head = encap(b"", self.vni)
        self.failure: str | None = None
        # A switch without a descriptor answers in receive(): nothing to poll.
        self._switch_fd = switch.fileno()
        self._polled = self._switch_fd is not None
        self.link = LossyLink(faults, seed)
        self.stats: Tally = Tally()
        self._jobs: dict[int, _Job] = {}
        self._endpoint_of: dict[int, tuple[str, int]] = {}  # switch port -> worker VTEP
        self._port_of: dict[tuple[str, int], int] = {}
        self._qpn_at: dict[int, bytes] = {}  # switch port -> the switch QPN its bound rank's frames must name
        self._job_at: dict[int, _Job] = {}  # switch port -> the job holding it, whose counters its frames count in
        # switch port -> a socket of its own for the bound endpoint (the VXLAN address, connected to the endpoint)
        self._sock_at: dict[int, socket.socket] = {}
        self._probes: dict[tuple[int, int], tuple[tuple[str, int], str, str]] = {}  # (job, rank) -> endpoint, session, nonce
        self._held = HeldFrames()
        # Per job, the data frames read and waiting for the job's turn: (switch port, frame).
        self._backlog: dict[int, deque[tuple[int, bytes]]] = {}
        self._conns: dict[int, _Conn] = {}
        self._conns_of: Tally = Tally()  # source address -> connections open
        self._next_sweep = 0.0
        self._stop = False
        self._served = False
        self._thread: threading.Thread | None = None
        self._sel = selectors.DefaultSelector()
        self._udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._wake_r, self._wake_w = socket.socketpair()
        try:
            for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                self._udp.setsockopt(socket.SOL_SOCKET, opt, _SOCKET_BUFFER)
            if segment:
                enable_gro(self._udp)
            # Each attached endpoint gets a socket of its own on this address (:meth:`_endpoint_socket`), which
            # SO_REUSEPORT allows; a bind without it first makes sure that no other process holds the address.
            self._udp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            self._udp.bind(_unheld(vxlan))
            self._udp.setblocking(False)
            self._tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._tcp.bind(control)
            self._tcp.listen(64)
            self._tcp.setblocking(False)
            self._wake_r.setblocking(False)
            self._wake_w.setblocking(False)
        except BaseException:
            self._close_sockets()
            raise
        self._sel.register(self._udp, selectors.EVENT_READ, "udp")
        self._sel.register(self._tcp, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        if self._polled:
            self._sel.register(self._switch_fd, selectors.EVENT_READ, "switch")
        self.vxlan_address: tuple[str, int] = self._udp.getsockname()
        self.control_address: tuple[str, int] = self._tcp.getsockname()

    # -- running ----------------------------------------------------------

    def serve(self) -> None:
        """Run until :meth:`shutdown`; then tear every job down and close every socket."""
        self._served = True
        log.info("listening: control %s:%d, vxlan %s:%d, vni %d, %d ports, %d slots of %d bytes",
                 *self.control_address, *self.vxlan_address, self.vni, self.spec.ports, self.spec.slots,
                 self.spec.chunk_bytes)
        try:
            while not self._stop:
                wait = 0.0 if self._backlog else self._switch_call(
                    lambda: idle_wait(self._held, self.switch, 0.5, time.monotonic()))
                for key, events in self._sel.select(0.5 if wait is None else wait):
                    self._guarded(self._on_event, key.data, events)
                self._guarded(self._take_turns)
                for direction, port, f in self._held.due():  # a frame the link held back arrives on its own
                    self._guarded(self._attributed, self._job_at.get(port) if direction == 0 else None,
                                  lambda: self._arrive(direction, port, f))
                if self.failure is None:
                    self._guarded(self._switch_call, self._poll)
                if (now := time.monotonic()) >= self._next_sweep:
                    self._next_sweep = now + 0.5
                    self._close_idle(now)
        finally:
            self._teardown()

    def _on_event(self, what, events: int) -> None:
        if what == "udp":
            self._on_udp(self._udp, _BURST)
        elif isinstance(what, tuple):  # ("endpoint", switch port)
            self._on_udp(self._sock_at[what[1]], self.limits.job_frames, what[1])
        elif what == "listen":
            self._on_accept()
        elif what == "wake":
            self._drain_wake()
        elif what != "switch":  # the switch's results are polled after every wake
            self._on_conn(what, events)

    def _guarded(self, call, *args) -> None:
        """``call(*args)``; a bug it meets is logged and counted, and the loop goes on serving everyone else."""
        try:
            call(*args)
        except Exception:
            self.stats["internal_errors"] += 1
            log.exception("internal error in %s; the service goes on", getattr(call, "__name__", call))
            if args and isinstance(args[0], _Conn):
                self._close_conn(args[0])

    def shutdown(self) -> None:
        """Ask the loop to stop (safe from any thread and from a signal handler)."""
        self._stop = True
        try:
            self._wake_w.send(b"\0")
        except OSError:  # already closed, or the wake-up is pending anyway
            pass

    def start(self) -> "SwitchService":
        """Run :meth:`serve` in a daemon thread."""
        self._thread = threading.Thread(target=self.serve, daemon=True, name="inagg-switch-service")
        self._thread.start()
        return self

    def stop(self) -> None:
        """:meth:`shutdown` and wait for the loop's thread (or, never started, close the sockets)."""
        self.shutdown()
        if self._thread is not None:
            self._thread.join()
        elif not self._served:
            self._close_sockets()

    def __enter__(self) -> "SwitchService":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _teardown(self) -> None:
        try:
            self._notify(None, "service_stopping", "the inagg switch service is stopping")
            for job in sorted(self._jobs):
                self._remove(job, "the service is shutting down")
            for conn in list(self._conns.values()):
                self._close_conn(conn)
            counters = self._switch_call(lambda: ", ".join(f"{c.name} {v}" for c, v in self.switch.counters.items()
                                                           if v) or "all zero")
            self._close_sockets()
            log.info("stopped: %s; switch counters: %s", dict(self.stats) or "no traffic",
                     counters or "unavailable, the switch failed")
        finally:
            self.switch.close()

    def _switch_call(self, call):
        """``call()``, or None once the switch has failed (logged, and kept in :attr:`failure`)."""
        if self.failure is not None:
            return None
        try:
            return call()
        except SwitchBackendError as e:
            self.failure = str(e)
            log.error("the switch failed: %s; every request is refused from now on", e)
            self._notify(None, "switch_failed", f"the switch failed: {e}")
            if self._polled:
                self._sel.unregister(self._switch_fd)
            return None

    def _poll(self) -> None:
        """What the switch sent later than ``receive`` (a clocked backend) and what its timers sent."""
        out = self.switch.on_timer(time.monotonic())
        if self._polled:
            out += self.switch.poll()
        for port, frame in out:
            self._cross(1, port, frame)

    def _close_sockets(self) -> None:
        self._sel.close()
        for s in (self._udp, self._tcp, self._wake_r, self._wake_w):
            s.close()

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass

    # -- data plane -------------------------------------------------------

    def _on_udp(self, sock: socket.socket, budget: int, own: int | None = None) -> None:
        """Read about ``budget`` datagrams from ``sock`` (the service's, or switch port ``own``'s endpoint's own
        socket) into their jobs' backlogs: reads stop once ``budget`` have come, and one read may bring a run.

        An endpoint's own socket is connected to it, so the kernel delivers it that endpoint's datagrams only; a
        datagram's counts are added once per call, not per datagram.
        """
        counts: Tally = Tally()  # (job number or None, name) -> datagrams
        vni, capture, backlog = self.vni, self.capture, self._backlog
        here = sock.getsockname() if capture is not None else None
        job_backlog = self.limits.job_backlog
        taken = 0
        while taken < budget:
            try:
                datagrams, src = recv_datagrams(sock)
            except BlockingIOError:
                break
            except OSError as e:  # an ICMP error of an earlier send, reported late
                counts[None, "rx_errors"] += 1
                taken += 1
                log.debug("vxlan receive error: %s", e)
                continue
            taken += len(datagrams)
            for datagram in datagrams:
                counts[None, "rx_datagrams"] += 1
                if capture is not None:
                    capture(src, here, datagram)
                inner = decap(datagram, vni)
                if inner.__class__ is VxlanDrop:
                    counts[None, inner.value] += 1
                    continue
                port = own if own is not None else self._port_of.get(src)
                if port is None:
                    counts[None, "unbound_source"] += 1
                    continue
                j = self._job_at[port]
                counts[j.number, "rx_datagrams"] += 1
                if inner[_QPN_AT] != self._qpn_at[port]:
                    # Another rank's or another job's QPN: whatever R_Key it carries, not this endpoint's to use.
                    counts[None, "foreign_qpn"] += 1
                    counts[j.number, "foreign_qpn"] += 1
                    continue
                waiting = backlog.get(j.number)
                if waiting is None:
                    waiting = backlog[j.number] = deque()
                if len(waiting) >= job_backlog:
                    counts[None, "fair_share_drops"] += 1
                    counts[j.number, "fair_share_drops"] += 1
                    continue
                waiting.append((port, inner))
        for (number, name), n in counts.items():
            (self.stats if number is None else self._jobs[number].service)[name] += n

    def _take_turns(self) -> None:
        """One turn: every job with frames waiting hands the switch up to ``job_frames`` of them, in job order.

        A job that floods the data plane gets the same turns as its co-tenants; its excess waits, then is
        dropped (``fair_share_drops``) in :meth:`_on_udp`, at the cost of a read, not of a switch pass.
        """
        for number in list(self._backlog):
            waiting = self._backlog[number]
            turn = [waiting.popleft() for _ in range(min(len(waiting), self.limits.job_frames))]
            if self.switch_batch:
                self._attributed(self._jobs[number], lambda: self._pass(turn))
            else:
                self._attributed(self._jobs[number], lambda: [self._cross(0, port, frame) for port, frame in turn])
            if not waiting:
                del self._backlog[number]

    def _pass(self, turn: list[tuple[int, bytes]]) -> None:
        """Take a job's ``turn`` of ``(port, frame)`` pairs across the link to the switch in one call, and what
        the switch sends back to the endpoints: what :meth:`_cross` does frame by frame, in the same order.

        The switch's clock is set once for the batch, which arrives at one instant. A clean link (the usual
        case) passes the frames on as they are; a faulty one takes each frame in turn, and the copies it holds
        back arrive later on their own, as on the frame-by-frame path.
        """
        if self.link.faults.clean:
            arrived = turn
        else:
            arrived = []
            for port, frame in turn:
                self._held.cross(self.link, 0, port, frame, lambda _, p, f: arrived.append((p, f)))
        if not arrived:
            return
        switch = self.switch
        out = self._switch_call(lambda: switch.on_timer(time.monotonic()) + switch.receive_batch(arrived))
        if out is None:
            j = self._job_at.get(arrived[0][0])
            self.stats["switch_failed"] += len(arrived)
            if j is not None:
                j.service["switch_failed"] += len(arrived)
            return
        if not self.link.faults.clean:
            for port, frame in out:
                self._cross(1, port, frame)
            return
        self._transmit(out)

    def _transmit(self, out: list[tuple[int, bytes]]) -> None:
        """Send the switch's ``out`` frames to their ports' endpoints, each in a VXLAN datagram, in order per port.

        A port's datagrams go out back to back (:func:`~inagg.host.vxlan.send_all` on its endpoint's own
        socket, in one call per run with :attr:`segment`), not in the switch's order, which takes the ports in turn for every chunk: a worker is then
        woken once for its results and takes them in one batch, where it would be woken, and run, once per
        result. What the sends count is added once per call, per port.
        """
        head, capture, here = self._vxlan_head, self.capture, self.vxlan_address
        endpoint_of, sock_at, shared = self._endpoint_of, self._sock_at, self._udp
        by_port: dict[int, list[bytes]] = {}
        for port, frame in out:
            by_port.setdefault(port, []).append(head + frame)
        sent: Tally = Tally()  # (port, name) -> datagrams
        for port, datagrams in by_port.items():
            dst = endpoint_of.get(port)
            if dst is None:
                sent[port, "tx_unbound_port"] += len(datagrams)
                continue
            own = sock_at.get(port)
            fates = (send_all(own, datagrams, segment=self.segment) if own is not None else
                     send_all(shared, datagrams, dst, segment=self.segment))
            for datagram, e in zip(datagrams, fates):
                if e is not None:  # a full socket buffer or a vanished route: the worker's timer resends
                    sent[port, "tx_errors"] += 1
                    log.debug("vxlan send to %s:%d failed: %s", *dst, e)
                    continue
                sent[port, "tx_datagrams"] += 1
                if capture is not None:
                    capture(here, dst, datagram)
        for (port, name), n in sent.items():
            self.stats[name] += n
            if (j := self._job_at.get(port)) is not None:
                j.service[name] += n

    def _attributed(self, j: _Job | None, call) -> None:
        """``call()``, which hands the switch frames of job ``j`` only: what it adds to the switch's and the backend's
        counters is counted in ``j``'s too (the frames came in on ``j``'s ports, which no other job shares).

        Counters are compared once per call (a turn's frames), not per frame. A switch that answers later
        (``fileno``, the RTL) counts a frame's fate after the call returns, and reads its counters slowly: only
        its backend's drops, which it counts in the call, are attributed.
        """
        before = None if j is None else self._switch_call(self._snapshot)
        call()
        after = None if before is None else self._switch_call(self._snapshot)
        if after is not None:
            for mine, was, now in zip((j.backend, j.switch), before, after):
                _add_growth(mine, was, now)

    def _snapshot(self) -> tuple[dict, dict]:
        """The backend's drops and (on a switch that answers at once) the switch's counters, as they are now."""
        return dict(self.switch.drops), {} if self._polled else dict(self.switch.counters)

    def _cross(self, direction: int, port: int, frame: bytes) -> None:
        """Put a frame on the lossy link; direction 0 is towards the switch."""
        self._held.cross(self.link, direction, port, frame, self._arrive)

    def _count(self, j: _Job | None, name: str) -> None:
        """Count ``name`` in the service's :attr:`stats` and in job ``j``'s own counts (none when None)."""
        self.stats[name] += 1
        if j is not None:
            j.service[name] += 1

    def _arrive(self, direction: int, port: int, frame: bytes) -> None:
        j = self._job_at.get(port)
        if direction == 0:
            out = self._switch_call(lambda: clocked_receive(self.switch, port, frame))
            if out is None:
                self._count(j, "switch_failed")
                return
            for out_port, f in out:
                self._cross(1, out_port, f)
            return
        dst = self._endpoint_of.get(port)
        if dst is None:
            self._count(j, "tx_unbound_port")
            return
        datagram = encap(frame, self.vni)
        own = self._sock_at.get(port)
        try:
            if own is not None:
                own.send(datagram)
            else:
                self._udp.sendto(datagram, dst)
        except OSError as e:  # a full socket buffer or a vanished route: the worker's timer resends
            self._count(j, "tx_errors")
            log.debug("vxlan send to %s:%d failed: %s", *dst, e)
            return
        self._count(j, "tx_datagrams")
        if self.capture is not None:
            self.capture(self.vxlan_address, dst, datagram)

    # -- control plane ----------------------------------------------------

    def _on_accept(self) -> None:
        try:
            sock, addr = self._tcp.accept()
        except BlockingIOError:
            return
        why = None
        if len(self._conns) >= self.limits.connections:
            why = f"{self.limits.connections} connections open already"
        elif self._conns_of[addr[0]] >= self.limits.connections_per_source:
            why = f"{self.limits.connections_per_source} connections from {addr[0]} open already"
        if why is not None:
            self.stats["connections_refused"] += 1
            log.warning("control %s:%d: refused, %s", *addr, why)
            sock.close()
            return
        sock.setblocking(False)
        if self.tls is not None:  # the handshake runs in the loop, as the peer's bytes come
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        conn = _Conn(sock, addr, self.limits.requests_per_second)
        self._conns[sock.fileno()] = conn
        self._conns_of[conn.source] += 1
        self._sel.register(sock, selectors.EVENT_READ, conn)
        log.debug("control %s: connected", conn.name)

    def _on_conn(self, conn: _Conn, events: int) -> None:
        if conn.handshaking and not self._handshake(conn):
            return
        if events & selectors.EVENT_WRITE:
            self._flush(conn)
        if conn.closing or conn.closed:
            return
        limit = self.limits.request_bytes
        try:
            data = conn.sock.recv(limit)
            # TLS: bytes the last record decrypted beyond what was read wake no select; take them now.
            while isinstance(conn.sock, ssl.SSLSocket) and conn.sock.pending() and len(data) <= limit:
                data += conn.sock.recv(conn.sock.pending())
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except OSError:
            data = b""
        if not data:
            self._close_conn(conn)
            return
        conn.heard = time.monotonic()
        conn.inbuf += data
        while not conn.closed and not conn.closing and (nl := conn.inbuf.find(b"\n")) >= 0:
            line = bytes(conn.inbuf[:nl])
            del conn.inbuf[:nl + 1]
            self._reply(conn, self._request(conn, line) if self._admit(conn) else self._refuse(
                "rate_limited", f"more than {self.limits.requests_per_second:g} requests a second"))
        if not conn.closed and not conn.closing and len(conn.inbuf) > limit:
            log.warning("control %s: request longer than %d bytes; closing", conn.name, limit)
            self._reply(conn, self._refuse("too_long", f"request longer than {limit} bytes"))
            conn.closing = True
            self._flush(conn)

    def _handshake(self, conn: _Conn) -> bool:
        """Take the TLS handshake of ``conn`` one step on; True once it is done, False while it waits or failed."""
        try:
            conn.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
            return False
        except ssl.SSLWantWriteError:
            self._sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
            return False
        except (ssl.SSLError, OSError) as e:  # not TLS, or a certificate the client refused
            self.stats["tls_failed"] += 1
            log.warning("control %s: TLS handshake failed: %s", conn.name, e)
            self._close_conn(conn)
            return False
        conn.handshaking = False
        self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
        return True

    def _admit(self, conn: _Conn) -> bool:
        """Whether the connection's request rate leaves room for one more request now."""
        rate = self.limits.requests_per_second
        now = time.monotonic()
        conn.allowance = min(rate, conn.allowance + (now - conn.refilled) * rate)
        conn.refilled = now
        if conn.allowance < 1:
            return False
        conn.allowance -= 1
        return True

    def _refuse(self, reason: str, error: str) -> dict:
        """The error answer to a request; counted under ``reason`` in :attr:`stats`."""
        self.stats[reason] += 1
        return {"ok": False, "error": error}

    def _close_idle(self, now: float) -> None:
        """Close connections that own no job and sent nothing for ``idle_timeout`` seconds."""
        for conn in [c for c in self._conns.values()
                     if not c.jobs and not c.watched and now - c.heard > self.limits.idle_timeout]:
            self.stats["idle_closed"] += 1
            log.info("control %s: closed, idle for %g s", conn.name, self.limits.idle_timeout)
            self._close_conn(conn)

    def _reply(self, conn: _Conn, answer: dict) -> None:
        if conn.closed:
            return
        conn.outbuf += json.dumps(answer).encode() + b"\n"
        self._flush(conn)
        if not conn.closed and len(conn.outbuf) > self.limits.output_bytes:
            self.stats["slow_readers"] += 1
            log.warning("control %s: closed, it does not read its answers (%d bytes waiting)", conn.name,
                        len(conn.outbuf))
            self._close_conn(conn)

    def _flush(self, conn: _Conn) -> None:
        try:
            while conn.outbuf:
                n = conn.sock.send(conn.outbuf)
                del conn.outbuf[:n]
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            pass
        except OSError:
            self._close_conn(conn)
            return
        if conn.closing and not conn.outbuf:
            self._close_conn(conn)
            return
        want = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbuf else 0)
        self._sel.modify(conn.sock, want, conn)

    def _close_conn(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        del self._conns[conn.sock.fileno()]
        self._conns_of[conn.source] -= 1
        if not self._conns_of[conn.source]:
            del self._conns_of[conn.source]
        for job in sorted(conn.jobs):
            self._remove(job, f"its owner's control connection {conn.name} closed")
        for job, rank in sorted(conn.watched):
            self._notify(job, "rank_left", f"rank {rank} of job {job} is gone: its control connection {conn.name} "
                                           "closed without leaving the job")
        self._sel.unregister(conn.sock)
        conn.sock.close()
        log.debug("control %s: closed", conn.name)

    def _request(self, conn: _Conn, line: bytes) -> dict:
        """The answer to one request line; signed with the request's key when the request was."""
        conn.signed = None
        answer = self._answer(conn, line)
        if conn.signed is not None:
            key, answer["seq"] = conn.signed
            answer["mac"] = _mac(key, conn.nonce, "answer", answer)
        return answer

    def _answer(self, conn: _Conn, line: bytes) -> dict:
        too_deep = f"a request nests at most {self.limits.request_depth} levels deep"
        try:
            req = json.loads(line)
        except RecursionError:  # the C decoder's own bound, at about a thousand levels
            return self._refuse("bad_requests", too_deep)
        except (ValueError, UnicodeDecodeError):
            req = None
        if _depth(req) > self.limits.request_depth:
            return self._refuse("bad_requests", too_deep)
        if not isinstance(req, dict):
            return self._refuse("bad_requests", "a request is one JSON object per line")
        op = req.get("op")
        handler = self._OPS.get(op) if isinstance(op, str) else None
        if handler is None:
            return self._refuse("bad_requests", f"unknown op {op!r}; known: {', '.join(sorted(self._OPS))}")
        if self.failure is None:
            try:
                answer = self._switch_call(lambda: {"ok": True, **handler(self, conn, req)})
            except _Refused as e:
                return self._refuse("bad_requests", str(e))
            except Exception:
                log.exception("control %s: internal error in %s; the service goes on", conn.name, op)
                return self._refuse("internal_errors", f"internal error in {op} (logged by the service)")
            if answer is not None:
                return answer
        return {"ok": False, "error": f"the switch failed: {self.failure}"}

    def _authorized(self, conn: _Conn, req: dict) -> _Job:
        """The job a request names, after checking that the job's key signed it."""
        job = _int(req, "job", 0, MAX_JOBS - 1)
        j = self._jobs.get(job)
        if j is None:
            raise _Refused(f"job {job} is not configured")
        self._verify(conn, req, j.token, f"job {job}")
        return j

    def _verify(self, conn: _Conn, req: dict, key: str, what: str) -> None:
        """Check that ``key`` signed ``req`` on this connection, after every earlier request of it (no replay)."""
        seq, mac = req.get("seq"), req.get("mac")
        why = None
        if not isinstance(mac, str) or not isinstance(seq, int) or isinstance(seq, bool):
            why = "the request is not signed (seq and mac, docs/scaleout.md)"
        elif not hmac.compare_digest(mac.encode(), _mac(key, conn.nonce, "request", req).encode()):
            why = "wrong signature"
        elif not conn.seq < seq < 1 << 53:
            why = f"seq {seq} is not above the connection's last, {conn.seq} (a replay?)"
        if why is not None:
            self.stats["refused_requests"] += 1
            log.warning("control %s: refused %s on %s: %s", conn.name, req["op"], what, why)
            raise _Refused(f"{what}: {why}")
        conn.seq, conn.signed = seq, (key, seq)

    def _op_hello(self, conn: _Conn, req: dict) -> dict:
        free = self.spec.ports - sum(len(j.spec.workers) for j in self._jobs.values())
        return {"service": "inagg switch", "version": __version__, "vxlan": list(self.vxlan_address),
                "vni": self.vni, "switch": _switch_dict(self.spec), "jobs": len(self._jobs), "free_ports": free,
                "nonce": conn.nonce, "admin": self.admin_token is not None}

    def _op_create_job(self, conn: _Conn, req: dict) -> dict:
        if self.admin_token is not None:
            self._verify(conn, req, self.admin_token, "create_job")
        elif "mac" in req:
            raise _Refused("this service takes no admin token: send create_job unsigned")
        n = _int(req, "workers", 1, MAX_WORKERS)
        window = _int(req, "window", 1, self.spec.slots // 2, default=32)
        if window & (window - 1):
            raise _Refused(f"window must be a power of two, not {window}")
        modes = {m.value: m for m in Mode}
        mode = req.get("mode", Mode.UC.value)
        if not isinstance(mode, str) or mode not in modes:
            raise _Refused(f"mode must be one of {', '.join(modes)}, not {mode!r}")
        used = {w.port for j in self._jobs.values() for w in j.spec.workers}
        free = [p for p in range(self.spec.ports) if p not in used]
        if len(free) < n:
            raise _Refused(f"a job of {n} workers needs {n} free switch ports; {len(free)} of "
                           f"{self.spec.ports} are free")
        mine = [j.spec for j in self._jobs.values() if j.owner.source == conn.source]
        if len(mine) >= self.limits.jobs_per_source:
            raise _Refused(f"{conn.source} owns {len(mine)} jobs already, its quota")
        held = sum(len(s.workers) for s in mine)
        if held + n > self.limits.ports_per_source:
            raise _Refused(f"{conn.source} holds {held} switch ports; {n} more exceed its quota of "
                           f"{self.limits.ports_per_source}")
        region = 2 * window
        base = self._free_region(region)
        if base is None:
            retired = sum(n for _, n in self.switch.retired_slots)
            raise _Refused(f"no free region of {region} slots (window {window}) in the switch's "
                           f"{self.spec.slots} slots" + (f" ({retired} of them retired by removed jobs until the "
                                                         "switch restarts)" if retired else ""))
        number = self._free_number()
        # A contribution R_Key per worker where the switch takes one: a key read off one worker's frames does not
        # let anyone contribute as another.
        own = self.switch.per_worker_rkeys
        workers = tuple(WorkerSpec(port=p, mac=worker_mac(p), ip=worker_ip(p), qpn=_WORKER_QPN + p,
                                   rkey=secrets.randbits(32), result_va=RESULT_VA,
                                   contrib_rkey=secrets.randbits(32) if own else None) for p in free[:n])
        spec = JobSpec(job=number, rkey=secrets.randbits(32), slot_base=base, slots=region, workers=workers,
                       mode=modes[mode])
        try:
            self.switch.add_job(spec)
        except ValueError as e:
            raise _Refused(f"the switch refused job {number}: {e}") from None
        salt = secrets.token_hex(16)
        token = secrets.token_hex(16) if self.admin_token is None else _job_key(self.admin_token, salt)
        self._jobs[number] = j = _Job(number, spec, token, conn)
        self._job_at.update((w.port, j) for w in workers)
        conn.jobs.add(number)
        log.info("job %d created by %s: %d workers on ports %s, slots %d..%d", number, conn.name, n,
                 ",".join(str(w.port) for w in workers), base, base + region - 1)
        ticket = json.loads(Ticket(self.spec, spec, token, self.vxlan_address, self.vni,
                                   self.control_address).to_json())
        if self.admin_token is not None:  # the creator derives the key: it never crosses the wire
            ticket["token"] = None
            return {"ticket": ticket, "salt": salt}
        return {"ticket": ticket}

    def _endpoint_socket(self, port: int, endpoint: tuple[str, int]) -> None:
        """Give switch ``port``'s newly bound ``endpoint`` a socket of its own: the VXLAN address again
        (``SO_REUSEPORT``), connected to the endpoint, so that the kernel queues the endpoint's datagrams there,
        in a buffer of their own: a flood fills its sender's buffer, not its co-tenants'. Without one (the
        socket cannot be had: ``endpoint_socket_errors``) the endpoint's datagrams come on the shared socket.
        """
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                sock.setsockopt(socket.SOL_SOCKET, opt, _ENDPOINT_SOCKET_BUFFER)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if self.segment:
                enable_gro(sock)
            sock.bind(self.vxlan_address)
            sock.connect(endpoint)
            sock.setblocking(False)
        except OSError as e:
            sock.close()
            self.stats["endpoint_socket_errors"] += 1
            log.warning("no socket of its own for endpoint %s:%d: %s", *endpoint, e)
            return
        self._sock_at[port] = sock
        self._sel.register(sock, selectors.EVENT_READ, ("endpoint", port))

    def _free_number(self) -> int:
        """A job number that neither names a job nor is the switch job of one's incarnation."""
        used = set(self._jobs) | {j.spec.job for j in self._jobs.values()}
        number = next((k for k in range(1, MAX_JOBS) if k not in used), None)
        if number is None:
            raise _Refused(f"all {MAX_JOBS - 1} job numbers are in use")
        return number

    def _free_region(self, size: int, besides: _Job | None = None) -> int | None:
        """The base of a free region of ``size`` slots, the region of job ``besides`` counted as free."""
        taken = [(j.spec.slot_base, j.spec.slot_base + j.spec.slots) for j in self._jobs.values() if j is not besides]
        taken += [(base, base + n) for base, n in self.switch.retired_slots]
        for base in range(0, self.spec.slots - size + 1, size):
            if all(base + size <= lo or hi <= base for lo, hi in taken):
                return base
        return None

    def _op_attach(self, conn: _Conn, req: dict) -> dict:
        j = self._authorized(conn, req)
        rank = _int(req, "rank", 0, len(j.spec.workers) - 1)
        endpoint = _endpoint(req.get("endpoint"))
        session = _session(req)
        switch_port = j.spec.workers[rank].port
        other = self._port_of.get(endpoint)
        if other is not None and other != switch_port:
            raise _Refused(f"endpoint {endpoint[0]}:{endpoint[1]} is attached to switch port {other} already")
        if not (self._endpoint_of.get(switch_port) == endpoint and j.sessions.get(rank) == session):
            proof = req.get("proof")
            if proof is None:
                return self._probe(j, rank, endpoint, session)
            pending = self._probes.pop((j.number, rank), None)
            if pending is None or pending[:2] != (endpoint, session) or not isinstance(proof, str) \
                    or not hmac.compare_digest(proof.encode(), pending[2].encode()):
                self.stats["proofs_refused"] += 1
                raise _Refused(f"endpoint {endpoint[0]}:{endpoint[1]} did not prove it receives: the proof is not the "
                               "nonce last sent there for this rank; attach again for a new one")
        if j.sessions.setdefault(rank, session) != session:
            self._reincarnate(j, rank)
            j.sessions[rank] = session
        self._unbind(switch_port)
        self._endpoint_of[switch_port] = endpoint
        self._port_of[endpoint] = switch_port
        self._endpoint_socket(switch_port, endpoint)
        self._qpn_at[switch_port] = switch_qpn(j.spec.job, rank).to_bytes(3, "big")
        # Attaching again without the watch, from the watching connection, is how a rank leaves quietly.
        for c in self._conns.values():
            c.watched.discard((j.number, rank))
        if req.get("watch") is True:
            conn.watched.add((j.number, rank))
        log.info("job %d rank %d attached from %s:%d (switch port %d, incarnation %d)", j.number, rank, *endpoint,
                 switch_port, j.incarnation)
        return {"port": switch_port, "incarnation": j.incarnation, "job": _job_dict(j.spec)}

    def _probe(self, j: _Job, rank: int, endpoint: tuple[str, int], session: str) -> dict:
        """Send ``endpoint`` a nonce that the attach must echo: only who receives there can bind it (no reflector).

        One probe of a few dozen bytes per request, to an address the request
        named: no amplification, and the request rate bounds the probes.
        """
        nonce = secrets.token_hex(_NONCE_BYTES)
        self._probes[(j.number, rank)] = (endpoint, session, nonce)
        frame = bytes(12) + _PROBE_TYPE.to_bytes(2, "big") + _PROBE_MARK + nonce.encode()
        datagram = encap(frame, self.vni)
        try:
            self._udp.sendto(datagram, endpoint)
        except OSError as e:
            raise _Refused(f"cannot send the proof of receipt to {endpoint[0]}:{endpoint[1]}: {e}") from None
        self.stats["probes_sent"] += 1
        if self.capture is not None:
            self.capture(self.vxlan_address, endpoint, datagram)
        return {"prove": "echo the nonce sent to the endpoint as the attach's proof"}

    def _unbind(self, port: int) -> None:
        """Forget the endpoint bound to switch ``port``, if any."""
        ep = self._endpoint_of.pop(port, None)
        if ep is not None:
            del self._port_of[ep]
            del self._qpn_at[port]
        sock = self._sock_at.pop(port, None)
        if sock is not None:  # its job keeps the count of what the kernel dropped there
            self._job_at[port].service["socket_drops"] += _socket_drops(sock)
            self._sel.unregister(sock)
            sock.close()

    def _reincarnate(self, j: _Job, rank: int) -> None:
        """Start job ``j``'s next incarnation: rank ``rank`` joined again from another session (a new run).

        The old switch job goes (its slots are wiped, or retired by a switch
        that cannot wipe them) and a new one takes its ports under a fresh job
        number and R_Keys, so neither the old run's slots nor its frames in
        flight can reach the new run. The old run's endpoints are unbound and
        its watching ranks told.
        """
        old, number = j.spec, self._free_number()  # before anything is torn down: it may refuse
        self._notify(j.number, "job_removed", f"rank {rank} of job {j.number} joined again from a new run: "
                                              f"incarnation {j.incarnation + 1} replaces this one")
        for w in old.workers:
            self._unbind(w.port)
        self._switch_call(lambda: self.switch.remove_job(old.job))
        base = self._free_region(old.slots, besides=j)
        if base is None:
            self._remove(j.number, "no free slot region for its next incarnation", on_switch=False)
            raise _Refused(f"job {j.number} cannot start a new incarnation: no free region of {old.slots} slots "
                           "(the switch retired its old one); create a new job")
        workers = tuple(dataclasses.replace(w, rkey=secrets.randbits(32), contrib_rkey=None if w.contrib_rkey is None
                                            else secrets.randbits(32)) for w in old.workers)
        j.spec = dataclasses.replace(old, job=number, rkey=secrets.randbits(32), slot_base=base, workers=workers)
        self.switch.add_job(j.spec)
        j.incarnation += 1
        j.sessions = {}
        log.info("job %d: incarnation %d on switch job %d (slots %d..%d), after rank %d joined again", j.number,
                 j.incarnation, j.spec.job, base, base + old.slots - 1, rank)

    def _op_counters(self, conn: _Conn, req: dict) -> dict:
        """The job's own counts, for its token only: another tenant's traffic is none of its business."""
        j = self._authorized(conn, req)
        bound = [self._sock_at[w.port] for w in j.spec.workers if w.port in self._sock_at]
        drops = j.service["socket_drops"] + sum(map(_socket_drops, bound))
        return {"job": j.number, "service": {**j.service, "socket_drops": drops},
                "backend": {**{name: 0 for name in self.switch.drops}, **j.backend},
                "switch": None if self._polled else {c.name: j.switch[c.name] for c in Counter}}

    def _op_switch_counters(self, conn: _Conn, req: dict) -> dict:
        """The switch-wide counters, of every job: the operator's, for the admin token only."""
        if self.admin_token is None:
            raise _Refused("this service has no admin token (--admin-token-file): its switch-wide counters are "
                           "in its log only")
        self._verify(conn, req, self.admin_token, "switch_counters")
        return {"switch": {c.name: v for c, v in self.switch.counters.items()}, "service": dict(self.stats),
                "link": dict(self.link.stats), "backend": dict(self.switch.drops)}

    def _op_remove_job(self, conn: _Conn, req: dict) -> dict:
        j = self._authorized(conn, req)
        self._remove(j.number, f"removed by {conn.name}")
        return {}

    _OPS = {"hello": _op_hello, "create_job": _op_create_job, "attach": _op_attach, "counters": _op_counters,
            "switch_counters": _op_switch_counters, "remove_job": _op_remove_job}

    def _notify(self, job: int | None, event: str, reason: str) -> None:
        """Tell the connections watching ranks of ``job`` (of every job when None) what ended them.

        Called while the job is still there: its key signs the event. A removed job has no watchers left.
        """
        for conn in list(self._conns.values()):
            jobs = sorted({j for j, _ in conn.watched if job is None or j == job})
            for j in jobs:
                conn.watched = {(k, r) for k, r in conn.watched if k != j}
                # Signed as an answer is, under the job's key and the connection's nonce, with a seq of its own.
                conn.events += 1
                body = {"event": event, "job": j, "reason": reason, "seq": conn.events}
                self._reply(conn, {**body, "mac": _mac(self._jobs[j].token, conn.nonce, "event", body)})

    def _remove(self, job: int, why: str, on_switch: bool = True) -> None:
        self._notify(job, "job_removed", f"job {job} was torn down: {why}")
        j = self._jobs.pop(job)
        j.owner.jobs.discard(job)
        self._backlog.pop(job, None)
        for rank, w in enumerate(j.spec.workers):
            self._unbind(w.port)
            del self._job_at[w.port]
            self._probes.pop((job, rank), None)
        if on_switch:  # else the switch job went already, between two incarnations
            self._switch_call(lambda: self.switch.remove_job(j.spec.job))
        log.info("job %d torn down: %s", job, why)
        if (j.spec.slot_base, j.spec.slots) in self.switch.retired_slots:
            log.info("slots %d..%d retired until the switch restarts: it cannot clear a removed job's state",
                     j.spec.slot_base, j.spec.slot_base + j.spec.slots - 1)


# -- the client ------------------------------------------------------------


class SwitchClient:
    """A control connection to a :class:`SwitchService`.

    ``address`` is ``"HOST:PORT"`` or ``(host, port)``; None reads it from
    ``INAGG_SWITCH``. Every request waits at most ``timeout`` seconds for
    its answer. A job created through this client lives until
    :meth:`remove_job` or until the client is closed.

    Requests on a job are signed with its ticket's token (HMAC-SHA256 over
    the request, this connection's nonce and a rising sequence number; the
    token itself is never sent) and their answers checked the same way.
    ``admin_token`` (default: ``INAGG_ADMIN_TOKEN``) signs ``create_job`` for
    a service that requires it; the new job's token is then derived on both
    sides and never crosses the wire. ``tls_ca`` (default: ``INAGG_TLS_CA``),
    a CA certificate file, makes the connection TLS, the service's
    certificate checked against it and the address's host.
    """

    def __init__(self, address: str | tuple[str, int] | None = None, *, timeout: float = 10.0,
                 admin_token: str | None = None, tls_ca: str | None = None):
        if address is None:
            address = os.environ.get(ENV_SWITCH)
            if not address:
                raise SwitchUnavailableError(f"no switch service address: pass one or set {ENV_SWITCH}=HOST:PORT")
        self.address = parse_address(address) if isinstance(address, str) else (str(address[0]), int(address[1]))
        self.timeout = timeout
        tls_ca = (tls_ca if tls_ca is not None else os.environ.get(ENV_TLS_CA)) or None
        try:
            self._sock = socket.create_connection(self.address, timeout=timeout)
        except OSError as e:
            raise SwitchUnavailableError(f"cannot reach the inagg switch service at "
                                         f"{self.address[0]}:{self.address[1]}: {e}") from None
        if tls_ca is not None:
            try:  # the service's certificate must be signed by tls_ca and name the address's host
                self._sock = ssl.create_default_context(cafile=tls_ca).wrap_socket(
                    self._sock, server_hostname=self.address[0])
            except (ssl.SSLError, OSError) as e:
                self._sock.close()
                raise SwitchUnavailableError(f"no TLS connection to the inagg switch service at "
                                             f"{self.address[0]}:{self.address[1]} with CA {tls_ca}: {e}") from None
        # A job lives as long as this connection, which may idle for a whole training run.
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        self._buf = bytearray()
        # Names this client's attaches: a rank attached again by another client is a new run (an incarnation).
        self.session = secrets.token_hex(16)
        self.admin_token = (admin_token if admin_token is not None else os.environ.get(ENV_ADMIN_TOKEN)) or None
        self._nonce: str | None = None  # the connection's, from hello: what signatures are bound to
        self._seq = 0
        self._event_seq = 0  # the last event's: a later one must be above it

    def request(self, op: str, *, key: str | None = None, **fields) -> dict:
        """Send one request; return the answer, or raise :class:`ServiceError` with the service's refusal.

        With ``key`` the request is signed with it and a successful answer
        must carry the service's signature under it. Events the service
        pushes to a watching connection (:func:`join`) are skipped.
        """
        body = {"op": op, **fields}
        if key is not None:
            if self._nonce is None:
                self._nonce = str(self.request("hello").get("nonce"))
            self._seq += 1
            body["seq"] = self._seq
            body["mac"] = _mac(key, self._nonce, "request", body)
        try:
            self._sock.settimeout(self.timeout)
            self._sock.sendall(json.dumps(body).encode() + b"\n")
            deadline = time.monotonic() + self.timeout
            while (answer := self._line(deadline - time.monotonic())) is None or "event" in answer:
                if time.monotonic() >= deadline or len(self._buf) > MAX_REQUEST_BYTES:
                    raise TimeoutError(f"no answer to {op!r} within {self.timeout} s")
        except OSError as e:
            raise SwitchUnavailableError(f"inagg switch service at {self.address[0]}:{self.address[1]}: "
                                         f"{op} failed: {e}") from None
        if not answer.get("ok"):
            raise ServiceError(f"inagg switch service refused {op}: {answer.get('error')}")
        if key is not None and not (answer.get("seq") == self._seq and isinstance(answer.get("mac"), str) and
                                    hmac.compare_digest(answer["mac"].encode(),
                                                        _mac(key, self._nonce, "answer", answer).encode())):
            raise ServiceError(f"inagg switch service at {self.address[0]}:{self.address[1]}: the answer to {op} "
                               "is not signed with the request's key: not the service, or altered on the way")
        return answer

    def check_event(self, event: dict, key: str) -> None:
        """Raise :class:`ServiceError` unless the service signed ``event`` with ``key`` on this connection, later
        than every event before it (so neither a forged event nor a replayed one is taken)."""
        seq, mac, name = event.get("seq"), event.get("mac"), event.get("event")
        where = "%s:%d" % self.address
        if self._nonce is None or not isinstance(mac, str) or \
                not hmac.compare_digest(mac.encode(), _mac(key, self._nonce, "event", event).encode()):
            raise ServiceError(f"event {name!r} on the control connection to {where} is not signed with the job's "
                               "key: forged, or altered on the way; ignored")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq <= self._event_seq:
            raise ServiceError(f"event {name!r} on the control connection to {where} has seq {seq!r}, not above "
                               f"the last event's, {self._event_seq}: replayed; ignored")
        self._event_seq = seq

    def _line(self, timeout: float) -> dict | None:
        """The next line from the service, waiting at most ``timeout`` s for it; None when none came in time.

        Raises ``ConnectionResetError`` when the service closed the connection.
        """
        if (nl := self._buf.find(b"\n")) < 0:
            self._sock.settimeout(max(timeout, 0.0))
            try:
                data = self._sock.recv(MAX_REQUEST_BYTES)
            except (TimeoutError, BlockingIOError, ssl.SSLWantReadError):  # TLS: nothing, with no timeout
                return None
            if not data:
                raise ConnectionResetError("the service closed the connection")
            self._buf += data
            if (nl := self._buf.find(b"\n")) < 0:
                return None
        line = json.loads(self._buf[:nl])
        del self._buf[:nl + 1]
        return line

    def fileno(self) -> int:
        return self._sock.fileno()

    def hello(self) -> dict:
        """The service's description: version, VXLAN endpoint, VNI, switch, free ports."""
        return self.request("hello")

    def create_job(self, workers: int, *, window: int = 32, mode: Mode = Mode.UC) -> Ticket:
        """A new job of ``workers`` ranks, each with ``window`` chunks outstanding, in ``mode`` (Modes I, II
        and III need a switch backend that implements them, such as ``model``; others refuse the job)."""
        answer = self.request("create_job", key=self.admin_token, workers=workers, window=window,
                              mode=Mode(mode).value)
        d = answer["ticket"]
        if d.get("token") is None:  # created under the admin token: the job's key is derived from it
            if self.admin_token is None or not isinstance(answer.get("salt"), str):
                raise ServiceError("inagg switch service created a job without its token, and no admin token "
                                   "here derives it")
            d["token"] = _job_key(self.admin_token, answer["salt"])
        # A service bound to the wildcard address is reached where this client reached it.
        for key in ("vxlan", "control"):
            if d[key][0] in ("0.0.0.0", ""):
                d[key][0] = self.address[0]
        return Ticket.from_json(json.dumps(d))

    def attach(self, ticket: Ticket, rank: int, endpoint: tuple[str, int], *, watch: bool = False,
               receive: Callable[[float], bytes | None] | None = None) -> JobSpec:
        """Bind rank ``rank``'s switch port to its VXLAN ``endpoint``; returns the job's current incarnation.

        An endpoint proves it receives before it is bound: the service sends it
        a nonce, which ``receive`` (the endpoint's ``VxlanPort.recv``) reads and
        the attach echoes. Only an endpoint this client attached before for the
        rank needs no ``receive``.

        The first attach of a rank by another client than the one that
        attached it before starts the job's next incarnation (a restarted
        run): a switch job with fresh QPNs and slots, which the returned
        :class:`~inagg.models.job.JobSpec` describes and the rank must use.
        ``watch``: the service tells this connection when the rank's job ends without it (:class:`WatchedPort`).
        """
        fields = dict(key=ticket.token, job=ticket.job.job, rank=rank, endpoint=list(endpoint), session=self.session,
                      **({"watch": True} if watch else {}))
        answer, probes = self.request("attach", **fields), 0
        while "prove" in answer:
            if receive is None:
                raise ServiceError(f"inagg switch service asks endpoint {endpoint[0]}:{endpoint[1]} to prove it "
                                   "receives: attach it with receive= (join does)")
            probes += 1
            nonce = _await_probe(receive, self.timeout / _PROBE_TRIES)
            if nonce is None and probes == _PROBE_TRIES:
                raise ServiceError(f"inagg switch service: endpoint {endpoint[0]}:{endpoint[1]} got none of "
                                   f"{_PROBE_TRIES} proofs of receipt the service sent it within {self.timeout} s")
            answer = self.request("attach", **fields, **({} if nonce is None else {"proof": nonce}))
        try:
            return _job_from(answer["job"])
        except (ValueError, KeyError, TypeError) as e:
            raise ServiceError(f"inagg switch service answered attach with no job incarnation: {e}") from None

    def counters(self, job: int, token: str) -> dict:
        """Job ``job``'s own counts: ``switch`` (by :class:`~inagg.models.protocol.Counter` name, for the frames
        that came in on the job's ports; None on a switch that counts later, the RTL), ``service`` and ``backend``."""
        return self.request("counters", key=token, job=job)

    def switch_counters(self) -> dict:
        """The switch-wide counters of every job, and the service's and link's: signed with the admin token."""
        if self.admin_token is None:
            raise ServiceError("the switch-wide counters need the service's admin token: pass admin_token= or set "
                               f"{ENV_ADMIN_TOKEN}")
        return self.request("switch_counters", key=self.admin_token)

    def remove_job(self, job: int, token: str) -> None:
        self.request("remove_job", key=token, job=job)

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> "SwitchClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _await_probe(receive: Callable[[float], bytes | None], timeout: float) -> str | None:
    """The nonce of the first probe ``receive`` gives within ``timeout`` s (other frames skipped), or None."""
    end = time.monotonic() + timeout
    while (left := end - time.monotonic()) > 0:
        frame = receive(left)
        if frame is not None and frame[12:14] == _PROBE_TYPE.to_bytes(2, "big") and frame[14:].startswith(_PROBE_MARK):
            return frame[14 + len(_PROBE_MARK):].decode("ascii", "replace")
    return None


def join(ticket: Ticket, rank: int, *, timing: Timing | None = None, bind: tuple[str, int] | None = None,
         watch: bool = False, segment: bool = True) -> Group:
    """The :class:`~inagg.host.api.Group` of rank ``rank`` of ``ticket``'s job, over VXLAN.

    Opens the rank's UDP endpoint and attaches it to the rank's switch
    port; ``timing`` is :data:`SERVICE_TIMING` when None.
    ``group.close()`` stops the group answering between calls (Modes I, II
    and III), then ``group.port.close()`` releases the socket. With
    ``watch`` the group's port is a :class:`WatchedPort`: the rank learns at
    once, as a typed error, when the service stops or another rank of the
    job goes away. ``segment``: the port's :class:`~inagg.host.vxlan.VxlanPort` argument.
    """
    if not isinstance(rank, int) or not 0 <= rank < len(ticket.job.workers):
        raise ValueError(f"rank must be an integer in 0..{len(ticket.job.workers) - 1}, not {rank!r}")
    port = VxlanPort(ticket.vxlan, ticket.vni, bind=bind, segment=segment)
    client = None
    try:
        client = SwitchClient(ticket.control)
        job = client.attach(ticket, rank, port.address, watch=watch, receive=port.recv)
        joined = client.counters(ticket.job.job, ticket.token)["switch"]
        if watch:
            port = WatchedPort(port, client, ticket, rank)
        else:
            client.close()
        group = Group(ticket.switch, job, rank, port, timing=timing or SERVICE_TIMING)
        group.diagnose = lambda e: _slot_drops(ticket, joined)
        return group
    except BaseException:
        port.close()
        if client is not None:
            client.close()
        raise


# The drops that time a chunk out while the switch and every rank are there: the ranks disagree on chunks.
_SLOT_DROPS = {"DROP_STALE": "older than the chunk its slot holds", "DROP_WINDOW": "too far ahead of its slot's chunk"}


def _slot_drops(ticket: Ticket, joined: dict[str, int] | None) -> str | None:
    """Why a rank of ``ticket``'s job timed out, when the job's slot-rule drops grew since ``joined``; else None.

    The counts are the job's own (frames that came in on its ports); a switch that does not attribute them (None,
    the RTL) gives no cause.
    """
    try:
        with SwitchClient(ticket.control, timeout=2.0) as c:
            now = c.counters(ticket.job.job, ticket.token)["switch"]
    except (ServiceError, OSError, ValueError):  # the service is gone, or answers nonsense: no better cause
        return None
    if now is None or joined is None:
        return None
    grew = [(name, n) for name in _SLOT_DROPS if (n := now.get(name, 0) - joined.get(name, 0)) > 0]
    if not grew:
        return None
    return ("the switch dropped " + ", ".join(f"{n} contributions as {name} ({_SLOT_DROPS[name]})" for name, n in grew)
            + " of this job since this rank joined: do the ranks agree on the chunk sequence?")


class SwitchGoneError(ProtocolError, ConnectionError):
    """The switch service stopped, died or lost its switch while a rank was attached to it."""


class PeerFailedError(ProtocolError):
    """Another rank of the job went away (its process ended, or it gave up after an error of its own)."""


class WatchedPort:
    """A rank's VXLAN port together with the control connection that watches its job (``join(..., watch=True)``).

    :meth:`recv` waits on both: frames come first; then an event of the
    service raises :class:`SwitchGoneError` (the service stops, or its switch
    failed) or :class:`PeerFailedError` (another rank's connection closed
    without leaving, or the job's owner went away), and the end of the
    connection (the service's process died) raises :class:`SwitchGoneError`.
    An event is taken only when the service signed it with the job's key
    (:meth:`SwitchClient.check_event`); a forged or replayed one is logged,
    counted in ``stats["refused_events"]`` and ignored.
    Every later :meth:`recv` raises the same error. :meth:`close` leaves the
    job quietly; :meth:`abort` closes without leaving, so that the service
    tells the other ranks.
    """

    _EVENTS = {"service_stopping": SwitchGoneError, "switch_failed": SwitchGoneError,
               "job_removed": PeerFailedError, "rank_left": PeerFailedError}

    def __init__(self, port: VxlanPort, client: SwitchClient, ticket: Ticket, rank: int):
        self.port, self.client, self.ticket, self.rank = port, client, ticket, rank
        self.failure: ProtocolError | None = None
        self._closed = False
        self._sel = selectors.DefaultSelector()
        self._sel.register(port.fileno(), selectors.EVENT_READ, "data")
        self._sel.register(client.fileno(), selectors.EVENT_READ, "control")

    @property
    def address(self) -> tuple[str, int]:
        return self.port.address

    @property
    def stats(self) -> Tally:
        return self.port.stats

    def send(self, frame: bytes) -> None:
        self.port.send(frame)

    def send_batch(self, frames: list[bytes]) -> None:
        self.port.send_batch(frames)

    def recv(self, timeout: float) -> bytes | None:
        if self.port.pending:  # a frame of an earlier read: the socket may have nothing more to wake us
            return self.port.recv(0.0)
        end = time.monotonic() + timeout
        while self.failure is None:
            ready = {key.data for key, _ in self._sel.select(max(0.0, end - time.monotonic()))}
            if "data" in ready and (frame := self.port.recv(0.0)) is not None:
                return frame
            if "control" in ready:
                self._read_events()
            elif time.monotonic() >= end:
                return None
        raise self.failure

    def _read_events(self) -> None:
        """Take every event the control connection holds (one read may bring several), until one ends the rank."""
        where = "%s:%d" % self.ticket.control
        while self.failure is None:
            try:
                event = self.client._line(0.0)
            except (OSError, ValueError) as e:
                self.failure = SwitchGoneError(f"rank {self.rank} of job {self.ticket.job.job}: the inagg switch "
                                               f"service at {where} is gone ({e}): it stopped or died")
                return
            if event is None:
                return
            if event.get("event") not in self._EVENTS:
                continue
            try:
                self.client.check_event(event, self.ticket.token)
            except ServiceError as e:
                self.stats["refused_events"] += 1
                log.warning("rank %d of job %d: %s", self.rank, self.ticket.job.job, e)
                continue
            self.failure = self._EVENTS[event["event"]](f"rank {self.rank} of job {self.ticket.job.job}: "
                                                        f"{event.get('reason')} (service at {where})")

    def abort(self) -> None:
        """Close without leaving the job: the service tells the other ranks that this one is gone."""
        self._closed = True
        self._sel.close()
        self.client.close()
        self.port.close()

    def close(self) -> None:
        """Leave the job (the other ranks are not told) and close both sockets; after :meth:`abort`, nothing."""
        if self.failure is None and not self._closed:
            try:
                self.client.attach(self.ticket, self.rank, self.port.address)  # attached again, unwatched
            except ServiceError:  # the service is gone already: nobody is left to tell
                pass
        self.abort()


def group_from_env(*, timing: Timing | None = None) -> Group:
    """:func:`join` with the ticket of ``INAGG_TICKET`` (JSON, or ``@FILE``) and the rank of ``INAGG_RANK``."""
    text = os.environ.get(ENV_TICKET)
    rank = os.environ.get(ENV_RANK)
    if not text or rank is None:
        raise SwitchUnavailableError(f"set {ENV_TICKET} (a job ticket, or @FILE) and {ENV_RANK} to join a job")
    if text.startswith("@"):
        with open(text[1:], encoding="utf-8") as f:
            text = f.read()
    if not rank.isdigit():
        raise ValueError(f"{ENV_RANK} must be a non-negative integer, not {rank!r}")
    return join(Ticket.from_json(text), int(rank), timing=timing)

