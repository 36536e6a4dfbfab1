"""Model checking of EPIC's Modes I, II and III on one switch; completion time against loss on a tree; state per job.

Runs :func:`inagg.host.checker.check` over each scope below (2 ranks, every
interleaving, reordering always on, at most one loss or duplication per
timeout round) and the mutations (a result freed before the slowest rank
ACKed it, in Mode III and in Mode I), and writes ``docs/results/modes.md``.
A scope that passes the state budget is reported as such, not left out.
``--mode-i`` measures Mode I alone and replaces its section of the page.
``--tree-mutations`` runs the tree checker on the test-only mutations
(buffer recycling, an off-by-one shadow wipe) and replaces that section.
``--completion`` instead measures, in virtual time, how long an AllReduce
takes on a 2x4 tree of model switches per mode (UC, II, III) and loss rate
on every hop, and replaces that section of the page; ``--state`` computes
the switch state per job per mode and replaces that section;
``--collectives`` model-checks Reduce and Broadcast in Modes I, II and III on
EPIC's tree (:func:`inagg.host.tree_checker.check_tree`) and replaces that
section; ``--tree-mutations`` runs the tree checker on the test-only
mutations and replaces that section; ``--reach`` model-checks all three
collectives in Modes II and III on that tree with the partial-order
reduction, up to three packets per rank and window 2, and replaces its
section; ``--faults`` model-checks duplication on that tree, the mutations
the state invariants find before the final check, and links that reorder at
three packets per rank, and replaces its section; ``--window-loss`` explores
Mode II at window 2 with one loss to the end, one process per collective,
with peak memory, and replaces its section. A run of the checker keeps
those sections as they are.

    nice -n 10 .venv/bin/python bench/modes.py [--budget STATES] [--mode-i | --completion | --state | --collectives
                                                                  | --tree-mutations | --reach | --window-loss
                                                                  | --faults]
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import platform
import resource
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from _report import head_commit
from inagg.host import tree_checker
from inagg.host.checker import Scope, Violation, check
from inagg.host.collectives import tree_operations
from inagg.host.controller import TreeController, plan_tree
from inagg.host.link import Faults
from inagg.host.memnet import TreeNetwork
from inagg.host.tree_checker import TreeScope, check_tree
from inagg.host.worker import Timing
from inagg.models.job import Collective, Mode
from inagg.models.modes import HOP_TIMEOUT, AugmentedJob, TranslatedJob
from inagg.models.protocol import CHUNK_MOD, MAX_WORKERS, QPN_JOB_BITS
from inagg.models.rc import PSN_BITS
from inagg.models.state import STATE_OF, TIMER_BITS, job_state, window_for
from inagg.models.switch import ModelSwitch
from inagg.models.terminated import TerminatedJob

OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "modes.md"
SCOPES = [Scope(workers=2, chunks=c, window=w, faults=f, mode=m)
          for m in (Mode.TRANSLATED, Mode.AUGMENTED) for w, c, f in ((1, 2, 0), (1, 2, 1), (1, 3, 0), (1, 3, 1),
                                                                      (2, 2, 0), (2, 2, 1))]
MUTATION = Scope(workers=2, chunks=3, window=1, faults=1, mode=Mode.AUGMENTED)
MODE_I_SCOPES = [Scope(workers=2, chunks=c, window=w, faults=f, mode=Mode.TERMINATED)
                 for w, c, f in ((1, 2, 0), (1, 2, 1), (1, 3, 0), (1, 3, 1), (2, 2, 0), (2, 2, 1))]
MODE_I_MUTATION = Scope(workers=2, chunks=2, window=1, faults=0, mode=Mode.TERMINATED)
MODE_I_HEADING = "## Mode I: connection terminated"
TITLE = "# EPIC's Modes I, II and III: model checking on one switch"
COLLECTIVES_HEADING = "## Reduce and Broadcast in Modes I, II and III on a tree"
# EPIC's scope (a root over two switches of two ranks each, links in order, retransmission when quiet), root rank 0.
COLLECTIVE_SCOPES = [TreeScope("2x2", chunks=c, window=w, faults=f, mode=m, reorder=False, quiet=True, collective=k)
                     for k in (Collective.REDUCE, Collective.BROADCAST)
                     for m in (Mode.TERMINATED, Mode.TRANSLATED, Mode.AUGMENTED)
                     for w, c, f in ((1, 1, 1), (1, 2, 0), (1, 2, 1), (2, 2, 0))]
REACH_HEADING = "## Further on the tree: partial-order reduction, three packets, window 2"
# EPIC's scope with three packets per rank, then window 2; a few rows without the reduction to compare.
REACH_SCOPES = [(TreeScope("2x2", chunks=c, window=w, faults=f, mode=m, reorder=False, quiet=True, collective=k), True)
                for k in (Collective.ALLREDUCE, Collective.REDUCE, Collective.BROADCAST)
                for m in (Mode.TRANSLATED, Mode.AUGMENTED) for w, c, f in ((1, 3, 0), (1, 3, 1), (2, 3, 0), (2, 3, 1))]
REACH_SCOPES += [(TreeScope("2x2", chunks=c, window=1, faults=f, mode=m, reorder=False, quiet=True,
                            collective=Collective.REDUCE), red)
                 for m, c, f in ((Mode.TRANSLATED, 2, 1), (Mode.AUGMENTED, 2, 0)) for red in (False, True)]
# One loss: Mode III's invariant counts a freed result still in flight to its child as held, until it is lost.
COLLECTIVE_MUTATION = TreeScope("2x2", chunks=1, window=1, faults=1, mode=Mode.AUGMENTED, reorder=False,
                                collective=Collective.BROADCAST)


def _measured(command: str, load: tuple[float, ...], *, commit: str | None = None, per_row: bool = True,
              note: str = "") -> str:
    """The sentence that opens a section: what ran, where, and the machine's load at the start."""
    return (f"Measured with `{command}` at commit {commit or head_commit()} on {platform.machine()}, Python "
            f"{platform.python_version()}, 2 cores shared with other jobs (load average {load[0]:.1f} at the start"
            f"{note})" + ("; one run per row." if per_row else "."))


