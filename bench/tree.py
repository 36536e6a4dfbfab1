"""The model check of the UC protocol and of EPIC's Modes II and III on a tree of model switches: states,
transitions and time per scope, and the Mode III buffer-recycling mutation found.

Writes docs/results/tree.md. Run: ``.venv/bin/python bench/tree.py``; ``--modes`` runs the Mode II/III part
only and replaces that section of the page; ``--scale`` runs 16 jobs at once over 256 ranks on a depth-3
tree and replaces (or adds) that section.
"""

from __future__ import annotations

import math
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from _report import head_commit
from inagg.host.checker import Violation
from inagg.host.collectives import exponent as collective_exponent
from inagg.host.collectives import reference, tree_operations
from inagg.host.controller import TreeController, plan_tree_jobs
from inagg.host.memnet import RankMux, TreeNetwork
from inagg.host.tree_checker import TreeScope, check_tree
from inagg.host.worker import Timing
from inagg.models.job import Mode
from inagg.models.modes import AugmentedJob
from inagg.models.switch import ModelSwitch
from inagg.models.tree import Tree

OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "tree.md"

SCOPES = [
    TreeScope("2x1", chunks=2, window=2, faults=1),
    TreeScope("2x2", chunks=1, window=1, faults=0),
    TreeScope("2x2", chunks=1, window=1, faults=1),
    TreeScope("2x2", chunks=2, window=1, faults=1),
]


# EPIC's scope: a root over two switches of two ranks each; window 1 (and 2, beyond EPIC's defaults); at
# most one loss at a time; links in order and timers firing when nothing is in flight, as EPIC's checks
# run. The last two rows show what reordering costs.
MODE_SCOPES = [
    TreeScope("2x2", chunks=1, window=1, faults=1, mode=Mode.TRANSLATED, reorder=False, quiet=True),
    TreeScope("2x2", chunks=2, window=1, faults=1, mode=Mode.TRANSLATED, reorder=False, quiet=True),
    TreeScope("2x2", chunks=3, window=1, faults=0, mode=Mode.TRANSLATED, reorder=False, quiet=True),
    TreeScope("2x2", chunks=2, window=2, faults=0, mode=Mode.TRANSLATED, reorder=False, quiet=True),
    TreeScope("2x2", chunks=1, window=1, faults=1, mode=Mode.AUGMENTED, reorder=False, quiet=True),
    TreeScope("2x2", chunks=2, window=1, faults=0, mode=Mode.AUGMENTED, reorder=False, quiet=True),
    TreeScope("2x2", chunks=1, window=1, faults=1, mode=Mode.TERMINATED, reorder=False, quiet=True),
    TreeScope("2x2", chunks=2, window=1, faults=0, mode=Mode.TERMINATED, reorder=False, quiet=True),
    TreeScope("2x2", chunks=1, window=1, faults=0, mode=Mode.TRANSLATED),
    TreeScope("2x2", chunks=1, window=1, faults=0, mode=Mode.AUGMENTED),
]
MODES_HEADING = "## Modes II and III on the tree"
# The page's budget per scope (the issue's): a scope beyond it is reported as such, not explored further.
BUDGET = 30_000


def _machine() -> str:
    load = os.getloadavg()
    commit = head_commit()
    return (f"on {platform.machine()}, Python {platform.python_version()}, numpy {np.__version__}, commit "
            f"{commit}, one core of a machine shared with other jobs (load average {load[0]:.1f} / "
            f"{load[1]:.1f} / {load[2]:.1f} at the start)")


