"""Explicit-state model checking of the sans-IO worker protocol with the model switch.

The checker runs the real code -- :class:`~inagg.host.worker.Worker` (UC
mode) or :class:`~inagg.host.rc_worker.RcWorker` (EPIC's Modes I, II and III)
and :class:`~inagg.models.switch.ModelSwitch`, exchanging real frames -- and
explores every interleaving within a small :class:`Scope`, after EPIC's TLA+
checks of its Modes II and III (Mode I too):

* Every frame in flight may be delivered next, in any order (reordering is
  therefore always on).
* A fault may hit any frame in flight -- lost, or duplicated -- at most one
  per timeout round (between two advances of the clock), and at most
  ``faults`` in a run.
* Time is discrete: frames take no time, and the clock advances to the next
  timer (a worker's, or the Mode III switch's result timer) when nothing is
  in flight (timeouts are longer than a round trip). With ``spurious`` it
  may also advance while frames are in flight, that many times per run: a
  timer that fires before the round trip it waits for ends, as an RTT
  estimate that is too low gives. Any timer that is due may fire at any
  point, also between deliveries.

Every explored run must end -- no frame in flight, no timer armed -- with
every worker holding the exact aggregate of every chunk, and no worker may
give up (:class:`~inagg.host.worker.ChunkTimeoutError`). The state graph is
acyclic (each step consumes a frame or advances a send counter or the
clock), so "no state without a successor other than a correct final state"
means every run terminates correctly.

States that differ only in the switch's counters are merged (counters do
not steer the switch), and in the UC mode also states that differ only in
the PSNs of results: the UC worker ignores them (``docs/protocol.md``
section 1.4). RC endpoints do not, so the RC modes keep them.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections import Counter as Tally, deque
from dataclasses import dataclass

import numpy as np

from inagg.models import arith, rc, wire
from inagg.models.frame import CONTRIBUTION, layout
from inagg.models.job import Mode
from inagg.models.modes import AugmentedJob
from inagg.models.protocol import RESULT_OPCODES, Opcode
from inagg.models.switch import ModelSwitch, Slot
from inagg.models.terminated import TerminatedJob

from inagg.host.controller import Controller, plan
from inagg.host.rc_worker import RC_MODES, RcWorker
from inagg.host.worker import ProtocolError, Timing, Worker

__all__ = ["Scope", "CheckResult", "Violation", "check"]

_TO_SWITCH, _TO_HOST = 0, 1
# The result PSN and the ICRC (which covers it) are masked in state keys of the UC mode.
_PSN = slice(51, 54)
_OPCODE = CONTRIBUTION.span("bth.opcode")[0]
_AETH = layout(Opcode.RC_ACK).offset("aeth")


class Violation(AssertionError):
    """A reachable state breaks the protocol's guarantees; the message holds the trace, ``states`` how many
    distinct states the search had reached when it found the bad one."""

    states: int | None = None


@dataclass(frozen=True)
class Scope:
    """What the checker explores.

    ``workers`` in one job, ``chunks`` chunks each, ``window`` chunks
    outstanding (the job region is ``2 * window`` slots), ``faults``
    losses or duplications per run. With ``promote`` one lane overflows
    INT32 so the results go out as FP32 (2 workers: the promoted sum does
    not depend on arrival order). ``mode`` is the job's
    :class:`~inagg.models.job.Mode`: UC, TERMINATED, TRANSLATED or AUGMENTED.
    With ``stray`` (UC only) a contribution of worker 0 for chunk ``2**31``,
    no chunk of this run, is in flight from the start, as a stray or hostile
    frame would be: it may take the slot of chunk 0 at any point, and the
    run must still end exact (``docs/protocol.md`` section 3, "Liveness").
    ``spurious`` times per run the clock may jump to the next timer with
    frames still in flight (a retransmission timeout shorter than the round
    trip: a resend races its original).
    """

    workers: int = 2
    chunks: int = 3
    window: int = 2
    faults: int = 1
    promote: bool = False
    mode: Mode = Mode.UC
    stray: bool = False
    spurious: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.workers, int) or not 1 <= self.workers <= 4:
            raise ValueError(f"workers must be an integer in 1..4, not {self.workers!r}")
        if not isinstance(self.chunks, int) or not 1 <= self.chunks <= 8:
            raise ValueError(f"chunks must be an integer in 1..8, not {self.chunks!r}")
        if not isinstance(self.faults, int) or not 0 <= self.faults <= 4:
            raise ValueError(f"faults must be an integer in 0..4, not {self.faults!r}")
        if self.promote and self.workers != 2:
            raise ValueError("promote needs exactly 2 workers (the FP32 sum of more depends on arrival order)")
        if self.mode is not Mode.UC and self.mode not in RC_MODES:
            raise ValueError(f"mode must be UC, TERMINATED, TRANSLATED or AUGMENTED, not {self.mode!r}")
        if not isinstance(self.spurious, int) or not 0 <= self.spurious <= 3:
            raise ValueError(f"spurious must be an integer in 0..3, not {self.spurious!r}")
        if self.stray and self.mode is not Mode.UC:
            raise ValueError("stray needs the UC mode (the RC modes check the PSN of every contribution)")


@dataclass(frozen=True)
class CheckResult:
    """What an exploration covered."""

    scope: Scope
    states: int
    transitions: int
    final_states: int
    max_depth: int
    seconds: float


class _State:
    """One state: the workers and the switch are shared with the parent state until a step writes them
    (:meth:`worker`, :meth:`own_switch` fork them first), so a step copies only what it changes; ``prints``
    caches each one's part of the :meth:`key`, dropped when it is written or the clock moves."""

    __slots__ = ("workers", "switch", "flight", "clock", "faults", "fault_this_round", "depth", "spurious", "prints")

    def clone(self) -> "_State":
        s = _State()
        s.workers, s.switch, s.prints = list(self.workers), self.switch, list(self.prints)
        s.flight, s.clock, s.faults = self.flight, self.clock, self.faults
        s.fault_this_round, s.depth, s.spurious = self.fault_this_round, self.depth + 1, self.spurious
        return s

    def worker(self, r: int):
        """Worker ``r``, this state's own copy to change."""
        w = self.workers[r] = self.workers[r].fork()
        self.prints[r] = None
        return w

    def own_switch(self, i: int) -> ModelSwitch:
        """The switch (``i`` is 0), this state's own copy to change, its clock set to the state's."""
        self.switch = _fork_switch(self.switch)
        self.switch.now = self.clock
        self.prints[-1] = None
        return self.switch

    def key(self) -> tuple:
        for r, w in enumerate(self.workers):
            if self.prints[r] is None:
                self.prints[r] = w.fingerprint(self.clock)
        if self.prints[-1] is None:
            self.switch.now = self.clock  # the switch's timers enter the key relative to the clock, as the workers'
            sw = tuple((int(s.state), s.chunk, s.bitmap, s.count, s.first, s.lanes.words.tobytes(),
                        s.lanes.promoted.tobytes()) for s in self.switch.fast)
            self.prints[-1] = (sw, tuple(m.state() for m in self.switch.modes.values()))
        uc = not self.switch.modes
        flight = tuple(sorted((d, p, f[:_PSN.start] + f[_PSN.stop:-4] if d == _TO_HOST and uc else f)
                              for d, p, f in self.flight))
        return (tuple(self.prints), flight, self.faults, self.fault_this_round, self.spurious)