def _row(scope: Scope | TreeScope, budget: int, checker=check, lead: str = "") -> str:
    """One table row: ``lead`` (the first columns), the scope, and what ``checker`` found in ``budget`` states."""
    head = f"{lead}| {scope.mode.value} | {scope.window} | {scope.chunks} | {scope.faults} |"
    t0 = time.perf_counter()
    try:
        r = checker(scope, max_states=budget)
    except RuntimeError:
        return f"{head} > {budget:,} (budget) | | | {time.perf_counter() - t0:.0f} s |"
    return f"{head} {r.states:,} | {r.transitions:,} | {r.final_states} | {r.seconds:.1f} s |"


def reach_section(budget: int, command: str) -> str:
    """Model-check the three collectives in Modes II and III on a 2x2 tree with the partial-order reduction."""
    load = os.getloadavg()
    rows = []
    for s, red in REACH_SCOPES:
        rows.append(_row(s, budget, lambda scope, max_states: check_tree(scope, max_states=max_states, reduce=red),
                         f"| {s.collective.value} | {'yes' if red else 'no'} "))
        print(rows[-1], flush=True)
    return "\n".join([
        REACH_HEADING,
        "",
        _measured(command, load),
        "",
        "The scope of the section above (2x2, root rank 0, links in order, timers when nothing is in flight, at",
        "most one loss per timeout round and `faults` per run), explored with `check_tree(..., reduce=True)`:",
        "copy-on-write states and the partial-order reductions below (a rank's delivery alone; in Modes II",
        "and III every delivery into a set of switches). The last rows compare it with the full exploration",
        "on the same scopes.",
        "",
        "| collective | reduced | mode | window | packets per rank | faults | states | transitions | final states "
        "| time |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "A row over the budget was explored breadth first up to that many states without a violation.",
        "",
        "**The reduction** (`tree_checker._ample`). When a rank has a frame at the head of its link, the",
        "checker takes that delivery alone, with that frame's loss and duplication when they are allowed",
        "(a stubborn set: a loss elsewhere disables this frame's loss only after it, as Valmari's D1 allows),",
        "instead of every enabled step. Conditions, after",
        "Godefroid's persistent sets (LNCS 1032, 1996) and Clarke, Grumberg and Peled's ample sets:",
        "",
        "- C0: the set is empty only when the state has no step (it holds one enabled delivery).",
        "- C1 (persistence): a rank has one incoming link, so only this frame can reach it until it takes it;",
        "  each link has one sender, so what other nodes send lands on other links or behind this frame;",
        "  losses stay impossible and timers stay off (they fire, and the clock moves, only when nothing is",
        "  in flight; with timers at any time the rank's own timer must not be due, and nothing but the",
        "  clock makes it due). Every step outside the set, in any sequence, commutes with the delivery and",
        "  neither disables the other.",
        "- C2 (visibility): a step the set puts off may break an invariant, and the set's step after it must",
        "  not mend it, or the reduced search would miss the broken state. Proof sketch: take a shortest",
        "  path from a state to a broken one; if it holds a step of the set, that step moves to the front",
        "  (C1); if not, the set's delivery moves to the front and the path's end stays broken as long as",
        "  the delivery mends nothing; induct on the longest path from the state (the graph is acyclic).",
        "  So an invariant must be one no step mends. The invariant that every result a rank took is exact",
        "  is such (a rank never drops a result). Mode III's held-result invariant is made such: a result a",
        "  child lacks must be in a slot of its switch that is not free, or in flight to that child. A",
        "  child's expected PSN grows only by taking that in-flight copy, a switch takes a PSN's result",
        "  once (in order), sends only what it holds, and a loss or a duplication only removes or copies a",
        "  frame, so a broken state stays broken. Mode I's invariant reads the PSN a rank expects without",
        "  the frames in flight, so a result delivered to a Mode I rank is never reduced (an ACK or NAK is).",
        "- C3 (cycle proviso): the state graph is acyclic (module docstring of `host/checker.py`), so every",
        "  postponed step is taken later on each path; persistent sets then keep every final state.",
        "",
        "**Deliveries into Mode II and III switches** (`tree_checker._switch_set`). When no rank's delivery",
        "can go alone, the checker takes every delivery into a set `S` of switches (of the sets that qualify,",
        "the one with the fewest frames to take) as the set, with their losses and duplications,",
        "when each empty link into `S` from outside stays empty until `S` takes a frame: the node at its",
        "far end, and every node it is connected to without passing through `S`, has no frame to take and",
        "no timer due (a node acts only on a frame or a timer; what `S` sends, it sends only through the set).",
        "",
        "- C0: the set holds at least one enabled delivery.",
        "- C1: a step outside the set is a delivery into a node outside `S` or a due timer outside `S`; it",
        "  changes neither `S` nor the head of a link into `S` (what it sends onto such a link lands behind a",
        "  head, since the links that are empty stay empty), so it commutes with every delivery in the set",
        "  and disables none; a delivery into `S` on a link that is empty now stays disabled (the condition,",
        "  or only `S` sends on it). No switch of `S` may have a timer due (Mode III switches keep timers);",
        "  none falls due before the clock moves, which waits for the frames in flight.",
        "- C2: as above: no step mends a broken invariant of Modes II and III.",
        "- C3: as above, the graph is acyclic.",
        "",
        "Mode III's invariant before counted only the slots (a result in flight to the child that lacks it",
        "did not count), which a result delivered to a rank or a child switch could mend; neither could then be",
        "reduced. The buffer-recycling mutation is now found when the freed result's last copy is lost on its",
        "way (one loss), not when it is freed: `tests/host/test_tree_checker.py` checks that the trace ends",
        "with that loss.",
        "`tests/host/test_tree_reduction.py` checks on Mode II and III scopes that the switch sets reach the",
        "same final states as the full exploration with fewer states than the rank deliveries alone.",
        "",
        "Links that reorder get no reduction (a new frame can overtake, so the next delivery to a rank is not",
        "fixed). Symmetry reduction is not applied: the ranks' data differ (rank r sends",
        "`10 r + 1` onwards), and the root rank of Reduce and Broadcast breaks the subtrees' symmetry.",
        "`tests/host/test_tree_reduction.py` checks that the reduced and the full exploration reach the same",
        "set of final states on 23 small scopes and that every known mutation is still found with it.",
        "",
    ])


