"""The worker API: ``allreduce(array, group)`` and the other collectives of :mod:`inagg.host.collectives`.

A :class:`Group` names one worker of one job on one switch and the
:class:`Port` its frames go through (an AF_PACKET socket in a namespace, a
TAP device, or a port of the in-process :class:`MemoryFabric`). It keeps the
job's chunk sequence from call to call, as the protocol requires. Each call
drives the sans-IO :class:`~inagg.host.worker.AllReduce` (or the collective's
operation) with a real clock, over the worker the job's mode calls for: a UC
:class:`~inagg.host.worker.Worker`, or for EPIC's Modes I, II and III an RC
queue pair (:class:`~inagg.host.rc_worker.RcWorker`), which keeps
answering between calls on a thread of its own, as a NIC's responder does
(:func:`run`).
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable
from typing import Protocol

import numpy as np

from inagg.models.job import Collective, JobSpec, SwitchSpec

from inagg.host.collectives import AllGather, Barrier, Broadcast, Reduce, ReduceScatter, collective_worker
from inagg.host.link import Faults, HeldFrames, LossyLink, clocked_receive, idle_wait
from inagg.host.rc_worker import RC_MODES, RcRetryError, RcWorker
from inagg.host.worker import AllReduce, ChunkTimeoutError, Timing, Worker

__all__ = ["Port", "Group", "allreduce", "reduce", "broadcast", "barrier", "reduce_scatter", "allgather", "run",
           "drive", "MemoryFabric", "Collective"]


class Port(Protocol):
    """Where a worker's frames go in and out.

    A port may also offer ``send_batch(frames)``, which sends a list of frames in order as ``send`` would one by
    one, in fewer system calls (:class:`~inagg.host.vxlan.VxlanPort`); :func:`drive` uses it where there is one.
    """

    def send(self, frame: bytes) -> None: ...

    def recv(self, timeout: float) -> bytes | None:
        """The next frame, or None when ``timeout`` seconds pass without one."""


class Group:
    """Worker ``rank`` of ``job`` on ``switch``, attached through ``port``.

    Every rank of the job makes the same sequence of :func:`allreduce` calls
    with arrays of the same length; the group numbers their chunks from
    ``first_chunk`` on. ``last_exponent`` is the scale exponent of the last
    call's sum (exact to ``workers * 2**-(e+1)``): the agreed one, or a smaller
    one when a P4 switch saturated a lane and the call was resent.

    ``accept_zero_icrc=True`` is for a Tofino switch, whose results carry an
    ICRC field of zero (``docs/p4.md``): they are taken and counted in
    ``worker.stats["zero_icrc"]``. Off by default.

    On a tree of switches ``rank`` is the worker index on the leaf switch
    and ``tree_rank`` the rank in the whole tree (the controller's
    ``TreePlan.rank`` maps one to the other); the collectives that place
    data by rank use :attr:`index`. The job's collective decides which of
    the functions below the group can run.

    The job's mode (``job.mode``, :class:`~inagg.models.job.Mode`) decides
    the worker: Mode.UC a UC :class:`~inagg.host.worker.Worker` with its own
    timers; Modes I, II and III (:data:`~inagg.host.rc_worker.RC_MODES`) an
    :class:`~inagg.host.rc_worker.RcWorker`, one RC queue pair whose ACK
    timeout is ``timing.timeout`` and retry count ``timing.tries - 1``. The
    functions are the same; where a UC group raises
    :class:`~inagg.host.worker.ChunkTimeoutError`, an RC group raises
    :class:`~inagg.host.rc_worker.RcRetryError` (also a ``TimeoutError``)
    when its QP runs out of retries. Every mode runs every collective. An RC
    queue pair starts its PSNs and chunks at 0, so ``first_chunk`` must be 0
    there, and ``accept_zero_icrc`` (a UC Tofino switch) False.

    After a call, an RC group that others still wait on for ACKs (Modes I
    and III: every rank that takes results; Mode II: Reduce's root rank and
    Broadcast's other ranks) keeps answering in the background, as a NIC's
    responder does, until its next call starts, until :meth:`close`, or
    until ``timing.timeout * timing.tries`` seconds pass without a frame
    (:func:`run` says how that must relate to the switch's ``hop_timeout``).
    Close a group (or use it as a context manager) before its port; one
    thread at a time calls it.
    """

    def __init__(self, switch: SwitchSpec, job: JobSpec, rank: int, port: Port, *, timing: Timing | None = None,
                 first_chunk: int = 0, accept_zero_icrc: bool = False, tree_rank: int | None = None):
        self.switch, self.job, self.rank, self.port = switch, job, rank, port
        # Called with a ChunkTimeoutError, returns its cause when it can tell one (join() over a service does).
        self.diagnose: Callable[[ChunkTimeoutError], str | None] | None = None
        self.index = rank if tree_rank is None else tree_rank
        if job.mode in RC_MODES:
            if first_chunk or accept_zero_icrc:
                raise ValueError(f"mode {job.mode.value} runs over an RC queue pair, whose PSNs start at 0: "
                                 "first_chunk must be 0 and accept_zero_icrc False")
            self.worker: Worker | RcWorker = RcWorker(switch, job, rank, timing=timing)
        else:
            self.worker = collective_worker(switch, job, rank, timing=timing, first_chunk=first_chunk,
                                            accept_zero_icrc=accept_zero_icrc)
        self.last_exponent: int | None = None
        # Frames of the next call that came while the last one was still answering (run() takes them first).
        self.early: list[bytes] = []
        # The between-calls responder while it runs (its thread and the event that stops it), and the error
        # that ended it, which the next call raises.
        self._responder: tuple[threading.Thread, threading.Event] | None = None
        self._responder_error: Exception | None = None

    @property
    def answering(self) -> bool:
        """True while the group answers between calls (a thread of its own holds the port and the worker)."""
        return self._responder is not None and self._responder[0].is_alive()

    def close(self) -> None:
        """Stop answering between calls and wait until the responder has let go of the port and the worker.

        Idempotent; the port stays open (its owner closes it, after this). An error the responder met is
        dropped with it: the group is done."""
        self._hand_over()
        self._responder_error = None

    def __enter__(self) -> "Group":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _hand_over(self) -> None:
        """Stop the responder and join it: from then on the caller's thread alone touches the worker and port."""
        if self._responder is not None:
            thread, stop = self._responder
            stop.set()
            thread.join()
            self._responder = None

    def _answer_between_calls(self, quiet: float, clock: Callable[[], float]) -> None:
        stop = threading.Event()
        thread = threading.Thread(target=self._answer_late, args=(stop, quiet, clock), daemon=True,
                                  name=f"inagg-responder-job{self.job.job}-rank{self.rank}")
        self._responder = thread, stop
        thread.start()

    def _answer_late(self, stop: threading.Event, quiet: float, clock: Callable[[], float]) -> None:
        """The responder's thread: ACK the results the port brings again until ``stop`` is set, ``quiet``
        seconds pass without a frame, or a frame of the next call comes (kept in :attr:`early`)."""
        try:
            heard = clock()
            while not stop.is_set() and (left := heard + quiet - clock()) > 0:
                frame = self.port.recv(min(left, RESPONDER_POLL))
                if frame is None:
                    continue
                heard = clock()
                if (acks := self.worker.answer_late(heard, frame)) is None:
                    self.early.append(frame)
                    return
                for f in acks:
                    self.port.send(f)
        except Exception as e:  # a port that failed, or a QP in error: the next call raises it
            self._responder_error = e

    @property
    def size(self) -> int:
        """Ranks in the job (over the whole tree)."""
        return self.job.ranks


def allreduce(array: np.ndarray, group: Group, *, clock: Callable[[], float] = time.monotonic) -> np.ndarray:
    """The element-wise sum of ``array`` over every rank of ``group``'s job, as float32 of the same shape.

    Raises ``TypeError`` for a non-float32 array, ``ValueError`` for NaN or
    infinity, :class:`~inagg.host.worker.LengthMismatchError` when the ranks
    passed different sizes, :class:`~inagg.host.worker.ChunkTimeoutError`
    (naming the chunk and the worker) when the switch does not answer, and
    :class:`~inagg.host.worker.SaturatedResultError` when a P4 switch keeps
    saturating lanes after the call was resent at smaller scales. A group
    of Mode I, II or III raises :class:`~inagg.host.rc_worker.RcRetryError`
    (also a ``TimeoutError``) where a UC group raises ``ChunkTimeoutError``
    (:func:`run` says when).
    """
    a = np.asarray(array)
    if a.dtype != np.float32:
        raise TypeError(f"allreduce takes a float32 array, not {a.dtype}")
    op = run(AllReduce(group.worker, a.ravel()), group, clock=clock)
    group.last_exponent = op.exponent
    return op.result().reshape(a.shape)


def reduce(array: np.ndarray, group: Group, *, amax: float,
           clock: Callable[[], float] = time.monotonic) -> np.ndarray | None:
    """The sum of ``array`` over the ranks on the job's root rank (None on the others).

    ``amax`` bounds ``|x|`` on every rank and is the same everywhere
    (:class:`~inagg.host.collectives.Reduce` says why); larger values are
    refused with ``ValueError`` before anything is sent.

    Errors as :func:`allreduce`'s (``LengthMismatchError`` when the ranks' lengths differ).
    """
    a = np.asarray(array)
    out = run(Reduce(group.worker, a.ravel(), amax=amax, rank=group.index), group, clock=clock).result()
    return None if out is None else out.reshape(a.shape)


def broadcast(array: np.ndarray, group: Group, *, clock: Callable[[], float] = time.monotonic) -> np.ndarray:
    """The root rank's ``array``, bit for bit, on every rank; the others pass an array of the same shape.

    Errors as :func:`allreduce`'s (``LengthMismatchError`` when the ranks' lengths differ).
    """
    a = np.asarray(array)
    return run(Broadcast(group.worker, a.ravel(), rank=group.index), group, clock=clock).result().reshape(a.shape)


def barrier(group: Group, *, clock: Callable[[], float] = time.monotonic) -> None:
    """Return when every rank of the job has called it.

    Raises ``ChunkTimeoutError`` (UC) or ``RcRetryError`` (Modes I, II, III) when a rank or the switch does not
    answer.
    """
    run(Barrier(group.worker, rank=group.index), group, clock=clock)


def reduce_scatter(array: np.ndarray, group: Group, *, clock: Callable[[], float] = time.monotonic) -> np.ndarray:
    """This rank's part (``numpy.array_split`` of the flat sum into ``group.size`` parts) of the sum over the ranks.

    Errors as :func:`allreduce`'s (``LengthMismatchError`` when the ranks' lengths differ).
    """
    a = np.asarray(array)
    op = run(ReduceScatter(group.worker, a.ravel(), rank=group.index), group, clock=clock)
    group.last_exponent = op.exponent
    return op.result()


def allgather(array: np.ndarray, group: Group, *, clock: Callable[[], float] = time.monotonic) -> np.ndarray:
    """Every rank's flat ``array`` (all of one length), concatenated in rank order, bit for bit.

    Errors as :func:`allreduce`'s (``LengthMismatchError`` when the ranks' lengths differ).
    """
    return run(AllGather(group.worker, np.asarray(array).ravel(), rank=group.index), group, clock=clock).result()


DRAIN = 256
"""Frames :func:`run` hands an operation at most at once: one that arrived and those queued behind it."""

RESPONDER_POLL = 2e-3
"""Seconds the between-calls responder waits on its port at most before it looks whether the next call wants
the port: the longest a call waits for the responder to hand over. No :class:`Port` can be woken from
``recv``, so this trades that wait (1 ms on average: small beside a call's round trips through a Python host)
against the idle responder's wake-ups: 500 a second, about 50 us of CPU each on a memory fabric's port, 2 %
of a core per group for the ``timing.timeout * timing.tries`` seconds it may run (1 ms: 3 %, 5 ms: 1 %)."""


def run(op, group: Group, *, clock: Callable[[], float] = time.monotonic):
    """Drive the sans-IO operation ``op`` (``start``, ``receive_batch``, ``on_timer``, ``deadline``, ``done``) to its end.

    ``op`` works on ``group.worker``; its frames go through ``group.port``. A frame that arrives
    goes to ``op`` with those already queued behind it (up to :data:`DRAIN`), in one batch. Returns ``op``.
    A :class:`~inagg.host.worker.ChunkTimeoutError` carries the cause
    ``group.diagnose`` finds, when the group has one.

    An RC queue pair whose chunks are all ACKed has no timer left, yet in
    Modes I and III (the switch ACKs chunks itself) its results may never
    come when another rank is missing: after ``timing.timeout * timing.tries``
    seconds without a frame, the time its retries would take, the call
    raises :class:`~inagg.host.rc_worker.RcRetryError` naming the chunk.
    RNR NAKs keep a timer armed, so that rule does not see a Mode I switch
    that keeps refusing a chunk because another rank is missing: the
    worker itself gives up on it after the same time without progress
    (:meth:`RcWorker.receive <inagg.host.rc_worker.RcWorker.receive>`).

    A NIC's responder answers at any time, not only during a call. When
    someone still waits on this rank's ACKs (``RcWorker.answers_between_calls``:
    the switch's result requester in Modes I and III, other ranks in Mode
    II), the call returns at once and leaves a thread answering on
    ``group.port``: a result that comes again because its ACK was lost is
    ACKed again. It ends when the group's next call starts (which waits up
    to :data:`RESPONDER_POLL` for it, then takes first the frame of its own
    that the responder may have kept in ``group.early``), on
    :meth:`Group.close`, or after ``timing.timeout * timing.tries`` seconds
    without a frame. That quiet time must outlast every retransmission of
    the last result, lost ones included, so keep it at least the retry time
    of whoever waits: in Mode I ``(RESULT_RETRIES + 1) * hop_timeout`` of the
    switch (8 hop timeouts; else a responder that heard nothing while
    resends in a row were lost stops before the switch does, whose result
    QP then goes to error and fails the job's next call with
    ``RcRetryError``); in Mode II the waiting ranks' ``timeout * tries``,
    which holds when every rank has the same ``timing``. Mode III's switch
    resends without limit, so there a responder that stops early costs
    resends until the next call, no error. An error the responder met (a
    port that failed) is raised by the next call.
    """
    group._hand_over()
    if (error := group._responder_error) is not None:
        group._responder_error = None
        raise error
    worker = group.worker
    quiet = worker.patience if isinstance(worker, RcWorker) else None
    early, group.early = group.early, []

    def silence() -> RcRetryError:
        return RcRetryError(f"job {worker.job.job} worker {worker.rank}: every chunk ACKed but no result for "
                            f"chunk {worker.waiting} in {quiet:g} s (another worker of the job is missing, or "
                            "the switch lost the job)")

    # An RC QP is one worker over every call: a frame drained behind the last one this call needs may be the
    # next call's, so it takes its frames one at a time (its receive_batch is one frame after the other anyway).
    drive(op, group.port, clock=clock, diagnose=group.diagnose, early=early, quiet=quiet, silence=silence,
          drain=DRAIN if quiet is None else 1)
    if quiet is not None and worker.answers_between_calls:
        group._answer_between_calls(quiet, clock)
    return op


def drive(op, port: Port, *, clock: Callable[[], float] = time.monotonic,
          diagnose: Callable[[ChunkTimeoutError], str | None] | None = None, early: list[bytes] | None = None,
          quiet: float | None = None, silence: Callable[[], Exception] | None = None, drain: int = DRAIN):
    """Drive the sans-IO endpoint ``op`` to its end over ``port`` (what :func:`run` does for a group's
    operation); ``diagnose`` as :attr:`Group.diagnose`. Returns ``op``.

    ``early``: frames that came before the call, handed to ``op`` first. ``quiet``: while ``op`` has no
    timer armed, the seconds without a frame after which ``silence()`` is raised (None: wait on). ``drain``:
    the most frames handed over in one batch.
    """
    send = _sender(port)
    send(list(op.start(clock())))
    early = list(early or ())

    def recv(timeout: float) -> bytes | None:
        return early.pop(0) if early else port.recv(timeout)

    heard = clock()
    while not op.done:
        deadline = op.deadline
        if deadline is None:
            deadline = heard + quiet if quiet is not None else clock() + 1.0
        frame = recv(max(0.0, deadline - clock()))
        now = clock()
        frames = [] if frame is None else [frame]
        while frames and len(frames) < drain and (more := recv(0.0)) is not None:
            frames.append(more)
        out = []
        if frames:
            heard = now
            out = op.receive_batch(now, frames)
        if not op.done and (d := op.deadline) is not None and d <= now:
            try:
                out += op.on_timer(now)
            except ChunkTimeoutError as e:
                if diagnose is None or (cause := diagnose(e)) is None:
                    raise
                raise ChunkTimeoutError(e.job, e.rank, e.chunk, e.tries, cause) from None
        elif not op.done and d is None and quiet is not None and now - heard >= quiet:
            raise silence()
        if out:
            send(out)
    return op


def _sender(port: Port) -> Callable[[list[bytes]], None]:
    """What sends a list of frames on ``port``: its ``send_batch``, or ``send`` once per frame."""
    batch = getattr(port, "send_batch", None)
    if batch is not None:
        return batch

    def each(frames: list[bytes]) -> None:
        for f in frames:
            port.send(f)
    return each


class _QueuePort:
    def __init__(self, fabric: "MemoryFabric", port: int):
        self._fabric, self._port = fabric, port
        self._q: queue.SimpleQueue[bytes] = queue.SimpleQueue()

    def send(self, frame: bytes) -> None:
        self._fabric._to_switch(self._port, frame)

    def recv(self, timeout: float) -> bytes | None:
        try:
            return self._q.get(timeout=timeout)
        except queue.Empty:
            return None


class MemoryFabric:
    """A switch and its ports in one process, in real time, for workers on threads.

    ``port(n)`` is the :class:`Port` of switch port ``n``. A frame sent on a
    port crosses the lossy link, the switch handles it in the sender's
    thread (under a lock), and its results cross the link to their ports'
    queues: every frame either way (UC contributions and results; RC
    chunks, results, ACKs and NAKs) meets the same faults. A timer thread
    releases the frames the link holds back and runs the switch's own
    timers (:attr:`~inagg.models.backend.DataPlane.deadline` and
    ``on_timer``: Mode III's hop timers, Mode I's result retransmission) on
    :func:`time.monotonic`, which the switch is told before every frame too.
    Give such a switch a ``hop_timeout`` longer than a loaded host takes to
    ACK (tens of milliseconds for Python threads), or its timers fire
    without loss and resend whole windows (``docs/results/api_modes.md``).
    """

    def __init__(self, switch, *, faults: Faults | None = None, seed: int = 0):
        self.switch = switch
        self._link = LossyLink(faults, seed)
        self._lock = threading.Lock()
        self._ports: dict[int, _QueuePort] = {}
        self._held = HeldFrames()
        self._wake = threading.Condition(self._lock)
        self._closed = False
        self._switch_due: float | None = None  # the switch's deadline the timer thread waits for
        self._timer = threading.Thread(target=self._run_timers, daemon=True, name="inagg-fabric-timer")
        self._timer.start()

    @property
    def link_stats(self) -> dict:
        return dict(self._link.stats)

    def port(self, n: int) -> Port:
        if n not in self._ports:
            self._ports[n] = _QueuePort(self, n)
        return self._ports[n]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._wake.notify()
        self._timer.join()

    def __enter__(self) -> "MemoryFabric":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _to_switch(self, port: int, frame: bytes) -> None:
        with self._lock:
            self._cross(0, port, frame)

    def _cross(self, direction: int, port: int, frame: bytes) -> None:
        """Put a frame on the link (lock held); direction 0 is towards the switch."""
        for delay, f in self._link.transmit(frame):
            if delay:
                self._held.hold(delay, direction, port, f)
                self._wake.notify()
            else:
                self._arrive(direction, port, f)

    def _arrive(self, direction: int, port: int, frame: bytes) -> None:
        if direction == 0:
            for out_port, out in clocked_receive(self.switch, port, frame):
                self._cross(1, out_port, out)
            d = self.switch.deadline
            if d is not None and (self._switch_due is None or d < self._switch_due):
                self._wake.notify()  # a timer earlier than the one the timer thread waits for
        elif port in self._ports:
            self._ports[port]._q.put(frame)

    def _run_timers(self) -> None:
        """The timer thread: held frames when they are due, the switch's timers when they run out."""
        with self._lock:
            while not self._closed:
                now = time.monotonic()
                for direction, port, f in self._held.due(now):
                    self._arrive(direction, port, f)
                d = self.switch.deadline
                if d is not None and d <= now:
                    for port, f in self.switch.on_timer(now):
                        self._cross(1, port, f)
                    d = self.switch.deadline
                self._switch_due = d
                wait = idle_wait(self._held, self.switch, math.inf, now)
                self._wake.wait(None if wait == math.inf else wait)
