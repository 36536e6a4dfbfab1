"""A worker of EPIC's Modes I, II and III: the chunk stream over one standard RC queue pair (sans-IO).

:class:`RcWorker` is what a host with a stock RoCE NIC does in those
modes: one RC QP to the switch, whose requester (:class:`inagg.models.rc.Requester`)
sends each chunk as an RDMA WRITE ONLY message and whose responder
(:class:`inagg.models.rc.Responder`) takes each result as an RDMA WRITE
ONLY WITH IMMEDIATE and ACKs it. The NIC's rules do the rest: the window,
the ACK timeout, Go-Back-N, the retry count. Nothing here knows whether
the switch terminates the connection (Mode I: the switch's own RC
endpoint ACKs the chunk and sends the result from its own PSN space),
translates it (Mode II: the ACK of a chunk is the switch's reflection of
this host's ACK of its result) or augments it (Mode III: the switch ACKs
the chunk itself): that is EPIC's point.

It has :class:`~inagg.host.worker.Worker`'s interface (``submit``,
``receive``, ``on_timer``, ``deadline``, ``done``, ``results``), so
:class:`~inagg.host.worker.AllReduce` runs on it unchanged, and ``fork`` /
``fingerprint`` for the model checker. Both PSN spaces start at 0: the
first chunk the QP carries has PSN 0, its result too.

The job's collective says whether this host sends its chunks and whether it
gets results (:func:`inagg.models.modes.flow`): in a Reduce only the root
rank gets results, and the others are done when every chunk is ACKed (in
Modes II and III the root rank's ACK, passed on by the switches; in Mode I
its switch's); in a Broadcast only the root rank sends, and is done when
its chunks are ACKed too (in Modes II and III when every rank has them).
The endpoint is the same QP either way.
"""

from __future__ import annotations

import copy
from collections import Counter as Tally
from collections.abc import Sequence

import numpy as np

from inagg.models import modes, rc, wire
from inagg.models.frame import Opcode
from inagg.models.job import JobSpec, Mode, SwitchSpec
from inagg.models.protocol import CHUNK_MOD, IMM_CHUNK_MASK, Counter, decode_imm, qp_udp_sport

from inagg.host.worker import ProtocolError, QuantizedChunks, Timing, Worker, chunk_rows

__all__ = ["RcWorker", "RcRetryError", "RC_MODES"]

RC_MODES = (Mode.TERMINATED, Mode.TRANSLATED, Mode.AUGMENTED)
"""The modes whose hosts :class:`RcWorker` is."""
# Chunks are quantized and posted to the send queue this many at a time, as the window reaches them.
_BLOCK = 512


class RcRetryError(ProtocolError, TimeoutError):
    """The collective fails: the QP's requester ran out of retries (:class:`inagg.models.rc.RetryExceededError`),
    the switch refused the same chunk as not ready (RNR NAKs) for :attr:`RcWorker.patience` seconds without
    progress, or (raised by :func:`inagg.host.api.run`) every chunk was ACKed but the results stopped coming
    for that long."""


