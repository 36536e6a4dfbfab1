"""The Verilated RTL switch in real time: a simulator child process behind a :class:`~inagg.host.service.SwitchService`.

The bridge's other transports run the workers inside the simulation, in
simulated time. A switch service runs on the wall clock, for workers in any
process, so this module splits the two across a process boundary:

* :class:`RtlSwitch`, in the service's process, is the service's switch: a
  :class:`~inagg.models.backend.SwitchBackend` whose results arrive later
  than the frames that cause them (``fileno`` and ``poll``). It builds the
  harness (:func:`~inagg.testbench.bridge.build.build`,
  cached), starts the simulator on this module in a thread
  (:func:`~inagg.testbench.bridge.build.run`) and talks to it over a Unix
  stream socket.
* :func:`serve`, the cocotb test inside the simulator, moves frames between
  that socket and the harness's rings (:class:`~inagg.testbench.bridge.bridge.FrameBridge`)
  at every alarm, and turns register requests into AXI4-Lite accesses
  through cocotbext-axi. With nothing in flight for a few wakes it stops
  simulating and blocks on the socket, so an idle service costs no CPU.

**Channel.** Both ways, messages of a 7-byte header (kind, a 16-bit
argument, a 32-bit payload length, little-endian) and a payload: ``FRAME``
(argument: the switch port; payload: the Ethernet frame), ``WRITE``
(payload: address/value pairs; answered by an empty ``WRITE``), ``READ``
(payload: addresses; answered by ``READ`` with the values), ``QUIT``, and
the simulator's first message ``HELLO`` (its pid and the ``ID``, ``JOBS``
and ``GEOMETRY`` registers). Register requests are answered in order; the
frames that come before an answer are kept for the next :meth:`RtlSwitch.poll`.

**Jobs.** :meth:`RtlSwitch.add_job` writes the job through
:class:`~inagg.host.controller.RegisterTarget` (the switch-wide registers
with the first job). :meth:`RtlSwitch.remove_job` tears the job down in
the RTL (the ``TEARDOWN`` register: its enable bit and its slots cleared,
as ``ModelSwitch.remove_job``) and waits until the RTL says it is done, so
the next job may take the same region at once.

**Failures.** When the simulator exits while the service runs (a crash, a
kill), every call raises :class:`~inagg.models.backend.SwitchBackendError`
naming the simulator's pid and exit; the service refuses its requests with
that reason from then on. When the service's process goes away, the
simulator reads the end of its socket and exits: no simulator outlives its
service.
"""

from __future__ import annotations

import logging
import os
import re
import select
import signal
import socket
import struct
import tempfile
import threading
import time
from collections import Counter as Tally
from collections import deque
from pathlib import Path

import cocotb
from cocotbext.axi import AxiLiteBus, AxiLiteMaster

from inagg.host.controller import RegisterTarget
from inagg.models import regmap as rm
from inagg.models.backend import SwitchBackend, SwitchBackendError
from inagg.models.job import JobSpec, SwitchSpec
from inagg.models.protocol import MAX_WORKERS, Counter
from inagg.testbench.bridge.bridge import FrameBridge
from inagg.testbench.bridge.build import HarnessParams, build, run
from inagg.testbench.bridge.harness import RingGeometry

__all__ = ["RtlSwitch", "SOCKET_ENV", "GEOMETRY_ENV", "START_TIMEOUT"]

SOCKET_ENV = "INAGG_RTL_SOCKET"      # the Unix socket the simulator connects to
GEOMETRY_ENV = "INAGG_RTL_GEOMETRY"  # ports,width,chunk_bytes,depth,order_depth of the harness
START_TIMEOUT = 120.0  # seconds from the simulator's start to its HELLO
_QUIT_TIMEOUT = 30.0   # seconds the simulator has to finish after QUIT before it is killed

_HEADER = struct.Struct("<BHI")
FRAME, WRITE, READ, QUIT, HELLO = 1, 2, 3, 4, 5
_HELLO = struct.Struct("<4I")
_SOCKET_BUFFER = 4 << 20
# Simulated wakes without a frame anywhere before the simulator blocks on its socket: longer than a frame
# takes from an ingress ring to an egress ring (each wake is at most FrameBridge.flush_cycles).
_QUIET_WAKES = 4