def collectives_section(budget: int, command: str) -> str:
    """Model-check Reduce and Broadcast in Modes I, II and III on a 2x2 tree; the section of docs/results/modes.md."""
    load = os.getloadavg()
    rows = []
    for s in COLLECTIVE_SCOPES:
        rows.append(_row(s, budget, check_tree, f"| {s.collective.value} "))
        print(rows[-1], flush=True)
    verdict, trace = _mutation(AugmentedJob, COLLECTIVE_MUTATION, budget, check_tree)
    lines = [
        COLLECTIVES_HEADING,
        "",
        _measured(command, load),
        "",
        "`inagg.host.tree_checker` on EPIC's scope: a root switch over two switches of two ranks each, root rank",
        "0, links delivering in order, timers firing only when nothing is in flight, at most one loss per",
        "timeout round and `faults` per run (`docs/protocol.md` sections 10.1 and 11). Properties: every run",
        "ends with the root rank holding the exact sum (Reduce) or every rank holding the root rank's chunks",
        "bit for bit (Broadcast), the other ranks of a Reduce holding nothing, no QP out of retries, every run",
        "ending; in Mode III every state keeps each result a receiving child lacks in a slot that is not free",
        "or in flight to that child, in Mode I in the slot its switch's requester reads it from.",
        "",
        "| collective | mode | window | packets per rank | faults | states | transitions | final states | time |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "A row over the budget was explored breadth first up to that many states, every one of them",
        "checked, without a violation.",
        "",
    ]
    s = COLLECTIVE_MUTATION
    lines += ["### Mutation: a Mode III Broadcast result freed at the first child's ACK", "",
              "`AugmentedJob.free_on_first_ack` on a Broadcast (a switch frees a result when its first child ACKed",
              f"it, before the slowest one). Scope: 2x2, mode {s.mode.value}, window {s.window}, "
              f"{s.chunks} packet per rank, {s.faults} loss, links in order, timers at any time. Result: {verdict}.",
              ""]
    if trace:
        lines += ["```", *trace.splitlines(), "```", ""]
    return "\n".join(lines)


def _found(job: type, attr: str, value, run, scope, budget: int) -> Violation | None:
    """What the checker ``run`` (``check`` or ``check_tree``) finds in ``scope`` while the test-only mutation
    ``job.attr = value`` is in place; ``RuntimeError`` when the budget runs out first."""
    old = vars(job)[attr]
    setattr(job, attr, value)
    try:
        run(scope, max_states=budget)
    except Violation as v:
        return v
    finally:
        setattr(job, attr, old)
    return None


def _mutation(job: type, scope: Scope, budget: int, checker=check) -> tuple[str, str]:
    t0 = time.perf_counter()
    try:
        v = _found(job, "free_on_first_ack", True, checker, scope, budget)
    except RuntimeError:
        return f"not found within {budget:,} states ({time.perf_counter() - t0:.0f} s)", ""
    if v is None:
        return "NOT FOUND: the checker missed the bug", ""
    return f"found in {time.perf_counter() - t0:.2f} s", str(v)


