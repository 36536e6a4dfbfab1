"""Loss recovery: completion time at 1 % loss against no loss, waiting for the timeout or resending early.

Writes docs/results/recovery.md. Run: ``.venv/bin/python bench/recovery.py``. Times are virtual (the memory
network's clock, 1 us per hop), so they do not depend on the machine's load; each figure is the median over
seeds.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

import numpy as np
from _report import publish

from inagg.host.controller import Controller, plan
from inagg.host.link import Faults
from inagg.host.memnet import MemoryNetwork
from inagg.host.worker import AllReduce, Timing, Worker
from inagg.models.backend import DEFAULT_BACKEND, load_backend

OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "recovery.md"
WORKERS, SIZE, SEEDS = 4, 256 << 10, 7
# inagg demo's timing on the memory network: the first timeout is about 100 round trips.
DEMO = Timing(timeout=200e-6, max_timeout=20e-3, tries=30)


def completion(loss: float, timing: Timing, seed: int) -> tuple[float, int]:
    """(virtual seconds until every worker has its sum, contributions resent) of one all-reduce."""
    p = plan([WORKERS])
    switch = load_backend(DEFAULT_BACKEND).open(p.switch)
    Controller(switch, p).configure()
    rng = np.random.default_rng(seed)
    data = [rng.standard_normal(SIZE // 4, np.float32) for _ in range(WORKERS)]
    ops = {w.port: AllReduce(Worker(p.switch, p.jobs[0], r, timing=timing), data[r])
           for r, w in enumerate(p.jobs[0].workers)}
    stats = MemoryNetwork(switch, faults=Faults(loss=loss), seed=seed).run(ops)
    first = ops[p.jobs[0].workers[0].port].result()
    assert all(np.array_equal(op.result(), first) for op in ops.values()), "workers disagree on the sum"
    return stats.virtual_time, sum(op.worker.stats["resent"] for op in ops.values())


def main() -> None:
    rows = []
    for name, timing in (("timeout only (early = 0)", dataclasses.replace(DEMO, early=0)),
                         (f"early resend (early = {DEMO.early})", DEMO)):
        clean = statistics.median(completion(0.0, timing, s)[0] for s in range(SEEDS))
        lossy = [completion(0.01, timing, s) for s in range(SEEDS)]
        t = statistics.median(v for v, _ in lossy)
        resent = statistics.median(r for _, r in lossy)
        rows.append((name, clean, t, resent))
        print(f"{name}: {clean * 1e3:.3f} ms clean, {t * 1e3:.3f} ms at 1% loss ({t / clean:.1f}x), "
              f"{resent:.0f} resent", flush=True)
    lines = [
        "# Loss recovery: completion time at 1 % loss",
        "",
        f"Measured with `.venv/bin/python bench/recovery.py`: {WORKERS} workers x {SIZE >> 10} KiB, the memory "
        "network (1 us per hop, virtual time), the fast switch, `inagg demo`'s timing (first timeout 200 us, "
        f"about 100 round trips, doubling up to 20 ms). Medians over {SEEDS} seeds; virtual time does not depend on "
        "the machine's load.",
        "",
        "| worker | no loss | 1 % loss | ratio | contributions resent (1 % loss) |",
        "|---|---:|---:|---:|---:|",
        *[f"| {name} | {clean * 1e3:.3f} ms | {t * 1e3:.3f} ms | {t / clean:.1f}x | {resent:,.0f} |"
          for name, clean, t, resent in rows],
        "",
        "With early resends a worker resends a chunk sent once as soon as the result of a chunk 3 or more",
        "places later arrives (`docs/protocol.md` section 3.1), instead of waiting for its timer; the timer",
        "stays the backstop (for the last chunks of a batch, which nothing overtakes, and for a resend that is",
        "lost again).",
        "",
    ]
    publish(OUT, lines)


if __name__ == "__main__":
    main()