def _stray(frame: bytes, chunk_bytes: int) -> bytes:
    """Contribution ``frame`` (of chunk 0) as the contribution of chunk ``2**31``: far from every chunk of the run."""
    r = wire.parse(frame)
    return wire.build(eth_dst=r.eth_dst, eth_src=r.eth_src, ip_src=r.ip_src, ip_dst=r.ip_dst, udp_sport=r.udp_sport,
                      opcode=r.opcode, dest_qpn=r.dest_qpn, psn=r.psn, va=(1 << 31) * chunk_bytes, rkey=r.rkey,
                      payload=r.payload)


def _fork_switch(sw: ModelSwitch) -> ModelSwitch:
    """A copy of a model switch without exception path: its slots, result PSNs and counters are its state."""
    t = copy.copy(sw)
    t.fast = [Slot(s.lanes.copy(), s.state, s.job, s.chunk, s.bitmap, s.count, s.first) for s in sw.fast]
    t.jobs = {k: dataclasses.replace(j, result_psn=list(j.result_psn)) for k, j in sw.jobs.items()}
    t.counters = dict(sw.counters)
    t.tree_counters = dict(sw.tree_counters)
    t.resent = Tally(sw.resent)
    t.modes = {k: m.fork(t) for k, m in sw.modes.items()}
    return t