# The mutations on a tree, on EPIC's scope (a root over two switches of two ranks each, links in order):
# (what it breaks, the job class, its test-only attribute and mutated value, the scope).
TREE_MUTATIONS = [
    ("a result freed at the first child's ACK (buffer recycling)", AugmentedJob, "free_on_first_ack", True,
     TreeScope("2x2", chunks=1, window=1, faults=1, mode=Mode.AUGMENTED, reorder=False)),
    ("the shadow wipe one slot off, (p + W + 1) mod 2W", TranslatedJob, "shadow_skew", 1,
     TreeScope("2x2", chunks=3, window=1, faults=0, mode=Mode.TRANSLATED, reorder=False, quiet=True)),
]
TREE_MUTATIONS_HEADING = "## Mutations on a tree"


def tree_mutations_section(budget: int, command: str) -> str:
    """Run the tree checker on each of TREE_MUTATIONS; the section of docs/results/modes.md."""
    load = os.getloadavg()
    rows, traces = [], []
    for what, job, attr, value, scope in TREE_MUTATIONS:
        head = (f"| {what} | `{job.__name__}.{attr} = {value}` | {scope.mode.value} | {scope.spec} | {scope.chunks} "
                f"| {scope.window} | {scope.faults} |")
        t0 = time.perf_counter()
        try:
            v = _found(job, attr, value, check_tree, scope, budget)
        except RuntimeError:
            rows.append(f"{head} not found within {budget:,} states | {time.perf_counter() - t0:.1f} s | |")
            continue
        seconds = time.perf_counter() - t0
        if v is None:
            rows.append(f"{head} NOT FOUND: every run ended correctly | {seconds:.1f} s | |")
            continue
        steps = str(v).split("\ntrace:\n", 1)[1].count("\n") + 1
        rows.append(f"{head} {v.states:,} | {seconds:.2f} s | {steps} |")
        print(rows[-1], flush=True)
        traces += [f"{what}:", "", "```", str(v), "```", ""]
    return "\n".join([
        TREE_MUTATIONS_HEADING,
        "",
        _measured(command, load, per_row=False),
        "",
        "`inagg.host.tree_checker` (`docs/results/tree.md`) with a test-only mutation of the model switch in",
        "place, on EPIC's scope: a root over two switches of two ranks each, links in order (timers quiet for",
        "Mode II). States: distinct states reached when the checker stopped at the first bad one (breadth",
        "first, so its trace is a shortest one); trace: its steps. `tests/host/test_tree_checker.py` checks",
        "both mutations in CI (the shadow wipe on a 2x1 tree).",
        "",
        "| mutation | switch | mode | tree | packets per rank | window | losses | states | time | trace steps |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "The shadow wipe clears a child's bit in slot `(p + W) mod 2W` when its PSN `p` is taken in order",
        "(`docs/protocol.md` section 6.2): one slot off, the slot that PSN `p + W` needs keeps the bits of",
        "`p - W`, so `p + W` is `DROP_WINDOW` at every try and the ranks run out of retries.",
        "",
        *traces,
    ]).rstrip("\n") + "\n"


WINDOW_LOSS_HEADING = "## Mode II at window 2 with a loss, explored to the end"
# The reach section's Mode II window-2 rows with a loss, which need more states than its budget.
WINDOW_LOSS_SCOPES = [TreeScope("2x2", chunks=3, window=2, faults=1, mode=Mode.TRANSLATED, reorder=False, quiet=True,
                                collective=k) for k in (Collective.ALLREDUCE, Collective.REDUCE, Collective.BROADCAST)]


def _reduced_with_peak(scope: TreeScope, budget: int) -> tuple[str, int]:
    """A reduced ``_row`` of ``scope`` and this process's peak resident memory in KiB (run in a child process)."""
    row = _row(scope, budget, lambda sc, max_states: check_tree(sc, max_states=max_states, reduce=True),
               f"| {scope.collective.value} ")
    return row, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def window_loss_section(budget: int, command: str) -> str:
    """Model-check Mode II at window 2 with one loss to the end, one process per collective, all at once."""
    load = os.getloadavg()
    # Fork so each child gets its own peak memory figure; the three run at once on the two cores.
    with ProcessPoolExecutor(len(WINDOW_LOSS_SCOPES), mp_context=multiprocessing.get_context("fork")) as pool:
        done = list(pool.map(_reduced_with_peak, WINDOW_LOSS_SCOPES, [budget] * len(WINDOW_LOSS_SCOPES)))
    rows = [f"{row} {peak / 2**20:.2f} GiB |" for row, peak in done]
    return "\n".join([
        WINDOW_LOSS_HEADING,
        "",
        _measured(command, load, per_row=False, note="; the three rows ran at once, one process each, so a"
                  " row's time is wall time shared with the others"),
        "",
        "The reach section's scope (2x2, root rank 0, links in order, timers when nothing is in flight, three",
        "packets per rank, at most one loss per timeout round) in Mode II at window 2 with one loss, explored",
        "with `check_tree(..., reduce=True)` (the rank deliveries and the Mode II switch sets argued there)",
        "until no state is left. Peak memory: the child process's maximum resident set size.",
        "",
        "| collective | mode | window | packets per rank | faults | states | transitions | final states | time "
        "| peak memory |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "A row over the budget was explored breadth first up to that many states without a violation.",
        "",
    ])