class _Channel:
    """Messages over a stream socket: :meth:`send` buffers, :meth:`flush` writes, :meth:`fill` reads into :attr:`messages`."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.messages: deque[tuple[int, int, bytes]] = deque()  # (kind, argument, payload), in arrival order
        self._in = bytearray()
        self._out = bytearray()
        self.closed = False  # the other end is gone

    def send(self, kind: int, arg: int = 0, payload: bytes = b"") -> None:
        self._out += _HEADER.pack(kind, arg, len(payload))
        self._out += payload

    @property
    def pending(self) -> int:
        """Bytes buffered by :meth:`send` and not written yet."""
        return len(self._out)

    def fill(self) -> None:
        """Read what the socket holds, without waiting, into :attr:`messages`; sets :attr:`closed` at its end."""
        while not self.closed:
            try:
                data = self.sock.recv(1 << 20, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                self.closed = True
            self._in += data
        buf, at = self._in, 0
        while len(buf) - at >= _HEADER.size:
            kind, arg, n = _HEADER.unpack_from(buf, at)
            start = at + _HEADER.size
            if len(buf) - start < n:
                break
            self.messages.append((kind, arg, bytes(buf[start:start + n])))
            at = start + n
        del buf[:at]

    def flush(self) -> None:
        """Write everything :meth:`send` buffered, reading meanwhile (so two flushing ends never deadlock)."""
        while self._out and not self.closed:
            _, writable, _ = select.select([self.sock], [self.sock], [])
            if not writable:
                self.fill()
                continue
            try:
                n = self.sock.send(self._out, socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue
            except OSError:
                self.closed = True
                return
            del self._out[:n]


# -- inside the simulator --------------------------------------------------------


@cocotb.test()
async def serve(dut):
    """Serve the service on the other end of ``INAGG_RTL_SOCKET`` until it says QUIT or goes away."""
    # The service stops the simulator itself: a Ctrl-C meant for the service must not kill it first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ports, width, chunk_bytes, depth, order_depth = map(int, os.environ[GEOMETRY_ENV].split(","))
    bridge = FrameBridge(dut, RingGeometry(ports, width, chunk_bytes, depth, order_depth))
    await bridge.start()
    axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axil"), dut.clk, dut.rst)
    for model in (axil.write_if, axil.read_if):
        model.log.setLevel(logging.WARNING)  # it logs every access at INFO
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        sock.setsockopt(socket.SOL_SOCKET, opt, _SOCKET_BUFFER)
    sock.connect(os.environ[SOCKET_ENV])
    chan = _Channel(sock)
    regs = [await axil.read_dword(rm.RegMap.switch(r)) for r in ("ID", "JOBS", "GEOMETRY")]
    chan.send(HELLO, 0, _HELLO.pack(os.getpid(), *regs))
    chan.flush()
    quiet = 0
    while True:
        got = bridge.pull()
        for port, frame in got:
            chan.send(FRAME, port, frame)
        chan.flush()
        chan.fill()
        registers = False
        messages = len(chan.messages)
        while chan.messages:
            kind, arg, payload = chan.messages.popleft()
            if kind == FRAME:
                bridge.send(arg, payload)  # the service sends only frames a row holds
            elif kind == WRITE:
                for addr, value in struct.iter_unpack("<II", payload):
                    await axil.write_dword(addr, value)
                chan.send(WRITE)
                registers = True
            elif kind == READ:
                values = [await axil.read_dword(a) for (a,) in struct.iter_unpack("<I", payload)]
                chan.send(READ, 0, struct.pack(f"<{len(values)}I", *values))
                registers = True
            elif kind == QUIT:
                chan.flush()
                return
        if chan.closed:
            return
        bridge.push()
        if registers:  # simulated time moved on: read the rings again before choosing how long to sleep
            quiet = 0
            continue
        quiet = 0 if got or messages or not bridge.idle else quiet + 1
        if quiet < _QUIET_WAKES:
            await bridge.wait(bridge.flush_cycles)
        else:  # nothing in flight: no cycle is simulated until the service sends something
            select.select([sock], [], [])


# -- in the service's process ----------------------------------------------------


class RtlSwitch(SwitchBackend):
    """The Verilated RTL switch of ``spec`` in a simulator process, a :class:`~inagg.models.backend.SwitchBackend`.

    Parameters
    ----------
    spec:
        The switch: ports, slots, chunk size (the harness is built for it).
    width:
        Beat width of the RTL, 64, 256 or 512 bits.
    jobs:
        Entries of the RTL's job table: job numbers 0..jobs-1 (a service numbers its jobs from 1).
    workers:
        Most workers per job; ``min(spec.ports, 64)`` when None.
    start_timeout:
        Seconds the simulator has, after the build, to connect.

    The first use of a geometry builds a Verilator model (minutes; cached
    in :attr:`build_dir` under ``sim_build/``); :attr:`pid` is the
    simulator's process. :meth:`close` stops the simulator. ``drops``
    counts frames no ring row can carry (``oversize``, ``empty``), which
    never reach the RTL.
    """

    per_worker_rkeys = True  # the worker table holds each worker's CONTRIB_RKEY

    def __init__(self, spec: SwitchSpec, *, width: int = 64, jobs: int = 4, workers: int | None = None,
                 start_timeout: float = START_TIMEOUT):
        if not isinstance(spec, SwitchSpec):
            raise TypeError(f"spec must be a SwitchSpec, not {type(spec).__name__}")
        workers = min(spec.ports, MAX_WORKERS) if workers is None else workers
        self.params = HarnessParams.for_switch(spec, width=width, jobs=jobs, workers=workers)
        self.spec, self.width = spec, width
        self.geometry = self.params.rings
        self.drops: Tally = Tally()
        self.pid: int | None = None
        self._jobs: dict[int, JobSpec] = {}
        self._results: list[tuple[int, bytes]] = []
        self._failure: str | None = None
        self._exit: BaseException | None = None
        self._writes: list[tuple[int, int]] = []
        runner, folder = build(self.params)
        self.build_dir = folder
        self._tmp = tempfile.TemporaryDirectory(prefix="inagg-rtl-service-")
        path = str(Path(self._tmp.name) / "switch.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(path)
            listener.listen(1)
            env = {SOCKET_ENV: path, GEOMETRY_ENV: f"{spec.ports},{width},{spec.chunk_bytes},{self.params.depth},"
                                                   f"{self.params.order_depth}"}
            self._thread = threading.Thread(target=self._simulate, args=(runner, folder, env), daemon=True,
                                            name="inagg-rtl-simulator")
            self._thread.start()
            self._sock = self._accept(listener, start_timeout)
        except BaseException:
            listener.close()
            self._tmp.cleanup()
            raise
        listener.close()
        self._chan = _Channel(self._sock)
        try:
            self.pid, ident, jobs_reg, geometry = _HELLO.unpack(self._expect(HELLO))
        except BaseException:
            self.close()
            raise
        self.regmap = rm.RegMap.from_jobs(jobs_reg)
        want = self.regmap.geometry(spec, width)
        if ident != rm.ID_VALUE or geometry != want or (self.regmap.jobs, self.regmap.workers) != (jobs, workers):
            self.close()
            raise SwitchBackendError(f"the RTL switch is not the one built: ID 0x{ident:08X}, GEOMETRY "
                                     f"0x{geometry:08X} (0x{want:08X} expected), JOBS 0x{jobs_reg:08X}")
        self._target = RegisterTarget(lambda addr, value: self._writes.append((addr, value)), self.regmap, spec,
                                      read=self._read_register)

    def _simulate(self, runner, folder, env) -> None:
        try:
            run(runner, folder, __name__, env=env)
        except BaseException as e:  # reported by the next call on the switch
            self._exit = e

    def _accept(self, listener: socket.socket, timeout: float) -> socket.socket:
        listener.settimeout(0.1)
        deadline = time.monotonic() + timeout
        while True:
            try:
                sock, _ = listener.accept()
                break
            except TimeoutError:
                if not self._thread.is_alive():
                    raise SwitchBackendError(f"the RTL simulator exited before it connected: {self._exit}") from None
                if time.monotonic() > deadline:
                    raise SwitchBackendError(f"the RTL simulator did not connect within {timeout} s") from None
        sock.settimeout(None)
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            sock.setsockopt(socket.SOL_SOCKET, opt, _SOCKET_BUFFER)
        return sock

    # -- the switch interface ----------------------------------------------------

    # remove_job() waits until the RTL has cleared the job's slots: none is ever retired.
    retired_slots: tuple[tuple[int, int], ...] = ()

    def fileno(self) -> int:
        """The simulator's socket: readable when results (or the simulator's end) arrive."""
        return self._sock.fileno()

    def receive(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        """Send ``frame`` into switch port ``port``; the results come out of :meth:`poll`, later."""
        self._check()
        if not 0 < len(frame) <= self.geometry.frame_bytes:
            self.drops["empty" if not frame else "oversize"] += 1
            return []
        self._chan.send(FRAME, port, frame)
        if self._chan.pending >= _SOCKET_BUFFER // 4:
            self._flush()
        return []

    def poll(self) -> list[tuple[int, bytes]]:
        """Hand the frames received so far to the simulator; return the frames the switch sent, as (port, frame)."""
        self._check()
        self._flush()
        self._chan.fill()
        while self._chan.messages:
            self._take(*self._chan.messages.popleft())
        if self._chan.closed:
            self._fail()
        out, self._results = self._results, []
        return out

    def add_job(self, job: JobSpec) -> None:
        """Write ``job`` into the RTL's registers; ``ValueError`` for a job it cannot hold."""
        self._check()
        if job.job in self._jobs:  # the registers would take it and overwrite the running job
            raise ValueError(f"job {job.job} is configured already")
        self._target.add_job(job)  # validates, writes, and reads the job's CTRL back (which sends the writes)
        self._jobs[job.job] = job

    def remove_job(self, job: int) -> None:
        """Tear ``job`` down in the RTL and wait until its slots are free (``KeyError`` for a job not added)."""
        self._check()
        del self._jobs[job]
        try:
            self._target.remove_job(job)  # writes TEARDOWN and polls it until the RTL is done
        except RuntimeError as e:
            # Only a slot another job's key diverted from refuses, and this switch has no exception path.
            self._failure = str(e)
            raise SwitchBackendError(self._failure) from e

    @property
    def counters(self) -> dict[Counter, int]:
        """Every counter, read from the RTL's registers."""
        self._check()
        cs = list(Counter)
        values = self._registers(READ, struct.pack(f"<{len(cs)}I", *(self.regmap.counter(c) for c in cs)))
        return dict(zip(cs, struct.unpack(f"<{len(cs)}I", values)))

    def close(self) -> None:
        """Stop the simulator (killed when it does not stop within 30 s) and wait for it."""
        if not self._chan.closed:
            self._chan.send(QUIT)
            self._chan.flush()
        self._thread.join(_QUIT_TIMEOUT)
        if self._thread.is_alive() and self.pid is not None:
            os.kill(self.pid, signal.SIGKILL)
            self._thread.join()
        self._sock.close()
        self._tmp.cleanup()

    # -- the channel --------------------------------------------------------------

    def _read_register(self, addr: int) -> int:
        """One register's value, after the writes queued before it (as a bus orders them)."""
        if self._writes:
            self._registers(WRITE, self._take_writes())
        (value,) = struct.unpack("<I", self._registers(READ, struct.pack("<I", addr)))
        return value

    def _take_writes(self) -> bytes:
        payload = b"".join(struct.pack("<II", a, v) for a, v in self._writes)
        self._writes.clear()
        return payload

    def _registers(self, kind: int, payload: bytes) -> bytes:
        """Send a register request and wait for its answer (frames that come first are kept for :meth:`poll`)."""
        self._chan.send(kind, 0, payload)
        self._flush()
        return self._expect(kind)

    def _expect(self, kind: int) -> bytes:
        """The payload of the next message of ``kind``; the frames before it go to :meth:`poll`."""
        while True:
            while self._chan.messages:
                k, arg, payload = self._chan.messages.popleft()
                if k == kind:
                    return payload
                self._take(k, arg, payload)
            if self._chan.closed:
                self._fail()
            select.select([self._sock], [], [])
            self._chan.fill()

    def _take(self, kind: int, arg: int, payload: bytes) -> None:
        if kind != FRAME:
            self._failure = f"the RTL simulator (pid {self.pid}) sent a message of unknown kind {kind}"
            raise SwitchBackendError(self._failure)
        self._results.append((arg, payload))

    def _flush(self) -> None:
        self._chan.flush()
        if self._chan.closed:
            self._fail()

    def _check(self) -> None:
        if self._failure is not None:
            raise SwitchBackendError(self._failure)

    def _fail(self) -> None:
        self._thread.join(_QUIT_TIMEOUT)
        self._failure = f"the RTL simulator (pid {self.pid}) exited: {_describe(self._exit)}"
        raise SwitchBackendError(self._failure)


def _describe(e: BaseException | None) -> str:
    """How the simulator ended, from what :func:`~inagg.testbench.bridge.build.run` raised."""
    if e is None:
        return "its test ended"
    # cocotb's runner reports a simulator that failed as "Command failed with return code: N".
    m = re.search(r"return code: (-?\d+)", str(e))
    if m is not None:
        code = int(m.group(1))
        return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
    return f"{type(e).__name__}: {e}"
