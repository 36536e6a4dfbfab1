"""EPIC's Modes II (translated) and III (augmented) in the model switch, on one switch or a tree of them.

Hosts keep RC queue pairs (:mod:`inagg.models.rc`) end to end. The
:class:`~inagg.models.switch.ModelSwitch` hands every frame addressed to a
job of these modes to that job's :class:`TranslatedJob` or
:class:`AugmentedJob` (:meth:`~TranslatedJob.from_parent` for a frame from
the parent switch of a tree); UC jobs never reach this module.
``docs/protocol.md`` sections 6.2 (Mode II), 7 (Mode III) and 10.1 (both on
a tree) are the specification; each rule below names its step there.

A job of ``slots = 2W`` slots keeps here, beside the lanes of its slots,
per child the expected contribution PSN and per slot the bitmap of the
children in. The root makes the result, and sends it to each child as an
RC WRITE ONLY WITH IMMEDIATE whose PSN is the contributions' PSN, so that
every host's RC responder sees one result per contribution, in order. A
switch below the root (a job with a ``parent``) sends its completed
partial upward instead, as an RC contribution of its own with the same
PSN, and sends the result that comes back down to every child unchanged.
Every child's first contribution has PSN 0.

The job's collective (``docs/protocol.md`` section 11) says which children
send lanes up and which get results down (:func:`flow`): Reduce sends the
result towards the root rank only, and the root rank's ACK releases the
senders (Mode II: sent up to the top switch and from there to every child;
Mode III: every hop ACKs on its own). Broadcast takes lanes from the root
rank's side only and sends the result to every child; in Mode II each
switch sends the lowest ACK point of its children towards the root rank
(:class:`TranslatedBroadcast`), in Mode III every hop ACKs on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from inagg.models import arith, wire
from inagg.models.frame import AETH, Opcode, layout
from inagg.models.job import Collective, JobSpec, Mode, SwitchSpec
from inagg.models.protocol import CHUNK_MOD, IMM_CHUNK_MASK, Counter, encode_imm, qp_udp_sport
from inagg.models.rc import PSN_MOD, Ack, Address, Packet, Syndrome, encode, psn_add, psn_diff
from inagg.models.tree import TreeCounter

__all__ = ["MODES", "HOP_TIMEOUT", "worker_addresses", "ack_of", "RC_CONTRIBUTION", "RC_RESULT", "Entry", "flow",
           "no_data", "TranslatedJob", "TranslatedBroadcast", "AugmentedJob", "open_job"]

MODES = (Mode.UC, Mode.TRANSLATED, Mode.AUGMENTED)
"""The modes :class:`~inagg.models.switch.ModelSwitch` implements."""
HOP_TIMEOUT = 100e-6
"""Mode III's default ACK timeout of a result on the hop (the switch's clock, seconds)."""
RC_CONTRIBUTION = layout(Opcode.RC_RDMA_WRITE_ONLY)
"""A contribution of Modes II and III: RC RDMA WRITE ONLY, one chunk."""
RC_RESULT = layout(Opcode.RC_RDMA_WRITE_ONLY_IMM)
"""A result of Modes II and III, and a child switch's partial with promoted lanes: RC WRITE ONLY WITH IMMEDIATE."""


def worker_addresses(switch: SwitchSpec, spec: JobSpec) -> list[Address]:
    """Where the switch's frames to each worker of ``spec`` go: the worker's QP, from the switch's addresses."""
    mac, ip = wire.mac_bytes(switch.mac), wire.ip_bytes(switch.ip)
    return [Address(eth_dst=wire.mac_bytes(w.mac), eth_src=mac, ip_src=ip, ip_dst=wire.ip_bytes(w.ip),
                    udp_sport=qp_udp_sport(w.qpn), dest_qpn=w.qpn, rkey=w.rkey, pkey=switch.pkey)
            for w in spec.workers]


def ack_of(r: wire.RoceFrame, counters) -> Ack | None:
    """The ACK or NAK an RC ACK frame carries; None, with ``DROP_BAD_LENGTH`` counted, when its AETH is cut."""
    if len(r.payload) != AETH.size:
        counters[Counter.DROP_BAD_LENGTH] += 1
        return None
    a = AETH.unpack(r.payload)
    return Ack(r.psn, a["syndrome"], a["msn"])


