"""The public API in each mode on threads: AllReduce wall time over the in-process fabric, and how long a dead
rank takes to become an error.

Writes docs/results/api_modes.md. Run: ``.venv/bin/python bench/api_modes.py``.
"""

from __future__ import annotations

import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from inagg import host
from inagg.host.controller import Controller, plan
from inagg.host.link import Faults
from inagg.host.service_cli import SERVICE_HOP_TIMEOUT
from inagg.models.job import Mode
from inagg.models.protocol import Counter
from inagg.models.switch import ModelSwitch

from _report import head_commit, publish

OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "api_modes.md"
RANKS, ELEMENTS, REPEAT = 4, 1 << 16, 3
TIMING = host.Timing(timeout=0.05, max_timeout=0.05, tries=40)
DEAD = host.Timing(timeout=0.02, max_timeout=0.02, tries=3)
HOP_TIMEOUTS = (0.01, SERVICE_HOP_TIMEOUT)  # a short one, and the service's default


def call_all(mode: Mode, ranks: list[int], timing: host.Timing, faults: Faults | None, data,
             hop_timeout: float = HOP_TIMEOUTS[0]) -> tuple[list, dict]:
    """Each rank of ``ranks`` all-reduces its array on a thread; returns (seconds, error type or None) by rank,
    and the switch's counters."""
    p = plan([RANKS], window=32, chunk_bytes=1024, mode=mode)
    sw = ModelSwitch(p.switch, hop_timeout=hop_timeout)
    Controller(sw, p).configure()

    def rank(g, x):
        t0 = time.perf_counter()
        try:
            host.allreduce(x, g)
            return time.perf_counter() - t0, None
        except host.ProtocolError as e:
            return time.perf_counter() - t0, type(e).__name__

    with host.MemoryFabric(sw, faults=faults, seed=1) as fabric, ThreadPoolExecutor(len(ranks)) as pool:
        groups = [host.Group(p.switch, p.jobs[0], r, fabric.port(p.jobs[0].workers[r].port), timing=timing)
                  for r in ranks]
        out = list(pool.map(rank, groups, [data[r] for r in ranks]))
        for g in groups:
            g.close()
    return out, sw.counters


def main() -> None:
    rng = np.random.default_rng(0)
    data = [rng.standard_normal(ELEMENTS).astype(np.float32) for _ in range(RANKS)]
    rows = []
    for mode in (Mode.UC, Mode.TERMINATED, Mode.TRANSLATED, Mode.AUGMENTED):
        for hop in HOP_TIMEOUTS if mode in (Mode.TERMINATED, Mode.AUGMENTED) else HOP_TIMEOUTS[:1]:
            cells = [mode.value, f"{hop * 1e3:g}" if mode in (Mode.TERMINATED, Mode.AUGMENTED) else "-"]
            for loss in (0.0, 0.01):
                runs = [call_all(mode, list(range(RANKS)), TIMING, Faults(loss=loss), data, hop)
                        for _ in range(REPEAT)]
                slowest = [max(t for t, _ in times) for times, _ in runs]
                failed = sum(any(e for _, e in times) for times, _ in runs)
                resends = statistics.median(c[Counter.HOP_RESENDS] for _, c in runs)
                cells.append(f"{statistics.median(slowest) * 1e3:.0f} ({resends:.0f})"
                             + (f", {failed} of {REPEAT} failed" if failed else ""))
            times, _ = call_all(mode, list(range(RANKS - 1)), DEAD, None, data, hop)
            errors = ", ".join(sorted({str(e) for _, e in times}))
            cells.append(f"{max(t for t, _ in times) * 1e3:.0f} ({errors})")
            rows.append("| " + " | ".join(cells) + " |")
    publish(OUT, [
        "# The public API in each mode, on threads",
        "",
        f"`.venv/bin/python bench/api_modes.py` at commit {head_commit()}, {os.cpu_count()} cores shared with "
        "other jobs: wall-clock figures, a guide rather than a promise.",
        "",
        f"{RANKS} ranks on threads call `inagg.host.allreduce` on {ELEMENTS:,} float32 each through one "
        "`MemoryFabric` and a `ModelSwitch` (Modes I and III: its hop timeout in real time), window 32, "
        f"1024-byte chunks; the slowest rank's time, median of {REPEAT} runs, and in brackets the switch's "
        f"`HOP_RESENDS` (median). Hosts: timeout "
        f"{TIMING.timeout * 1e3:g} ms, {TIMING.tries} tries. Dead rank: one rank never calls; the others, with "
        f"timeout {DEAD.timeout * 1e3:g} ms and {DEAD.tries} tries (bound {DEAD.timeout * DEAD.tries * 1e3:g} ms), "
        "raise the error shown after the time shown (the slowest of them).",
        "",
        "| mode | hop timeout (ms) | AllReduce, no loss (ms) | AllReduce, 1 % loss each way (ms) | "
        "dead rank: error after (ms) |",
        "|---|---|---|---|---|",
        *rows,
        "",
        "A hop timeout shorter than the time a Python host takes to ACK under load fires without loss: the "
        "switch resends results the hosts have (`HOP_RESENDS` above zero with no loss), and Mode I's result QPs "
        "may run out of retries (`QP_ERRORS`). In real time the hop timeout has to cover the hosts' response "
        "time; `inagg switch serve --backend model --hop-timeout` sets it.",
        "",
    ])


if __name__ == "__main__":
    main()
