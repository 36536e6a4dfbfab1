"""Explicit-state model checking of the UC protocol and of EPIC's Modes I, II and III on a tree of model switches.

:mod:`inagg.host.checker` grown to EPIC's IncTree: the real worker of every
rank (:class:`~inagg.host.worker.Worker` in the UC mode,
:class:`~inagg.host.rc_worker.RcWorker` in Modes I, II and III) and the real
:class:`~inagg.models.switch.ModelSwitch` of every switch of a
:class:`~inagg.models.tree.Tree`, exchanging real frames, explored over
every interleaving within a :class:`TreeScope` with the rules of that
checker: any frame in flight on any hop may be delivered next (with
``reorder`` off, as EPIC checks by default, each link delivers its frames in
the order they were sent, and any link may go next); a frame may be lost,
at most one per timeout round and at most ``faults`` per run; a frame may
be duplicated on its hop, at most ``duplicates`` per run in any round (the
copy follows its original on an in-order link); the clock
advances to the next timer (a rank's, or a Mode I or III switch's) only when
nothing is in flight. A due timer fires at any point, or (``quiet``, as
EPIC's checks retransmit) only when nothing is in flight.

In Modes I and III every state must also keep, at every switch, the
result of every PSN that a child still lacks (Mode III: in a slot that is
not free, or in flight to that child; Mode I: in the slot its requester
reads it from): the rule "free a result only when the slowest child ACKed
it", checked where it could break rather than only at the end of a run.
In Modes I, II and III every result a rank has taken must already be the
exact one.

Every explored run must end with every rank holding the exact sum of every
chunk (Reduce: the root rank; Broadcast: the root rank's chunks on every
rank, the others holding nothing) and no rank giving up. As there, the state graph is acyclic, so this
also proves that every run terminates. States that differ only in
counters are merged, and in the UC mode also states that differ only in
result PSNs (which count resends there; RC endpoints read them).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import numpy as np

from inagg.models import arith
from inagg.models.frame import Opcode
from inagg.models.job import Collective, Mode
from inagg.models.modes import AugmentedJob
from inagg.models.rc import psn_add, psn_diff
from inagg.models.switch import ModelSwitch
from inagg.models.terminated import TerminatedJob
from inagg.models.tree import Tree

from inagg.host.checker import (
    _OPCODE, _PSN, CheckResult, Violation, _clock, _describe, _explore, _fork_switch, _guard, _push, _remove,
    _terminated_lost, _values,
)
from inagg.host.controller import TreeController, plan_tree
from inagg.host.rc_worker import RC_MODES, RcWorker
from inagg.host.worker import Timing, Worker

__all__ = ["TreeScope", "check_tree"]

_RESULT_OPCODE = Opcode.UC_RDMA_WRITE_ONLY_IMM  # a UC result (its PSN is masked in state keys)
# Mode I's invariant reads the PSN a rank expects next, and a result delivered to the rank advances it: such a
# step could hide a result the switch freed too early, so it is never reduced (Mode III's invariant counts the
# result in flight, so there no step can).
_HIDES = Mode.TERMINATED


@dataclass(frozen=True)
class TreeScope:
    """What :func:`check_tree` explores: the tree ``spec``, ``chunks`` per rank, ``window``, ``faults`` losses,
    the job's ``mode`` (UC, TERMINATED, TRANSLATED or AUGMENTED), whether links ``reorder`` frames, whether
    timers fire only when nothing is in flight (``quiet``), and in Modes I, II and III the ``collective`` (with
    its ``root`` rank for Reduce and Broadcast; Barrier, ReduceScatter and AllGather are AllReduces there)."""

    spec: str = "2x2"
    chunks: int = 1
    window: int = 1
    faults: int = 1
    mode: Mode = Mode.UC
    reorder: bool = True
    quiet: bool = False
    collective: Collective = Collective.ALLREDUCE
    root: int = 0
    duplicates: int = 0

    def __post_init__(self) -> None:
        tree = Tree.parse(self.spec)
        if tree.ranks > 4 or tree.depth > 3:
            raise ValueError(f"a checked tree has at most 4 ranks and depth 3, not {tree.ranks} and {tree.depth}")
        if not isinstance(self.chunks, int) or not 1 <= self.chunks <= 4:
            raise ValueError(f"chunks must be an integer in 1..4, not {self.chunks!r}")
        if not isinstance(self.window, int) or self.window < 1 or self.window & (self.window - 1):
            raise ValueError(f"window must be a power of two >= 1, not {self.window!r}")
        if not isinstance(self.faults, int) or not 0 <= self.faults <= 2:
            raise ValueError(f"faults must be an integer in 0..2, not {self.faults!r}")
        if not isinstance(self.duplicates, int) or not 0 <= self.duplicates <= 2:
            raise ValueError(f"duplicates must be an integer in 0..2, not {self.duplicates!r}")
        if not isinstance(self.mode, Mode):
            raise ValueError(f"mode must be a Mode (UC, TERMINATED, TRANSLATED or AUGMENTED), not {self.mode!r}")
        if self.collective not in (Collective.ALLREDUCE, Collective.REDUCE, Collective.BROADCAST):
            raise ValueError(f"collective must be ALLREDUCE, REDUCE or BROADCAST, not {self.collective!r}")
        if self.collective is not Collective.ALLREDUCE and self.mode is Mode.UC:
            raise ValueError(f"{self.collective.value} is checked in Modes I, II and III, not in mode uc")
        if not isinstance(self.root, int) or not 0 <= self.root < tree.ranks:
            raise ValueError(f"root must be a rank in 0..{tree.ranks - 1}, not {self.root!r}")


class _State:
    """One state, its ranks and switches shared with the parent state until a step writes them (as
    :class:`inagg.host.checker._State`: ``prints`` caches each one's part of the key).

    ``names``, one dict for every state of a run, numbers each distinct node summary and frame in
    flight in the order first seen; keys hold those numbers. A number stands for exactly one value,
    so two keys are equal exactly when the states' summaries are (no hashing away of states), and each
    summary is stored once however many states share it."""

    __slots__ = ("workers", "switches", "flight", "clock", "faults", "fault_this_round", "duplicates", "depth",
                 "prints", "names")

    def clone(self) -> "_State":
        s = _State()
        s.workers, s.switches, s.prints = list(self.workers), list(self.switches), list(self.prints)
        s.flight, s.clock, s.faults, s.duplicates = self.flight, self.clock, self.faults, self.duplicates
        s.fault_this_round, s.depth, s.names = self.fault_this_round, self.depth + 1, self.names
        return s

    def worker(self, r: int):
        """Rank ``r``'s worker, this state's own copy to change."""
        w = self.workers[r] = self.workers[r].fork()
        self.prints[r] = None
        return w

    def own_switch(self, i: int) -> ModelSwitch:
        """Switch ``i``, this state's own copy to change, its clock set to the state's."""
        sw = self.switches[i] = _fork_switch(self.switches[i])
        sw.now = self.clock
        self.prints[len(self.workers) + i] = None
        return sw

    def key(self) -> tuple:
        names = self.names
        for r, w in enumerate(self.workers):
            if self.prints[r] is None:
                self.prints[r] = names.setdefault(w.fingerprint(self.clock), len(names))
        for i, t in enumerate(self.switches, len(self.workers)):
            if self.prints[i] is None:
                t.now = self.clock  # Mode III timers enter the key relative to the clock, as the ranks'
                self.prints[i] = names.setdefault((tuple((int(s.state), s.chunk, s.bitmap, s.count,
                                                          s.lanes.words.tobytes()) for s in t.fast),
                                                   tuple(m.state() for m in t.modes.values())), len(names))
        # A link's queue keeps its order, numbered from its head (with reordering every frame is 0).
        head = {}
        for to, n, _ in self.flight:
            head.setdefault(to, n)
        flight = tuple(names.setdefault(e, len(names)) for e in sorted(
            (to, n - head[to], f[:_PSN.start] + f[_PSN.stop:-4] if f[_OPCODE] == _RESULT_OPCODE else f)
            for to, n, f in self.flight))
        return (tuple(self.prints), flight, self.faults, self.fault_this_round, self.duplicates)


def check_tree(scope: TreeScope = TreeScope(), *, timing: Timing | None = None,
               max_states: int = 2_000_000, reduce: bool = False) -> CheckResult:
    """Explore every run of ``scope``; raises :class:`~inagg.host.checker.Violation` with a trace on a bad state.

    With ``reduce`` the exploration skips interleavings that cannot change the verdict (partial-order
    reduction, :func:`_ample`): the same final states and violations, fewer states and transitions."""
    start = time.perf_counter()
    tp = plan_tree(scope.spec, window=scope.window, chunk_bytes=256, mode=scope.mode, collective=scope.collective,
                   root=scope.root)
    tree = tp.tree
    timing = timing or Timing(timeout=1.0, backoff=2.0, max_timeout=4.0, tries=scope.faults + 3)
    lanes = tp.plans[0].switch.lanes
    data = [(np.arange(scope.chunks * lanes, dtype=np.int32).reshape(scope.chunks, lanes) % 7 + 10 * r + 1)
            for r in range(tree.ranks)]
    expect = np.stack([arith.aggregate(np.stack([d[c] for d in data])) for c in range(scope.chunks)])
    if scope.collective is Collective.REDUCE:  # the sum on the root rank; nothing on the others
        expect = [expect if r == scope.root else np.zeros_like(expect) for r in range(tree.ranks)]
    elif scope.collective is Collective.BROADCAST:
        expect = [data[scope.root]] * tree.ranks

    init = _State()
    # A Mode III switch's timers are shorter than the ranks': the hop repairs a loss first.
    init.switches = [ModelSwitch(q.switch, hop_timeout=timing.timeout / 2) for q in tp.plans]
    TreeController(init.switches, tp).configure()
    kind = RcWorker if scope.mode in RC_MODES else Worker
    init.workers = []
    for r in range(tree.ranks):
        s, w = tp.rank(r)
        init.workers.append(kind(tp.plans[s].switch, tp.plans[s].jobs[0], w, timing=timing))
    push = _queue if not scope.reorder else lambda flight, out: _push(flight, ((to, 0, f) for to, f in out))
    init.flight = push((), [(("s", *tp.rank(r)), f) for r, w in enumerate(init.workers)
                            for f in w.submit(0.0, data[r])])
    init.clock, init.faults, init.fault_this_round, init.duplicates, init.depth = 0.0, 0, False, 0, 0
    init.prints, init.names = [None] * (len(init.workers) + len(init.switches)), {}
    expect_each = expect if isinstance(expect, list) else [expect] * tree.ranks

    def invariant(s: _State, trace: tuple) -> None:
        _check_results_held(s, tree, trace)
        if kind is RcWorker:
            _check_taken(s, expect_each, trace)

    counts = _explore(init, lambda s, trace: _successors(s, scope, tree, tp, push, trace, reduce), expect, max_states,
                      invariant=invariant)
    return CheckResult(scope, *counts, time.perf_counter() - start)


def _name(to: tuple) -> str:
    return f"s{to[1]}:{to[2]}" if to[0] == "s" else f"rank {to[1]}"


def _queue(flight: tuple, out) -> tuple:
    """``flight`` with the ``(to, frame)`` entries of ``out`` queued behind what is in flight to ``to``."""
    last: dict = {}
    for to, n, _ in flight:
        last[to] = max(last.get(to, -1), n)
    entries = []
    for to, f in out:
        last[to] = last.get(to, -1) + 1
        entries.append((to, last[to], f))
    return tuple(sorted(flight + tuple(entries)))


def _ample(s: _State, scope: TreeScope, heads: list):
    """The one delivery that stands for every interleaving of ``s`` (partial-order reduction), or None.

    A rank has one incoming link, so the frame at its head stays the only frame it can receive until it
    takes it; with links in order nothing else can touch that rank or that frame before it, so the
    delivery, with the loss and the duplication of that frame when allowed (:func:`_steps`), is a
    stubborn set: every other step commutes with each of them, and none disables the delivery (a loss
    elsewhere may disable this frame's loss, but only after it, which the set's condition D1 allows);
    exploring it alone keeps every final state (the graph is acyclic, so no cycle proviso is needed).
    Every invariant state found broken must stay broken through the steps the set puts off, or the set
    could hide it: Mode I's invariant reads each rank's expected result PSN, so there a delivered result
    is not reduced (an ACK or NAK is); Mode III's counts a result in flight to its child as held, and a
    wrong result a rank took stays to the final state, so no step mends either. ``docs/results/modes.md``
    gives the conditions and their checks."""
    if scope.reorder:
        return None
    for item in heads:
        to, _, frame = item
        if to[0] != "r" or (scope.mode is _HIDES and frame[_OPCODE] != Opcode.RC_ACK):
            continue
        if scope.quiet or (dl := s.workers[to[1]].deadline) is None or dl > s.clock:
            return item  # with timers at any time, the rank's own timer must not be due (it never falls due
            # before the clock moves, which waits for this frame)
    return None


def _switch_set(s: _State, scope: TreeScope, tree: Tree, heads: list) -> list | None:
    """Every delivery into a set of Mode II or III switches, which together stand for every interleaving of
    ``s``, or None.

    For a set ``S`` of switches, the steps of the head of every link into a switch of ``S`` (its
    delivery, loss and duplication, :func:`_steps`) form a stubborn set when every empty link into
    ``S`` from outside stays empty until ``S`` takes a frame, and no switch of ``S`` has a timer due: a
    sender can act only after a frame reaches it or its timer falls due, and every node that can is cut
    off from that sender by ``S`` (whose switches then act only through the set; no timer falls due
    before the clock moves, which waits for ``S``'s frames). Other steps then touch neither ``S`` nor the
    heads of its links (what they send lands behind a head), so they commute with the set and never
    disable it. No step mends a broken invariant (Mode II has none a switch enters; Mode III's counts a
    result in flight as held; a wrong result taken stays), so the set hides none. The set with the
    fewest deliveries is taken. ``docs/results/modes.md`` gives the conditions (C0-C3)."""
    if scope.mode not in (Mode.TRANSLATED, Mode.AUGMENTED) or scope.reorder:
        return None
    busy = {to[:2] for to, _, _ in heads}  # ("s", j) or ("r", r): a node with a frame to take
    timed = set()  # nodes with a timer due: they act without a frame (Mode III switches keep timers too)
    if not scope.quiet:
        timed = {("r", r) for r, w in enumerate(s.workers) if (dl := w.deadline) is not None and dl <= s.clock}
        timed |= {("s", i) for i, sw in enumerate(s.switches) if (dl := sw.deadline) is not None and dl <= s.clock}
        busy |= timed
    best = None
    links, neighbours = _topology(tree)
    for inside in _subsets(tree):
        into = [h for h in heads if h[0][:2] in inside]
        if not into or (best is not None and len(into) >= len(best)) or inside & timed:
            continue
        active, todo = set(), [n for n in busy if n not in inside]
        while todo:  # every node that may send before S takes a frame: reached from a busy one, not through S
            n = todo.pop()
            if n not in active:
                active.add(n)
                todo += [m for m in neighbours[n] if m not in inside]
        full = {h[0] for h in into}
        if all(("s", i, p) in full or far in inside or far not in active
               for _, i in inside for p, far in links[i]):
            best = into
    return best


def _node(child) -> tuple:
    return ("s" if child.switch else "r", child.index)


@functools.cache
def _topology(tree: Tree) -> tuple[list, dict]:
    """Per switch its ``(port, node at the far end)`` pairs, and per node (``("s", i)`` or ``("r", r)``) its
    neighbours: what :func:`_switch_set` walks in every state, computed once per tree."""
    links = [[(p, _node(tree.peer(i, p)[0])) for p in range(sw.ports)] for i, sw in enumerate(tree.switches)]
    neighbours = {("s", i): [far for _, far in ls] for i, ls in enumerate(links)}
    neighbours |= {("r", r): [("s", tree.leaf_of(r)[0])] for r in range(tree.ranks)}
    return links, neighbours


@functools.cache
def _subsets(tree: Tree) -> list[frozenset]:
    """Every non-empty set of the tree's switches, as nodes."""
    n = len(tree.switches)
    return [frozenset(("s", i) for i in range(n) if bits >> i & 1) for bits in range(1, 1 << n)]


def _successors(s: _State, scope: TreeScope, tree: Tree, tp, push, trace: tuple, reduce: bool = False):
    # Without reordering only the oldest frame on each link may arrive (or be lost) next.
    heads = sorted(set(s.flight)) if scope.reorder else [e for i, e in enumerate(s.flight)
                                                         if i == 0 or s.flight[i - 1][0] != e[0]]
    if reduce and (item := _ample(s, scope, heads)) is not None:
        yield from _steps(s, item, scope, tree, tp, push, trace)
        return
    if reduce and (into := _switch_set(s, scope, tree, heads)) is not None:
        for item in into:
            yield from _steps(s, item, scope, tree, tp, push, trace)
        return
    for item in heads:
        yield from _steps(s, item, scope, tree, tp, push, trace)
    # UC and Mode II switches keep no timers of their own; Mode III switches do.
    yield from _clock(s, trace, lambda r, f: (("s", *tp.rank(r)), f), lambda state: state.switches,
                      lambda i, port, f: _routed(tree, i, port, f), push, scope.quiet)


def _steps(s: _State, item: tuple, scope: TreeScope, tree: Tree, tp, push, trace: tuple):
    """The steps of the frame at a link's head: its delivery, its loss, its duplication (each when allowed)."""
    to, _, frame = item
    t = s.clone()
    t.flight = _remove(s.flight, item)
    if to[0] == "s":
        out = [_routed(tree, to[1], port, g) for port, g in t.own_switch(to[1]).receive(to[2], frame)]
    else:
        out = [(("s", *tp.rank(to[1])), g) for g in _guard(t.worker(to[1]).receive, t.clock, frame, trace)]
    t.flight = push(t.flight, out)
    yield t, f"{_name(to)} <- {_describe(frame)}"
    if s.faults < scope.faults and not s.fault_this_round:
        t = s.clone()
        t.flight = _remove(s.flight, item)
        t.faults += 1
        t.fault_this_round = True
        yield t, f"lose {_describe(frame)} to {_name(to)}"
    if s.duplicates < scope.duplicates:
        t = s.clone()
        t.flight = _push(s.flight, [item])  # the copy takes its original's place in the link's order
        t.duplicates += 1
        yield t, f"duplicate {_describe(frame)} to {_name(to)}"


def _check_taken(s: _State, expect: list[np.ndarray], trace: tuple) -> None:
    """Modes I, II and III: every result a rank has taken is already the exact one (module docstring).

    A result, once taken, stays to the end of the run, where the final check
    would find it wrong too: checked here, the trace ends where it went wrong."""
    for r, w in enumerate(s.workers):
        words, fp32 = w.taken()
        if not np.array_equal(_values(words, fp32), expect[r][:len(words)]):
            raise Violation(f"rank {r} took a wrong result for chunk {len(words) - 1}\ntrace:\n  " + "\n  ".join(trace))


def _check_results_held(s: _State, tree: Tree, trace: tuple) -> None:
    """Modes I and III: every result a child still lacks is still held by its switch (module docstring).

    A child rank lacks the results from its responder's expected PSN on, a
    child switch those from the PSN it expects from its parent on (Mode I:
    its responder's towards the parent). Mode I holds them in the slots its
    requester of that child reads; Mode III in slots that are not free, or a
    copy is on its way to the child (in flight on the hop to it): no step
    can then make a broken state whole again, which the partial-order
    reduction needs (``docs/results/modes.md``)."""
    onway = None
    for i, sw in enumerate(s.switches):
        for m in sw.modes.values():
            if isinstance(m, TerminatedJob):
                for w, child in enumerate(tree.switches[i].children):
                    q = (s.switches[child.index].modes[m.spec.job].up_responder.expected if child.switch
                         else s.workers[child.index].responder.expected)
                    if lost := _terminated_lost(m, w, q):
                        raise Violation(f"switch {i} no longer holds result PSN {lost[0]}, which its child {w} "
                                        "lacks\ntrace:\n  " + "\n  ".join(trace))
            if not isinstance(m, AugmentedJob):
                continue
            for w, child in enumerate(tree.switches[i].children):
                if not m.receivers >> w & 1:
                    continue  # Reduce: a child off the root rank's side gets no result
                node = _node(child)
                q = (s.switches[child.index].modes[m.spec.job].parent_expected if child.switch
                     else s.workers[child.index].responder.expected)
                while psn_diff(q, m.next_result) < 0:
                    e = m.entries[q % len(m.entries)]
                    if e.psn != q or not e.held or not e.bitmap:
                        onway = _results_on_their_way(s, tree) if onway is None else onway
                        if (node, q) not in onway:
                            raise Violation(f"switch {i} no longer holds result PSN {q}, which its child {w} lacks"
                                            "\ntrace:\n  " + "\n  ".join(trace))
                    q = psn_add(q, 1)


def _results_on_their_way(s: _State, tree: Tree) -> set:
    """``(node, PSN)`` of every result in flight from a switch to its child: to a rank, or on a switch's uplink
    (what comes down from a parent is a result or an ACK)."""
    return {(to[:2], int.from_bytes(f[_PSN], "big")) for to, _, f in s.flight
            if f[_OPCODE] != Opcode.RC_ACK and (to[0] == "r" or to[2] == tree.switches[to[1]].uplink_port)}


def _routed(tree: Tree, switch: int, port: int, frame: bytes) -> tuple:
    """The flight entry of ``frame``, sent by ``switch`` on ``port``: to the node at the far end."""
    node, far = tree.peer(switch, port)
    return ("s", node.index, far) if node.switch else ("r", node.index), frame