def flow(spec: JobSpec) -> tuple[int, int]:
    """(senders, receivers) of a Mode I, II or III job, as worker bitmaps: who sends lanes up, who gets results
    down.

    Reduce: every child sends, only the child on the root rank's side gets
    the result (none below the top switch off the root rank's side).
    Broadcast: only that child sends (none off the root rank's side), every
    child gets the result. Every other collective is an AllReduce on the
    switch (Barrier, ReduceScatter and AllGather are derived from it on the
    hosts).
    """
    everyone = (1 << len(spec.workers)) - 1
    root = 0 if spec.root is None else 1 << spec.root
    if spec.collective is Collective.REDUCE:
        return everyone, root
    if spec.collective is Collective.BROADCAST:
        return root, everyone
    return everyone, everyone


def no_data(job, worker: int, r: wire.RoceFrame) -> bool:
    """True, with ``DROP_NO_DATA`` counted, when ``job``'s collective has ``worker`` send nothing like ``r``: a
    contribution from a child that is no sender, an ACK from one that is no receiver (section 11.1). ``job``
    is a Mode I, II or III job with ``senders``, ``receivers`` (:func:`flow`) and ``switch``."""
    if (job.receivers if r.opcode == Opcode.RC_ACK else job.senders) >> worker & 1:
        return False
    job.switch.tree_counters[TreeCounter.DROP_NO_DATA] += 1
    return True


@dataclass
class Entry:
    """One slot of a Mode II/III job: a chunk's lanes while it aggregates, then its result."""

    lanes: arith.LaneState
    chunk: int = 0
    psn: int = 0
    bitmap: int = 0      # children whose contribution is in (Mode III Broadcast off the root rank's side: the
                         # receivers, while the slot holds a result); empty: the slot is free
    count: int = 0
    done: bool = False   # every child is in: the root made the result, a switch below it sent its partial up
    held: bool = False   # the lanes are the result (the root's, or the parent's in Mode III)
    acked: int = 0       # Mode III: children that ACKed the result

    def copy(self) -> "Entry":
        return Entry(self.lanes.copy(), self.chunk, self.psn, self.bitmap, self.count, self.done, self.held,
                     self.acked)