def report_modes() -> str:
    """Run the Mode II/III scopes and the mutation; the section of docs/results/tree.md."""
    machine = _machine()
    rows = []
    for scope in MODE_SCOPES:
        links = "in order" if not scope.reorder else "any order"
        timers = "quiet" if scope.quiet else "any time"
        head = (f"| {scope.mode.value} | {scope.spec} | {scope.chunks} | {scope.window} | {scope.faults} | {links} | "
                f"{timers} |")
        try:
            r = check_tree(scope, max_states=BUDGET)
        except RuntimeError:
            rows.append(f"{head} > {BUDGET:,} | | | | |")
        else:
            rows.append(f"{head} {r.states:,} | {r.transitions:,} | {r.final_states} | {r.max_depth} | "
                        f"{r.seconds:.1f} |")
        print(rows[-1], flush=True)
    AugmentedJob.free_on_first_ack = True
    start = time.perf_counter()
    try:
        check_tree(TreeScope("2x2", chunks=1, window=1, faults=1, mode=Mode.AUGMENTED, reorder=False))
        raise AssertionError("the checker missed the buffer-recycling mutation")
    except Violation as e:
        found, trace = time.perf_counter() - start, str(e)
    finally:
        AugmentedJob.free_on_first_ack = False
    return "\n".join([
        MODES_HEADING,
        "",
        "The same checker with RC ranks (`RcWorker`) and model switches in EPIC's Modes II and III",
        "(`docs/protocol.md` section 10.1), and Mode I (section 10.2: every connection ends at the next",
        "switch), AllReduce, on EPIC's scope: a root over two switches of two",
        "ranks each, window 1 (and 2), at most one loss at a time. \"In order\": each link delivers in sending",
        "order (EPIC's default, `MAX_OUT_OF_ORDER = 0`), any link may go next; \"quiet\": a due timer",
        "fires only when nothing is in flight (EPIC's `StrictRetxCondition`). Every scope ends with every",
        "rank holding the exact sum and every run terminating; in Mode III every state also keeps, at",
        "every switch, each result a child lacks in a slot that is not free or in flight to that child.",
        "",
        f"Measured with `.venv/bin/python bench/tree.py --modes` {machine}; budget {BUDGET:,} states per",
        "scope.",
        "",
        "| mode | tree | packets per rank | window | losses | links | timers | states | transitions | final states "
        "| depth | seconds |",
        "|---|---|---:|---:|---:|---|---|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "A row over the budget was explored breadth first up to that many states, every one of them checked,",
        "without a violation; its whole state space needs partial-order reduction or more time.",
        "",
        "**Mutation.** With `AugmentedJob.free_on_first_ack` (a slot freed at its first child's ACK, the",
        f"buffer-recycling bug EPIC's model check found) the checker stops in {found:.1f} s with this trace",
        "(2x2, one packet per rank, one loss, links in order; a freed result still on its way to the child",
        "that lacks it counts as held until that copy is lost):",
        "",
        "```",
        trace,
        "```",
        "",
        "`tests/host/test_tree_checker.py` runs three small Mode II/III scopes, this mutation, and a",
        "Mode II switch that does not resend its partial, in CI.",
    ]) + "\n"


def report() -> str:
    """Run every scope; the page of docs/results/tree.md."""
    load = os.getloadavg()
    rows = []
    for scope in SCOPES:
        r = check_tree(scope)
        rows.append(f"| {scope.spec} | {scope.chunks} | {scope.window} | {scope.faults} | {r.states:,} | "
                    f"{r.transitions:,} | {r.final_states} | {r.max_depth} | {r.seconds:.1f} |")
        print(rows[-1], flush=True)
    lines = [
        "# Model check of the UC tree (`host/tree_checker.py`)",
        "",
        "Every interleaving of real ranks (`Worker`) and real model switches (`ModelSwitch`) on a tree,",
        "UC AllReduce, at most one lost frame per timeout round and `faults` per run, any frame in flight on",
        "any hop delivered next (`docs/protocol.md` section 10). Every scope below ends with every rank",
        "holding the exact sum of every chunk and every run terminating (the state graph is acyclic).",
        "",
        f"Measured with `.venv/bin/python bench/tree.py` on {platform.machine()}, Python",
        f"{platform.python_version()}, numpy {np.__version__}, one core of a machine shared with other jobs",
        f"(load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at the start).",
        "",
        "| tree | chunks per rank | window | losses | states | transitions | final states | depth | seconds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "`2x1` is a root over two switches of one rank each, `2x2` a root over two switches of two ranks",
        "each (depth 2; EPIC's depth-3 scope, which counts the ranks as a level).",
        "`tests/host/test_tree_checker.py` runs the two small scopes in CI and a switch that does not",
        "resend its partial, which the checker refutes with a trace.",
    ]
    return "\n".join(lines) + "\n"


# -- 256 ranks on a depth-3 tree, 16 jobs at once (issue 17) ------------------------------------------------

# Every job spans every rank (HyNA replays 256 workers): SCALE_JOBS AllReduces of SCALE_ELEMENTS float32 per
# rank share the model switches of SCALE_TREE, each in its own slot region, in one run of TreeNetwork.
SCALE_TREE, SCALE_JOBS, SCALE_ELEMENTS, SCALE_WINDOW = "4x8x8", 16, 2048, 8
SCALE_MODES = (Mode.UC, Mode.TRANSLATED, Mode.AUGMENTED)
SCALE_HEADING = "## 256 ranks, 16 jobs at once"


@dataclass
class ScaleRun:
    """What :func:`run_jobs` measured."""

    ranks: int
    switches: int
    jobs: int
    exact: bool
    wall: float            # seconds of the run itself (planning and data excluded)
    virtual: float         # virtual seconds until every rank of every job was done
    to_switch: int
    to_hosts: int
    dropped: int


