"""Scale-out figures: DDP through inagg against gloo, and the switch service's frame rate.

Writes docs/results/scaleout.md. Run: ``.venv/bin/python bench/scaleout.py [--only ddp,torch,service,rtl,batch]``
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
5. The service's two paths side by side (issue 24): a job's turn handed to
   the switch one frame per call (``SwitchService(switch_batch=False)``,
   the path before) or in one ``receive_batch`` call, with 4 worker
   processes of one job over VXLAN on loopback, all-reducing or sending
   prebuilt contributions; alternating, medians of several runs, with the
   CPU time each side spends per frame, and the batched path with the
   kernel's UDP segmentation and receive offloads (the default). Also what
   the kernel's batching (``sendmmsg``/``recvmmsg`` through ctypes, and the
   offloads) saves per datagram on loopback against one ``send``/``recv``
   call each.
"""

from __future__ import annotations

import argparse
import functools
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
SECTIONS = ("ddp", "torch", "service", "rtl", "batch")
# The service's two paths (section 5): the window of each worker, all-reduces per run, prebuilt contributions per
# worker, and runs of each (workload, path).
BATCH_WINDOW = 32
BATCH_ROUNDS = 30
PREBUILT_CHUNKS = 16384
BATCH_REPS = 7
BATCH_PATHS = ("old", "new", "new, sendmmsg", "new, offload")
# The paths whose VXLAN sockets use the kernel's UDP segmentation and receive offloads.
OFFLOAD_PATHS = ("new, offload",)
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
segment = sys.argv[5:] == ["offload"]
timing = Timing(timeout=timeout, max_timeout=10 * timeout, tries=12)
groups = {r: join(ticket, r, timing=timing, segment=segment) for r in ranks}
print("ready", flush=True)
sys.stdin.readline()
cpu = time.process_time()
ok = {}
def run(r):
    x = np.ones(n, np.float32)
    ok[r] = all(np.array_equal(allreduce(x, groups[r]), np.full(n, len(ticket.job.workers), np.float32))
                for _ in range(rounds))
threads = [threading.Thread(target=run, args=(r,)) for r in ranks]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps({"ok": all(ok.values()), "resent": sum(g.worker.stats["resent"] for g in groups.values()),
                  "cpu": time.process_time() - cpu}), flush=True)
"""

# One rank that sends prebuilt contributions (all lanes 1) as its window allows and counts the results: what a
# worker costs beyond the sockets left out, so that the service's own rate shows.
SENDER = r"""
import json, os, select, sys, time
import numpy as np
from inagg.host.fastpath import ContribTemplate
from inagg.host.service import Ticket, join
from inagg.host.vxlan import encap, recv_datagrams, send_all

ticket = Ticket.from_json(os.environ["INAGG_TICKET"])
rank, chunks = int(sys.argv[1]), int(sys.argv[2])
segment = sys.argv[3:] == ["offload"]
g = join(ticket, rank, segment=segment)
window = g.job.window
rows = ContribTemplate(ticket.switch, g.job, rank).build(np.arange(chunks), np.ones((chunks, ticket.switch.lanes),
                                                                                     np.int32))
frames = [encap(row.tobytes(), ticket.vni) for row in rows]
sock = g.port.sock
poll = select.poll()
poll.register(sock, select.POLLIN)
print("ready", flush=True)
sys.stdin.readline()
cpu = time.process_time()
sent = got = 0
size = None
ok = True
while got < chunks and ok:
    if sent < chunks and sent - got < window:
        more = min(chunks, got + window) - sent
        ok &= send_all(sock, frames[sent:sent + more], segment=segment) == [None] * more
        sent += more
    if not poll.poll(10_000):  # no loss on loopback: a missing result is a failure, not a retransmission
        ok = False
        break
    for d in recv_datagrams(sock)[0]:
        size = len(d) if size is None else size
        ok &= len(d) == size
        got += 1
print(json.dumps({"ok": ok, "resent": 0, "cpu": time.process_time() - cpu}), flush=True)
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


@functools.cache
def _libc():
    """libc through ctypes, for ``sendmmsg`` and ``recvmmsg`` (Linux)."""
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.sendmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
    return libc


