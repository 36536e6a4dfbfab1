"""Scale-out figures: DDP through inagg against gloo, and the switch service's frame rate.

Writes docs/results/scaleout.md. Run: ``.venv/bin/python bench/scaleout.py [--only ddp,torch,service,rtl]``
(``ddp`` needs the ``torch`` extra; ``rtl`` the simulation tools of the ``dev`` extra). With ``--only``,
the other sections of the file stay as they were.

1. ``examples/ddp_train.py --backend both`` under torchrun with 2 and 4 CPU
   processes: median step time and bytes each rank sends per step, inagg
   (contribution frames, headers included) against gloo (what the process
   writes to its sockets; ring all-reduce moves 2(N-1)/N of the gradient).
2. ``examples/step_time.py`` under torchrun with 2 and 4 CPU processes, for
   a model of about 0.25 M and one of about 25 M parameters: the median DDP
   step time through the ``"inagg"`` process group, through gloo with
   inagg's comm hook, and on gloo alone, in one run.
3. ``inagg switch serve`` with 4, 16 and 64 workers of one job spread over
   4 worker processes (threads within), each worker all-reducing the same
   number of float32 elements: contribution frames in and result frames out
   per second of the service.
4. The same with ``--backend rtl``: 4 workers on the Verilated RTL switch
   (4 ports) at 64- and 512-bit beats.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "results" / "scaleout.md"
STEPS = 30
WORKER_PROCESSES = 4
ELEMENTS = 64 << 10  # float32 elements per worker and all-reduce: 256 KiB, 256 chunks
ROUNDS = 3
TIMEOUT = 0.2      # first retransmission timeout of the workers, seconds
RTL_TIMEOUT = 1.0  # the simulated switch drains 128 frames in flight in a few hundred milliseconds
RTL_WIDTHS = (64, 512)
RTL_WORKERS = 4
SECTIONS = ("ddp", "torch", "service", "rtl")
# (ranks, model width, timed steps): about 0.25 M and 25 M parameters. A 25 M step sends 100 times the
# frames through the Python switch (minutes at 4 ranks on two cores): timed once.
TORCH_RUNS = ((2, 500, 3), (4, 500, 3), (2, 5000, 1), (4, 5000, 1))
TORCH_WAYS = ("backend", "hook", "gloo")

WORKERS = r"""
import json, os, sys, threading, time
import numpy as np
from inagg.host import allreduce
from inagg.host.service import Ticket, join
from inagg.host.worker import Timing

ticket = Ticket.from_json(os.environ["INAGG_TICKET"])
ranks = [int(r) for r in sys.argv[1].split(",")]
n, rounds, timeout = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
timing = Timing(timeout=timeout, max_timeout=10 * timeout, tries=12)
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
    return _torchrun(nproc, "ddp_train.py", "--backend", "both", "--steps", str(STEPS), "--json")