def _lanes(scope: Scope, lanes: int) -> list[np.ndarray]:
    data = []
    for r in range(scope.workers):
        x = (np.arange(scope.chunks * lanes, dtype=np.int32).reshape(scope.chunks, lanes) % 7 + 10 * r + 1)
        if scope.promote:
            x[:, 0] = 2**31 - 1 - r  # lane 0 overflows on the second contribution
        data.append(x.astype(np.int32))
    return data


def check(scope: Scope = Scope(), *, timing: Timing | None = None, max_states: int = 2_000_000) -> CheckResult:
    """Explore every run of ``scope``; raises :class:`Violation` with a trace on the first bad state.

    ``timing`` defaults to more tries than the scope has faults and spurious
    timeouts, so that a worker giving up is a violation, not a consequence
    of them, and to an estimated timeout whose floor (0.5) is below the
    first (1.0): round trips take no time here, so after the first result
    every chunk's first timer is the floor's (``docs/protocol.md`` section 3.1).
    """
    start = time.perf_counter()
    p = plan([scope.workers], window=scope.window, chunk_bytes=256)
    p = dataclasses.replace(p, jobs=(dataclasses.replace(p.jobs[0], mode=scope.mode),))
    job = p.jobs[0]
    timing = timing or Timing(timeout=1.0, backoff=2.0, max_timeout=4.0, tries=scope.faults + scope.spurious + 3,
                              min_timeout=0.5)
    data = _lanes(scope, p.switch.lanes)
    rows = [np.stack([d[c] for d in data]) for c in range(scope.chunks)]
    expect = np.stack([arith.aggregate(r) for r in rows])

    init = _State()
    # The switch's result timer (Mode III) is shorter than the workers': it repairs a lost result first.
    init.switch = ModelSwitch(p.switch, hop_timeout=timing.timeout / 2)
    Controller(init.switch, p).configure()
    kind = RcWorker if scope.mode in RC_MODES else Worker
    init.workers = [kind(p.switch, job, r, timing=timing) for r in range(scope.workers)]
    init.flight = tuple(sorted((_TO_SWITCH, r, f) for r, w in enumerate(init.workers)
                               for f in w.submit(0.0, data[r])))
    if scope.stray:
        init.flight = tuple(sorted(init.flight + ((_TO_SWITCH, 0, _stray(init.flight[0][2], p.switch.chunk_bytes)),)))
    init.clock, init.faults, init.fault_this_round, init.depth, init.spurious = 0.0, 0, False, 0, 0
    init.prints = [None] * (scope.workers + 1)
    counts = _explore(init, lambda s, trace: _successors(s, scope, trace), expect, max_states,
                      invariant=_check_results_held)
    return CheckResult(scope, *counts, time.perf_counter() - start)


