"""The RoCE reliable connection (RC) as sans-IO state machines: a requester and a responder.

A standard RoCE NIC's RC rules, as Linux's soft-RoCE (``rxe_req.c``,
``rxe_resp.c``, ``rxe_comp.c``) applies them to RDMA WRITE, written as
state machines that take events and return packet descriptions: nothing
here owns a socket or a clock. Time is passed in (``now``) and each timer
is reported (:attr:`Requester.deadline`). The packets are
:class:`Packet` and :class:`Ack` descriptions; :func:`encode` and
:func:`decode` turn them into RoCEv2 frames (``models/frame.py`` layouts)
and back. Hosts drive them through ``inagg.host.rc_worker``; a switch in
Mode I is an RC endpoint with the same classes.

PSNs are 24-bit serial numbers (:func:`psn_add`, :func:`psn_diff`); a
window of at most ``2**23 - 1`` packets keeps their comparison exact.
``docs/protocol.md`` section 6.1 is the specification.
"""

from __future__ import annotations

import copy
from collections import Counter as Tally
from collections import deque
from dataclasses import dataclass

from inagg.models import frame as _frame
from inagg.models import icrc as _icrc
from inagg.models import wire
from inagg.models.frame import BTH, UDP, Opcode, SegmentOpcode
from inagg.models.protocol import DEFAULT_PKEY, ETH_LEN, ICRC_LEN, IPV4_LEN, Counter

__all__ = [
    "PSN_BITS", "PSN_MOD", "psn_add", "psn_diff", "Syndrome", "Packet", "Ack", "Segment", "Message", "RcError",
    "RemoteError", "RetryExceededError", "RnrRetryExceededError", "RNR_DELAY", "RNR_FOREVER", "Requester",
    "Responder", "Address", "encode", "decode",
]

PSN_BITS = 24
PSN_MOD = 1 << PSN_BITS
_PSN_HALF = PSN_MOD >> 1


def psn_add(psn: int, n: int) -> int:
    """``psn + n`` modulo 2**24."""
    return (psn + n) % PSN_MOD


def psn_diff(a: int, b: int) -> int:
    """``a - b`` as a signed serial-number distance in ``-2**23 .. 2**23 - 1`` (RFC 1982 on 24 bits)."""
    d = (a - b) % PSN_MOD
    return d - PSN_MOD if d >= _PSN_HALF else d


class Syndrome:
    """AETH syndromes (IBTA vol. 1, 9.7.5.1.1): bits 6-5 say ACK (00) or NAK (11)."""

    ACK = 0x1F            # ACK, credits not used ("unlimited", as rxe sends it)
    RNR_NAK = 0x20        # RNR NAK (bits 6-5 01): the responder cannot take the PSN yet; bits 4-0, the RNR timer
    NAK_SEQ = 0x60        # NAK: PSN sequence error; the AETH's PSN is the one expected
    NAK_INVALID = 0x61    # NAK: invalid request (an opcode out of its message sequence)

    @staticmethod
    def is_nak(syndrome: int) -> bool:
        return syndrome >> 5 == 0b11

    @staticmethod
    def is_rnr(syndrome: int) -> bool:
        return syndrome >> 5 == 0b01


RNR_DELAY = (655.36e-3, 0.01e-3, 0.02e-3, 0.03e-3, 0.04e-3, 0.06e-3, 0.08e-3, 0.12e-3, 0.16e-3, 0.24e-3, 0.32e-3,
             0.48e-3, 0.64e-3, 0.96e-3, 1.28e-3, 1.92e-3, 2.56e-3, 3.84e-3, 5.12e-3, 7.68e-3, 10.24e-3, 15.36e-3,
             20.48e-3, 30.72e-3, 40.96e-3, 61.44e-3, 81.92e-3, 122.88e-3, 163.84e-3, 245.76e-3, 327.68e-3, 491.52e-3)
"""Seconds a requester waits after an RNR NAK, by the 5-bit RNR timer field (IBTA vol. 1, table 45)."""
RNR_FOREVER = 7
"""The ``rnr_retries`` value that retries after RNR NAKs without a limit (IBTA: an RNR retry count of 7)."""


_FIRST = frozenset({SegmentOpcode.RC_RDMA_WRITE_FIRST, Opcode.RC_RDMA_WRITE_ONLY, Opcode.RC_RDMA_WRITE_ONLY_IMM})
_LAST = frozenset({SegmentOpcode.RC_RDMA_WRITE_LAST, Opcode.RC_RDMA_WRITE_ONLY, Opcode.RC_RDMA_WRITE_ONLY_IMM})