def _torchrun(nproc: int, example: str, *args: str) -> dict:
    """The JSON line of ``examples/EXAMPLE ARGS`` under torchrun with ``nproc`` CPU processes."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--standalone",
           str(ROOT / "examples" / example), *args]
    # A session of its own, so that a run past its time is killed with every rank it started.
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                         start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        out, err = p.communicate(timeout=1800)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        raise
    if p.returncode:
        raise RuntimeError(out + err)
    return json.loads(next(line for line in out.splitlines() if line.startswith("{")))


def service_rate(workers: int, width: int | None = None) -> dict:
    """The service's frame rate for one job of ``workers``; on the RTL at ``width`` bits when given."""
    from inagg.host.service import ENV_TICKET, SwitchClient

    switch = (["--ports", "64", "--slots", "4096"] if width is None else
              ["--backend", "rtl", "--ports", str(workers), "--slots", "256", "--width", str(width)])
    # The switch-wide counters are the operator's: the bench is, with an admin token (the RTL attributes none to a job).
    admin = secrets.token_hex(16)
    token_file = tempfile.NamedTemporaryFile("w", suffix=".token")
    token_file.write(admin + "\n")
    token_file.flush()
    # The simulator's own output (cocotb's) goes nowhere; the service logs to stderr.
    serve = subprocess.Popen([sys.executable, "-m", "inagg.cli", "switch", "serve", "--listen", "127.0.0.1:0",
                              "--vxlan", "127.0.0.1:0", *switch, "--log-level", "info",
                              "--admin-token-file", token_file.name],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while not (m := re.search(r"listening: control ([\d.]+:\d+)", line := serve.stderr.readline())):
            if not line:
                raise RuntimeError(f"inagg switch serve {' '.join(switch)} did not start")
        addr = m.group(1)
        with SwitchClient(addr, admin_token=admin) as client:
            # About 128 frames in flight in all: a deeper queue only lengthens the round trip.
            ticket = client.create_job(workers, window=max(2, 128 // workers))
            env = {**os.environ, ENV_TICKET: ticket.to_json()}
            procs = []
            for k in range(min(WORKER_PROCESSES, workers)):
                ranks = ",".join(str(r) for r in range(k, workers, WORKER_PROCESSES))
                timeout = TIMEOUT if width is None else RTL_TIMEOUT
                procs.append(subprocess.Popen([sys.executable, "-c", WORKERS, ranks, str(ELEMENTS), str(ROUNDS),
                                               str(timeout)],
                                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env))
            for p in procs:
                assert p.stdout.readline().strip() == "ready"
            before = client.switch_counters()["switch"]
            t0 = time.perf_counter()
            for p in procs:
                p.stdin.write("go\n")
                p.stdin.flush()
            answers = [json.loads(p.stdout.readline()) for p in procs]
            wall = time.perf_counter() - t0
            after = client.switch_counters()["switch"]
            for p in procs:
                p.wait(60)
    finally:
        serve.terminate()
        serve.wait(30)
        token_file.close()
    if not all(a["ok"] for a in answers):
        raise RuntimeError(f"an all-reduce through the service came out wrong with {workers} workers")
    rx = after["RX_FRAMES"] - before["RX_FRAMES"]
    tx = after["TX_RESULTS"] - before["TX_RESULTS"]
    return {"workers": workers, "width": width, "processes": len(procs), "wall_s": wall, "rx_fps": rx / wall,
            "tx_fps": tx / wall, "retransmissions": sum(a["resent"] for a in answers)}


def _ddp_section() -> list[str]:
    runs = {n: ddp(n) for n in (2, 4)}
    lines = [
        f"## DDP step time and bytes per rank (`examples/ddp_train.py --backend both --steps {STEPS}`)",
        "",
        f"Measured at commit {_commit()}. Median over the steps of forward + backward (the all-reduce",
        "included). S is the gradient's size; inagg sends 32-bit lanes in 1098-byte frames for 1024 payload",
        "bytes, plus the two chunks of the scale",
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
    return lines + [
        "",
        "The inagg step is slow here because the switch (the compiled fast switch) runs in a service thread",
        "of rank 0 (an embedded service), and the ranks build, send, receive and parse every frame in Python",
        "on the two shared cores; gloo adds in C++. The bytes are the point: in-network aggregation sends",
        "each gradient byte once, the ring twice (less 1/N).",
        "",
    ]


def _torch_section() -> list[str]:
    lines = [
        "## PyTorch step time: the inagg process group, the comm hook, gloo (`examples/step_time.py`)",
        "",
        f"Measured at commit {_commit()}. Median DDP step (forward, backward with the all-reduce, SGD step) of",
        "`Linear(W, W)`, tanh, `Linear(W, 1)` in float32, batch 16, after one step of warm-up; each way a",
        "torchrun run of its own, the switch embedded in rank 0.",
        "",
        "| ranks | parameters | timed steps | inagg process group | gloo + inagg comm hook | gloo "
        "| process group / gloo |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, width, steps in TORCH_RUNS:
        r = {way: _torchrun(n, "step_time.py", "--way", way, "--width", str(width), "--steps", str(steps))
             for way in TORCH_WAYS}
        t = {way: r[way]["median_s"] for way in TORCH_WAYS}
        lines.append(f"| {n} | {r['gloo']['parameters']:,} | {steps} | {t['backend'] * 1e3:,.0f} ms | "
                     f"{t['hook'] * 1e3:,.0f} ms | {t['gloo'] * 1e3:,.0f} ms | {t['backend'] / t['gloo']:.0f} |")
    return lines + [
        "",
        "Both inagg ways run the fast switch in a service thread of rank 0, and the ranks build, send,",
        "receive and parse every frame in Python on the two shared cores; gloo adds in C++. The process",
        "group and the hook send the same frames; the process group also syncs the model and runs the",
        "barriers through the switch.",
        "25 M parameters sends 100 times the frames of 0.25 M per step: one timed step.",
        "",
    ]


def _commit() -> str:
    """The measured commit, ``-dirty`` when the work tree differs from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=ROOT).returncode
    return f"`{head.stdout.strip()}{'-dirty' if dirty else ''}`"


def _rate_rows(rates: list[dict]) -> list[str]:
    lines = ["| workers | processes | wall time | contributions in | results out | retransmissions |",
             "|---:|---:|---:|---:|---:|---:|"]
    for r in rates:
        lines.append(f"| {r['workers']} | {r['processes']} | {r['wall_s']:.2f} s | {r['rx_fps']:,.0f} frames/s | "
                     f"{r['tx_fps']:,.0f} frames/s | {r['retransmissions']:,} |")
    return lines


def _service_section() -> list[str]:
    rates = [service_rate(n) for n in (4, 16, 64)]
    return [
        f"## Switch service frame rate (`inagg switch serve`, {WORKER_PROCESSES} worker processes, "
        f"{ELEMENTS * 4 >> 10} KiB per worker, {ROUNDS} all-reduces)",
        "",
        f"Measured at commit {_commit()}.",
        "",
        *_rate_rows(rates),
        "",
        "One service thread runs the fast switch (docs/results/fastswitch.md: 300,000 contributions/s and",
        "more alone, in batches) and its socket loop in Python; the worker processes compete with it for",
        "the same cores.",
        "",
    ]


def _rtl_section() -> list[str]:
    rates = [service_rate(RTL_WORKERS, width) for width in RTL_WIDTHS]
    lines = [
        f"## Switch service frame rate on the RTL (`inagg switch serve --backend rtl --ports {RTL_WORKERS} "
        f"--slots 256 --width W`, {RTL_WORKERS} worker processes, {ELEMENTS * 4 >> 10} KiB per worker, "
        f"{ROUNDS} all-reduces)",
        "",
        f"Measured at commit {_commit()}.",
        "",
        "| W | " + _rate_rows(rates)[0][2:],
        "|---:" + _rate_rows(rates)[1],
    ]
    lines += [f"| {r['width']} " + row for r, row in zip(rates, _rate_rows(rates)[2:])]
    return lines + [
        "",
        "The Verilated switch runs in a simulator child process of the service (docs/emulation.md, real",
        "time); the service thread, the simulator and the worker processes share the two cores. Start-up",
        "(the Verilog generation, the cached build's check, the simulator) is not in the wall time.",
        f"The workers' first timeout is {RTL_TIMEOUT} s here ({TIMEOUT} s on the software switch); contributions in",
        "count retransmitted frames too.",
        "",
    ]


def _sections(text: str) -> dict[str, str]:
    """The ``## `` sections of a results file by key, each with its heading."""
    keys = {"## DDP": "ddp", "## PyTorch step time": "torch", "## Switch service frame rate on the RTL": "rtl",
            "## Switch service frame rate": "service"}
    out = {}
    for part in re.split(r"(?m)^(?=## )", text)[1:]:
        out[next(k for h, k in keys.items() if part.startswith(h))] = part
    return out


def main(argv: list[str] | None = None) -> int:
    import numpy

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", type=lambda t: t.split(","), default=list(SECTIONS),
                    help=f"sections to measure again, of {','.join(SECTIONS)} (default all)")
    args = ap.parse_args(argv)
    if set(args.only) - set(SECTIONS):
        ap.error(f"--only takes sections of {','.join(SECTIONS)}, not {','.join(args.only)}")
    try:
        import torch
        versions = f"numpy {numpy.__version__}, torch {torch.__version__}"
    except ImportError:
        if {"ddp", "torch"} & set(args.only):
            raise
        versions = f"numpy {numpy.__version__}"
    kept = _sections(OUT.read_text()) if OUT.exists() else {}
    load0 = os.getloadavg()[0]
    build = {"ddp": _ddp_section, "torch": _torch_section, "service": _service_section, "rtl": _rtl_section}
    fresh = {k: "\n".join(build[k]()) + "\n" for k in SECTIONS if k in args.only}
    load1 = os.getloadavg()[0]
    command = "bench/scaleout.py" + ("" if len(args.only) == len(SECTIONS) else f" --only {','.join(args.only)}")
    lines = [
        "# Scale-out: DDP through inagg, and the switch service",
        "",
        f"Measured with `.venv/bin/python {command}` at commit {_commit()} on {platform.machine()}, "
        f"{os.cpu_count()} cores shared "
        f"by every process, Python {platform.python_version()}, {versions}, "
        f"loopback only; 1-minute load average {load0:.1f} at the start and {load1:.1f} at the end (other",
        "work shares the machine: rates vary from run to run by a factor of two or more)."
        + ("" if len(args.only) == len(SECTIONS) else
           f" Sections other than {', '.join(args.only)} are from an earlier run."),
        "",
    ]
    parts = [fresh.get(k, kept.get(k, "")).strip("\n") for k in SECTIONS]
    text = "\n".join(lines) + "\n" + "\n\n".join(p for p in parts if p) + "\n"
    OUT.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