def _explore(init, successors, expect: np.ndarray | list[np.ndarray], max_states: int, invariant=None) -> tuple[int, int, int, int]:
    """Breadth-first search from ``init`` over ``successors(state, trace)``; (states, transitions, final
    states, depth). ``invariant(state, trace)``, when given, checks every state; a state without
    successors must be a correct final state (:func:`_check_final`)."""
    seen = {init.key()}
    frontier = deque([(init, ())])
    transitions = finals = max_depth = 0
    try:
        while frontier:
            s, trace = frontier.popleft()
            max_depth = max(max_depth, s.depth)
            if invariant is not None:
                invariant(s, trace)
            succ = list(successors(s, trace))
            if not succ:
                _check_final(s, expect, trace)
                finals += 1
            for t, label in succ:
                transitions += 1
                k = t.key()
                if k not in seen:
                    seen.add(k)
                    if len(seen) > max_states:
                        raise RuntimeError(f"more than {max_states} states: choose a smaller scope")
                    frontier.append((t, trace + (label,)))
    except Violation as e:
        e.states = len(seen)
        raise
    return len(seen), transitions, finals, max_depth


def _successors(s: _State, scope: Scope, trace: tuple):
    distinct = sorted(set(s.flight))
    for item in distinct:
        d, port, frame = item
        t = s.clone()
        t.flight = _remove(s.flight, item)
        if d == _TO_SWITCH:
            out = [(_TO_HOST, q, f) for q, f in t.own_switch(0).receive(port, frame)]
            label = f"switch <- w{port} {_describe(frame)}"
        else:
            out = [(_TO_SWITCH, port, f) for f in _guard(t.worker(port).receive, t.clock, frame, trace)]
            label = f"w{port} <- {_describe(frame)}"
        t.flight = tuple(sorted(t.flight + tuple(out)))
        yield t, label
        if s.faults < scope.faults and not s.fault_this_round:
            for kind in ("lose", "duplicate"):
                t = s.clone()
                t.flight = _remove(s.flight, item) if kind == "lose" else tuple(sorted(s.flight + (item,)))
                t.faults += 1
                t.fault_this_round = True
                yield t, f"{kind} {_describe(frame)} {'from' if d == _TO_SWITCH else 'to'} w{port}"
    yield from _clock(s, trace, lambda r, f: (_TO_SWITCH, r, f), lambda state: [state.switch],
                      lambda i, q, f: (_TO_HOST, q, f), spurious=scope.spurious)


def _push(flight: tuple, out) -> tuple:
    """``flight`` with the entries ``out`` added: a multiset, kept sorted."""
    return tuple(sorted(flight + tuple(out)))


def _clock(s, trace: tuple, sent, switches=lambda state: [], routed=None, push=_push, quiet=False, spurious=0):
    """The timer steps of state ``s``: a due timer fires (a worker's, or a switch's own: Mode III's
    timers), or the clock advances to the next one when nothing is in flight. ``sent(worker, frame)`` is
    the flight entry of a frame a worker sends; ``switches(state)`` lists a state's switches that may
    keep timers, and ``routed(i, port, frame)`` is the flight entry of a frame switch ``i`` sends;
    ``push(flight, entries)`` puts entries in flight. With ``quiet`` a due timer fires only when nothing
    is in flight (EPIC's checks retransmit so). Up to ``spurious`` times per run (counted in
    ``s.spurious``) the clock also advances with frames in flight: a timer fires before its round trip ends."""
    if quiet and s.flight:
        return
    due = [r for r, w in enumerate(s.workers) if (dl := w.deadline) is not None and dl <= s.clock]
    for r in due:
        t = s.clone()
        t.flight = push(t.flight, [sent(r, f) for f in _guard(t.worker(r).on_timer, t.clock, None, trace)])
        yield t, f"w{r} timer at {s.clock:g}"
    switch_dls = [sw.deadline for sw in switches(s)]
    switch_due = [i for i, dl in enumerate(switch_dls) if dl is not None and dl <= s.clock]
    for i in switch_due:
        t = s.clone()
        t.flight = push(t.flight, [routed(i, q, f) for q, f in t.own_switch(i).on_timer(t.clock)])
        yield t, f"switch {i} timer at {s.clock:g}"
    early = spurious > 0 and bool(s.flight) and s.spurious < spurious
    if (early or not s.flight) and not due and not switch_due:
        deadlines = [dl for w in s.workers if (dl := w.deadline) is not None]
        deadlines += [dl for dl in switch_dls if dl is not None]
        if deadlines:
            t = s.clone()
            t.depth -= 1
            t.clock = min(deadlines)
            t.prints = [None] * len(t.prints)  # the timers of every part enter its print relative to the clock
            t.fault_this_round = False
            if early:
                t.spurious += 1
            yield t, f"clock -> {t.clock:g}{' with frames in flight' if early else ''}"