def run_jobs(spec: str, jobs: int, *, elements: int, window: int, mode: Mode = Mode.UC,
             seed: int = 0) -> ScaleRun:
    """``jobs`` AllReduces at once over every rank of the tree ``spec`` of model switches; each rank's result
    checked bit for bit against numpy (:func:`inagg.host.collectives.reference`)."""
    tp = plan_tree_jobs(spec, jobs, window=window, mode=mode)
    switches = [ModelSwitch(p.switch) for p in tp.plans]
    timing = Timing(timeout=200e-6, max_timeout=20e-3, tries=30)
    data = [[np.random.default_rng([seed, j, r]).standard_normal(elements, np.float32) for r in range(tp.tree.ranks)]
            for j in range(jobs)]
    ops = tree_operations(tp, data, timing=timing)
    muxes = {r: RankMux(o) for r, o in ops.items()}
    with TreeController(switches, tp):
        t0 = time.perf_counter()
        stats = TreeNetwork(tp.tree, switches, seed=seed).run(muxes)
        wall = time.perf_counter() - t0
    exact = True
    for j in range(jobs):
        mine = [list(ops[r].values())[j] for r in range(tp.tree.ranks)]
        want = reference("allreduce", data[j], exponent=collective_exponent(mine[0]))
        exact &= all(np.array_equal(op.result(), w) for op, w in zip(mine, want))
    return ScaleRun(tp.tree.ranks, len(switches), jobs, exact, wall, stats.virtual_time, stats.to_switch,
                    stats.to_hosts, sum(m.dropped for m in muxes.values()))


def report_scale() -> str:
    """Run the scale point per mode; the section of docs/results/tree.md."""
    machine = _machine()
    rows = []
    for mode in SCALE_MODES:
        r = run_jobs(SCALE_TREE, SCALE_JOBS, elements=SCALE_ELEMENTS, window=SCALE_WINDOW, mode=mode)
        if not r.exact:
            raise AssertionError(f"mode {mode.value}: a rank's sum differs from numpy's")
        rows.append(f"| {mode.value} | {r.ranks} | {r.switches} | {r.jobs} | yes | {r.to_switch:,} | "
                    f"{r.to_hosts:,} | {r.virtual * 1e6:,.0f} | {r.wall:.1f} |")
        print(rows[-1], flush=True)
    return "\n".join([
        SCALE_HEADING,
        "",
        f"{SCALE_JOBS} AllReduce jobs at once, each over all {math.prod(Tree.parse(SCALE_TREE).fanouts)} ranks "
        f"of a {SCALE_TREE} tree (depth 3: a root, 4",
        "switches, 32 leaf switches of 8 ranks) of model switches, in one `TreeNetwork` run in virtual time,",
        f"1 us per hop, no faults; {SCALE_ELEMENTS:,} float32 per rank and job ({SCALE_ELEMENTS * 4 // 1024} KiB, "
        f"1 KiB chunks, window {SCALE_WINDOW}).",
        "`plan_tree_jobs` gives each job its own slot region and QPNs on every switch; a rank's `RankMux`",
        "hands each frame to the job whose QP it names. Every rank of every job ends with its sum equal, bit",
        "for bit, to numpy's (`inagg.host.collectives.reference`). Wall time: the run alone, on one core.",
        "Virtual time counts hop latency only (`TreeNetwork` has no link rate): it shows the rounds of",
        "the window, not throughput. `inagg demo --tree SPEC --jobs N` runs the same path.",
        "",
        f"Measured with `nice -n 10 .venv/bin/python bench/tree.py --scale` {machine}.",
        "",
        "| mode | ranks | switches | jobs | exact | frames to switches | frames to ranks | virtual us | wall s |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|",
        *rows,
        "",
        "`tests/host/test_tree_scale.py` runs the same path on a 2x2x4 tree with 2 jobs in CI.",
    ]) + "\n"


def _scale_section(page: str) -> str:
    """The page's scale section, which sits between the UC part and the Mode II/III one ("" when absent)."""
    if SCALE_HEADING not in page:
        return ""
    return page[page.index(SCALE_HEADING):page.index(MODES_HEADING)].rstrip("\n") + "\n\n"


def main() -> None:
    page = OUT.read_text() if OUT.exists() else ""
    if "--scale" in sys.argv[1:]:
        head = page[:page.index(SCALE_HEADING if SCALE_HEADING in page else MODES_HEADING)]
        text = report_scale()
        OUT.write_text(head.rstrip("\n") + "\n\n" + text + "\n" + page[page.index(MODES_HEADING):])
    elif "--modes" in sys.argv[1:]:
        page = page[:page.index(MODES_HEADING)].rstrip("\n") + "\n" if MODES_HEADING in page else page
        OUT.write_text(page + "\n" + (text := report_modes()))
    else:
        OUT.write_text((text := report()) + "\n" + _scale_section(page) + report_modes())
    print(text, end="")

if __name__ == "__main__":
    main()
