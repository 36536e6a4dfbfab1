"""Scale-out figures: DDP through inagg against gloo, and the switch service's frame rate.

Writes docs/results/scaleout.md. Run: ``.venv/bin/python bench/scaleout.py`` (needs the ``torch`` extra).

1. ``examples/ddp_train.py --backend both`` under torchrun with 2 and 4 CPU
   processes: median step time and bytes each rank sends per step, inagg
   (contribution frames, headers included) against gloo (what the process
   writes to its sockets; ring all-reduce moves 2(N-1)/N of the gradient).
2. ``inagg switch serve`` with 4, 16 and 64 workers of one job spread over
   4 worker processes (threads within), each worker all-reducing the same
   number of float32 elements: contribution frames in and result frames out
   per second of the service.
"""

from __future__ import annotations

import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "results" / "scaleout.md"
STEPS = 30
WORKER_PROCESSES = 4
ELEMENTS = 64 << 10  # float32 elements per worker and all-reduce: 256 KiB, 256 chunks
ROUNDS = 3

WORKERS = r"""
import json, os, sys, threading, time
import numpy as np
from inagg.host import allreduce
from inagg.host.service import Ticket, join
from inagg.host.worker import Timing

ticket = Ticket.from_json(os.environ["INAGG_TICKET"])
ranks = [int(r) for r in sys.argv[1].split(",")]
n, rounds = int(sys.argv[2]), int(sys.argv[3])
timing = Timing(timeout=0.2, max_timeout=2.0, tries=12)
groups = {r: join(ticket, r, timing=timing) for r in ranks}
print("ready", flush=True)
sys.stdin.readline()
ok = {}
def run(r):
    x = np.ones(n, np.float32)
    ok[r] = all(np.array_equal(allreduce(x, groups[r]), np.full(n, len(ticket.job.workers), np.float32))
                for _ in range(rounds))
threads = [threading.Thread(target=run, args=(r,)) for r in ranks]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps({"ok": all(ok.values()), "resent": sum(g.worker.stats["resent"] for g in groups.values())}),
      flush=True)
"""


def ddp(nproc: int) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--standalone",
           str(ROOT / "examples" / "ddp_train.py"), "--backend", "both", "--steps", str(STEPS), "--json"]
    # A session of its own, so that a run past its time is killed with every rank it started.
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                         start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        out, err = p.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        raise
    if p.returncode:
        raise RuntimeError(out + err)
    return json.loads(next(line for line in out.splitlines() if line.startswith("{")))