@dataclass(frozen=True, slots=True)
class Packet:
    """One RC RDMA WRITE request packet.

    ``va`` and ``length`` (the whole message's) travel in the RETH of a
    FIRST or ONLY packet; ``imm`` in the ImmDt of WRITE ONLY WITH IMMEDIATE.
    """

    opcode: Opcode | SegmentOpcode
    psn: int
    payload: bytes
    ackreq: bool = False
    va: int | None = None
    length: int | None = None
    imm: int | None = None


@dataclass(frozen=True, slots=True)
class Ack:
    """An ACKNOWLEDGE (opcode 0x11): the AETH's syndrome and MSN, and the PSN it answers."""

    psn: int
    syndrome: int = Syndrome.ACK
    msn: int = 0

    @property
    def nak(self) -> bool:
        return Syndrome.is_nak(self.syndrome)


@dataclass(frozen=True, slots=True)
class Segment:
    """One in-order request packet as :meth:`Responder.take` places it: ``va`` is where its payload goes
    (the message's VA plus the bytes of the message before it); ``first`` and ``last`` say whether it
    opens and ends its message; ``imm`` is the message's ImmDt (on a WRITE ONLY WITH IMMEDIATE)."""

    va: int
    payload: bytes
    first: bool
    last: bool
    imm: int | None = None


@dataclass(frozen=True, slots=True)
class Message:
    """A whole RDMA WRITE message as the responder delivers it."""

    va: int
    payload: bytes
    imm: int | None = None


class RcError(Exception):
    """An RC queue pair that cannot go on: the work request completes in error."""


class RemoteError(RcError):
    """The responder answered with a NAK other than a sequence error (rxe's IB_WC_REM_INV_REQ_ERR)."""

    def __init__(self, psn: int, syndrome: int):
        self.psn, self.syndrome = psn, syndrome
        super().__init__(f"RC responder refused PSN {psn}: NAK syndrome 0x{syndrome:02x}")


class RetryExceededError(RcError):
    """The requester retransmitted ``retries`` times without progress (rxe's IB_WC_RETRY_EXC_ERR)."""

    def __init__(self, psn: int, retries: int, reason: str):
        self.psn, self.retries, self.reason = psn, retries, reason
        super().__init__(f"RC retry count exceeded: PSN {psn} unacknowledged after {retries} retries ({reason})")


class RnrRetryExceededError(RcError):
    """The responder answered ``retries`` RNR NAKs in a row for the same PSN (rxe's IB_WC_RNR_RETRY_EXC_ERR)."""

    def __init__(self, psn: int, retries: int):
        self.psn, self.retries = psn, retries
        super().__init__(f"RC RNR retry count exceeded: PSN {psn} refused as not ready after {retries} RNR retries")