class RcWorker:
    """The chunk stream of worker ``rank`` of a Mode I, II or III ``job``, over one RC QP (sans-IO).

    ``timing.timeout`` is the QP's local ACK timeout and ``timing.tries``
    its retry count plus one (backoff does not exist on an RC QP). The QP's
    window is the job's (``job.window`` chunks). An RNR NAK spends no retry
    (the QP retries them without limit, as a NIC with an RNR retry count
    of 7), so :meth:`receive` raises :class:`RcRetryError` when the switch
    has refused chunks as not ready for :attr:`patience` seconds with no
    chunk ACKed and no result placed in between. ``stats`` counts chunks
    sent and resent, results placed, and ignored frames by reason, as
    :class:`~inagg.host.worker.Worker`'s does.
    """

    def __init__(self, switch: SwitchSpec, job: JobSpec, rank: int, *, timing: Timing | None = None):
        if job.mode not in RC_MODES:
            raise ValueError(f"RcWorker runs Modes I, II and III (RC queue pairs), not {job.mode.name}")
        self.switch, self.job, self.rank = switch, job, rank
        senders, receivers = modes.flow(job)
        self.sends, self.receives = bool(senders >> rank & 1), bool(receivers >> rank & 1)
        # When the senders are not the receivers (Reduce, Broadcast), a sender keeps its timer until its chunks
        # are ACKed: in Modes II and III only once the ranks that depend on them have them, in Mode I once the
        # switch has them, which is all a Reduce's other ranks learn (an AllReduce host is done with its results:
        # its ACKs follow from them).
        self._wait_acks = self.sends and senders != receivers
        # A NIC's responder keeps ACKing after the application is done, and so must its driver wherever someone
        # still waits on this rank's ACKs of its results: in Modes I and III the switch's result requester (it
        # sends a result again until this rank ACKs it; Mode I's gives up after RESULT_RETRIES and fails the
        # job's next call), in Mode II the ranks whose chunks only those ACKs complete (Reduce's root rank,
        # Broadcast's other ranks). An AllReduce rank of Mode II has nobody waiting: its own chunks are the
        # ones its ACKs complete, and its next call resends them.
        self.answers_between_calls = self.receives and (
            job.mode is not Mode.TRANSLATED or (senders != receivers and bool(senders & ~(1 << rank))))
        self.timing = timing or Timing()
        self.window = job.window
        w = job.workers[rank]
        self.qpn = w.qpn
        self.to = rc.Address(eth_dst=wire.mac_bytes(switch.mac), eth_src=wire.mac_bytes(w.mac),
                             ip_src=wire.ip_bytes(w.ip), ip_dst=wire.ip_bytes(switch.ip),
                             udp_sport=qp_udp_sport(w.qpn), dest_qpn=job.qpn(rank), rkey=job.rkey,
                             pkey=switch.pkey)
        self.requester = rc.Requester(window=self.window, mtu=switch.chunk_bytes, timeout=self.timing.timeout,
                                      retries=self.timing.tries - 1)
        self.responder = rc.Responder()
        self.next_chunk = 0
        self.stats: Tally = Tally()
        self._k = self._posted = self._got = 0
        self._lanes = np.zeros((0, switch.lanes), np.int32)
        self._words = np.zeros((0, switch.lanes), np.uint32)
        self._fp32 = np.zeros(0, bool)
        self._saturated = np.zeros(0, bool)
        self._posted_base = 0   # requester.completed when the batch started
        # When the switch first refused a chunk (RNR NAK) since the last progress; None while it takes them.
        # A time of the first refusal, not of the last progress, so that it stays None (out of the model
        # checker's key) wherever no RNR NAK comes.
        self._refused_since: float | None = None

    base = Worker.base
    results = Worker.results

    def taken(self) -> tuple[np.ndarray, np.ndarray]:
        """(words uint32, fp32 flag per chunk) of the batch's results taken so far: RC delivers them in chunk
        order, so they are the first chunks' (the model checkers check each one as it comes)."""
        return self._words[:self._got], self._fp32[:self._got]

    @property
    def done(self) -> bool:
        """True when every chunk of the current batch has its result and, when the collective's senders are
        not its receivers, every chunk this host sends is ACKed."""
        acked = self.requester.completed - self._posted_base == self._k
        return (not self.receives or self._got == self._k) and (acked or not self._wait_acks)

    @property
    def waiting(self) -> int:
        """Chunk sequence of the batch's first chunk without its result."""
        return (self.base + self._got) % CHUNK_MOD

    @property
    def deadline(self) -> float | None:
        """The QP's ACK timer."""
        return self.requester.deadline

    @property
    def patience(self) -> float:
        """Seconds without progress after which the QP gives up on a switch that only refuses its chunks
        (:meth:`receive`), and :func:`~inagg.host.api.run` on results that do not come: ``timing.timeout *
        timing.tries``, as long as its retries take."""
        return self.timing.timeout * self.timing.tries

    def submit(self, now: float, lanes: "np.ndarray | QuantizedChunks") -> list[bytes]:
        """Start a batch of chunks (int32, shape (k, lanes)); returns the first frames."""
        lanes = chunk_rows(self, lanes)
        k = lanes.shape[0]
        self._k, self._lanes, self._posted, self._got = k, lanes, 0, 0
        self._words = np.zeros((k, self.switch.lanes), np.uint32)
        self._fp32 = np.zeros(k, bool)
        self._saturated = np.zeros(k, bool)
        self._posted_base = self.requester.completed
        self._refused_since = None
        self.next_chunk = (self.next_chunk + k) % CHUNK_MOD
        return self._post(now)

    def receive(self, now: float, frame: bytes) -> list[bytes]:
        """Handle one frame from the switch: an ACK/NAK of a chunk, or a result.

        Raises :class:`RcRetryError` when the QP's requester fails, and when
        the frame is an RNR NAK and the switch has refused chunks as not
        ready for :attr:`patience` seconds with no progress in between."""
        r = rc.decode(frame, self.switch.pkey)
        if isinstance(r, Counter):
            self.stats[r] += 1
            return []
        qpn, item = r
        if qpn != self.qpn:
            self.stats[Counter.DROP_UNKNOWN_QPN] += 1
            return []
        if isinstance(item, rc.Ack):
            una = self.requester.una
            out = self._guard(lambda: self.requester.receive(now, item))
            if self.requester.una != una:
                self._refused_since = None
            if rc.Syndrome.is_rnr(item.syndrome) and item.psn == self.requester.una != self.requester.next_psn:
                self._refused(now)
            return out + self._post(now)
        if item.opcode != Opcode.RC_RDMA_WRITE_ONLY_IMM or len(item.payload) != self.switch.chunk_bytes:
            self.stats[Counter.DROP_BAD_OPCODE if item.opcode != Opcode.RC_RDMA_WRITE_ONLY_IMM
                       else Counter.DROP_BAD_LENGTH] += 1
            return []
        messages, acks = self.responder.receive(item)
        if not messages:
            self.stats["duplicate" if rc.psn_diff(item.psn, self.responder.expected) < 0 else "out_of_order"] += 1
        for m in messages:
            self._place(m)
        return [rc.encode(a, self.to) for a in acks]

    def receive_batch(self, now: float, frames: Sequence[bytes]) -> list[bytes]:
        """:meth:`receive` on each frame in turn: the QP's requester and responder take packets one at a time."""
        return [out for frame in frames for out in self.receive(now, frame)]

    def answer_late(self, now: float, frame: bytes) -> list[bytes] | None:
        """After the batch: the ACK of a result this QP has taken already (its first ACK was lost), nothing
        for a late ACK of this QP's own chunks or for a frame no QP would take (counted as :meth:`receive`
        counts it), or None for any other frame, which is the next batch's to handle (a Broadcast's next
        results may come before it)."""
        r = rc.decode(frame, self.switch.pkey)
        if isinstance(r, Counter) or r[0] != self.qpn:
            # A corrupted or misaddressed frame is nobody's: it must not end the answering.
            return self.receive(now, frame)
        if isinstance(r[1], rc.Ack):
            # Reduce's root rank sends too, and in Mode II the switch sends its ACK of a result to every
            # sender, itself among them: each ACK of a late result comes back to it. An ACK of a PSN it
            # sent is never the next batch's (that batch has sent nothing), so it must not end the wait.
            if r[1].nak or rc.psn_diff(r[1].psn, self.requester.next_psn) >= 0:
                return None
            return self.receive(now, frame)
        if rc.psn_diff(r[1].psn, self.responder.expected) >= 0:
            return None
        return self.receive(now, frame)

    def on_timer(self, now: float) -> list[bytes]:
        """The QP's ACK timeout: Go-Back-N; :class:`RcRetryError` after the last retry."""
        out = self._guard(lambda: self.requester.on_timer(now))
        self.stats["resent"] += len(out)
        return out

    def _refused(self, now: float) -> None:
        """An RNR NAK of the oldest unACKed chunk: the switch's slot for it still holds another chunk. A Mode I
        switch frees the slot once every rank has its result; a rank that is missing or failed never lets
        that happen, and the QP, which spends no retry on RNR NAKs, would wait without end. So the wait ends
        after the patience of :func:`~inagg.host.api.run`'s silence rule, counted from the first refusal
        since the last progress: a peer that comes within it lets the job go on."""
        if self._refused_since is None:
            self._refused_since = now
        elif now - self._refused_since >= self.patience:
            chunk = (self.base + self.requester.completed - self._posted_base) % CHUNK_MOD
            raise RcRetryError(f"job {self.job.job} worker {self.rank}: no progress: the switch refused chunk "
                               f"{chunk} as not ready for {now - self._refused_since:.3g} s (another rank of "
                               "the job is missing or failed)")

    def _guard(self, call) -> list[bytes]:
        try:
            return [rc.encode(p, self.to) for p in call()]
        except rc.RcError as e:
            raise RcRetryError(f"job {self.job.job} worker {self.rank}: {e}") from e

    def _place(self, m: rc.Message) -> None:
        chunk30, fp32, saturated = decode_imm(m.imm)
        i = (chunk30 - self.base) & IMM_CHUNK_MASK
        if i >= (self._posted if self.sends else self._k) or i != self._got or not self.receives:
            # RC delivers each result once, in PSN order: anything else is a switch that broke the protocol.
            self.stats["unexpected"] += 1
            return
        self._words[i] = np.frombuffer(m.payload, ">u4")
        self._fp32[i], self._saturated[i] = fp32, saturated
        self._got += 1
        self._refused_since = None
        self.stats["results"] += 1
        if fp32:
            self.stats["fp32_results"] += 1

    def _post(self, now: float) -> list[bytes]:
        """Post chunks to the send queue, two windows past the oldest one not ACKed, a block at a time.

        The requester's window decides what goes out; posting ahead of it
        only saves a call per ACK, and posting lazily quantizes lazily."""
        if not self.sends:
            return []  # Broadcast but the root rank: the results come without a contribution
        stop = min(self._k, self.requester.completed - self._posted_base + 2 * self.window)
        out = []
        c = self.switch.chunk_bytes
        while self._posted < stop:
            hi = min(stop, self._posted + _BLOCK)
            rows = self._lanes[self._posted:hi].astype(">i4")
            for j, row in enumerate(rows, self._posted):
                chunk = (self.base + j) % CHUNK_MOD
                out += self.requester.post(now, row.tobytes(), va=chunk * c)
            self.stats["sent"] += hi - self._posted
            self._posted = hi
        return [rc.encode(p, self.to) for p in out]

    def fork(self) -> "RcWorker":
        """An independent copy of the protocol state (the model checker branches with it)."""
        w = copy.copy(self)
        w.stats = Tally(self.stats)
        w.requester, w.responder = self.requester.copy(), self.responder.copy()
        w._words, w._fp32, w._saturated = self._words.copy(), self._fp32.copy(), self._saturated.copy()
        return w

    def fingerprint(self, now: float) -> tuple:
        """A hashable summary of the protocol state, timers relative to ``now``."""
        return (self.next_chunk, self._k, self._posted, self._got, self._words.tobytes(), self._fp32.tobytes(),
                self.requester.state(now), self.responder.state(),
                None if self._refused_since is None else self._refused_since - now)
