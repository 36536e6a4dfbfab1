"""The host's side of management frames (``inagg.models.mgmt``): a sans-IO session and a blocking register bus.

:class:`MgmtSession` builds request frames and reads the answers, one
request at a time; it owns no socket and no clock: the caller hands it the
time and the frames that arrived, and sends what :meth:`MgmtSession.data_to_send`
returns. A lost request or answer is sent again after ``timeout`` (the
same frame: if the board performed it, the copy is answered ``REPLAYED``
with the floor equal to its sequence number, which completes a write, and
a read is asked again under a new number); an answer ``REPLAYED`` with
another floor means the board saw higher numbers (this host restarted, or
another host configures it), and the request goes again above that floor.
After ``tries`` sends without an answer it raises :class:`MgmtTimeout`.

:class:`MgmtBus` runs a session over two callables (send a frame, wait
for one), with the ``write(addr, value)`` and ``read(addr)`` of
:class:`~inagg.host.controller.RegisterTarget`, so the controller configures
a board over its Ethernet as it does over AXI4-Lite
(:func:`inagg.host.controller.management_target`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from inagg.models.mgmt import KEY_BYTES, Op, Response, Status, parse_key, parse_response, request_frame

__all__ = ["MgmtError", "MgmtTimeout", "MgmtSession", "MgmtBus", "read_key_file"]


def read_key_file(path: str) -> bytes:
    """The board's 16-byte key from the file ``path``: 32 hex digits, as ``inagg verilog --mgmt-key`` takes it
    (white space around them is ignored); ``ValueError`` naming the file otherwise."""
    try:
        text = open(path).read()
    except OSError as e:
        raise ValueError(f"cannot read the management key file {path}: {e.strerror}") from None
    try:
        return parse_key(text)
    except ValueError:
        raise ValueError(f"the management key file {path} must hold the board's key as {2 * KEY_BYTES} hex "
                         "digits") from None


class MgmtError(RuntimeError):
    """The board refused a register access (SLVERR), or a session was misused."""


class MgmtTimeout(MgmtError):
    """No answer from the board: every try was lost, or the board does not know the key."""


class MgmtSession:
    """One host's management requests to one board (see the module docstring).

    Parameters
    ----------
    key:
        The board's 16-byte key.
    board, host:
        MAC addresses: the board's (the requests' destination) and this host's.
    seq:
        The first sequence number; a host that keeps no state across runs may start at 1 and is moved
        above the board's floor by its first answer.
    timeout:
        Seconds to wait for an answer before sending again.
    tries:
        Sends of one request (counting resends above a floor) before :class:`MgmtTimeout`.
    """

    def __init__(self, key: bytes, *, board: str, host: str, seq: int = 1, timeout: float = 0.05, tries: int = 4):
        if not isinstance(tries, int) or tries < 1:
            raise ValueError(f"tries must be a positive integer, not {tries!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, not {timeout!r}")
        request_frame(key, dst=board, src=host, op=Op.READ, seq=seq, addr=0)  # checks key, MACs and seq
        self.key, self.board, self.host = key, board, host
        self.seq, self.timeout, self.tries = seq, timeout, tries
        self._pending: tuple[Op, int, int] | None = None
        self._outbox: list[bytes] = []
        self._sent = 0
        self._deadline = 0.0

    @property
    def pending(self) -> bool:
        """A request waits for its answer."""
        return self._pending is not None

    @property
    def deadline(self) -> float:
        """When the pending request is sent again (:meth:`poll`)."""
        return self._deadline

    def _send(self, now: float) -> None:
        if self._sent == self.tries:
            op, addr, _ = self._pending
            self._pending = None
            raise MgmtTimeout(f"no answer from the management bridge of {self.board} to a {op.name} of 0x{addr:04X} "
                              f"after {self.tries} tries of {self.timeout} s (lost frames, or a wrong key)")
        op, addr, data = self._pending
        self._outbox.append(request_frame(self.key, dst=self.board, src=self.host, op=op, seq=self.seq, addr=addr,
                                          data=data))
        self._sent += 1
        self._deadline = now + self.timeout

    def request(self, op: Op, addr: int, data: int = 0, *, now: float) -> None:
        """Start ``op`` on register ``addr`` (``data``: a write's value); the frame is in :meth:`data_to_send`."""
        if self._pending is not None:
            raise MgmtError("a management request is still waiting for its answer")
        self._pending, self._sent = (Op(op), addr, data), 0
        self._send(now)

    def data_to_send(self) -> list[bytes]:
        """The frames to send now, oldest first (each given once)."""
        out, self._outbox = self._outbox, []
        return out

    def poll(self, now: float) -> None:
        """Send the request again when its answer is overdue; :class:`MgmtTimeout` after the last try."""
        if self._pending is not None and now >= self._deadline:
            self._send(now)

    def receive(self, frame: bytes, now: float) -> Response | None:
        """The answer to the pending request when ``frame`` completes it, else None.

        Frames that are not a response tagged under the key, or that answer
        another sequence number (a late answer to an earlier try), are
        ignored. A write answered ``REPLAYED`` at its own sequence number
        was performed by an earlier try: it completes with status OK.
        """
        r = parse_response(self.key, frame)
        if r is None or self._pending is None or r.seq != self.seq or r.op != self._pending[0]:
            return None
        if r.status == Status.REPLAYED:
            if r.op == Op.WRITE and r.floor == r.seq:
                r = dataclasses.replace(r, status=Status.OK)
            else:
                self.seq = max(r.floor, self.seq) + 1
                self._send(now)
                return None
        self._pending = None
        self.seq += 1
        return r


class MgmtBus:
    """Register writes and reads over a :class:`MgmtSession`, blocking.

    Parameters
    ----------
    session:
        The session.
    send:
        ``send(frame)``: put a frame on the wire.
    recv:
        ``recv(timeout)``: the next frame that arrives within ``timeout`` seconds, or None.
    clock:
        Seconds, monotonic (the session's time).
    """

    def __init__(self, session: MgmtSession, send: Callable[[bytes], None],
                 recv: Callable[[float], bytes | None], clock: Callable[[], float] = time.monotonic):
        self.session, self._send, self._recv, self._clock = session, send, recv, clock

    def _transact(self, op: Op, addr: int, data: int = 0) -> Response:
        s = self.session
        s.request(op, addr, data, now=self._clock())
        while True:
            for frame in s.data_to_send():
                self._send(frame)
            frame = self._recv(max(0.0, s.deadline - self._clock()))
            now = self._clock()
            if frame is not None and (r := s.receive(frame, now)) is not None:
                if r.status != Status.OK:
                    raise MgmtError(f"the board refused the {op.name} of 0x{addr:04X}: {r.status.name}")
                return r
            s.poll(now)

    def write(self, addr: int, value: int) -> None:
        """Write ``value`` to register ``addr``; :class:`MgmtError` when the board refuses it."""
        self._transact(Op.WRITE, addr, value)

    def read(self, addr: int) -> int:
        """Register ``addr``'s value; :class:`MgmtError` when the board refuses the read."""
        return self._transact(Op.READ, addr).data