# Duplication and reordering on the tree (EPIC's scope, then links that reorder at three packets per rank):
# (scope, whether the partial-order reduction is on). UC is explored in full: the reduction is argued for RC.
FAULTS_HEADING = "## Duplication, held results and reordering on a tree"
FAULT_SCOPES = [(TreeScope("2x2", chunks=c, window=1, faults=f, duplicates=1, mode=m, reorder=False, quiet=True),
                 m is not Mode.UC)
                for m in (Mode.UC, Mode.TERMINATED, Mode.TRANSLATED, Mode.AUGMENTED) for c, f in ((1, 0), (2, 0), (1, 1))]
FAULT_SCOPES += [(TreeScope("2x2", chunks=3, window=1, faults=f, mode=m, reorder=True, quiet=True), False)
                 for m in (Mode.TRANSLATED, Mode.AUGMENTED) for f in (0, 1)]
# The mutations that the invariants checked in every state find: (what, job class, attribute, value, scope).
INVARIANT_MUTATIONS = [
    ("a duplicate of an open slot added again", TranslatedJob, "add_duplicates", True,
     TreeScope("2x2", chunks=1, window=1, faults=0, duplicates=1, mode=Mode.TRANSLATED, reorder=False, quiet=True)),
    ("a duplicate of an open slot added again", TranslatedJob, "add_duplicates", True,
     TreeScope("2x2", chunks=1, window=1, faults=0, duplicates=1, mode=Mode.AUGMENTED, reorder=False, quiet=True)),
    ("a result freed at the first child's ACK (buffer recycling)", TerminatedJob, "free_on_first_ack", True,
     TreeScope("2x1", chunks=2, window=1, faults=1, mode=Mode.TERMINATED, reorder=False, quiet=True)),
]


def _final_only(run):
    """``run`` with the tree checker's state invariants off: a violation is found in a final state only."""
    def wrapped(scope, max_states):
        kept = tree_checker._check_results_held, tree_checker._check_taken
        tree_checker._check_results_held = tree_checker._check_taken = lambda *a: None
        try:
            return run(scope, max_states=max_states)
        finally:
            tree_checker._check_results_held, tree_checker._check_taken = kept
    return wrapped


def _hunt(job: type, attr: str, value, run, scope, budget: int) -> str:
    """Three cells: the states when ``run`` found the mutation, the seconds, the trace's steps."""
    t0 = time.perf_counter()
    try:
        v = _found(job, attr, value, run, scope, budget)
    except RuntimeError:
        return f"not found within {budget:,} states | {time.perf_counter() - t0:.1f} s | |"
    if v is None:
        return f"NOT FOUND: every run ended correctly | {time.perf_counter() - t0:.1f} s | |"
    steps = str(v).split("\ntrace:\n", 1)[1].count("\n") + 1
    return f"{v.states:,}: {str(v).splitlines()[0]} | {time.perf_counter() - t0:.2f} s | {steps} |"


def faults_section(budget: int, command: str) -> str:
    """Duplication and reordering rows on the tree, and the mutations the state invariants find first."""
    load = os.getloadavg()
    rows, hunts = [], []
    for s, red in FAULT_SCOPES:
        lead = f"| {s.spec} | {'yes' if s.reorder else 'no'} | {s.duplicates} | {'yes' if red else 'no'} "
        rows.append(_row(s, budget, lambda scope, max_states: check_tree(scope, max_states=max_states, reduce=red),
                         lead))
        print(rows[-1], flush=True)
    for what, job, attr, value, s in INVARIANT_MUTATIONS:
        hunts.append(f"| {what} | `{job.__name__}.{attr} = {value}` | {s.mode.value} | {s.spec} | {s.chunks} | "
                     f"{s.faults} | {s.duplicates} | {_hunt(job, attr, value, check_tree, s, budget)} "
                     f"{_hunt(job, attr, value, _final_only(check_tree), s, budget)}")
        print(hunts[-1], flush=True)
    return "\n".join([
        FAULTS_HEADING,
        "",
        _measured(command, load, note=", so the times are under load" if load[0] >= 1.0 else ""),
        "",
        "`inagg.host.tree_checker` with `TreeScope(duplicates=1)`: any frame in flight on any hop may be",
        "duplicated once per run, at any point (the copy follows its original on a link that keeps order),",
        "beside at most `faults` losses (one per timeout round). EPIC's scope as above (2x2, links in",
        "order, timers when nothing is in flight), the partial-order reduction on in Modes I to III: a",
        "frame's duplication joins its delivery and loss in the set (`_ample`). The last rows are links that reorder, at",
        "three packets per rank, explored in full (the reduction needs links in order). Properties: those of",
        "the sections above; in every state of Modes I and III each switch still holds every result a child",
        "lacks, and in Modes I to III every result a rank has taken is already the exact sum.",
        "",
        "| tree | reorder | duplicates | reduced | mode | window | packets per rank | losses | states | transitions "
        "| final states | time |",
        "|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "A row over the budget was explored breadth first up to that many states without a violation.",
        "",
        "### Mutations found by the invariants of every state",
        "",
        "Each test-only mutation with the invariants checked in every state, then with the final-state",
        "check alone (`_final_only`): states reached when the first bad state was found (breadth first,",
        "so its trace is a shortest one) and what it was. `TranslatedJob.add_duplicates` adds a child's",
        "duplicate of a contribution its slot still aggregates again: without a duplicated frame every run",
        "of these scopes ends exact (`tests/host/test_tree_checker.py`). `TerminatedJob.free_on_first_ack`",
        "frees a Mode I slot at its first child's ACK: without a loss the final state is still right, so",
        "the final check alone needs the loss that makes the freed result needed again.",
        "",
        "| mutation | switch | mode | tree | packets per rank | losses | duplicates | every state: found at "
        "| time | trace steps | final state only: found at | time | trace steps |",
        "|---|---|---|---|---:|---:|---:|---|---:|---:|---|---:|---:|",
        *hunts,
        "",
        "**Duplication and the reduction.** A duplication of the frame at a link's head does not commute",
        "with its delivery (once delivered it cannot be duplicated), so the set takes it along with the",
        "delivery and the loss of that frame (a stubborn set: a duplication elsewhere disables this one only",
        "after it, as Valmari's D1 allows). The invariant that every result a rank took is exact is one no",
        "step mends (C2): a rank never drops a result it took, so a wrong one is still there in every final",
        "state after it. Mode I's held-result invariant reads the PSN each rank expects, and a result",
        "delivered to a Mode I rank mends it, so those are not reduced, only ACKs and NAKs are; Mode III's",
        "counts a result in flight to its child as held, so no step mends it (the reach section).",
        "",
    ])