def _sendmmsg_all(sock, datagrams: list[bytes], address=None, *, segment: bool = False) -> list[OSError | None]:
    """:func:`inagg.host.vxlan.send_all` in ``sendmmsg`` calls: the alternative it was measured against (on an
    endpoint's own connected socket; to an ``address``, one call per datagram as ``send_all`` without ``segment``).

    The messages (struct mmsghdr on 64-bit Linux: 8 words, msg_iov the third, msg_iovlen the fourth) point
    into one joined buffer; a refused datagram is reported and the call goes on after it.
    """
    import ctypes

    import numpy as np

    from inagg.host.vxlan import send_all

    if address is not None:
        return send_all(sock, datagrams, address, segment=False)
    k = len(datagrams)
    buf = b"".join(datagrams)
    iov = np.empty((k, 2), np.uint64)
    iov[:, 1] = np.fromiter(map(len, datagrams), np.uint64, k)
    iov[0, 0] = 0
    np.cumsum(iov[:-1, 1], out=iov[1:, 0])
    iov[:, 0] += ctypes.cast(ctypes.c_char_p(buf), ctypes.c_void_p).value
    msgs = np.zeros((k, 8), np.uint64)
    msgs[:, 2] = iov.ctypes.data + 16 * np.arange(k, dtype=np.uint64)
    msgs[:, 3] = 1
    fates: list[OSError | None] = [None] * k
    i = 0
    while i < k:
        n = _libc().sendmmsg(sock.fileno(), msgs.ctypes.data + 64 * i, k - i, 0)
        if n < 0:
            code = ctypes.get_errno()
            fates[i] = OSError(code, os.strerror(code))
            i += 1
        else:
            i += n
    return fates


def service_paths(path: str, workload: str) -> dict:
    """One run of ``workload`` (``allreduce`` or ``prebuilt``) through an in-process service on ``path`` (of
    :data:`BATCH_PATHS`)."""
    import inagg.host.service as service
    from inagg.host.service import ENV_TICKET, SwitchClient, SwitchService
    from inagg.host.vxlan import send_all
    from inagg.models.job import SwitchSpec
    from inagg.models.protocol import Counter

    switch_batch, segment = path != "old", path in OFFLOAD_PATHS
    service.send_all = _sendmmsg_all if path == "new, sendmmsg" else send_all
    flag = ["offload"] if segment else []
    with SwitchService(SwitchSpec(ports=64, slots=4096), switch_batch=switch_batch, segment=segment) as svc, \
            SwitchClient(svc.control_address) as client:
        ticket = client.create_job(WORKER_PROCESSES, window=BATCH_WINDOW)
        env = {**os.environ, ENV_TICKET: ticket.to_json()}
        if workload == "allreduce":
            argv = [[sys.executable, "-c", WORKERS, str(r), str(ELEMENTS), str(BATCH_ROUNDS), str(TIMEOUT), *flag]
                    for r in range(WORKER_PROCESSES)]
        else:
            argv = [[sys.executable, "-c", SENDER, str(r), str(PREBUILT_CHUNKS), *flag]
                    for r in range(WORKER_PROCESSES)]
        procs = [subprocess.Popen(a, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
                 for a in argv]
        try:
            for p in procs:
                assert p.stdout.readline().strip() == "ready"
            before = svc.switch.counters
            load = os.getloadavg()[0]
            t0, cpu0 = time.perf_counter(), time.process_time()
            for p in procs:
                p.stdin.write("go\n")
                p.stdin.flush()
            answers = [json.loads(p.stdout.readline()) for p in procs]
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            after = svc.switch.counters
            for p in procs:
                p.wait(60)
        finally:
            for p in procs:
                p.kill()
    if not all(a["ok"] for a in answers):
        raise RuntimeError(f"{workload} through the service came out wrong on the {path} path")
    rx = after[Counter.RX_FRAMES] - before[Counter.RX_FRAMES]
    tx = after[Counter.TX_RESULTS] - before[Counter.TX_RESULTS]
    return {"wall_s": wall, "rx_fps": rx / wall, "tx_fps": tx / wall, "service_us": cpu / rx * 1e6,
            "workers_us": sum(a["cpu"] for a in answers) / rx * 1e6,
            "retransmissions": sum(a["resent"] for a in answers), "load": load}


def _kernel_batching(n: int = 256, reps: int = 7) -> dict:
    """Microseconds per 1,110-byte datagram on loopback: ``send``/``recv`` one call each, against one
    ``sendmmsg``/``recvmmsg`` call (through ctypes, its message arrays filled before the clock starts) for ``n``;
    medians of ``reps``."""
    import ctypes
    import socket
    import statistics

    libc = _libc()

    class Iovec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    class Msghdr(ctypes.Structure):
        _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32), ("iov", ctypes.POINTER(Iovec)),
                    ("iovlen", ctypes.c_size_t), ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                    ("flags", ctypes.c_int)]

    class Mmsghdr(ctypes.Structure):
        _fields_ = [("hdr", Msghdr), ("len", ctypes.c_uint)]

    def messages(buf, size: int):
        iov, msgs = (Iovec * n)(), (Mmsghdr * n)()
        for i in range(n):
            iov[i].base, iov[i].len = ctypes.addressof(buf) + i * size, size
            msgs[i].hdr.iov, msgs[i].hdr.iovlen = ctypes.pointer(iov[i]), 1
        return iov, msgs

    size, dontwait = 1110, 0x40  # MSG_DONTWAIT
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    rx.bind(("127.0.0.1", 0))
    rx.setblocking(False)
    tx.connect(rx.getsockname())
    datagram = os.urandom(size)
    out_buf, in_buf = ctypes.create_string_buffer(datagram * n), ctypes.create_string_buffer(2048 * n)
    out_msgs, in_msgs = messages(out_buf, size), messages(in_buf, 2048)
    t = {"send": [], "recv": [], "sendmmsg": [], "recvmmsg": [], "segmented": [], "offload": []}
    from inagg.host.vxlan import enable_gro, recv_datagrams, send_all

    grx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    grx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    grx.bind(("127.0.0.1", 0))
    if not enable_gro(grx):
        raise RuntimeError("this kernel has no UDP receive offload (UDP_GRO, Linux 5.0)")
    gtx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    gtx.connect(grx.getsockname())
    batch = [datagram] * n
    try:
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(n):
                tx.send(datagram)
            t1 = time.perf_counter()
            for _ in range(n):
                rx.recv(65535)
            t2 = time.perf_counter()
            sent = libc.sendmmsg(tx.fileno(), out_msgs[1], n, 0)
            t3 = time.perf_counter()
            got = libc.recvmmsg(rx.fileno(), in_msgs[1], n, dontwait, None)
            t4 = time.perf_counter()
            fates = send_all(gtx, batch)
            t5 = time.perf_counter()
            runs = 0
            while runs < n:
                runs += len(recv_datagrams(grx)[0])
            t6 = time.perf_counter()
            if sent != n or got != n or fates != [None] * n:
                raise RuntimeError(f"sendmmsg/recvmmsg moved {sent}/{got} of {n} datagrams")
            for k, dt in zip(t, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5)):
                t[k].append(dt / n * 1e6)
    finally:
        for s in (rx, tx, grx, gtx):
            s.close()
    return {k: statistics.median(v) for k, v in t.items()}


