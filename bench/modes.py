"""Model checking of EPIC's Modes I, II and III on one switch: states, transitions and time per scope.

Runs :func:`inagg.host.checker.check` over each scope below (2 ranks, every
interleaving, reordering always on, at most one loss or duplication per
timeout round) and the mutations (a result freed before the slowest rank
ACKed it, in Mode III and in Mode I), and writes ``docs/results/modes.md``.
A scope that passes the state budget is reported as such, not left out.
``--mode-i`` measures Mode I alone and replaces its section of the file,
keeping the rest.

    nice -n 10 .venv/bin/python bench/modes.py [--budget STATES] [--mode-i]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import time
from pathlib import Path

from inagg.host.checker import Scope, Violation, check
from inagg.models.job import Mode
from inagg.models.modes import AugmentedJob
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


def _row(scope: Scope, budget: int) -> str:
    head = f"| {scope.mode.value} | {scope.window} | {scope.chunks} | {scope.faults} |"
    t0 = time.perf_counter()
    try:
        r = check(scope, max_states=budget)
    except RuntimeError:
        return f"{head} > {budget:,} (budget) | | | {time.perf_counter() - t0:.0f} s |"
    return f"{head} {r.states:,} | {r.transitions:,} | {r.final_states} | {r.seconds:.1f} s |"


def _mutation(job: type, scope: Scope, budget: int) -> tuple[str, str]:
    job.free_on_first_ack = True
    t0 = time.perf_counter()
    try:
        check(scope, max_states=budget)
    except Violation as v:
        return f"found in {time.perf_counter() - t0:.2f} s", str(v)
    except RuntimeError:
        return f"not found within {budget:,} states ({time.perf_counter() - t0:.0f} s)", ""
    finally:
        job.free_on_first_ack = False
    return "NOT FOUND: the checker missed the bug", ""


def _mode_i_section(budget: int, command: str) -> list[str]:
    """The Mode I section of the file: its rows and its mutation, with the command and the commit."""
    load = os.getloadavg()
    rows = []
    for s in MODE_I_SCOPES:
        rows.append(_row(s, budget))
        print(rows[-1], flush=True)
    verdict, trace = _mutation(TerminatedJob, MODE_I_MUTATION, budget)
    print("mode I mutation:", verdict, flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=OUT.parent).stdout.strip() or "unknown"
    lines = [
        MODE_I_HEADING,
        "",
        f"Measured with `{command}` at commit {commit} on {platform.machine()}, Python "
        f"{platform.python_version()}, 2 cores shared with other jobs (load average {load[0]:.1f} at the start); "
        "one run per row.",
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


def _without_mode_i(text: str) -> list[str]:
    """The lines of ``text`` outside its Mode I section."""
    lines = text.splitlines()
    if MODE_I_HEADING not in lines:
        return lines + [""]
    start = lines.index(MODE_I_HEADING)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[:start] + lines[end:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=30_000, help="states per scope before it is given up")
    ap.add_argument("--mode-i", action="store_true", help="measure Mode I only and replace its section of the file")
    args = ap.parse_args()
    command = f"nice -n 10 .venv/bin/python bench/modes.py --budget {args.budget}"
    if args.mode_i:
        lines = _without_mode_i(OUT.read_text()) + _mode_i_section(args.budget, command + " --mode-i")
        lines[0] = TITLE
        OUT.write_text("\n".join(lines))
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
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