class TranslatedJob:
    """Mode II, connection translated (``docs/protocol.md`` sections 6.2 and 10.1).

    ``switch`` is the :class:`~inagg.models.switch.ModelSwitch` that holds
    the job: its spec, counters and lane arithmetic. A job with a
    ``parent`` is a switch below the root of a tree: a child of its parent
    like a host, with the uplink's result QPN as its QP.

    ``shadow_skew`` is a test-only mutation: the shadow wipe of step 2 lands
    that many slots past the shadow slot, an off-by-one in the "2W slots
    indexed by PSN mod 2W" rule; :mod:`inagg.host.tree_checker` must find it.
    ``add_duplicates`` is another: a child's duplicate of a contribution its
    slot still aggregates is added again (step 4 forgotten while the slot is
    open); the tree checker must find it through a duplicated frame.
    """

    mode = Mode.TRANSLATED
    shadow_skew = 0
    add_duplicates = False

    def __init__(self, switch, spec: JobSpec):
        self.switch, self.spec = switch, spec
        n = len(spec.workers)
        self.all = (1 << n) - 1
        self.senders, self.receivers = flow(spec)
        self.need = self.senders.bit_count()  # contributions that complete a slot
        self.expected = [0] * n
        self.entries = [Entry(arith.LaneState(switch.spec.lanes)) for _ in range(spec.slots)]
        self.to = worker_addresses(switch.spec, spec)
        mac, ip = wire.mac_bytes(switch.spec.mac), wire.ip_bytes(switch.spec.ip)
        up = spec.parent
        self.up = None if up is None else Address(
            eth_dst=wire.mac_bytes(up.mac), eth_src=mac, ip_src=ip, ip_dst=wire.ip_bytes(up.ip),
            udp_sport=qp_udp_sport(up.result_qpn), dest_qpn=up.qpn, rkey=up.rkey, pkey=switch.spec.pkey)

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
        return (tuple(self.expected), tuple((e.chunk, e.psn, e.bitmap, e.count, e.done, e.held, e.acked,
                                             e.lanes.words.tobytes(), e.lanes.promoted.tobytes())
                                            for e in self.entries))

    # -- frames in -------------------------------------------------------

    def receive(self, worker: int, r: wire.RoceFrame) -> list[tuple[int, bytes]]:
        """One checked frame (``wire.parse``) addressed to ``worker``'s switch QPN."""
        count = self.switch.counters
        if no_data(self, worker, r):
            return []
        if r.opcode == Opcode.RC_ACK:
            ack = ack_of(r, self.switch.counters)
            return [] if ack is None else self._result_ack(worker, ack)
        c = self.switch.spec.chunk_bytes
        # A child switch's partial with promoted lanes carries their promotion bits after the lanes.
        promoted = r.opcode == Opcode.RC_RDMA_WRITE_ONLY_IMM and worker in self.spec.subswitches
        kind, size = (RC_RESULT, self.switch.partial_bytes) if promoted else (RC_CONTRIBUTION, c)
        bad = wire.check_receiver(r, kind, size, qpn_ok=True, rkey_ok=r.rkey == self.spec.rkey,
                                  va_ok=r.va is not None and r.va % c == 0 and r.va // c < CHUNK_MOD
                                  and (not promoted or r.imm == encode_imm(r.va // c, True)))
        if bad is not None:
            count[bad] += 1
            return []
        return self._contribution(worker, r.psn, r.va // c, r.payload, promoted)

    def _contribution(self, w: int, psn: int, chunk: int, payload: bytes,
                      promoted: bool = False) -> list[tuple[int, bytes]]:
        count = self.switch.counters
        d = psn_diff(psn, self.expected[w])
        e = self.entries[psn % len(self.entries)]
        if d > 0:
            count[Counter.DROP_PSN_AHEAD] += 1
            return self._ahead(w)
        if d < 0 and not (self.add_duplicates and e.psn == psn and e.bitmap >> w & 1 and not e.done):
            return self._behind(w, psn, chunk, e)
        if e.bitmap and e.psn != psn:
            return self._busy(e)
        if e.bitmap and e.chunk != chunk:
            count[Counter.DROP_BAD_ADDRESS] += 1  # the hosts disagree on which chunk this PSN carries
            return []
        if not e.bitmap:
            e.chunk, e.psn, e.count, e.done, e.held, e.acked = chunk, psn, 0, False, False, 0
        out = []  # the test-only mutation adds a duplicate again, taking nothing in order
        if d == 0:
            self.expected[w] = psn_add(psn, 1)
            out = self._in_order(w, psn)
        self.switch._add(e.lanes, payload, promoted, first=e.count == 0)
        e.bitmap |= 1 << w
        e.count += 1
        count[Counter.RX_CONTRIB] += 1
        if e.count < self.need:
            return out
        e.done = True
        if self.up is not None:
            return out + self._partial_done(e)
        e.held = True
        count[Counter.COMPLETED] += 1
        if any(self.switch._lanes_out(e.lanes)[1:]):
            count[Counter.PROMOTED] += 1
        return out + self._completed(e)

    def from_parent(self, r: wire.RoceFrame) -> list[tuple[int, bytes]]:
        """A checked frame to the uplink's result QPN: a result from the parent (section 10.1), or its ACK."""
        if r.opcode == Opcode.RC_ACK:
            ack = ack_of(r, self.switch.counters)
            return [] if ack is None else self._parent_ack(ack)
        up, c = self.spec.parent, self.switch.spec.chunk_bytes
        chunk30 = (r.imm or 0) & IMM_CHUNK_MASK
        bad = wire.check_receiver(r, RC_RESULT, c, qpn_ok=True, rkey_ok=r.rkey == up.result_rkey,
                                  va_ok=r.va == up.result_va + (chunk30 & (self.spec.slots - 1)) * c)
        if bad is not None:
            self.switch.counters[bad] += 1
            return []
        return self._parent_result(r, chunk30)

    def _waiting(self, r: wire.RoceFrame, chunk30: int) -> Entry | None:
        """The slot whose partial the parent's result ``r`` answers; None (counted) when no slot waits for it."""
        e = self.entries[r.psn % len(self.entries)]
        if e.psn != r.psn or not e.done or e.chunk & IMM_CHUNK_MASK != chunk30:
            self.switch.tree_counters[TreeCounter.DROP_PARENT_STALE] += 1
            return None
        return e

    # -- the rules that differ between the modes ----------------------------

    def _ahead(self, w: int) -> list[tuple[int, bytes]]:
        """Mode II step 3: a PSN ahead is dropped; the host's Go-Back-N sends the gap again."""
        return []

    def _behind(self, w: int, psn: int, chunk: int, e: Entry) -> list[tuple[int, bytes]]:
        """Mode II step 4: the root sends the result again to this child, a switch below it its partial to
        the parent, when the slot still holds it. When the senders are not the receivers (Reduce, Broadcast)
        the result goes again to every child that gets results: the sender cannot tell which lost it."""
        count = self.switch.counters
        if e.psn != psn or e.chunk != chunk or not e.bitmap >> w & 1 and not e.done:
            count[Counter.DROP_STALE] += 1
            return []
        count[Counter.DUP_CONTRIB] += 1
        if not e.done:
            return []  # the result goes to every child when the slot completes
        if self.up is not None:
            self.switch.resent[self.spec.parent.port, TreeCounter.UP_RESENDS] += 1
            return self._up(e, TreeCounter.UP_RESENDS)
        to = [w] if self.senders == self.receivers else self._receiving()
        count[Counter.TX_RESENDS] += len(to)
        for v in to:
            self.switch.resent[self.spec.workers[v].port, Counter.TX_RESENDS] += 1
        return [self._result(v, e) for v in to]

    def _busy(self, e: Entry) -> list[tuple[int, bytes]]:
        # Mode II: the window keeps an in-order PSN off a slot that is not empty (section 6.2,
        # "Why a slot is empty"), so only a host that breaks the rules gets here.
        self.switch.counters[Counter.DROP_WINDOW] += 1
        return []

    def _in_order(self, w: int, psn: int) -> list[tuple[int, bytes]]:
        """Mode II step 2: wipe this child's bit in the shadow slot, W PSNs ahead."""
        shadow = self.entries[(psn + len(self.entries) // 2 + self.shadow_skew) % len(self.entries)]
        shadow.bitmap &= ~(1 << w)
        return []

    def _completed(self, e: Entry) -> list[tuple[int, bytes]]:
        payload, fp32, saturated = self.switch._lanes_out(e.lanes)  # once for every worker's copy
        imm = encode_imm(e.chunk, fp32, saturated)
        return [self._result_frame(v, e.psn, e.chunk, payload, imm) for v in self._receiving()]

    def _receiving(self) -> list[int]:
        """The children that get results, in worker-index order."""
        return [v for v in range(len(self.spec.workers)) if self.receivers >> v & 1]

    def _partial_done(self, e: Entry) -> list[tuple[int, bytes]]:
        """Section 10.1: a switch below the root sends its completed partial to the parent."""
        return self._up(e, TreeCounter.UP_PARTIALS)

    def _parent_result(self, r: wire.RoceFrame, chunk30: int) -> list[tuple[int, bytes]]:
        """Mode II on a tree: the parent's result goes to every child that gets results, unchanged; nothing is
        kept. A switch whose children send nothing (Broadcast off the root rank's side) has no partial to
        match it with and sends every result on."""
        if not self.receivers:
            self.switch.tree_counters[TreeCounter.DROP_NO_DATA] += 1  # Reduce off the root rank's side
            return []
        if self.need:
            e = self._waiting(r, chunk30)
            if e is None:
                return []
            chunk = e.chunk
        else:
            chunk = chunk30
        self.switch.tree_counters[TreeCounter.RX_PARENT] += 1
        return [self._result_frame(v, r.psn, chunk, r.payload, r.imm) for v in self._receiving()]

    def _parent_ack(self, ack: Ack) -> list[tuple[int, bytes]]:
        """Mode II: Reduce's root-rank ACK from the parent goes to every child; any other ACK from the parent
        is ``DROP_BAD_OPCODE`` (a child switch is no requester of its partials, so nobody ACKs them)."""
        if self.spec.collective is Collective.REDUCE:
            return self._ack_down(ack, range(len(self.spec.workers)))
        self.switch.counters[Counter.DROP_BAD_OPCODE] += 1
        return []

    def _result_ack(self, w: int, ack: Ack) -> list[tuple[int, bytes]]:
        """Mode II step 5: the host's ACK (or NAK) of a result goes back to it as the ACK of its contribution.
        Reduce: only the root rank ACKs results, and its ACK is every sender's: it goes up to the top switch,
        which sends it to every child (section 11)."""
        if self.spec.collective is Collective.REDUCE:
            if self.up is not None:
                self.switch.tree_counters[TreeCounter.ACK_UP] += 1
                return [(self.spec.parent.port, encode(ack, self.up))]
            return self._ack_down(ack, range(len(self.spec.workers)))
        self.switch.counters[Counter.ACK_REFLECTED] += 1
        return [(self.spec.workers[w].port, encode(ack, self.to[w]))]

    def _ack_down(self, ack: Ack, children) -> list[tuple[int, bytes]]:
        """``ack`` unchanged (PSN, syndrome, MSN) to each of ``children``: a rank's contribution QP, a child
        switch's result QPN (``ACK_DOWN`` each)."""
        out = [(self.spec.workers[v].port, encode(ack, self.to[v])) for v in children]
        self.switch.tree_counters[TreeCounter.ACK_DOWN] += len(out)
        return out

    # -- frames out --------------------------------------------------------

    def _result(self, w: int, e: Entry) -> tuple[int, bytes]:
        payload, fp32, saturated = self.switch._lanes_out(e.lanes)
        return self._result_frame(w, e.psn, e.chunk, payload, encode_imm(e.chunk, fp32, saturated))

    def _result_frame(self, w: int, psn: int, chunk: int, payload: bytes, imm: int) -> tuple[int, bytes]:
        ws = self.spec.workers[w]
        c = self.switch.spec.chunk_bytes
        self.switch.counters[Counter.TX_RESULTS] += 1
        pkt = Packet(Opcode.RC_RDMA_WRITE_ONLY_IMM, psn, payload, True,
                     ws.result_va + (chunk & (self.spec.slots - 1)) * c, c, imm)
        return ws.port, encode(pkt, self.to[w])

    def _up(self, e: Entry, event: TreeCounter) -> list[tuple[int, bytes]]:
        """Slot ``e``'s partial to the parent: an RC contribution with the slot's PSN; with promoted lanes an
        RC WRITE ONLY WITH IMMEDIATE (FP32 | chunk) whose promotion bits follow the lanes (section 10)."""
        self.switch.tree_counters[event] += 1
        c = self.switch.spec.chunk_bytes
        payload, imm = self.switch._partial(e.lanes, e.chunk)
        opcode = Opcode.RC_RDMA_WRITE_ONLY if imm is None else Opcode.RC_RDMA_WRITE_ONLY_IMM
        pkt = Packet(opcode, e.psn, payload, True, e.chunk * c, len(payload), imm)
        return [(self.spec.parent.port, encode(pkt, self.up))]


class TranslatedBroadcast(TranslatedJob):
    """Mode II Broadcast (``docs/protocol.md`` section 11): the children's ACKs of the results are gathered.

    Per child the switch keeps its ACK point, the oldest result PSN it has
    not ACKed. The lowest point goes towards the root rank: to the parent,
    or from the top switch down the root rank's side, every switch on that
    path passing it to its child on that side (:meth:`_parent_ack`), so that
    the root rank's requester takes it as the ACK of its contribution: the
    root rank's window moves when every rank has the result, end to end.
    """

    def __init__(self, switch, spec: JobSpec):
        super().__init__(switch, spec)
        self.acked = [0] * len(spec.workers)
        self.forwarded = 0  # the ACK point last sent towards the root rank

    def fork(self, switch) -> "TranslatedBroadcast":
        t = super().fork(switch)
        t.acked = list(self.acked)
        return t

    def state(self) -> tuple:
        return super().state() + (tuple(self.acked), self.forwarded)

    def _result_ack(self, w: int, ack: Ack) -> list[tuple[int, bytes]]:
        """A child's ACK of ``q`` moves its point to ``q + 1`` (a NAK sequence error of ``q``: to ``q``). A
        lower aggregate than before goes towards the root rank as an ACK of ``low - 1``; a NAK of the lowest
        point as a NAK of it (the root rank goes back N); an ACK that moves nothing (a re-ACK of a result sent
        again) sends the aggregate again, which repairs a lost aggregate ACK. Another NAK goes on unchanged:
        the root rank's QP fails with it."""
        if ack.nak and ack.syndrome != Syndrome.NAK_SEQ:
            return self._toward_root(ack)
        point = ack.psn if ack.nak else psn_add(ack.psn, 1)
        moved = psn_diff(point, self.acked[w]) > 0
        if moved:
            self.acked[w] = point
        low = min(self.acked, key=lambda p: psn_diff(p, self.forwarded))
        if ack.nak and low == ack.psn:
            out = Ack(low, Syndrome.NAK_SEQ, low)
        elif low != self.forwarded or not moved:
            out = Ack(psn_add(low, -1), Syndrome.ACK, low)  # MSN: every result is one message
        else:
            return []
        self.forwarded = low
        return self._toward_root(out)

    def _toward_root(self, ack: Ack) -> list[tuple[int, bytes]]:
        if self.up is not None:
            self.switch.tree_counters[TreeCounter.ACK_UP] += 1
            return [(self.spec.parent.port, encode(ack, self.up))]
        return self._ack_down(ack, [self.spec.root])

    def _parent_ack(self, ack: Ack) -> list[tuple[int, bytes]]:
        """The gathered ACK on its way down to the root rank: to the child on its side (none: ``DROP_BAD_OPCODE``)."""
        if self.spec.root is None:
            self.switch.counters[Counter.DROP_BAD_OPCODE] += 1
            return []
        return self._ack_down(ack, [self.spec.root])


class AugmentedJob(TranslatedJob):
    """Mode III, connection augmented (``docs/protocol.md`` sections 7 and 10.1): Mode II plus reliability on
    every hop.

    Upward the switch is each child's RC responder (it ACKs, re-ACKs and
    NAKs contributions itself) and, below the root, the RC requester of its
    partials to the parent: they stay until the parent ACKs them (or its
    result for them arrives), and go again after the parent's NAK or when
    the partial timer runs out. Downward it is each child's requester for
    results, and below the root the parent's responder for them: a slot's
    result stays until every child ACKed it, and is sent again after a
    child's NAK or when that child's ACK timer (``timeout``, on the switch's
    clock) runs out.

    ``free_on_first_ack`` is a test-only mutation: it frees a slot as soon
    as one child ACKed its result, the buffer-recycling bug EPIC's model
    check found; :mod:`inagg.host.checker` and
    :mod:`inagg.host.tree_checker` must find it.
    """

    mode = Mode.AUGMENTED
    free_on_first_ack = False

    def __init__(self, switch, spec: JobSpec, timeout: float = HOP_TIMEOUT):
        super().__init__(switch, spec)
        n = len(spec.workers)
        self.timeout = timeout
        self.nak_sent = [False] * n
        self.next_result = 0          # PSN of the next result to complete (results complete in PSN order)
        self.acked = [0] * n          # per child: the oldest result PSN it has not ACKed
        self.timers: list[float | None] = [None] * n
        # Below the root: the partials' requester and the results' responder towards the parent.
        self.up_start = 0             # the oldest partial the parent has not ACKed
        self.up_next = 0              # PSN of the next partial to complete
        self.up_timer: float | None = None
        self.parent_expected = 0      # PSN of the next result from the parent
        self.parent_nak = False

    def fork(self, switch) -> "AugmentedJob":
        t = super().fork(switch)
        t.nak_sent, t.acked, t.timers = list(self.nak_sent), list(self.acked), list(self.timers)
        return t

    def state(self) -> tuple:
        now = self.switch.now
        rel = [None if t is None else t - now for t in (*self.timers, self.up_timer)]
        return super().state() + (tuple(self.nak_sent), self.next_result, tuple(self.acked), tuple(rel),
                                  self.up_start, self.up_next, self.parent_expected, self.parent_nak)

    @property
    def deadline(self) -> float | None:
        """The earliest armed timer (a child's results, the partials), or None."""
        armed = [t for t in (*self.timers, self.up_timer) if t is not None]
        return min(armed) if armed else None

    def on_timer(self, now: float) -> list[tuple[int, bytes]]:
        """Go-Back-N of the results of every child whose timer ran out at ``now``, and of the partials."""
        out = []
        for w, t in enumerate(self.timers):
            if t is not None and t <= now:
                out += self.expire(w)
        if self.up_timer is not None and self.up_timer <= now:
            out += self._resend_partials()
        return out

    def expire(self, w: int) -> list[tuple[int, bytes]]:
        """Child ``w``'s ACK timer has run out: Go-Back-N of every result it has not ACKed, its timer armed
        again. A switch whose timers are checked one child at a time (the gateware's) runs out a child's
        timer after its deadline, not at it; a replay gives the model that moment through this call."""
        return self._resend(w, self.acked[w])

    # -- upward: the switch is the RC responder of its children ---------------

    def _ahead(self, w: int) -> list[tuple[int, bytes]]:
        """Mode III step 3: one NAK sequence error per gap ("NAK sent" per child)."""
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
        # Not ACKed: the child sends it again on its timer, after the slowest child ACKed the old result.
        self.switch.counters[Counter.DROP_BUFFER_BUSY] += 1
        return []

    def _in_order(self, w: int, psn: int) -> list[tuple[int, bytes]]:
        """Mode III step 2: ACK at once; the gap, if any, is closed."""
        self.nak_sent[w] = False
        self.switch.counters[Counter.ACK_SENT] += 1
        return [self._ack(w, psn)]

    def _ack(self, w: int, psn: int, syndrome: int = Syndrome.ACK) -> tuple[int, bytes]:
        # The MSN counts the child's messages taken: every contribution is one message.
        return self.spec.workers[w].port, encode(Ack(psn, syndrome, self.expected[w]), self.to[w])

    # -- upward, below the root: the switch is the RC requester of its partials ----

    def _partial_done(self, e: Entry) -> list[tuple[int, bytes]]:
        self.up_next = psn_add(e.psn, 1)
        if self.up_timer is None:
            self.up_timer = self.switch.now + self.timeout
        return super()._partial_done(e)

    def _parent_ack(self, ack: Ack) -> list[tuple[int, bytes]]:
        """Section 10.1, Mode III: the parent's ACK of partial ``q`` (NAK of ``q``: ``q - 1``) releases every
        partial up to it; a NAK of the oldest one sends every completed partial from it again."""
        upto = ack.psn if not ack.nak else psn_add(ack.psn, -1)
        self._partials_acked(upto)
        if ack.nak and ack.syndrome == Syndrome.NAK_SEQ and ack.psn == self.up_start:
            return self._resend_partials()
        return []

    def _partials_acked(self, upto: int) -> None:
        if psn_diff(upto, self.up_start) >= 0 and psn_diff(upto, self.up_next) < 0:
            if not self.receivers:
                # Reduce off the root rank's side: no result comes back, the parent holds the partial now.
                psn = self.up_start
                while psn_diff(psn, upto) <= 0:
                    self.entries[psn % len(self.entries)].bitmap = 0
                    psn = psn_add(psn, 1)
            self.up_start = psn_add(upto, 1)
            self.up_timer = None if self.up_start == self.up_next else self.switch.now + self.timeout

    def _resend_partials(self) -> list[tuple[int, bytes]]:
        # Every partial from up_start on is complete and still in its slot: a slot is freed only after
        # the parent's result for it, which releases the partial first (_parent_result).
        out, psn = [], self.up_start
        while psn_diff(psn, self.up_next) < 0:
            out += self._up(self.entries[psn % len(self.entries)], TreeCounter.UP_RESENDS)
            psn = psn_add(psn, 1)
        self.switch.counters[Counter.HOP_RESENDS] += len(out)
        self.switch.resent[self.spec.parent.port, Counter.HOP_RESENDS] += len(out)
        self.up_timer = self.switch.now + self.timeout if out else None
        return out

    # -- downward, below the root: the switch is the parent's responder of results ----

    def _parent_result(self, r: wire.RoceFrame, chunk30: int) -> list[tuple[int, bytes]]:
        """Section 10.1, Mode III: an in-order result is kept in its slot (which frees the partial), ACKed to
        the parent and sent to every child; behind: ACKed again; ahead: one NAK per gap."""
        count, tree = self.switch.counters, self.switch.tree_counters
        d = psn_diff(r.psn, self.parent_expected)
        if d < 0:
            tree[TreeCounter.DUP_PARENT] += 1
            return [self._ack_parent(psn_add(self.parent_expected, -1))]
        if d > 0:
            count[Counter.DROP_PSN_AHEAD] += 1
            if self.parent_nak:
                return []
            self.parent_nak = True
            count[Counter.NAK_SENT] += 1
            return [self._ack_parent(self.parent_expected, Syndrome.NAK_SEQ)]
        e = self._waiting(r, chunk30) if self.need else self._claim(r, chunk30)
        if e is None:
            return []  # not ACKed: the parent sends it again
        self.parent_nak = False
        self.parent_expected = psn_add(r.psn, 1)
        self._partials_acked(r.psn)  # the parent made the result: it holds every partial up to it
        self.switch._take_result(e.lanes, r)
        e.held = True
        tree[TreeCounter.RX_PARENT] += 1
        return [self._ack_parent(r.psn)] + self._completed(e)

    def _claim(self, r: wire.RoceFrame, chunk30: int) -> Entry | None:
        """Broadcast below the top switch off the root rank's side: the in-order result takes its slot, which
        stays taken until every child ACKed it; a slot still taken is ``DROP_BUFFER_BUSY`` (not ACKed)."""
        if not self.receivers:
            self.switch.tree_counters[TreeCounter.DROP_NO_DATA] += 1  # Reduce off the root rank's side
            return None
        e = self.entries[r.psn % len(self.entries)]
        if e.bitmap:
            self.switch.counters[Counter.DROP_BUFFER_BUSY] += 1
            return None
        e.chunk, e.psn, e.bitmap, e.count, e.done, e.acked = chunk30, r.psn, self.receivers, 0, True, 0
        return e

    def _ack_parent(self, psn: int, syndrome: int = Syndrome.ACK) -> tuple[int, bytes]:
        # The MSN counts the results taken from the parent.
        if syndrome == Syndrome.ACK:
            self.switch.counters[Counter.ACK_SENT] += 1
        return self.spec.parent.port, encode(Ack(psn, syndrome, self.parent_expected), self.up)

    # -- downward: the switch is the RC requester of results ---------------------

    def _completed(self, e: Entry) -> list[tuple[int, bytes]]:
        self.next_result = psn_add(e.psn, 1)
        due = self.switch.now + self.timeout
        self.timers = [due if t is None and self.receivers >> v & 1 else t for v, t in enumerate(self.timers)]
        return super()._completed(e)

    def _result_ack(self, w: int, ack: Ack) -> list[tuple[int, bytes]]:
        """Mode III step 5: a child's ACK frees what every child has ACKed; a NAK sends again from its PSN."""
        upto = ack.psn if not ack.nak else psn_add(ack.psn, -1)
        if psn_diff(upto, self.acked[w]) >= 0 and psn_diff(upto, self.next_result) < 0:
            bit = 1 << w
            psn = self.acked[w]
            while psn_diff(psn, upto) <= 0:
                e = self.entries[psn % len(self.entries)]
                e.acked |= bit
                if e.acked == self.receivers or self.free_on_first_ack:
                    e.bitmap = 0  # the slowest child has it: the slot is free
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
            if e.psn != psn or not e.held:
                break  # freed early (the test-only mutation): the result is gone
            out.append(self._result(w, e))
            psn = psn_add(psn, 1)
        self.switch.counters[Counter.HOP_RESENDS] += len(out)
        self.switch.resent[self.spec.workers[w].port, Counter.HOP_RESENDS] += len(out)
        self.timers[w] = self.switch.now + self.timeout if out else None
        return out


def open_job(switch, spec: JobSpec, *, hop_timeout: float = HOP_TIMEOUT) -> TranslatedJob:
    """The state of a Mode II or Mode III job on ``switch``."""
    if spec.slots > PSN_MOD:
        # PSN mod 2W names a slot only while 2W divides the PSN space, across a wrap too.
        raise ValueError(f"job {spec.job}: a Mode II/III job has at most 2**24 slots, not {spec.slots}")
    if spec.mode is Mode.TRANSLATED:
        return (TranslatedBroadcast if spec.collective is Collective.BROADCAST else TranslatedJob)(switch, spec)
    if spec.mode is Mode.AUGMENTED:
        return AugmentedJob(switch, spec, hop_timeout)
    raise ValueError(f"job {spec.job}: mode {spec.mode.name} is not one of this module's (TRANSLATED, AUGMENTED)")