# The completion-time runs: one AllReduce of ELEMENTS float32 per rank on TREE, WINDOW chunks of 1 KiB
# outstanding, 1 us per hop, the ranks' ACK timeout RANK_TIMEOUT (the demo's), Mode III's hop timer the
# model's default; every hop loses LOSSES of the frames in each direction; SEEDS runs per point.
TREE, ELEMENTS, WINDOW, LATENCY, RANK_TIMEOUT = "2x4", 1 << 18, 32, 1e-6, 200e-6
LOSSES = (0.0, 0.001, 0.01, 0.05)
SEEDS = range(3)
COMPLETION_HEADING = "## Completion time against loss on a 2x4 tree"


def completion(mode: Mode, loss: float, seed: int) -> float:
    """Virtual seconds until every rank of one AllReduce in ``mode`` holds its exact sum."""
    tp = plan_tree(TREE, window=WINDOW, chunk_bytes=1024, mode=mode)
    switches = [ModelSwitch(q.switch) for q in tp.plans]
    TreeController(switches, tp).configure()
    timing = Timing(timeout=RANK_TIMEOUT, max_timeout=20e-3, tries=30)
    data = [np.random.default_rng([seed, r]).standard_normal(ELEMENTS, np.float32) for r in range(tp.tree.ranks)]
    ops = {r: op for r, by_qpn in tree_operations(tp, [data], timing=timing).items() for op in by_qpn.values()}
    stats = TreeNetwork(tp.tree, switches, latency=LATENCY, faults=Faults(loss=loss), seed=seed).run(ops)
    first = ops[0].result()
    if not all(np.array_equal(op.result(), first) for op in ops.values()):
        raise AssertionError(f"mode {mode.value}, loss {loss}, seed {seed}: the ranks' sums differ")
    return stats.virtual_time


def completion_section() -> str:
    load = os.getloadavg()
    commit = head_commit()
    modes = (Mode.UC, Mode.TRANSLATED, Mode.AUGMENTED)
    rows = []
    for loss in LOSSES:
        t = {m: statistics.mean(completion(m, loss, seed) for seed in SEEDS) * 1e6 for m in modes}
        rows.append(f"| {loss * 100:g} % | " + " | ".join(f"{t[m]:,.0f}" for m in modes)
                    + f" | {t[Mode.AUGMENTED] / t[Mode.TRANSLATED]:.2f} |")
        print(rows[-1], flush=True)
    return "\n".join([
        COMPLETION_HEADING,
        "",
        f"Measured with `nice -n 10 .venv/bin/python bench/modes.py --completion` at commit {commit}",
        f"(load average {load[0]:.1f} at the start); virtual time, so the load does not change the figures.",
        "",
        f"One AllReduce of {ELEMENTS:,} float32 per rank ({ELEMENTS * 4 // 1024} KiB, 1 KiB chunks, window {WINDOW})",
        f"on a {TREE} tree of model switches (8 ranks, 3 switches) over `TreeNetwork`, {LATENCY * 1e6:g} us per hop;",
        f"every hop loses that share of its frames in each direction. Ranks: ACK timeout {RANK_TIMEOUT * 1e6:g} us",
        f"(UC: the same first timeout, doubling); Mode III's hop timer {HOP_TIMEOUT * 1e6:g} us. Mean of",
        f"{len(SEEDS)} seeds; every run ends with every rank holding the same sum.",
        "",
        "| loss per hop | UC (us) | Mode II (us) | Mode III (us) | III / II |",
        "|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "Mode II repairs a loss end to end: the rank's RC timer (or a NAK its responder sends, reflected)",
        "starts a Go-Back-N that travels the whole tree. Mode III repairs it on the hop where it happened:",
        "the receiver's NAK of the gap or the hop's own timer. A ratio below 1 is Mode III's gain.",
    ]) + "\n"


def _section(page: str, heading: str) -> slice:
    """Where the page's section ``heading`` is: from its heading up to the next ``## `` heading or the end."""
    start = page.index(heading)
    end = page.find("\n## ", start + len(heading))
    return slice(start, None if end < 0 else end + 1)


