"""EPIC's Mode I (connection terminated) in the model switch, for every collective on one switch or a tree.

The switch is the RC endpoint of every host: each host's QP ends at the
switch, whose responder takes the host's contributions and whose requester
sends it the results, with :mod:`inagg.models.rc`'s endpoint on both
sides (the same one the hosts run). The
:class:`~inagg.models.switch.ModelSwitch` hands every frame addressed to a
Mode I job's switch QPN to its :class:`TerminatedJob`.
``docs/protocol.md`` section 6.4 is the specification; each rule below
names its step there.

What the job keeps (section 9): its ``slots`` slots, each one chunk's
lanes (then its result), the chunk, the bitmap of workers in and a done
flag; the ring of slots whose result is out, in posting order, and how
many of them every receiver ACKed; per host QP the responder's state
(expected PSN, MSN, "NAK sent", the open message's next VA) and the
requester's (next PSN, oldest unACKed PSN, results ACKed, retry count,
timer, and the headers of the results not yet ACKed: a result's lanes
stay in its slot, read again for every retransmission, so the slot is
their only copy).

On a tree (``docs/protocol.md`` section 10.2) a switch below the root is
also an RC endpoint towards its parent, as a host is: the requester of its
partials (one QP, its own PSN space from 0) and the responder of the
results the parent sends it; a result it takes is posted to every child's
requester as the root posts its own.

The job's collective says which children send lanes up and which get
results down (:func:`inagg.models.modes.flow`, ``docs/protocol.md``
section 11.1): a slot completes when every sender is in, its result goes to
the receivers' requesters only, and it is freed when every receiver ACKed
it; a switch whose children get no result (Reduce, off the root rank's
side) frees it when the parent ACKed its partial, and one whose children
send nothing (Broadcast, off that side) takes the parent's result into a
free slot.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass

from inagg.models import arith, rc, wire
from inagg.models.frame import RETH, Opcode, SegmentOpcode
from inagg.models.job import JobSpec, Mode
from inagg.models.modes import RC_RESULT, ack_of, flow, no_data, worker_addresses
from inagg.models.protocol import CHUNK_MOD, IMM_CHUNK_MASK, Counter, encode_imm, qp_udp_sport
from inagg.models.tree import TreeCounter

__all__ = ["MODES", "RESULT_RETRIES", "Slot", "TerminatedJob", "open_job"]

MODES = (Mode.TERMINATED,)
"""The modes this module implements."""
RESULT_RETRIES = 7
"""Retransmissions of a result QP without progress before it fails (IBTA's largest retry count)."""

_REQUESTS = frozenset({SegmentOpcode.RC_RDMA_WRITE_FIRST, SegmentOpcode.RC_RDMA_WRITE_MIDDLE,
                       SegmentOpcode.RC_RDMA_WRITE_LAST, Opcode.RC_RDMA_WRITE_ONLY})
_HEADS = frozenset({SegmentOpcode.RC_RDMA_WRITE_FIRST, Opcode.RC_RDMA_WRITE_ONLY})


@dataclass
class Slot:
    """One slot of a Mode I job: a chunk's lanes while it aggregates, then its result until every host ACKed it."""

    lanes: arith.LaneState
    chunk: int = 0
    bitmap: int = 0      # workers whose contribution is in
    count: int = 0
    done: bool = False   # the result is out; the slot is free again when every receiver ACKed it
    # Below a tree's root, every sender in and not done: the partial is up, the slot waits for the result (or,
    # when no child gets one, for the parent's ACK of the partial).

    @property
    def free(self) -> bool:
        return not self.bitmap and not self.done

    def copy(self) -> "Slot":
        return Slot(self.lanes.copy(), self.chunk, self.bitmap, self.count, self.done)


class TerminatedJob:
    """Mode I, connection terminated (``docs/protocol.md`` section 6.4), for ``spec`` on ``switch``.

    ``switch`` is the :class:`~inagg.models.switch.ModelSwitch` that holds
    the job (its counters, clock ``now`` and lane arithmetic). ``timeout``
    is the ACK timeout of the switch's result requesters and ``retries``
    their retry count.

    ``free_on_first_ack`` is a test-only mutation: it frees a slot as soon
    as one receiver ACKed its result, the buffer-recycling bug of section 7;
    :mod:`inagg.host.checker` and :mod:`inagg.host.tree_checker` must find it.
    """

    mode = Mode.TERMINATED
    free_on_first_ack = False

    def __init__(self, switch, spec: JobSpec, timeout: float, retries: int = RESULT_RETRIES):
        self.switch, self.spec = switch, spec
        n = len(spec.workers)
        c = switch.spec.chunk_bytes
        self.senders, self.receivers = flow(spec)
        self.need = self.senders.bit_count()  # contributions that complete a slot
        self.slots = [Slot(arith.LaneState(switch.spec.lanes)) for _ in range(spec.slots)]
        self.responders = [rc.Responder() for _ in range(n)]
        # A result QP holds at most one result per slot, so a window of every slot never holds one back.
        self.requesters: list[rc.Requester | None] = [
            rc.Requester(window=spec.slots, mtu=c, timeout=timeout, retries=retries) for _ in range(n)]
        # Slots whose result is out and not ACKed by every receiver (or, when no child gets results, whose partial
        # the parent has not ACKed), in posting order; and how many of them were freed.
        self.order: deque[int] = deque()
        self.released = 0
        self.to = worker_addresses(switch.spec, spec)
        # Below a tree's root: the QP to the parent, requester of the partials and responder of the results.
        up = spec.parent
        self.up = None if up is None else rc.Address(
            eth_dst=wire.mac_bytes(up.mac), eth_src=wire.mac_bytes(switch.spec.mac),
            ip_src=wire.ip_bytes(switch.spec.ip), ip_dst=wire.ip_bytes(up.ip), udp_sport=qp_udp_sport(up.result_qpn),
            dest_qpn=up.qpn, rkey=up.rkey, pkey=switch.spec.pkey)
        self.up_requester: rc.Requester | None = None if up is None else rc.Requester(
            window=spec.slots, mtu=switch.partial_bytes, timeout=timeout, retries=retries)
        self.up_responder = None if up is None else rc.Responder()

    def fork(self, switch) -> "TerminatedJob":
        """An independent copy of the job's state, held by ``switch`` (the model checker branches with it)."""
        t = object.__new__(type(self))
        t.__dict__.update(self.__dict__)
        t.switch, t.slots, t.order = switch, [s.copy() for s in self.slots], deque(self.order)
        t.responders = [r.copy() for r in self.responders]
        t.requesters = [None if q is None else q.copy() for q in self.requesters]
        t.up_requester = None if self.up_requester is None else self.up_requester.copy()
        t.up_responder = None if self.up_responder is None else self.up_responder.copy()
        return t

    def state(self) -> tuple:
        """A hashable summary of the job's protocol state, timers relative to the switch's clock."""
        now = self.switch.now
        return (tuple((s.chunk, s.bitmap, s.count, s.done, s.lanes.words.tobytes(),
                       s.lanes.promoted.tobytes()) for s in self.slots),
                tuple(self.order), self.released, tuple(r.state() for r in self.responders),
                tuple(None if q is None else q.state(now) for q in self.requesters),
                None if self.up_requester is None else self.up_requester.state(now),
                None if self.up_responder is None else self.up_responder.state())

    # -- the clock of the result requesters ------------------------------------

    @property
    def deadline(self) -> float | None:
        """The earliest ACK timer of a result QP (or of the partials' QP to the parent), or None."""
        armed = [d for q in (*self.requesters, self.up_requester) if q is not None and (d := q.deadline) is not None]
        return min(armed) if armed else None

    def on_timer(self, now: float) -> list[tuple[int, bytes]]:
        """Step 6: Go-Back-N on every result QP (and the partials' QP) whose ACK timer ran out by ``now``."""
        out = []
        for w, q in enumerate(self.requesters):
            if q is not None and q.deadline is not None and q.deadline <= now:
                out += self._requester(w, lambda q: q.on_timer(now))
        q = self.up_requester
        if q is not None and q.deadline is not None and q.deadline <= now:
            out += self._uplink(lambda q: q.on_timer(now))
        return out

    # -- frames in -------------------------------------------------------------

    def receive(self, worker: int, r: wire.RoceFrame) -> list[tuple[int, bytes]]:
        """One checked frame (``wire.parse``) addressed to ``worker``'s switch QPN."""
        count = self.switch.counters
        if self.requesters[worker] is None:
            count[Counter.DROP_QP_ERROR] += 1  # step 7: the QP is in the error state
            return []
        if no_data(self, worker, r):
            return []
        if r.opcode == Opcode.RC_ACK:
            ack = ack_of(r, count)
            return [] if ack is None else self._requester(worker, lambda q: q.receive(self.switch.now, ack))
        pkt = self._request(worker, r)
        if isinstance(pkt, Counter):
            count[pkt] += 1
            return []
        return self._contribution(worker, pkt)

    def _request(self, worker: int, r: wire.RoceFrame) -> rc.Packet | Counter:
        """Step 1: the RC packet of a contribution frame, or the counter of its first failed check.

        ``wire.parse`` reads the RETH of single-packet opcodes only: a WRITE
        FIRST's RETH is still at the head of its payload. A child switch's
        partial with promoted lanes is a WRITE ONLY WITH IMMEDIATE (section 10.2)."""
        c = self.switch.spec.chunk_bytes
        if r.opcode == Opcode.RC_RDMA_WRITE_ONLY_IMM and worker in self.spec.subswitches:
            bad = wire.check_receiver(r, RC_RESULT, self.switch.partial_bytes, qpn_ok=True,
                                      rkey_ok=r.rkey == self.spec.rkey,
                                      va_ok=r.va is not None and r.va % c == 0 and r.va // c < CHUNK_MOD
                                      and r.imm == encode_imm(r.va // c, True))
            return bad if bad is not None else rc.Packet(Opcode.RC_RDMA_WRITE_ONLY_IMM, r.psn, r.payload, r.ackreq,
                                                         r.va, r.dma_len, r.imm)
        if r.opcode not in _REQUESTS:
            return Counter.DROP_BAD_OPCODE
        op = Opcode(r.opcode) if r.opcode == Opcode.RC_RDMA_WRITE_ONLY else SegmentOpcode(r.opcode)
        payload, va, rkey, length = r.payload, r.va, r.rkey, r.dma_len
        if op is SegmentOpcode.RC_RDMA_WRITE_FIRST:
            if len(payload) < RETH.size:
                return Counter.DROP_BAD_LENGTH
            reth = RETH.unpack(payload)
            payload, va, rkey, length = payload[RETH.size:], reth["va"], reth["rkey"], reth["dma_len"]
        # Every packet carries one whole chunk: a message of n packets is n chunks from its VA on.
        if len(payload) != c or r.pad:
            return Counter.DROP_BAD_LENGTH
        if op in _HEADS:
            if length % c or length < c or (op is Opcode.RC_RDMA_WRITE_ONLY) != (length == c):
                return Counter.DROP_BAD_LENGTH
            if rkey != self.spec.rkey:
                return Counter.DROP_BAD_RKEY
            if va % c or va // c + length // c > CHUNK_MOD:
                return Counter.DROP_BAD_ADDRESS
        return rc.Packet(op, r.psn, payload, r.ackreq, va if op in _HEADS else None,
                         length if op in _HEADS else None)

    # -- upward: the switch is the RC responder of contributions ---------------

    def _contribution(self, w: int, pkt: rc.Packet) -> list[tuple[int, bytes]]:
        """Steps 2-4: in order (aggregated, ACKed), ahead (one NAK per gap), behind (re-ACKed)."""
        count = self.switch.counters
        resp = self.responders[w]
        d = rc.psn_diff(pkt.psn, resp.expected)
        va = resp.address(pkt)
        if va is not None:
            chunk = va // self.switch.spec.chunk_bytes
            slot = self.slots[chunk % len(self.slots)]
            if not slot.free and slot.chunk != chunk:
                # Not taken: an RNR NAK tells the sender (a host, or a child switch's partials off a Reduce's
                # root rank side) to wait and send it again, spending no retry, until every receiver ACKed
                # the slot's result.
                count[Counter.DROP_BUFFER_BUSY] += 1
                return self._refuse(resp, pkt, self.spec.workers[w].port, self.to[w])
        seg, acks = resp.take(pkt)
        if d > 0:
            count[Counter.DROP_PSN_AHEAD] += 1
        elif d < 0:
            count[Counter.DUP_CONTRIB] += 1
        elif seg is None:
            count[Counter.DROP_BAD_OPCODE] += 1  # out of its message's sequence: NAK invalid request
        for a in acks:
            if a.syndrome != rc.Syndrome.NAK_INVALID:
                count[Counter.NAK_SENT if a.nak else Counter.ACK_SENT] += 1
        out = [(self.spec.workers[w].port, rc.encode(a, self.to[w])) for a in acks]
        if seg is not None:
            out += self._add(w, chunk, slot, seg.payload, pkt.opcode == Opcode.RC_RDMA_WRITE_ONLY_IMM)
        return out

    def _add(self, w: int, chunk: int, slot: Slot, payload: bytes, promoted: bool = False) -> list[tuple[int, bytes]]:
        """Step 2: add one packet's lanes (a child switch's partial with ``promoted`` lanes: section 10's
        merge); a complete slot posts its result to every host's requester, or below the root its partial
        to the parent."""
        count = self.switch.counters
        if slot.free:
            slot.chunk, slot.count = chunk, 0
        elif slot.bitmap >> w & 1 or slot.done:
            # The host sent this chunk again as a new message: RC took it, aggregation must not.
            count[Counter.DUP_CONTRIB] += 1
            return []
        self.switch._add(slot.lanes, payload, promoted, first=slot.count == 0)
        slot.bitmap |= 1 << w
        slot.count += 1
        count[Counter.RX_CONTRIB] += 1
        if slot.count < self.need:
            return []
        if self.up is not None:
            self.switch.tree_counters[TreeCounter.UP_PARTIALS] += 1
            if not self.receivers:
                self.order.append(chunk % len(self.slots))  # freed by the parent's ACK: no result comes back
            # A promoted partial is one WRITE ONLY WITH IMMEDIATE (section 10). Its header goes to the
            # requester; _send_up reads the lanes from the slot for every transmission.
            imm = encode_imm(chunk, True) if slot.lanes.promoted.any() else None
            return self._uplink(lambda q: q.post(self.switch.now, b"", chunk * self.switch.spec.chunk_bytes, imm))
        count[Counter.COMPLETED] += 1
        return self._post_result(chunk, slot)

    def _post_result(self, chunk: int, slot: Slot) -> list[tuple[int, bytes]]:
        """The result in ``slot`` (the root's, or the parent's below it) to every receiver's requester."""
        slot.done = True
        _, fp32, saturated = self.switch._lanes_out(slot.lanes)
        self.switch.counters[Counter.PROMOTED] += fp32 or saturated
        self.order.append(chunk % len(self.slots))
        c, imm = self.switch.spec.chunk_bytes, encode_imm(chunk, fp32, saturated)
        out = []
        for v, ws in enumerate(self.spec.workers):
            if not self.receivers >> v & 1:
                continue
            # Only the header goes to the requester (an empty payload): _send reads the lanes from the slot.
            va = ws.result_va + (chunk & (self.spec.slots - 1)) * c
            out += self._requester(v, lambda q: q.post(self.switch.now, b"", va, imm))
        return out

    # -- downward: the switch is the RC requester of results -------------------

    def _requester(self, w: int, call) -> list[tuple[int, bytes]]:
        """Run ``call`` on ``w``'s result requester (steps 5-7), send what it returns, free what every receiver
        ACKed."""
        q = self.requesters[w]
        if q is None:
            return []  # the QP is in error: its results are not sent any more
        resent, rnr = q.stats["resent"] + q.stats["rnr_resent"], q.stats["rnr_nak"]
        try:
            pkts = call(q)
        except rc.RcError:
            self.requesters[w] = None
            self.switch.counters[Counter.QP_ERRORS] += 1
            # A host in error no longer counts (step 5): the slots only its ACKs held are free now, not at
            # the next ACK from another host, which may never come while the others' chunks wait for them.
            self._release()
            return []
        n = q.stats["resent"] + q.stats["rnr_resent"] - resent
        self.switch.counters[Counter.HOP_RESENDS] += n
        self.switch.counters[Counter.RNR_NAK_RECEIVED] += q.stats["rnr_nak"] - rnr
        self.switch.resent[self.spec.workers[w].port, Counter.HOP_RESENDS] += n
        self._release()
        return [f for p in pkts if (f := self._send(w, p)) is not None]

    def _release(self) -> None:
        """Step 5: free the slots of the results every receiver ACKed (requesters complete in posting order); when
        no child gets results, of the partials the parent ACKed (section 11.1)."""
        holders = ([q for w, q in enumerate(self.requesters) if self.receivers >> w & 1] if self.receivers
                   else [self.up_requester])
        done = [q.completed for q in holders if q is not None]
        if not done:
            return
        upto = max(done) if self.free_on_first_ack else min(done)
        while self.order and self.released < upto:
            slot = self.slots[self.order.popleft()]
            slot.bitmap, slot.done = 0, False
            self.released += 1

    def holding(self, p: rc.Packet) -> Slot | None:
        """The slot that holds the lanes of result packet ``p`` (a requester's), or None when it holds them
        no more (only after the test-only mutation freed it early)."""
        chunk30 = p.imm & IMM_CHUNK_MASK
        slot = self.slots[chunk30 % len(self.slots)]
        return slot if slot.done and slot.chunk & IMM_CHUNK_MASK == chunk30 else None

    def _send(self, w: int, p: rc.Packet) -> tuple[int, bytes] | None:
        """The frame of result packet ``p`` to ``w``: its header from the requester, its lanes from the slot."""
        slot = self.holding(p)
        if slot is None:
            return None  # freed early (the test-only mutation): the result is gone
        payload = self.switch._lanes_out(slot.lanes)[0]
        self.switch.counters[Counter.TX_RESULTS] += 1
        return self.spec.workers[w].port, rc.encode(dataclasses.replace(p, payload=payload, length=len(payload)),
                                                    self.to[w])

    # -- below a tree's root: the switch is the parent's RC peer, as a host is ----------

    def from_parent(self, r: wire.RoceFrame) -> list[tuple[int, bytes]]:
        """A checked frame to the uplink's result QPN: the parent's ACK/NAK of partials, or a result."""
        count = self.switch.counters
        if self.up_requester is None:
            count[Counter.DROP_QP_ERROR] += 1  # the QP to the parent is in the error state
            return []
        if r.opcode == Opcode.RC_ACK:
            ack = ack_of(r, count)
            return [] if ack is None else self._uplink(lambda q: q.receive(self.switch.now, ack))
        up, c = self.spec.parent, self.switch.spec.chunk_bytes
        chunk30 = (r.imm or 0) & IMM_CHUNK_MASK
        bad = wire.check_receiver(r, RC_RESULT, c, qpn_ok=True, rkey_ok=r.rkey == up.result_rkey,
                                  va_ok=r.va == up.result_va + (chunk30 & (self.spec.slots - 1)) * c)
        if bad is not None:
            count[bad] += 1
            return []
        if not self.receivers:
            self.switch.tree_counters[TreeCounter.DROP_NO_DATA] += 1  # Reduce off the root rank's side
            return []
        pkt = rc.Packet(Opcode.RC_RDMA_WRITE_ONLY_IMM, r.psn, r.payload, r.ackreq, r.va, r.dma_len, r.imm)
        slot = self.slots[chunk30 % len(self.slots)]
        if rc.psn_diff(r.psn, self.up_responder.expected) == 0 and not self._ready(slot, chunk30):
            if not self.need:  # busy (Broadcast off the root rank's side): the parent waits and sends it again
                return self._refuse(self.up_responder, pkt, self.spec.parent.port, self.up)
            return []  # not taken, not ACKed: the parent sends it again
        seg, acks = self.up_responder.take(pkt)
        if seg is None:
            d = rc.psn_diff(r.psn, self.up_responder.expected)
            if d < 0:
                self.switch.tree_counters[TreeCounter.DUP_PARENT] += 1
            else:
                count[Counter.DROP_PSN_AHEAD] += 1
        for a in acks:
            count[Counter.NAK_SENT if a.nak else Counter.ACK_SENT] += 1
        out = [(self.spec.parent.port, rc.encode(a, self.up)) for a in acks]
        if seg is None:
            return out
        if self.need:
            # The parent made result j from every child's partial j: this switch's partial j is in, ACK or not.
            out += self._uplink(lambda q: q.receive(self.switch.now, rc.Ack(r.psn, rc.Syndrome.ACK, 0)))
        else:
            slot.chunk, slot.count = chunk30, 0
        self.switch._take_result(slot.lanes, r)
        self.switch.tree_counters[TreeCounter.RX_PARENT] += 1
        return out + self._post_result(slot.chunk, slot)

    def _refuse(self, resp: rc.Responder, pkt: rc.Packet, port: int, to: rc.Address) -> list[tuple[int, bytes]]:
        """The RNR NAK of an in-order packet whose slot is busy (section 6.4 step 2)."""
        self.switch.counters[Counter.RNR_NAK_SENT] += 1
        return [(port, rc.encode(a, to)) for a in resp.refuse(pkt)]

    def _ready(self, slot: Slot, chunk30: int) -> bool:
        """Whether ``slot`` may take the parent's in-order result for ``chunk30`` (else counted): it holds that
        chunk's completed partial (``DROP_PARENT_STALE``), or, when this switch's children send nothing
        (Broadcast off the root rank's side), it is free (``DROP_BUFFER_BUSY``)."""
        if not self.need:
            if slot.free:
                return True
            self.switch.counters[Counter.DROP_BUFFER_BUSY] += 1
            return False
        if slot.count == self.need and not slot.done and slot.chunk & IMM_CHUNK_MASK == chunk30:
            return True
        self.switch.tree_counters[TreeCounter.DROP_PARENT_STALE] += 1
        return False

    def _uplink(self, call) -> list[tuple[int, bytes]]:
        """Run ``call`` on the partials' requester, send what it returns; a QP error there is counted."""
        q = self.up_requester
        if q is None:
            return []
        resent, rnr = q.stats["resent"] + q.stats["rnr_resent"], q.stats["rnr_nak"]
        try:
            pkts = call(q)
        except rc.RcError:
            self.up_requester = None
            self.switch.counters[Counter.QP_ERRORS] += 1
            return []
        n = q.stats["resent"] + q.stats["rnr_resent"] - resent
        self.switch.counters[Counter.RNR_NAK_RECEIVED] += q.stats["rnr_nak"] - rnr
        self.switch.counters[Counter.HOP_RESENDS] += n
        self.switch.tree_counters[TreeCounter.UP_RESENDS] += n
        self.switch.resent[self.spec.parent.port, Counter.HOP_RESENDS] += n
        self._release()
        return [f for p in pkts if (f := self._send_up(p)) is not None]

    def _send_up(self, p: rc.Packet) -> tuple[int, bytes] | None:
        """The frame of partial packet ``p``: its header from the requester, its lanes from the slot, while the
        slot holds the partial (once the parent's result is in, the parent has the partial)."""
        chunk = p.va // self.switch.spec.chunk_bytes
        slot = self.slots[chunk % len(self.slots)]
        if slot.chunk != chunk or slot.done or slot.count < self.need:
            return None
        payload, _ = self.switch._partial(slot.lanes, chunk)
        return self.spec.parent.port, rc.encode(dataclasses.replace(p, payload=payload, length=len(payload)), self.up)


def open_job(switch, spec: JobSpec, *, hop_timeout: float) -> TerminatedJob:
    """The state of a Mode I job on ``switch``; ``hop_timeout`` is its result requesters' ACK timeout."""
    if spec.mode is not Mode.TERMINATED:
        raise ValueError(f"job {spec.job}: mode {spec.mode.name} is not Mode I (TERMINATED)")
    if spec.slots > rc.PSN_MOD:
        # The j-th result has PSN j mod 2**24 on every QP and the parent's: 2**24 slots at most.
        raise ValueError(f"job {spec.job}: a Mode I job has at most 2**24 slots, not {spec.slots}")
    return TerminatedJob(switch, spec, hop_timeout)
