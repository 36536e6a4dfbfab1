"""Host-library speed: frame building and parsing, AF_PACKET sends, demo goodput, model-checker scope.

Writes docs/results/host.md. Run: ``.venv/bin/python bench/host.py`` (as root for
the netns rows; without root they are reported as skipped).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import platform
import time
from pathlib import Path

import numpy as np

from inagg.host.checker import Scope, check
from inagg.host.controller import plan
from inagg.host.demo_run import DemoConfig, run_demo
from inagg.host.fastpath import ContribTemplate, ResultParser
from inagg.models.switch import ModelSwitch

OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "host.md"
PLAN = plan([4])
SW, JOB = PLAN.switch, PLAN.jobs[0]


def best(fn, repeat: int = 5) -> float:
    """Shortest of ``repeat`` runs of ``fn``, in seconds."""
    t = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - t0)
    return t


def frame_rates() -> list[tuple[str, float, str]]:
    from scapy.layers.l2 import Ether

    from inagg.host.roce import ImmDt, contribution

    k = 4096
    lanes = np.random.default_rng(0).integers(-2**31, 2**31 - 1, (k, SW.lanes)).astype(np.int32)
    chunks = np.arange(k)
    tpl = ContribTemplate(SW, JOB, 0)
    fast_build = k / best(lambda: tpl.build(chunks, lanes))
    payloads = [row.astype(">i4").tobytes() for row in lanes[:500]]
    scapy_build = 500 / best(lambda: [bytes(contribution(SW, JOB, 0, c, p)) for c, p in enumerate(payloads)], 3)
    sw = ModelSwitch(SW)
    sw.add_job(JOB)
    tpls = [ContribTemplate(SW, JOB, r) for r in range(4)]
    results = []
    for c in range(500):
        for r in range(4):
            out = sw.receive(r, tpls[r].build(np.array([c]), lanes[c:c + 1])[0].tobytes())
        results.append(out[0][1])  # the completing contribution returns every worker's result
    parser = ResultParser(SW, JOB, 0)
    fast_parse = len(results) / best(lambda: [parser.parse(f) for f in results])
    scapy_parse = len(results) / best(lambda: [Ether(f)[ImmDt].imm for f in results], 3)
    gbit = fast_build * SW.chunk_bytes * 8 / 1e9
    return [
        ("fast path: build + ICRC, 1 KB contributions (batches of 4096)", fast_build,
         f"frames/s ({gbit:.1f} Gb/s of payload)"),
        ("scapy: build + ICRC, 1 KB contributions", scapy_build, "frames/s"),
        ("fast path: parse + check (ICRC included) a 1 KB result", fast_parse, "frames/s"),
        ("scapy: dissect a 1 KB result", scapy_parse, "frames/s"),
    ]


def _sender(ns: str, ifname: str, frames: list[bytes], conn) -> None:
    from inagg.host.netns import PacketPort, enter

    enter(ns)
    port = PacketPort(ifname)
    t0 = time.perf_counter()
    for f in frames:
        port.send(f)
    conn.send(time.perf_counter() - t0)


def afpacket_rate() -> float | None:
    if os.geteuid() != 0:
        return None
    from inagg.host.netns import Topology

    lanes = np.zeros((20000, SW.lanes), np.int32)
    frames = [bytes(r) for r in ContribTemplate(SW, JOB, 0).build(np.arange(20000), lanes)]
    ctx = mp.get_context("fork")
    with Topology(plan([1])) as topo:
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_sender, args=(topo.worker_ns(0), topo.worker_if, frames, child))
        p.start()
        dt = parent.recv()
        p.join()
    return len(frames) / dt


def demo_rows() -> list[tuple[str, dict]]:
    runs = [
        ("memory, 2 workers, 16 MiB", DemoConfig(workers=2)),
        ("memory, 4 workers, 16 MiB (`inagg demo`)", DemoConfig()),
        ("memory, 8 workers, 16 MiB", DemoConfig(workers=8)),
        ("memory, 4 workers, 16 MiB, 1% loss", DemoConfig(loss=0.01)),
        ("memory, 2 jobs x 4 workers, 4 MiB", DemoConfig(jobs=2, size=4 << 20)),
    ]
    if os.geteuid() == 0:
        runs += [
            ("netns, 2 workers, 16 MiB", DemoConfig(workers=2, net="netns")),
            ("netns, 4 workers, 16 MiB", DemoConfig(net="netns")),
            ("netns, 4 workers, 4 MiB", DemoConfig(net="netns", size=4 << 20)),
            ("netns, 4 workers, 4 MiB, 1% loss", DemoConfig(net="netns", size=4 << 20, loss=0.01)),
        ]
    out = []
    for name, cfg in runs:
        s = run_demo(cfg)
        if not s["ok"]:
            raise SystemExit(f"demo run {name!r} missed its error bound")
        out.append((name, s))
        print(f"{name}: {s['wall_time_s']:.2f} s", flush=True)
    return out


def main() -> None:
    frames = frame_rates()
    send = afpacket_rate()
    demos = demo_rows()
    scopes = [check(s) for s in (Scope(workers=2, chunks=3, faults=1), Scope(workers=3, chunks=3, faults=1),
                                 Scope(workers=2, chunks=4, faults=2), Scope(workers=3, chunks=3, faults=2))]
    lines = [
        "# Host library: speed",
        "",
        "Measured with `.venv/bin/python bench/host.py` (as root) on "
        f"{platform.machine()}, Python {platform.python_version()}, numpy {np.__version__}, on 2 cores shared with",
        "other jobs: frame rates are the best of 5 runs (3 for scapy), demo and checker rows one run each,",
        "so wall times vary between runs by up to 3x with the machine's load.",
        "",
        "## Frames",
        "",
        "| what | rate | unit |",
        "|---|---:|---|",
        *[f"| {what} | {r:,.0f} | {unit} |" for what, r, unit in frames],
        ("| AF_PACKET `send` of 1 KB contributions on a veth, one process | "
         + (f"{send:,.0f} | frames/s |" if send else "skipped (needs root) | |")),
        "",
        "The fast path takes the constant part of the headers and of the ICRC from a template and writes",
        "a batch of frames with numpy; one `zlib.crc32` call per frame finishes the ICRC.",
        "",
        "## Demo goodput",
        "",
        "Goodput is the tensor bytes of all workers divided by the wall time of the all-reduce (set-up,",
        "tensor generation and the check excluded). The switch is the numpy model switch in one process: it",
        "is the bottleneck (about 50 us per contribution, results included; see `docs/results/models.md`).",
        "",
        "| run | wall time | goodput | contributions | retransmissions | max error / bound |",
        "|---|---:|---:|---:|---:|---:|",
        *[f"| {name} | {s['wall_time_s']:.2f} s | {s['goodput_gbit_s'] * 1000:.0f} Mb/s | "
          f"{s['packets']['contributions_sent']:,} | {s['packets']['retransmissions']:,} | "
          f"{s['worst_error_to_bound']:.3f} |" for name, s in demos],
        "",
        "In virtual time (memory) a loss costs no wall time beyond the resent frames (timeouts are free);",
        "in the namespaces it costs the timeout (0.3 s) of the chunk that stalls the window. Retransmissions",
        "outnumber losses: while one worker waits for a lost frame, the other workers' chunks behind the",
        "stalled window time out too, and their resends reach the switch as `DUP_CONTRIB` (ignored, or",
        "answered with the result when the slot is done).",
        "",
        "## Model checking (`inagg.host.checker`)",
        "",
        "Every interleaving of deliveries, at most one loss or duplication per timeout round; every run",
        "ends with the exact aggregate at every worker. The first two rows are the CI scope",
        "(`tests/host/test_checker.py`).",
        "",
        "| workers | chunks | window | faults per run | states | transitions | final states | time |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
        *[f"| {r.scope.workers} | {r.scope.chunks} | {r.scope.window} | {r.scope.faults} | {r.states:,} | "
          f"{r.transitions:,} | {r.final_states} | {r.seconds:.1f} s |" for r in scopes],
        "",
    ]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