def _replace_section(heading: str, text: str) -> None:
    """Put ``text`` in place of the page's section ``heading``, or append it."""
    page = OUT.read_text()
    if heading in page:
        at = _section(page, heading)
        rest = page[at.stop:] if at.stop is not None else ""
        page = page[:at.start].rstrip("\n") + "\n\n" + text + ("\n" + rest if rest else "")
    else:
        page = page.rstrip("\n") + "\n\n" + text
    OUT.write_text(page)


def _mode_i_section(budget: int, command: str) -> list[str]:
    """The Mode I section of the file: its rows and its mutation, with the command and the commit."""
    load = os.getloadavg()
    rows = []
    for s in MODE_I_SCOPES:
        rows.append(_row(s, budget))
        print(rows[-1], flush=True)
    verdict, trace = _mutation(TerminatedJob, MODE_I_MUTATION, budget)
    print("mode I mutation:", verdict, flush=True)
    commit = head_commit()
    lines = [
        MODE_I_HEADING,
        "",
        _measured(command, load, commit=commit),
        "",
        "The switch is each rank's RC peer (`models/terminated.py`): its responders ACK and NAK the",
        "contributions, its requesters send the results from their own PSN spaces and go back N on a NAK",
        "or their timer; the ranks run the same `RcWorker`. Same exploration and properties as above, plus",
        "the invariant that every result a rank lacks is still in its slot (the slot is the result's only",
        "copy).",
        "",
        "| mode | window | packets per rank | faults | states | transitions | final states | time |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
    ]
    return lines + _mutation_lines(
        "### Mutation: a Mode I slot freed at the first rank's ACK of its result",
        "`TerminatedJob.free_on_first_ack` (test-only) frees a slot when one rank's requester has its result\n"
        "ACKed.", MODE_I_MUTATION, verdict, trace)


def _mutation_lines(heading: str, what: str, scope: Scope, verdict: str, trace: str) -> list[str]:
    """A mutation's paragraph: what it breaks, its scope, whether the checker found it, and the trace."""
    lines = [heading, "", *what.splitlines()[:-1],
             f"{what.splitlines()[-1]} Scope: mode {scope.mode.value}, window {scope.window}, "
             f"{scope.chunks} packets per rank, {scope.faults} fault{'s' * (scope.faults != 1)}. Result: {verdict}.",
             ""]
    if trace:
        lines += ["```", *trace.splitlines(), "```", ""]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=30_000, help="states per scope before it is given up")
    ap.add_argument("--mode-i", action="store_true", help="measure Mode I only and replace its section of the file")
    ap.add_argument("--completion", action="store_true",
                    help="measure completion time against loss on a 2x4 tree instead (replaces that section)")
    ap.add_argument("--state", action="store_true",
                    help="compute the switch state per job per mode instead (replaces that section)")
    ap.add_argument("--collectives", action="store_true",
                    help="model-check Reduce and Broadcast in Modes I, II and III on a tree instead (replaces that "
                         "section)")
    ap.add_argument("--tree-mutations", action="store_true",
                    help="run the tree checker on the test-only mutations instead (replaces that section)")
    ap.add_argument("--reach", action="store_true",
                    help="model-check the three collectives with the partial-order reduction, 3 packets and window "
                         "2, instead (replaces that section)")
    ap.add_argument("--window-loss", action="store_true",
                    help="model-check Mode II at window 2 with one loss to the end (reduced, 3 packets) instead "
                         "(replaces that section)")
    ap.add_argument("--faults", action="store_true",
                    help="model-check duplication, the state invariants' mutations and links that reorder on a "
                         "tree instead (replaces that section)")
    args = ap.parse_args()
    command = f"nice -n {os.nice(0)} .venv/bin/python bench/modes.py --budget {args.budget}"  # the niceness it ran at
    # The sections measured by their own options: (option, heading, the section's text).
    sections = [
        (args.tree_mutations, TREE_MUTATIONS_HEADING,
         lambda: tree_mutations_section(args.budget, command + " --tree-mutations")),
        (args.reach, REACH_HEADING, lambda: reach_section(args.budget, command + " --reach")),
        (args.faults, FAULTS_HEADING, lambda: faults_section(args.budget, command + " --faults")),
        (args.window_loss, WINDOW_LOSS_HEADING,
         lambda: window_loss_section(args.budget, command + " --window-loss")),
        (args.state, STATE_HEADING, state_section),
        (args.collectives, COLLECTIVES_HEADING, lambda: collectives_section(args.budget, command + " --collectives")),
        (args.completion, COMPLETION_HEADING, completion_section),
    ]
    for chosen, heading, section in sections:
        if chosen:
            _replace_section(heading, text := section())
            print(text, end="")
            return
    if args.mode_i:
        _replace_section(MODE_I_HEADING, "\n".join(_mode_i_section(args.budget, command + " --mode-i")))
        print(f"wrote {OUT}")
        return
    load = os.getloadavg()
    rows = []
    for s in SCOPES:
        rows.append(_row(s, args.budget))
        print(rows[-1], flush=True)
    verdict, trace = _mutation(AugmentedJob, MUTATION, args.budget)
    print("mutation:", verdict, flush=True)
    lines = [
        TITLE,
        "",
        f"Measured with `{command}` on "
        f"{platform.machine()}, Python {platform.python_version()}, 2 cores shared with other jobs "
        f"(load average {load[0]:.1f} at the start); one run per row.",
        "",
        "`inagg.host.checker` runs the real `RcWorker` (RC requester and responder of `models/rc.py`) and",
        "the model switch's `TranslatedJob` / `AugmentedJob` on real frames, 2 ranks, every interleaving of",
        "deliveries (so every reordering), at most one loss or duplication per timeout round and `faults`",
        "per run, timers firing whenever due. Properties: every run ends with every rank holding the exact",
        "aggregate of every chunk, no rank's QP runs out of retries, and every run ends (no state without a",
        "successor but a correct final one).",
        "",
        "| mode | window | packets per rank | faults | states | transitions | final states | time |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "A row over the budget was explored breadth first up to that many states, every one of them",
        "checked, without a violation; its full state space needs partial-order reduction or more time.",
        "",
    ]
    lines += _mutation_lines(
        "## Mutation: a Mode III result freed before the slowest rank ACKed it",
        "`AugmentedJob.free_on_first_ack` (test-only) frees a slot when the first rank ACKs its result, the\n"
        "buffer-recycling bug EPIC's model check found.", MUTATION, verdict, trace)
    lines += _mode_i_section(args.budget, command)
    old = OUT.read_text() if OUT.exists() else ""
    # The sections measured by their own options are kept as they are.
    kept = (COMPLETION_HEADING, STATE_HEADING, COLLECTIVES_HEADING, TREE_MUTATIONS_HEADING, REACH_HEADING,
            WINDOW_LOSS_HEADING, FAULTS_HEADING)
    lines += [old[_section(old, h)].rstrip("\n") + "\n" for h in kept if h in old]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines))
    print(f"wrote {OUT}")


