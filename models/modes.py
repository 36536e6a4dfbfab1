"""EPIC's Modes II (translated) and III (augmented) in the model switch, for a job on one switch.

Hosts keep RC queue pairs (:mod:`inagg.models.rc`) end to end. The
:class:`~inagg.models.switch.ModelSwitch` hands every frame addressed to a
job of these modes to that job's :class:`TranslatedJob` or
:class:`AugmentedJob`; UC jobs never reach this module.
``docs/protocol.md`` sections 6.2 (Mode II) and 7 (Mode III) are the
specification; each rule below names its step there.

A job of ``slots = 2W`` slots keeps here, beside the lanes of its slots,
per worker the expected contribution PSN and per slot the bitmap of the
workers in. The switch is the root: it makes the result, and sends it to
each worker as an RC WRITE ONLY WITH IMMEDIATE whose PSN is the
contributions' PSN, so that every host's RC responder sees one result per
contribution, in order. Every worker's first contribution has PSN 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inagg.models import arith, wire
from inagg.models.frame import AETH, Opcode, layout
from inagg.models.job import JobSpec, Mode
from inagg.models.protocol import CHUNK_MOD, Counter, encode_imm, qp_udp_sport
from inagg.models.rc import PSN_MOD, Ack, Address, Packet, Syndrome, encode, psn_add, psn_diff

__all__ = ["MODES", "HOP_TIMEOUT", "RC_CONTRIBUTION", "Entry", "TranslatedJob", "AugmentedJob", "open_job"]

MODES = (Mode.UC, Mode.TRANSLATED, Mode.AUGMENTED)
"""The modes :class:`~inagg.models.switch.ModelSwitch` implements."""
HOP_TIMEOUT = 100e-6
"""Mode III's default ACK timeout of a result on the hop (the switch's clock, seconds)."""
RC_CONTRIBUTION = layout(Opcode.RC_RDMA_WRITE_ONLY)
"""A contribution of Modes II and III: RC RDMA WRITE ONLY, one chunk."""


@dataclass
class Entry:
    """One slot of a Mode II/III job: a chunk's lanes while it aggregates, then its result."""

    lanes: arith.LaneState
    chunk: int = 0
    psn: int = 0
    bitmap: int = 0      # workers whose contribution is in; empty: the slot is free
    count: int = 0
    done: bool = False
    acked: int = 0       # Mode III: workers that ACKed the result

    def copy(self) -> "Entry":
        return Entry(self.lanes.copy(), self.chunk, self.psn, self.bitmap, self.count, self.done, self.acked)