def _guard(fn, now, frame, trace):
    try:
        return fn(now) if frame is None else fn(now, frame)
    except ProtocolError as e:
        raise Violation(f"{e}\ntrace:\n  " + "\n  ".join(trace)) from e


def _describe(frame: bytes) -> str:
    """A frame as a trace shows it: its kind and PSN, read where every frame of the protocol holds them."""
    op, psn = frame[_OPCODE], int.from_bytes(frame[_PSN], "big")
    if op == Opcode.RC_ACK:
        return f"{'NAK' if rc.Syndrome.is_nak(frame[_AETH]) else 'ACK'} PSN {psn}"
    return f"{'result' if op in RESULT_OPCODES else 'contribution'} PSN {psn}"


def _remove(flight: tuple, item: tuple) -> tuple:
    i = flight.index(item)
    return flight[:i] + flight[i + 1:]


def _check_results_held(s: _State, trace: tuple) -> None:
    """Modes I and III: every result a worker still lacks is held by the switch until that worker ACKs it.

    This is what makes a lost result recoverable (one still in flight may
    yet be lost); checking it in every state finds a switch that recycles a
    result too early where it happens, not only at the end of the run.
    """
    for m in s.switch.modes.values():
        for r, w in enumerate(s.workers):
            q = w.responder.expected
            if isinstance(m, TerminatedJob):
                lost = _terminated_lost(m, r, q)
            elif isinstance(m, AugmentedJob):
                lost = []
                while rc.psn_diff(q, m.next_result) < 0 and not lost:
                    e = m.entries[q % len(m.entries)]
                    lost = [q] if e.psn != q or not e.held else []
                    q = rc.psn_add(q, 1)
            else:
                continue
            if lost:
                raise Violation(f"the switch no longer holds result PSN {lost[0]}, which worker {r} lacks\ntrace:\n  "
                                + "\n  ".join(trace))


def _terminated_lost(m: TerminatedJob, w: int, expected: int) -> list[int]:
    """Mode I: the PSNs of the results child ``w`` lacks (from its responder's ``expected`` on) whose slot the
    switch freed: its requester of ``w``'s results keeps their headers, the lanes are in the slots only."""
    sent = m.requesters[w]
    return [p.psn for p in (sent.unacked if sent is not None else ())
            if rc.psn_diff(p.psn, expected) >= 0 and m.holding(p) is None]


def _values(words: np.ndarray, fp32: np.ndarray) -> np.ndarray:
    """Result words as the values they stand for: float32 when a chunk was promoted, else int32."""
    if fp32.any():
        return np.where(fp32[:, None], words.view(np.float32), words.view(np.int32).astype(np.float32))
    return words.view(np.int32)


def _check_final(s: _State, expect: np.ndarray | list[np.ndarray], trace: tuple) -> None:
    """Every worker done with ``expect`` (one array for all, or a list of one per worker)."""
    for r, w in enumerate(s.workers):
        want = expect[r] if isinstance(expect, list) else expect
        if not w.done:
            raise Violation(f"run ends with worker {r} missing results\ntrace:\n  " + "\n  ".join(trace))
        words, fp32, _ = w.results()
        got = _values(words, fp32)
        if fp32.any() != (want.dtype == np.float32) or not np.array_equal(got, want):
            raise Violation(f"worker {r} ends with a wrong aggregate\ntrace:\n  " + "\n  ".join(trace))