def _batch_section() -> list[str]:
    import statistics

    load0 = os.getloadavg()[0]
    runs = {(w, b): [] for w in ("allreduce", "prebuilt") for b in BATCH_PATHS}
    for _ in range(BATCH_REPS):
        for key in runs:  # the paths alternate, so that a change of the machine's load hits both
            runs[key].append(service_paths(key[1], key[0]))
    kernel = _kernel_batching()
    load1 = os.getloadavg()[0]
    med = {k: {f: statistics.median(r[f] for r in v) for f in v[0]} for k, v in runs.items()}
    lines = [
        f"## Switch service: one frame per call against batches ({WORKER_PROCESSES} worker processes, "
        "VXLAN on loopback)",
        "",
        f"Measured at commit {_commit()}, 1-minute load average {load0:.1f} at the start and {load1:.1f} at the "
        f"end of the section (at the start of each run {min(r['load'] for v in runs.values() for r in v):.1f}"
        f" to {max(r['load'] for v in runs.values() for r in v):.1f}). One `SwitchService` with the fast switch "
        "(64 ports, 4,096 slots) in a thread of the bench process, and one job of",
        f"{WORKER_PROCESSES} workers with a window of {BATCH_WINDOW} chunks each, one worker per process. "
        f"*all-reduce*: each worker all-reduces {ELEMENTS * 4 >> 10} KiB {BATCH_ROUNDS} times (`inagg.host.allreduce`). "
        f"*prebuilt*: each worker sends {PREBUILT_CHUNKS:,} contributions built before the clock starts, as its window",
        "allows, and counts the results without parsing them: what the service takes when the workers cost little.",
        f"Medians of {BATCH_REPS} runs of each, the two paths alternating. *old*: each frame of a job's turn is handed "
        "to the switch by a `receive` call of its own (`switch_batch=False`, the path before issue 24); *new*: the",
        "turn's frames (at most `--job-frames`, 32) in one `receive_batch` call, the results sent in one pass, each",
        "endpoint's back to back, one `send` each (`inagg.host.vxlan.send_all(segment=False)`); *new, sendmmsg*: the",
        "same, each endpoint's results in `sendmmsg` calls through ctypes; *new, offload*: the same with the kernel's",
        "UDP segmentation and receive offloads on every VXLAN socket (`segment=True`, the default now): each run of",
        "an endpoint's results, and each batch of a worker's contributions, in one `sendmsg`, and a run read in one",
        "`recvmsg`. The other paths turn the offloads off on the workers' sockets too. CPU times are per",
        "contribution: the service's process, and the worker processes' together (their timed part only).",
        "",
        "| workload | path | wall time | contributions in | results out | ratio (new / old) | service CPU "
        "| workers' CPU | retransmissions |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for w in ("allreduce", "prebuilt"):
        for b in BATCH_PATHS:
            m = med[w, b]
            ratio = f"{m['rx_fps'] / med[w, 'old']['rx_fps']:.2f}x"
            lines.append(f"| {'all-reduce' if w == 'allreduce' else w} | {b} | {m['wall_s']:.2f} s | "
                         f"{m['rx_fps']:,.0f} frames/s | {m['tx_fps']:,.0f} frames/s | {ratio} | "
                         f"{m['service_us']:.1f} us | {m['workers_us']:.1f} us | "
                         f"{sum(r['retransmissions'] for r in runs[w, b])} |")
    new = {w: med[w, "new, offload"] for w in ("allreduce", "prebuilt")}
    bound = {w: 2e6 / (m["service_us"] + m["workers_us"]) for w, m in new.items()}
    lines += [
        "",
        "What bounds the rate is CPU time, shared: the service thread and the four worker processes run on "
        f"{os.cpu_count()} cores, beside the other work that the load average counts. On the offload path (the "
        "default) a contribution "
        f"costs {new['allreduce']['service_us']:.1f} us of the service's CPU and "
        f"{new['allreduce']['workers_us']:.1f} us of the all-reducing workers' (the host library's Python per frame "
        f"and per batch, and the sockets), {new['prebuilt']['service_us']:.1f} and "
        f"{new['prebuilt']['workers_us']:.1f} us with prebuilt contributions: on an idle machine with every core "
        f"busy that allows at most {bound['allreduce']:,.0f} and {bound['prebuilt']:,.0f} frames/s, and the "
        f"service alone on one core {1e6 / new['prebuilt']['service_us']:,.0f} frames/s. The frame-by-frame "
        "path shares the new path's reads (their counts added once per burst); it sends each result on its own, "
        "in the switch's order, which takes the ports in turn for every chunk, as before. That order wakes a "
        "worker once per result where the new path wakes it once per batch: hence the workers' CPU.",
        "",
        "What the kernel's batching saves on loopback, per 1,110-byte datagram (medians of 7 rounds of 256; the "
        "ctypes message arrays filled before the clock starts, so the Python cost of filling them per frame is "
        "not in these figures):",
        "",
        "| one call per datagram | us | one call per 256 datagrams | us | one call per run (offloads) | us |",
        "|---|---:|---|---:|---|---:|",
        f"| `send` | {kernel['send']:.2f} | `sendmmsg` | {kernel['sendmmsg']:.2f} | `send_all` (`UDP_SEGMENT`) | "
        f"{kernel['segmented']:.2f} |",
        f"| `recv` | {kernel['recv']:.2f} | `recvmmsg` | {kernel['recvmmsg']:.2f} | `recv_datagrams` (`UDP_GRO`) | "
        f"{kernel['offload']:.2f} |",
        "",
        "`sendmmsg` still crosses the stack once per datagram; a segmented run crosses it once (up to "
        f"{65507 // 1110} of these datagrams a call), and a receiver with the receive offload takes the run in one read.",
        "",
    ]
    return lines


def _ddp_section() -> list[str]:
    runs = {n: ddp(n) for n in (2, 4)}
    lines = [
        f"## DDP step time and bytes per rank (`examples/ddp_train.py --backend both --steps {STEPS}`)",
        "",
        f"Measured at commit {_commit()}. Median over the steps of forward + backward (the all-reduce",
        "included). S is the gradient's size; inagg sends 32-bit lanes in frames of 4,096 payload bytes (the",
        "embedded switch's chunk) and 74 of headers, plus the two chunks of the scale",
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
        "One service thread runs the fast switch (docs/results/fastswitch.md: about 500,000 contributions/s",
        "alone, in batches), handing it each job's turn of frames in one call, and its socket loop in Python;",
        "the worker processes compete with it for the same cores (the section below takes the two apart).",
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
            "## Switch service frame rate": "service", "## Switch service: one frame per call": "batch"}
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
    build = {"ddp": _ddp_section, "torch": _torch_section, "service": _service_section, "rtl": _rtl_section,
             "batch": _batch_section}
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