class TranslatedJob:
    """Mode II, connection translated (``docs/protocol.md`` section 6.2).

    ``switch`` is the :class:`~inagg.models.switch.ModelSwitch` that holds
    the job: its spec, counters and lane arithmetic.
    """

    mode = Mode.TRANSLATED

    def __init__(self, switch, spec: JobSpec):
        self.switch, self.spec = switch, spec
        n = len(spec.workers)
        self.all = (1 << n) - 1
        self.expected = [0] * n
        self.entries = [Entry(arith.LaneState(switch.spec.lanes)) for _ in range(spec.slots)]
        mac, ip = wire.mac_bytes(switch.spec.mac), wire.ip_bytes(switch.spec.ip)
        self.to = [Address(eth_dst=wire.mac_bytes(w.mac), eth_src=mac, ip_src=ip, ip_dst=wire.ip_bytes(w.ip),
                           udp_sport=qp_udp_sport(w.qpn), dest_qpn=w.qpn, rkey=w.rkey, pkey=switch.spec.pkey)
                   for w in spec.workers]

    @property
    def deadline(self) -> float | None:
        """None: Mode II keeps no timer (the hosts' RC requesters do)."""
        return None

    def on_timer(self, now: float) -> list[tuple[int, bytes]]:
        """Nothing: Mode II keeps no timer."""
        return []

    def fork(self, switch) -> "TranslatedJob":
        """An independent copy of the job's state, held by ``switch`` (the model checker branches with it)."""
        t = object.__new__(type(self))
        t.__dict__.update(self.__dict__)
        t.switch, t.expected, t.entries = switch, list(self.expected), [e.copy() for e in self.entries]
        return t

    def state(self) -> tuple:
        """A hashable summary of the job's protocol state."""
        return (tuple(self.expected), tuple((e.chunk, e.psn, e.bitmap, e.count, e.done, e.acked,
                                             e.lanes.words.tobytes()) for e in self.entries))

    # -- frames in -------------------------------------------------------

    def receive(self, worker: int, r: wire.RoceFrame) -> list[tuple[int, bytes]]:
        """One checked frame (``wire.parse``) addressed to ``worker``'s switch QPN."""
        count = self.switch.counters
        if r.opcode == Opcode.RC_ACK:
            if len(r.payload) != AETH.size:
                count[Counter.DROP_BAD_LENGTH] += 1
                return []
            a = AETH.unpack(r.payload)
            return self._result_ack(worker, Ack(r.psn, a["syndrome"], a["msn"]))
        c = self.switch.spec.chunk_bytes
        bad = wire.check_receiver(r, RC_CONTRIBUTION, c, qpn_ok=True, rkey_ok=r.rkey == self.spec.rkey,
                                  va_ok=r.va is not None and r.va % c == 0 and r.va // c < CHUNK_MOD)
        if bad is not None:
            count[bad] += 1
            return []
        return self._contribution(worker, r.psn, r.va // c, r.payload)

    def _contribution(self, w: int, psn: int, chunk: int, payload: bytes) -> list[tuple[int, bytes]]:
        count = self.switch.counters
        d = psn_diff(psn, self.expected[w])
        e = self.entries[psn % len(self.entries)]
        if d > 0:
            count[Counter.DROP_PSN_AHEAD] += 1
            return self._ahead(w)
        if d < 0:
            return self._behind(w, psn, chunk, e)
        if e.bitmap and e.psn != psn:
            return self._busy(e)
        if e.bitmap and e.chunk != chunk:
            count[Counter.DROP_BAD_ADDRESS] += 1  # the hosts disagree on which chunk this PSN carries
            return []
        if not e.bitmap:
            e.chunk, e.psn, e.count, e.done, e.acked = chunk, psn, 0, False, 0
        self.expected[w] = psn_add(psn, 1)
        out = self._in_order(w, psn)
        self.switch._accumulate(e.lanes, np.frombuffer(payload, ">i4").astype(np.int32), first=e.count == 0)
        e.bitmap |= 1 << w
        e.count += 1
        count[Counter.RX_CONTRIB] += 1
        if e.count < len(self.spec.workers):
            return out
        e.done = True
        count[Counter.COMPLETED] += 1
        if any(self.switch._lanes_out(e.lanes)[1:]):
            count[Counter.PROMOTED] += 1
        return out + self._completed(e)

    # -- the rules that differ between the modes ----------------------------

    def _ahead(self, w: int) -> list[tuple[int, bytes]]:
        """Mode II step 3: a PSN ahead is dropped; the host's Go-Back-N sends the gap again."""
        return []

    def _behind(self, w: int, psn: int, chunk: int, e: Entry) -> list[tuple[int, bytes]]:
        """Mode II step 4: the root sends the result again to this worker, when the slot still holds it."""
        count = self.switch.counters
        if e.psn != psn or e.chunk != chunk or not e.bitmap >> w & 1 and not e.done:
            count[Counter.DROP_STALE] += 1
            return []
        count[Counter.DUP_CONTRIB] += 1
        if not e.done:
            return []  # the result goes to every worker when the slot completes
        count[Counter.TX_RESENDS] += 1
        return [self._result(w, e)]

    def _busy(self, e: Entry) -> list[tuple[int, bytes]]:
        # Mode II: the window keeps an in-order PSN off a slot that is not empty (section 6.2,
        # "Why a slot is empty"), so only a host that breaks the rules gets here.
        self.switch.counters[Counter.DROP_WINDOW] += 1
        return []

    def _in_order(self, w: int, psn: int) -> list[tuple[int, bytes]]:
        """Mode II step 2: wipe this worker's bit in the shadow slot, W PSNs ahead."""
        shadow = self.entries[(psn + len(self.entries) // 2) % len(self.entries)]
        shadow.bitmap &= ~(1 << w)
        return []

    def _completed(self, e: Entry) -> list[tuple[int, bytes]]:
        return [self._result(v, e) for v in range(len(self.spec.workers))]

    def _result_ack(self, w: int, ack: Ack) -> list[tuple[int, bytes]]:
        """Mode II step 5: the host's ACK (or NAK) of a result goes back to it as the ACK of its contribution."""
        self.switch.counters[Counter.ACK_REFLECTED] += 1
        return [(self.spec.workers[w].port, encode(ack, self.to[w]))]

    # -- frames out --------------------------------------------------------

    def _result(self, w: int, e: Entry) -> tuple[int, bytes]:
        ws = self.spec.workers[w]
        payload, fp32, saturated = self.switch._lanes_out(e.lanes)
        c = self.switch.spec.chunk_bytes
        self.switch.counters[Counter.TX_RESULTS] += 1
        pkt = Packet(Opcode.RC_RDMA_WRITE_ONLY_IMM, e.psn, payload, True,
                     ws.result_va + (e.chunk & (self.spec.slots - 1)) * c, c, encode_imm(e.chunk, fp32, saturated))
        return ws.port, encode(pkt, self.to[w])



class AugmentedJob(TranslatedJob):
    """Mode III, connection augmented (``docs/protocol.md`` section 7): Mode II plus reliability on the hop.

    Upward the switch is each worker's RC responder (it ACKs, re-ACKs and
    NAKs contributions itself); downward it is each worker's requester for
    results: a slot's result stays until every worker ACKed it, and is
    sent again after a worker's NAK or when the worker's ACK timer
    (``timeout``, on the switch's clock) runs out.

    ``free_on_first_ack`` is a test-only mutation: it frees a slot as soon
    as one worker ACKed its result, the buffer-recycling bug EPIC's model
    check found; :mod:`inagg.host.checker` must find it.
    """

    mode = Mode.AUGMENTED
    free_on_first_ack = False

    def __init__(self, switch, spec: JobSpec, timeout: float = HOP_TIMEOUT):
        super().__init__(switch, spec)
        n = len(spec.workers)
        self.timeout = timeout
        self.nak_sent = [False] * n
        self.next_result = 0          # PSN of the next result to complete (results complete in PSN order)
        self.acked = [0] * n          # per worker: the oldest result PSN it has not ACKed
        self.timers: list[float | None] = [None] * n

    def fork(self, switch) -> "AugmentedJob":
        t = super().fork(switch)
        t.nak_sent, t.acked, t.timers = list(self.nak_sent), list(self.acked), list(self.timers)
        return t

    def state(self) -> tuple:
        now = self.switch.now
        return super().state() + (tuple(self.nak_sent), self.next_result, tuple(self.acked),
                                  tuple(None if t is None else t - now for t in self.timers))

    @property
    def deadline(self) -> float | None:
        """The earliest worker's result timer, or None."""
        armed = [t for t in self.timers if t is not None]
        return min(armed) if armed else None

    def on_timer(self, now: float) -> list[tuple[int, bytes]]:
        """Go-Back-N of the results of every worker whose timer ran out at ``now``."""
        out = []
        for w, t in enumerate(self.timers):
            if t is not None and t <= now:
                out += self._resend(w, self.acked[w])
        return out

    # -- upward: the switch is the RC responder --------------------------------

    def _ahead(self, w: int) -> list[tuple[int, bytes]]:
        """Mode III step 3: one NAK sequence error per gap ("NAK sent" per worker)."""
        if self.nak_sent[w]:
            return []
        self.nak_sent[w] = True
        self.switch.counters[Counter.NAK_SENT] += 1
        return [self._ack(w, self.expected[w], Syndrome.NAK_SEQ)]

    def _behind(self, w: int, psn: int, chunk: int, e: Entry) -> list[tuple[int, bytes]]:
        """Mode III step 4: a duplicate is ACKed again (the newest PSN taken), never added."""
        self.switch.counters[Counter.DUP_CONTRIB] += 1
        self.switch.counters[Counter.ACK_SENT] += 1
        return [self._ack(w, psn_add(self.expected[w], -1))]

    def _busy(self, e: Entry) -> list[tuple[int, bytes]]:
        # Not ACKed: the host sends it again on its timer, after the slowest worker ACKed the old result.
        self.switch.counters[Counter.DROP_BUFFER_BUSY] += 1
        return []

    def _in_order(self, w: int, psn: int) -> list[tuple[int, bytes]]:
        """Mode III step 2: ACK at once; the gap, if any, is closed."""
        self.nak_sent[w] = False
        self.switch.counters[Counter.ACK_SENT] += 1
        return [self._ack(w, psn)]

    def _ack(self, w: int, psn: int, syndrome: int = Syndrome.ACK) -> tuple[int, bytes]:
        # The MSN counts the worker's messages taken: every contribution is one message.
        return self.spec.workers[w].port, encode(Ack(psn, syndrome, self.expected[w]), self.to[w])

    # -- downward: the switch is the RC requester of results ---------------------

    def _completed(self, e: Entry) -> list[tuple[int, bytes]]:
        self.next_result = psn_add(e.psn, 1)
        due = self.switch.now + self.timeout
        self.timers = [due if t is None else t for t in self.timers]
        return super()._completed(e)

    def _result_ack(self, w: int, ack: Ack) -> list[tuple[int, bytes]]:
        """Mode III step 5: a worker's ACK frees what every worker has ACKed; a NAK sends again from its PSN."""
        upto = ack.psn if not ack.nak else psn_add(ack.psn, -1)
        if psn_diff(upto, self.acked[w]) >= 0 and psn_diff(upto, self.next_result) < 0:
            bit = 1 << w
            psn = self.acked[w]
            while psn_diff(psn, upto) <= 0:
                e = self.entries[psn % len(self.entries)]
                e.acked |= bit
                if e.acked == self.all or self.free_on_first_ack:
                    e.bitmap = 0  # the slowest worker has it: the slot is free
                psn = psn_add(psn, 1)
            self.acked[w] = psn
            self.timers[w] = None if psn == self.next_result else self.switch.now + self.timeout
        if ack.nak and ack.syndrome == Syndrome.NAK_SEQ and psn_diff(ack.psn, self.acked[w]) == 0:
            return self._resend(w, ack.psn)
        return []

    def _resend(self, w: int, psn: int) -> list[tuple[int, bytes]]:
        out = []
        while psn_diff(psn, self.next_result) < 0:
            e = self.entries[psn % len(self.entries)]
            if e.psn != psn or not e.done:
                break  # freed early (the test-only mutation): the result is gone
            out.append(self._result(w, e))
            psn = psn_add(psn, 1)
        self.switch.counters[Counter.HOP_RESENDS] += len(out)
        self.timers[w] = self.switch.now + self.timeout if out else None
        return out


def open_job(switch, spec: JobSpec, *, hop_timeout: float = HOP_TIMEOUT) -> TranslatedJob:
    """The state of a Mode II or Mode III job on ``switch``."""
    if spec.slots > PSN_MOD:
        # PSN mod 2W names a slot only while 2W divides the PSN space, across a wrap too.
        raise ValueError(f"job {spec.job}: a Mode II/III job has at most 2**24 slots, not {spec.slots}")
    if spec.mode is Mode.TRANSLATED:
        return TranslatedJob(switch, spec)
    if spec.mode is Mode.AUGMENTED:
        return AugmentedJob(switch, spec, hop_timeout)
    raise ValueError(f"job {spec.job}: mode {spec.mode.name} is not one of this module's (TRANSLATED, AUGMENTED)")

