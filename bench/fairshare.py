"""A co-tenant's all-reduce time through the switch service, alone and beside a job that floods the data plane.

Used by ``bench/reliability.py``, which writes its table into docs/results/reliability.md. ``inagg switch serve``
(fast switch, 256-byte chunks) runs as its own process, the flooding job's rank as another, sending valid
contributions of its own job (its own QPN and R_Key, chunk numbers cycling over four times its slot region) from
its attached endpoint as fast as Python sends; the co-tenant's two ranks are threads of the bench's process. Each
figure is the median wall time of a number of all-reduces of ``ELEMENTS`` floats. Side by side, the service is
run from this checkout and from an earlier commit (a ``git worktree``), e.g. the one before the fair share.
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from inagg.host import allreduce
from inagg.host.service import ENV_RANK, ENV_TICKET, SwitchClient, join

ROOT = Path(__file__).resolve().parents[1]
CHUNK = 256
ELEMENTS = 64 * CHUNK // 4  # 64 chunks an all-reduce

FLOOD = r"""
import os, sys, time
from inagg.host.roce import contribution
from inagg.host.service import group_from_env
g = group_from_env()
job, sw = g.job, g.switch
frames = [bytes(contribution(sw, job, 0, c, bytes(sw.chunk_bytes))) for c in range(4 * job.slots)]
print("ready", flush=True)
sys.stdin.readline()
sent, end = 0, time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    for f in frames:
        g.port.send(f)
    sent += len(frames)
print(sent, flush=True)
"""


def serve(options: list[str], log, pythonpath: str | None = None) -> tuple[subprocess.Popen, str]:
    """``inagg switch serve`` on free loopback ports with ``options``, its stderr to the file ``log``: the process
    and its control address, once it listens; ``pythonpath`` (:func:`checkout`) serves another commit's code."""
    env = dict(os.environ) if pythonpath is None else {**os.environ, "PYTHONPATH": pythonpath}
    proc = subprocess.Popen(
        [sys.executable, "-m", "inagg.cli", "switch", "serve", "--listen", "127.0.0.1:0", "--vxlan", "127.0.0.1:0",
         *options], stdout=subprocess.DEVNULL, stderr=log, env=env,
        cwd=pythonpath)  # python -m looks in its working folder first: not in this checkout for another's
    deadline = time.monotonic() + 60
    while not (m := re.search(r"listening: control ([\d.]+:\d+)", Path(log.name).read_text())):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"inagg switch serve did not start: {Path(log.name).read_text()}")
        time.sleep(0.05)
    return proc, m.group(1)


def _allreduces(groups, rounds: int) -> tuple[float, int]:
    """The median wall time of ``rounds`` all-reduces of the two ranks (a failed one counts its time to fail), and
    how many failed (a rank's error, or a wrong sum)."""
    data = [np.arange(ELEMENTS, dtype=np.float32) * (r + 1) for r in range(2)]
    times, failed = [], 0

    def rank(r, out):
        try:
            out[r] = allreduce(data[r], groups[r])
        except Exception as e:  # counted as a failed round
            out[r] = e

    for _ in range(rounds):
        out = [None, None]
        threads = [threading.Thread(target=rank, args=(r, out)) for r in range(2)]
        t0 = time.perf_counter()
        [t.start() for t in threads]
        [t.join() for t in threads]
        times.append(time.perf_counter() - t0)
        failed += not all(isinstance(o, np.ndarray) and np.array_equal(o, data[0] + data[1]) for o in out)
    return statistics.median(times), failed


def measure(rounds: int, flooders: int, pythonpath: str | None = None) -> dict:
    """The co-tenant's median all-reduce time alone and under the flood; the service's ``inagg`` from ``pythonpath``
    (:func:`checkout`) when given."""
    log = tempfile.NamedTemporaryFile("w+", prefix="inagg-fairshare-", suffix=".log")
    server, address = serve(["--ports", "8", "--slots", "1024", "--chunk-bytes", str(CHUNK)], log, pythonpath)
    procs = []
    try:
        with SwitchClient(address) as owner:
            victim = owner.create_job(2, window=16)
            groups = [join(victim, r) for r in range(2)]
            alone, _ = _allreduces(groups, rounds)
            floods = [owner.create_job(1, window=16) for _ in range(flooders)]
            for t in floods:
                procs.append(subprocess.Popen([sys.executable, "-c", FLOOD, "3600"], stdin=subprocess.PIPE,
                                              stdout=subprocess.PIPE, text=True,
                                              env={**os.environ, ENV_TICKET: t.to_json(), ENV_RANK: "0"}))
            for p in procs:
                assert p.stdout.readline().strip() == "ready"
                p.stdin.write("go\n")
                p.stdin.flush()
            time.sleep(1.0)  # the flood fills the socket buffers
            flooded, failed = _allreduces(groups, rounds)
            counts = [owner.counters(t.job.job, t.token)["service"] for t in floods]
            for g in groups:
                g.port.close()
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
            p.wait(30)
        server.send_signal(signal.SIGTERM)
        server.wait(60)
        log.close()
    return {"alone": alone, "flooded": flooded, "failed": failed, "rx": sum(c.get("rx_datagrams", 0) for c in counts),
            "dropped": sum(c.get("fair_share_drops", 0) + c.get("socket_drops", 0) for c in counts)}


def checkout(commit: str, where: Path) -> str:
    """Check ``commit`` out under ``where`` and lay its packages out as ``inagg`` imports them; the PYTHONPATH."""
    tree, pkg = where / "tree", where / "pkg" / "inagg"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=ROOT, check=True,
                   capture_output=True)
    pkg.mkdir(parents=True)
    for f in (tree / "inagg").glob("*.py"):
        (pkg / f.name).symlink_to(f)
    for sub in ("models", "hdl", "host", "testbench"):  # pyproject's package-dir
        (pkg / sub).symlink_to(tree / sub)
    return str(where / "pkg")


def section(before: str, rounds: int, flooders: int) -> list[str]:
    """The fair-share table: the service of this checkout and of commit ``before``, each alone and under a flood."""
    with tempfile.TemporaryDirectory(prefix="inagg-before-") as tmp:
        try:
            runs = {f"before (commit {before})": measure(rounds, flooders, checkout(before, Path(tmp))),
                    "this commit": measure(rounds, flooders)}
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(Path(tmp) / "tree")], cwd=ROOT,
                           capture_output=True)
    lines = [
        "## Fair share of the data plane: a co-tenant beside a flooding job",
        "",
        f"The script's `--before {before} --fair-share-rounds {rounds}` part (`bench/fairshare.py` says what runs): "
        f"the co-tenant (2 ranks) all-reduces {ELEMENTS} floats ({ELEMENTS * 4 // CHUNK} chunks of {CHUNK} bytes), "
        f"the median of {rounds} rounds, alone and while {flooders} job(s) of one rank flood valid contributions "
        "from another process; the service of the commit before the fair share and of this one, one after the "
        "other in the same run. A failed round counts its time to fail.",
        "",
        "| service | co-tenant alone | under the flood | slow-down | failed rounds | datagrams read (before: of every "
        "job) | flood dropped and counted |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in runs.items():
        flooded, slower = ((f"{r['flooded'] * 1e3:.1f} ms", f"{r['flooded'] / r['alone']:.1f}x") if not r["failed"]
                           else ("-", "every round failed" if r["failed"] == rounds else "some rounds failed"))
        lines.append(f"| {name} | {r['alone'] * 1e3:.1f} ms | {flooded} | {slower} | {r['failed']} of {rounds} | "
                     f"{r['rx']:,} | {r['dropped']:,} |")
    return lines + [""]