class Requester:
    """The sending half of an RC QP: a send queue of WRITE messages, a PSN window, Go-Back-N.

    Parameters
    ----------
    first_psn:
        PSN of the first packet.
    window:
        Most packets sent and not yet acknowledged.
    mtu:
        Payload bytes per packet: a longer message goes out as WRITE FIRST,
        MIDDLE..., LAST.
    timeout:
        The local ACK timeout: with packets outstanding and no ACK that
        makes progress for this long, everything unacknowledged is sent again.
    retries:
        Retransmissions (after a timeout or a NAK) allowed without progress
        before :class:`RetryExceededError`; progress restores the count.
    rnr_retries:
        Resends after an RNR NAK allowed without progress before
        :class:`RnrRetryExceededError`; :data:`RNR_FOREVER` (7) has no limit.
        An RNR NAK spends none of ``retries``.

    :attr:`completed` counts the messages fully acknowledged, in posting
    order; :attr:`stats` counts packets sent and resent, ACKs, NAKs and
    ignored ACKs by reason.
    """

    def __init__(self, *, first_psn: int = 0, window: int = 128, mtu: int = 1024, timeout: float = 0.005,
                 retries: int = 7, rnr_retries: int = RNR_FOREVER):
        if not isinstance(first_psn, int) or not 0 <= first_psn < PSN_MOD:
            raise ValueError(f"first_psn must be an integer in 0..2**24-1, not {first_psn!r}")
        if not isinstance(window, int) or not 1 <= window < _PSN_HALF:
            raise ValueError(f"window must be an integer in 1..2**23-1, not {window!r}")
        if not isinstance(mtu, int) or mtu <= 0 or mtu % 4:
            raise ValueError(f"mtu must be a positive multiple of 4, not {mtu!r}")
        if not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"timeout must be a positive number, not {timeout!r}")
        if not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be a non-negative integer, not {retries!r}")
        if not isinstance(rnr_retries, int) or not 0 <= rnr_retries <= RNR_FOREVER:
            raise ValueError(f"rnr_retries must be an integer in 0..7, not {rnr_retries!r}")
        self.window, self.mtu, self.timeout, self.retries = window, mtu, timeout, retries
        self.rnr_retries = rnr_retries
        self.una = first_psn          # oldest unacknowledged PSN
        self.next_psn = first_psn     # PSN of the next new packet
        self.completed = 0
        self.stats: Tally = Tally()
        self._queue: deque[Packet] = deque()   # packets not sent yet
        self._sent: deque[Packet] = deque()    # sent, not acknowledged, in PSN order
        self._ends: deque[int] = deque()       # last PSN of every message not yet complete
        self._left = retries
        self._timer: float | None = None
        self._nak_psn: int | None = None       # a Go-Back-N started by a NAK for this PSN
        self._rnr_left = rnr_retries
        self._rnr_wait = False                 # an RNR NAK of the oldest unACKed PSN: _timer is its RNR delay

    def copy(self) -> "Requester":
        """An independent copy of the state (packets are immutable and shared): a model checker branches with it."""
        t = copy.copy(self)
        t.stats, t._queue, t._sent, t._ends = Tally(self.stats), deque(self._queue), deque(self._sent), deque(self._ends)
        return t

    def state(self, now: float) -> tuple:
        """A hashable summary of the protocol state, the timer relative to ``now`` (a model checker's key)."""
        return (self.una, self.next_psn, self.completed, self._left, self._nak_psn, self._rnr_left, self._rnr_wait,
                len(self._queue), None if self._timer is None else self._timer - now)

    @property
    def deadline(self) -> float | None:
        """When :meth:`on_timer` must run: the ACK timeout of the oldest outstanding packet, or the end of an
        RNR NAK's delay."""
        return self._timer

    @property
    def idle(self) -> bool:
        """True when every posted message is acknowledged."""
        return not self._sent and not self._queue

    @property
    def unacked(self) -> tuple[Packet, ...]:
        """The packets sent and not acknowledged, in PSN order: what a retransmission sends again."""
        return tuple(self._sent)

    def post(self, now: float, payload: bytes, va: int, imm: int | None = None) -> list[Packet]:
        """Queue one RDMA WRITE message (WITH IMMEDIATE when ``imm`` is given); returns the packets the window lets out."""
        n = max(1, -(-len(payload) // self.mtu))
        if imm is not None and n > 1:
            raise ValueError("a WRITE WITH IMMEDIATE message must fit one packet here")
        psn = psn_add(self.next_psn, len(self._queue))
        for i in range(n):
            part = payload[i * self.mtu:(i + 1) * self.mtu]
            if n == 1:
                op = Opcode.RC_RDMA_WRITE_ONLY if imm is None else Opcode.RC_RDMA_WRITE_ONLY_IMM
            else:
                op = (SegmentOpcode.RC_RDMA_WRITE_FIRST if i == 0 else
                      SegmentOpcode.RC_RDMA_WRITE_LAST if i == n - 1 else SegmentOpcode.RC_RDMA_WRITE_MIDDLE)
            head = op in _FIRST
            # AckReq on a message's last packet: the responder then ACKs at once, so the
            # requester learns of each completion without waiting for a coalesced ACK.
            self._queue.append(Packet(op, psn_add(psn, i), part, ackreq=i == n - 1, va=va if head else None,
                                      length=len(payload) if head else None, imm=imm))
        self._ends.append(psn_add(psn, n - 1))
        return self._fill(now)

    def receive(self, now: float, ack: Ack) -> list[Packet]:
        """Handle an ACK, NAK or RNR NAK; returns the packets to send (new ones, or a Go-Back-N)."""
        d_next = psn_diff(ack.psn, self.next_psn)
        if Syndrome.is_rnr(ack.syndrome):
            return self._rnr(now, ack)
        if ack.nak:
            if ack.syndrome != Syndrome.NAK_SEQ:
                self.stats["nak_other"] += 1
                raise RemoteError(ack.psn, ack.syndrome)
            # A sequence NAK names the PSN the responder expects: everything before it arrived.
            if psn_diff(ack.psn, self.una) < 0 or d_next > 0:
                self.stats["ignored_ack"] += 1
                return []
            self.stats["nak"] += 1
            self._acked(now, psn_add(ack.psn, -1))
            if self._nak_psn == ack.psn:
                return []  # this gap's Go-Back-N is under way already
            self._nak_psn = ack.psn
            return self._retry(now, "NAK sequence error")
        if psn_diff(ack.psn, self.una) < 0 or d_next >= 0:
            self.stats["ignored_ack"] += 1  # a duplicate ACK, or one for a PSN never sent
            return []
        self.stats["ack"] += 1
        self._acked(now, ack.psn)
        return self._fill(now)

    def on_timer(self, now: float) -> list[Packet]:
        """The ACK timeout: Go-Back-N from the oldest unacknowledged PSN, or :class:`RetryExceededError`;
        at the end of an RNR NAK's delay the same Go-Back-N, spending no retry."""
        if self._timer is None or now < self._timer:
            return []
        if self._rnr_wait:
            self._rnr_wait = False
            self.stats["rnr_resent"] += len(self._sent)
            self._timer = now + self.timeout
            return list(self._sent) + self._fill(now)
        return self._retry(now, "ACK timeout")

    def _rnr(self, now: float, ack: Ack) -> list[Packet]:
        """An RNR NAK of PSN ``q``: everything before ``q`` arrived; wait its RNR delay, then resend from ``q``."""
        if psn_diff(ack.psn, self.una) < 0 or psn_diff(ack.psn, self.next_psn) >= 0:
            self.stats["ignored_ack"] += 1
            return []
        self._acked(now, psn_add(ack.psn, -1))
        if self._rnr_wait:
            self.stats["ignored_ack"] += 1  # a duplicate of the RNR NAK whose delay runs
            return []
        if self._rnr_left == 0:
            raise RnrRetryExceededError(self.una, self.rnr_retries)
        if self.rnr_retries != RNR_FOREVER:
            self._rnr_left -= 1
        self.stats["rnr_nak"] += 1
        self._rnr_wait = True
        # The packets behind q were dropped as ahead: the responder's sequence NAK of q must not start a second
        # Go-Back-N before the delay ends.
        self._nak_psn = ack.psn
        self._timer = now + RNR_DELAY[ack.syndrome & 0x1F]
        return []

    def _acked(self, now: float, psn: int) -> None:
        """Everything up to ``psn`` arrived: drop it from the window, complete its messages."""
        progressed = False
        while self._sent and psn_diff(self._sent[0].psn, psn) <= 0:
            self._sent.popleft()
            progressed = True
        if not progressed:
            return
        self.una = psn_add(psn, 1)
        while self._ends and psn_diff(self._ends[0], psn) <= 0:
            self._ends.popleft()
            self.completed += 1
        self._left, self._rnr_left = self.retries, self.rnr_retries
        self._nak_psn = None
        self._rnr_wait = False
        self._timer = now + self.timeout if self._sent else None

    def _retry(self, now: float, reason: str) -> list[Packet]:
        if self._left == 0:
            raise RetryExceededError(self.una, self.retries, reason)
        self._left -= 1
        self.stats["retries"] += 1
        self.stats["resent"] += len(self._sent)
        self._timer = now + self.timeout if self._sent else None
        return list(self._sent)

    def _fill(self, now: float) -> list[Packet]:
        out = []
        while self._queue and len(self._sent) < self.window and not self._rnr_wait:
            p = self._queue.popleft()
            self._sent.append(p)
            out.append(p)
        if out:
            self.next_psn = psn_add(out[-1].psn, 1)
            self.stats["sent"] += len(out)
            if self._timer is None:
                self._timer = now + self.timeout
        return out


class Responder:
    """The receiving half of an RC QP: in-order WRITE packets, ACK, re-ACK, one NAK per gap.

    ``ack_every`` coalesces ACKs: an in-order packet is ACKed when it asks
    (AckReq) or when that many packets arrived since the last ACK.
    :meth:`receive` returns ``(messages, acks)``: the messages the packet
    completed (at most one) and the ACK/NAK to send (at most one). A
    receiver that places each packet as it comes (a switch in Mode I,
    which aggregates packet by packet) uses :meth:`address` and
    :meth:`take` instead, and keeps no message buffer; when it cannot
    take the next packet yet it answers it with :meth:`refuse`, an RNR NAK
    whose RNR timer field is ``rnr_timer`` (an index of :data:`RNR_DELAY`).
    """

    def __init__(self, *, first_psn: int = 0, ack_every: int = 1, rnr_timer: int = 1):
        if not isinstance(first_psn, int) or not 0 <= first_psn < PSN_MOD:
            raise ValueError(f"first_psn must be an integer in 0..2**24-1, not {first_psn!r}")
        if not isinstance(ack_every, int) or ack_every < 1:
            raise ValueError(f"ack_every must be a positive integer, not {ack_every!r}")
        if not isinstance(rnr_timer, int) or not 0 <= rnr_timer < len(RNR_DELAY):
            raise ValueError(f"rnr_timer must be an integer in 0..31, not {rnr_timer!r}")
        self.expected = first_psn
        self.rnr_timer = rnr_timer
        self.msn = 0
        self.ack_every = ack_every
        self.stats: Tally = Tally()
        self._nak_sent = False
        self._unacked = 0
        self._va: int | None = None       # where the open message's next packet goes; None: no message open
        self._parts: list[bytes] = []     # receive(): the open message's payload so far
        self._msg_va = 0                  # receive(): the open message's VA

    def copy(self) -> "Responder":
        """An independent copy of the state: a model checker branches with it."""
        t = copy.copy(self)
        t.stats, t._parts = Tally(self.stats), list(self._parts)
        return t

    def state(self) -> tuple:
        """A hashable summary of the protocol state (a model checker's key)."""
        return self.expected, self.msn, self._nak_sent, self._unacked, self._va, len(self._parts)

    def address(self, pkt: Packet) -> int | None:
        """The VA ``pkt``'s payload goes to if it is the next packet (in order and in its message's
        sequence): a FIRST or ONLY packet's RETH VA, else the open message's VA plus the bytes it took.
        None for any other packet. Changes nothing: a receiver asks it before :meth:`take`."""
        if psn_diff(pkt.psn, self.expected) or (pkt.opcode in _FIRST) != (self._va is None):
            return None
        return pkt.va if self._va is None else self._va

    def refuse(self, pkt: Packet) -> list[Ack]:
        """The RNR NAK of the next packet (one :meth:`address` places) that the receiver cannot take yet: it
        changes nothing, so every copy of that PSN gets one until the receiver takes it. ValueError for any
        other packet (take() has a rule for it)."""
        if self.address(pkt) is None:
            raise ValueError(f"PSN {pkt.psn} is not the next packet (expected {self.expected}): nothing to refuse")
        self.stats["rnr_nak"] += 1
        return [Ack(self.expected, Syndrome.RNR_NAK | self.rnr_timer, self.msn)]

    def take(self, pkt: Packet) -> tuple[Segment | None, list[Ack]]:
        """Handle one request packet: the :class:`Segment` it places (in order only) and the ACK/NAK to send."""
        d = psn_diff(pkt.psn, self.expected)
        if d < 0:
            # A duplicate: its ACK was lost or is late. ACK the newest PSN taken, so the requester moves on.
            self.stats["duplicate"] += 1
            return None, [self._ack(psn_add(self.expected, -1))]
        if d > 0:
            self.stats["ahead"] += 1
            if self._nak_sent:
                return None, []
            self._nak_sent = True
            self.stats["nak"] += 1
            return None, [Ack(self.expected, Syndrome.NAK_SEQ, self.msn)]
        va = self.address(pkt)
        if va is None:
            self.stats["bad_sequence"] += 1  # a FIRST/ONLY inside a message, or a MIDDLE/LAST outside one
            return None, [Ack(self.expected, Syndrome.NAK_INVALID, self.msn)]
        self._nak_sent = False
        self.expected = psn_add(self.expected, 1)
        last = pkt.opcode in _LAST
        self._va = None if last else va + len(pkt.payload)
        if last:
            self.msn = (self.msn + 1) % PSN_MOD
            self.stats["messages"] += 1
        self._unacked += 1
        seg = Segment(va, pkt.payload, pkt.opcode in _FIRST, last, pkt.imm)
        if pkt.ackreq or self._unacked >= self.ack_every:
            return seg, [self._ack(pkt.psn)]
        return seg, []

    def receive(self, pkt: Packet) -> tuple[list[Message], list[Ack]]:
        """Handle one request packet; a LAST or ONLY packet delivers its whole message."""
        seg, acks = self.take(pkt)
        if seg is None:
            return [], acks
        if seg.first:
            self._msg_va, self._parts = seg.va, []
        self._parts.append(seg.payload)
        if not seg.last:
            return [], acks
        payload, self._parts = b"".join(self._parts), []
        return [Message(self._msg_va, payload, seg.imm)], acks

    def _ack(self, psn: int) -> Ack:
        self._unacked = 0
        self.stats["ack"] += 1
        return Ack(psn, Syndrome.ACK, self.msn)


# -- frames -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Address:
    """Both ends of one QP's frames: MACs and IPs (raw bytes, :func:`wire.mac_bytes`), the UDP source port,
    the destination QPN, the R_Key a request's RETH carries and the P_Key."""

    eth_dst: bytes
    eth_src: bytes
    ip_src: bytes
    ip_dst: bytes
    udp_sport: int
    dest_qpn: int
    rkey: int = 0
    pkey: int = DEFAULT_PKEY


def encode(item: Packet | Ack, to: Address) -> bytes:
    """The RoCEv2 frame of a :class:`Packet` or :class:`Ack`, ICRC included, laid out by ``frame.layout``."""
    if isinstance(item, Ack):
        opcode, psn, ackreq, payload = Opcode.RC_ACK, item.psn, 0, b""
        values = {"aeth": {"syndrome": item.syndrome, "msn": item.msn}}
    else:
        opcode, psn, ackreq, payload = item.opcode, item.psn, int(item.ackreq), item.payload
        values = {"reth": {"va": item.va, "rkey": to.rkey, "dma_len": item.length}, "immdt": {"imm": item.imm}}
    ext = b"".join(h.pack(**values[h.name]) for h in _HEADERS[opcode])
    bth = BTH.pack(opcode=opcode, pkey=to.pkey, dqpn=to.dest_qpn, ackreq=ackreq, psn=psn)
    return wire.encapsulate(bth + ext + payload, eth_dst=to.eth_dst, eth_src=to.eth_src, ip_src=to.ip_src,
                            ip_dst=to.ip_dst, udp_sport=to.udp_sport)


def decode(frame: bytes, pkey: int = DEFAULT_PKEY) -> tuple[int, Packet | Ack] | Counter:
    """``(destination QPN, packet or ACK)`` of an RC frame, or the counter of the first failed check.

    The checks of ``docs/protocol.md`` section 5 up to the opcode (via
    :func:`wire.check_datagram` and the ICRC), then the layout of the
    opcode: a frame too short for its extension headers, or with a RETH
    on a MIDDLE/LAST, is ``DROP_BAD_LENGTH``; an opcode that is not an RC
    WRITE or ACK is ``DROP_BAD_OPCODE``.
    """
    total = wire.check_datagram(frame)
    if isinstance(total, Counter):
        return total
    end = ETH_LEN + total
    if not _icrc.matches(frame, end):
        return Counter.DROP_BAD_ICRC
    off = ETH_LEN + IPV4_LEN + UDP.size
    bth = BTH.unpack(frame, off)
    if bth["tver"] != BTH["tver"].value or bth["pkey"] != pkey:
        return Counter.DROP_BAD_HEADER
    op = _RC_OPCODES.get(bth["opcode"])
    if op is None:
        return Counter.DROP_BAD_OPCODE
    off += BTH.size
    fields: dict[str, int] = {}
    for h in _HEADERS[op]:
        if off + h.size > end - ICRC_LEN:
            return Counter.DROP_BAD_LENGTH
        fields.update(h.unpack(frame, off))
        off += h.size
    payload = frame[off:end - ICRC_LEN - bth["pad"]]
    if op == Opcode.RC_ACK:
        if payload:
            return Counter.DROP_BAD_LENGTH
        return bth["dqpn"], Ack(bth["psn"], fields["syndrome"], fields["msn"])
    if len(payload) % 4:
        return Counter.DROP_BAD_LENGTH
    head = op in _FIRST
    return bth["dqpn"], Packet(op, bth["psn"], bytes(payload), bool(bth["ackreq"]),
                               fields["va"] if head else None, fields["dma_len"] if head else None,
                               fields.get("imm"))


_HEADERS = {**_frame.OPCODE_HEADERS, **_frame.SEGMENT_HEADERS}
_RC_OPCODES = {int(op): op for op in _FIRST | _LAST | {SegmentOpcode.RC_RDMA_WRITE_MIDDLE, Opcode.RC_ACK}}