def service_rate(workers: int) -> dict:
    from inagg.host.service import ENV_TICKET, SwitchClient

    serve = subprocess.Popen([sys.executable, "-m", "inagg.cli", "switch", "serve", "--listen", "127.0.0.1:0",
                              "--vxlan", "127.0.0.1:0", "--ports", "64", "--slots", "4096", "--log-level",
                              "info"], stderr=subprocess.PIPE, text=True)
    try:
        addr = re.search(r"listening: control ([\d.]+:\d+)", serve.stderr.readline()).group(1)
        with SwitchClient(addr) as client:
            # About 128 frames in flight in all: a deeper queue only lengthens the round trip.
            ticket = client.create_job(workers, window=max(2, 128 // workers))
            env = {**os.environ, ENV_TICKET: ticket.to_json()}
            procs = []
            for k in range(min(WORKER_PROCESSES, workers)):
                ranks = ",".join(str(r) for r in range(k, workers, WORKER_PROCESSES))
                procs.append(subprocess.Popen([sys.executable, "-c", WORKERS, ranks, str(ELEMENTS), str(ROUNDS)],
                                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env))
            for p in procs:
                assert p.stdout.readline().strip() == "ready"
            before = client.counters(ticket.job.job, ticket.token)["switch"]
            t0 = time.perf_counter()
            for p in procs:
                p.stdin.write("go\n")
                p.stdin.flush()
            answers = [json.loads(p.stdout.readline()) for p in procs]
            wall = time.perf_counter() - t0
            after = client.counters(ticket.job.job, ticket.token)["switch"]
            for p in procs:
                p.wait(60)
    finally:
        serve.terminate()
        serve.wait(30)
    if not all(a["ok"] for a in answers):
        raise RuntimeError(f"an all-reduce through the service came out wrong with {workers} workers")
    rx = after["RX_FRAMES"] - before["RX_FRAMES"]
    tx = after["TX_RESULTS"] - before["TX_RESULTS"]
    return {"workers": workers, "processes": len(procs), "wall_s": wall, "rx_fps": rx / wall, "tx_fps": tx / wall,
            "retransmissions": sum(a["resent"] for a in answers)}


def main() -> int:
    import numpy
    import torch

    load0 = os.getloadavg()[0]
    runs = {n: ddp(n) for n in (2, 4)}
    rates = [service_rate(n) for n in (4, 16, 64)]
    load1 = os.getloadavg()[0]
    lines = [
        "# Scale-out: DDP through inagg, and the switch service",
        "",
        f"Measured with `.venv/bin/python bench/scaleout.py` on {platform.machine()}, {os.cpu_count()} cores shared "
        f"by every process, Python {platform.python_version()}, numpy {numpy.__version__}, torch {torch.__version__}, "
        f"loopback only; 1-minute load average {load0:.1f} at the start and {load1:.1f} at the end (other",
        "work shares the machine: rates vary from run to run by a factor of two or more).",
        "",
        f"## DDP step time and bytes per rank (`examples/ddp_train.py --backend both --steps {STEPS}`)",
        "",
        "Median over the steps of forward + backward (the all-reduce included). S is the gradient's size; inagg",
        "sends 32-bit lanes in 1098-byte frames for 1024 payload bytes, plus the two chunks of the scale",
        "agreement per bucket; ring all-reduce sends 2(N-1)/N S per rank. gloo's bytes are what each",
        "process writes to its sockets (`/proc/self/io`), the barriers and loss reductions included.",
        "",
        "Retransmissions (of rank 0, over the run) are not in the inagg bytes.",
        "",
        "| ranks | parameters | S (bytes) | inagg step | gloo step | inagg sent/rank/step | gloo sent/rank/step "
        "| 2(N-1)/N S | inagg retransmissions | loss rel. diff |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, r in runs.items():
        a, g = r["runs"]["inagg"], r["runs"]["gloo"]
        s = 4 * a["parameters"]
        lines.append(f"| {n} | {a['parameters']:,} | {s:,} | {a['step_time_s'] * 1e3:.1f} ms | "
                     f"{g['step_time_s'] * 1e3:.1f} ms | {a['bytes_sent_per_step']:,.0f} ({a['bytes_sent_per_step'] / s:.2f} S) | "
                     f"{g['bytes_sent_per_step']:,.0f} ({g['bytes_sent_per_step'] / s:.2f} S) | "
                     f"{2 * (n - 1) / n * s:,.0f} | {a['retransmissions']} | {r['max_loss_rel_diff']:.1e} |")
    lines += [
        "",
        "The inagg step is slow here because the switch is the numpy model switch running in a thread of",
        "rank 0 (an embedded service) and every frame is built, checked and parsed in Python on the two",
        "shared cores; gloo adds in C++. The bytes are the point: in-network aggregation sends each",
        "gradient byte once, the ring twice (less 1/N).",
        "",
        f"## Switch service frame rate (`inagg switch serve`, {WORKER_PROCESSES} worker processes, "
        f"{ELEMENTS * 4 >> 10} KiB per worker, {ROUNDS} all-reduces)",
        "",
        "| workers | processes | wall time | contributions in | results out | retransmissions |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rates:
        lines.append(f"| {r['workers']} | {r['processes']} | {r['wall_s']:.2f} s | {r['rx_fps']:,.0f} frames/s | "
                     f"{r['tx_fps']:,.0f} frames/s | {r['retransmissions']:,} |")
    lines += [
        "",
        "One service thread runs the model switch (docs/results/models.md: about 20,000 contribution",
        "frames/s alone); the worker processes compete with it for the same cores.",
        "",
    ]
    OUT.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