# -- switch state per job per mode (docs/protocol.md section 9) ---------------------------------------------

# EPIC's operating point (docs/protocol.md section 9): a 100 Gb/s link over a 10 us round trip, 1 KiB chunks.
LINK_BPS, RTT, STATE_CHUNK = 100e9, 10e-6, 1024
STATE_WORKERS = (8, 32)
STATE_HEADING = "## Switch state per job per mode"


def state_section() -> str:
    """Compute the state table at EPIC's operating point; the section of docs/results/modes.md."""
    commit = head_commit()
    w = window_for(LINK_BPS, RTT, STATE_CHUNK)
    bdp = LINK_BPS * RTT / 8
    rows = []
    for mode in STATE_OF:
        for n in STATE_WORKERS:
            s = job_state(mode, workers=n, window=w, chunk_bytes=STATE_CHUNK)
            meta = s.total_bytes - s.lane_bytes
            rows.append(f"| {mode.value} | {n} | {s.slots} | {s.lane_bytes:,} | {s.slot_bits} | {s.child_bits} | "
                        f"{s.job_bits} | {meta:,} ({meta / s.lane_bytes:.1%}) | {s.total_bytes:,} | "
                        f"{s.total_bytes / bdp:.2f} |")
    return "\n".join([
        STATE_HEADING,
        "",
        f"Computed with `.venv/bin/python bench/modes.py --state` at commit {commit} (no timing: the figures",
        "depend on the code only). `job_state` installs one job on a `ModelSwitch` and reads its state off",
        "the model's own objects: the lane words of each slot (`LaneState`), every other field of a slot",
        "(`Slot` for UC and Mode I, `Entry` for Modes II and III), of the job (`_Job` for UC,",
        "`TerminatedJob`, `TranslatedJob` / `AugmentedJob`), one value per child for a list; Mode I's per",
        "child state is its `Responder` and `Requester` per host QP. Configuration (addresses, the spec,",
        "timeouts) is not state, nor are the copies of each result's header Mode I's requesters keep",
        "(a switch derives them from its ring, `docs/protocol.md` section 9).",
        f"Field widths: PSN {PSN_BITS} bits, chunk {CHUNK_MOD.bit_length() - 1}, job {QPN_JOB_BITS}, count "
        f"{MAX_WORKERS.bit_length()}, a bitmap one bit per child,",
        f"a promotion flag one bit per lane, a timer {TIMER_BITS}, a virtual address 64; a field without a width",
        "fails the table.",
        "A job below a tree's root holds the same objects (Mode III's uplink fields are in every job).",
        "",
        f"EPIC's operating point (`docs/protocol.md` section 9): B = {LINK_BPS / 1e9:g} Gb/s, T = {RTT * 1e6:g} us,",
        f"C = {STATE_CHUNK} B, so the bandwidth-delay product is {bdp:,.0f} B and W = ceil(B T / 8C) = "
        f"{math.ceil(LINK_BPS * RTT / (8 * STATE_CHUNK))},",
        f"a power of two: {w}; the job's region is 2W = {2 * w} slots.",
        "",
        "| mode | children | slots | lane bytes | bits per slot | bits per child | bits per job "
        "| other bytes (of lanes) | total bytes | / BDP |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "Every mode keeps 2W slots of lanes, twice the bandwidth-delay product (with W rounded up to a",
        "power of two: 2 x 128 KiB = 256 KiB against EPIC's 250 KB); what the modes differ in is the rest.",
        "Mode I needs only one BDP of slots (section 9) but is configured with 2W like the others; its",
        "per-QP state (a responder and a requester, bits per child) is the largest, its ring of slot",
        "indices the bits per job.",
    ]) + "\n"


if __name__ == "__main__":
    main()
