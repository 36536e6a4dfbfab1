"""``p4/v1model/inagg.p4`` on BMv2 ``simple_switch``: the reference vectors, and all-reduces of real hosts.

    .venv/bin/python p4/tests/run_bmv2.py vectors [--keep FOLDER]
    .venv/bin/python p4/tests/run_bmv2.py allreduce [--workers N] [--size BYTES] [--chunk 256|1024] [--keep FOLDER]

``vectors`` (:func:`run_vectors`) is the PTF-style check of the program
against the P4 profile model:

1. compile the program with ``p4c-bm2-ss`` for the chunk size and slot count
   of ``p4/tests/vectors/v1model.json``;
2. split ``v1model_in.pcap`` by input port, one frame per microsecond in case
   order, and start ``simple_switch --use-files``, which reads those files in
   timestamp order once its start delay has passed and writes every port's
   output to a pcap file;
3. configure it during that delay with the commands of
   :func:`inagg.host.p4ctl.bmv2.commands`, fed to ``simple_switch_CLI``;
4. compare each port's output frames with the frames the vectors list for it,
   and the switch's counters (ingress plus egress) with the vectors'.

``allreduce`` (:func:`run_allreduce`, root only) puts ``simple_switch`` in
the switch namespace of a :class:`~inagg.host.netns.Topology`, on the veths
of the workers, and runs one all-reduce per worker process with
:func:`inagg.host.api.allreduce`, exactly as against the model switch: the
host library, the control plane and the program end to end.

Tools come from the environment, then from PATH: ``P4C_BM2_SS``
(``p4c-bm2-ss``), ``SIMPLE_SWITCH`` (``simple_switch``) and
``SIMPLE_SWITCH_CLI`` (``simple_switch_CLI``, which needs Python's ``thrift``
and the bmv2 build's generated modules on its path). Exit status 0 when
everything matches, 1 on a mismatch, 2 when a tool is missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from scapy.utils import RawPcapReader, RawPcapWriter

from inagg.host.p4ctl import bmv2
from inagg.host.p4ctl.layout import plan
from inagg.models.job import JobSpec, SwitchSpec, WorkerSpec
from inagg.models.p4profile import V1MODEL
from inagg.models.protocol import Counter

HERE = Path(__file__).resolve().parent
VECTORS = HERE / "vectors"
PROGRAM = HERE.parent / "v1model" / "inagg.p4"
TOOLS = (("P4C_BM2_SS", "p4c-bm2-ss"), ("SIMPLE_SWITCH", "simple_switch"), ("SIMPLE_SWITCH_CLI", "simple_switch_CLI"))
# simple_switch_CLI configures the switch in about a second; packets start
# flowing this long after simple_switch starts, so there is time to spare.
START_DELAY = 5


@dataclass
class Report:
    """What a run found: one line per mismatch, and what was compared."""

    frames_in: int = 0
    frames_out: int = 0
    mismatches: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches


def tools() -> dict[str, str | None]:
    """Each tool's command, or None when it is not found."""
    return {name: os.environ.get(var) or shutil.which(name) for var, name in TOOLS}


def _pcap(path: Path) -> list[bytes]:
    return [bytes(data) for data, _ in RawPcapReader(str(path))]


def _spec_and_jobs(meta: dict) -> tuple[SwitchSpec, list[JobSpec]]:
    spec = SwitchSpec(**meta["switch"])
    jobs = [JobSpec(job=j["job"], rkey=j["rkey"], slot_base=j["slot_base"], slots=j["slots"],
                    workers=tuple(WorkerSpec(**w) for w in j["workers"])) for j in meta["jobs"]]
    return spec, jobs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# simple_switch_CLI prints "InaggIngress.ingress_counters[3]= (4416 bytes, 4 packets)".
_COUNTER = re.compile(r"_counters\[(\d+)\]=\s*\((\d+) bytes, (\d+) packets\)")


def _counters(cli: str, thrift_port: int, preexec_fn=None) -> dict[str, int]:
    cmds = [f"counter_read {block}.{name} {c.value}"
            for block, name in (("InaggIngress", "ingress_counters"), ("InaggEgress", "egress_counters"))
            for c in Counter]
    p = subprocess.run([cli, "--thrift-port", str(thrift_port)], input="\n".join(cmds) + "\n",
                       capture_output=True, text=True, timeout=60, check=True, preexec_fn=preexec_fn)
    found = _COUNTER.findall(p.stdout)
    if len(found) != len(cmds):
        raise RuntimeError(f"simple_switch_CLI answered {len(found)} of {len(cmds)} counter reads:\n{p.stdout}")
    got = {c.name: 0 for c in Counter}
    names = [c.name for c in Counter]
    for index, _, packets in found:
        got[names[int(index)]] += int(packets)
    return got


def _require_tools() -> dict[str, str]:
    found = tools()
    missing = [name for name, cmd in found.items() if cmd is None]
    if missing:
        raise FileNotFoundError(f"not found: {', '.join(missing)} (set {', '.join(v for v, n in TOOLS if n in missing)} "
                                "or put them on PATH)")
    return found


def _compile(p4c: str, spec: SwitchSpec, out: Path) -> None:
    subprocess.run([p4c, f"-DINAGG_LANES={spec.lanes}", f"-DINAGG_SLOTS={spec.slots}", "-o", str(out), str(PROGRAM)],
                   check=True, capture_output=True, timeout=600)


def run_vectors(vectors: Path = VECTORS, keep: Path | None = None) -> Report:
    """Run the v1model vectors through simple_switch; ``keep`` names a folder to leave the run's files in."""
    found = _require_tools()
    meta = json.loads((vectors / "v1model.json").read_text())
    ins, outs = _pcap(vectors / "v1model_in.pcap"), _pcap(vectors / "v1model_out.pcap")
    spec, jobs = _spec_and_jobs(meta)
    commands = bmv2.commands(plan(V1MODEL, spec, jobs))
    report = Report(frames_in=len(ins))
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = keep or Path(tmp_name)
        tmp.mkdir(parents=True, exist_ok=True)
        _compile(found["p4c-bm2-ss"], spec, tmp / "inagg.json")
        by_port: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(spec.ports)}
        for c in meta["cases"]:
            by_port[c["port"]].append((c["in"], ins[c["in"]]))
        for p, frames in by_port.items():
            with RawPcapWriter(str(tmp / f"p{p}_in.pcap"), linktype=1) as w:
                w.write_header(None)
                for i, f in frames:
                    w.write_packet(f, sec=1, usec=i)
        thrift_port = _free_port()
        argv = [found["simple_switch"], "--use-files", str(START_DELAY), "--thrift-port", str(thrift_port)]
        argv += [a for p in range(spec.ports) for a in ("-i", f"{p}@p{p}")]
        with open(tmp / "simple_switch.log", "w") as log:
            proc = subprocess.Popen(argv + ["inagg.json"], cwd=tmp, stdout=log, stderr=subprocess.STDOUT)
        try:
            started = time.monotonic()
            _configure(found["simple_switch_CLI"], thrift_port, commands, tmp / "cli.log", None, proc)
            if time.monotonic() - started > START_DELAY - 1:
                raise RuntimeError(f"configuring took longer than the {START_DELAY} s start delay: the frames may "
                                   "have met an unconfigured switch")
            expected = {p: [] for p in range(spec.ports)}
            for c in meta["cases"]:
                for o in c["out"]:
                    expected[o["port"]].append((c["name"], outs[o["frame"]]))
            got = _await_outputs(tmp, spec.ports, sum(map(len, expected.values())), started + START_DELAY + 20)
            counters = _counters(found["simple_switch_CLI"], thrift_port)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    report.frames_out = sum(map(len, got.values()))
    for p in range(spec.ports):
        exp, out = expected[p], got[p]
        for k, ((name, e), o) in enumerate(zip(exp, out)):
            if e != o:
                first = next(i for i in range(min(len(e), len(o))) if e[i] != o[i]) if len(e) == len(o) else None
                report.mismatches.append(f"port {p} frame {k} ({name}): {len(o)} bytes, expected {len(e)}"
                                         + (f", first difference at byte {first}" if first is not None else ""))
        if len(exp) != len(out):
            report.mismatches.append(f"port {p}: {len(out)} frames out, expected {len(exp)}")
    for name, n in meta["counters"].items():
        if counters[name] != n:
            report.mismatches.append(f"counter {name}: {counters[name]}, expected {n}")
    return report


def _await_outputs(tmp: Path, ports: int, total: int, deadline: float) -> dict[int, list[bytes]]:
    """Every port's output frames once ``total`` frames are out and a second passed without more."""
    last, since = -1, time.monotonic()
    while True:
        files = [tmp / f"p{p}_out.pcap" for p in range(ports)]
        # A file holds at least its 24-byte pcap header once simple_switch opened it.
        got = {p: _pcap(f) if f.exists() and f.stat().st_size >= 24 else [] for p, f in enumerate(files)}
        n = sum(map(len, got.values()))
        now = time.monotonic()
        if n != last:
            last, since = n, now
        elif n >= total and now - since > 1 or now > deadline:
            return got
        time.sleep(0.2)


@dataclass
class AllReduceRun:
    """One all-reduce of every worker of a job through simple_switch."""

    workers: int
    size: int
    chunk_bytes: int
    exact: bool           # every worker got the exact sum
    seconds: float        # from the go signal to the last worker's result
    resent: int           # contributions the workers sent again on a timeout
    counters: dict[str, int]

    @property
    def goodput_mbps(self) -> float:
        """Payload all-reduced per second, in Mb/s of one worker's vector."""
        return self.size * 8 / self.seconds / 1e6


def _in_ns(name: str):
    """A ``preexec_fn`` that moves the child into network namespace ``name`` before it runs its program."""
    from inagg.host import netns

    return lambda: netns.enter(name)


def _worker(ns, ifname, spec, job, rank, data, timing, go, conn):
    from inagg.host import netns
    from inagg.host.api import Group, allreduce

    try:
        netns.enter(ns)
        group = Group(spec, job, rank, netns.PacketPort(ifname), timing=timing)
        conn.send(("ready", None))
        go.wait()
        conn.send(("ok", (allreduce(data, group), group.worker.stats["resent"])))
    except Exception as e:  # the parent raises it
        conn.send(("error", e))


def run_allreduce(workers: int = 3, size: int = 1 << 16, chunk_bytes: int = 256, window: int = 16,
                  keep: Path | None = None) -> AllReduceRun:
    """All-reduce ``size`` bytes of float32 on each of ``workers`` processes through simple_switch (root only)."""
    import multiprocessing as mp

    import numpy as np
    from pyroute2 import NetNS

    from inagg.host import controller, netns
    from inagg.host.worker import Timing

    found = _require_tools()
    netns.require_root()
    p = controller.plan([workers], window=window, chunk_bytes=chunk_bytes)
    job = p.jobs[0]
    commands = bmv2.commands(plan(V1MODEL, p.switch, p.jobs))
    rng = np.random.default_rng(5)
    # Integers on the grid of the agreed scale: the sum is exact, so any wrong lane shows.
    data = [rng.integers(-1000, 1000, size // 4).astype(np.float32) for _ in range(workers)]
    # simple_switch takes a millisecond or so per frame: timeouts of a window's worth.
    timing = Timing(timeout=1.0, max_timeout=4.0, tries=10)
    ctx = mp.get_context("fork")
    procs: list = []
    with tempfile.TemporaryDirectory() as tmp_name, netns.Topology(p) as topo:
        tmp = keep or Path(tmp_name)
        tmp.mkdir(parents=True, exist_ok=True)
        _compile(found["p4c-bm2-ss"], p.switch, tmp / "inagg.json")
        with NetNS(topo.switch_ns) as ns:
            ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")  # the thrift server listens there
        in_switch = _in_ns(topo.switch_ns)
        thrift_port = 9090
        argv = [found["simple_switch"], "--thrift-port", str(thrift_port)]
        argv += [a for port in topo.ports for a in ("-i", f"{port}@{topo.switch_if(port)}")]
        with open(tmp / "simple_switch.log", "w") as log:
            proc = subprocess.Popen(argv + [str(tmp / "inagg.json")], stdout=log, stderr=subprocess.STDOUT,
                                    preexec_fn=in_switch)
        try:
            _configure(found["simple_switch_CLI"], thrift_port, commands, tmp / "cli.log", in_switch, proc)
            go = ctx.Event()
            conns = []
            for r, w in enumerate(job.workers):
                parent, child = ctx.Pipe()
                conns.append(parent)
                procs.append(ctx.Process(target=_worker, args=(topo.worker_ns(w.port), topo.worker_if, p.switch,
                                                               job, r, data[r], timing, go, child)))
                procs[-1].start()
            for c in conns:
                kind, value = c.recv()
                if kind == "error":
                    raise value
            start = time.perf_counter()
            go.set()
            results = []
            for c in conns:
                kind, value = c.recv()
                if kind == "error":
                    raise value
                results.append(value)
            seconds = time.perf_counter() - start
            counters = _counters(found["simple_switch_CLI"], thrift_port, in_switch)
        finally:
            for pr in procs:
                if pr.is_alive():
                    pr.terminate()
                pr.join()
            proc.terminate()
            proc.wait(timeout=10)
    ref = np.sum(data, axis=0, dtype=np.float64).astype(np.float32)
    exact = all(np.array_equal(out, ref) for out, _ in results)
    return AllReduceRun(workers, size, chunk_bytes, exact, seconds, sum(n for _, n in results), counters)


def _configure(cli: str, thrift_port: int, commands: list[str], log: Path, preexec_fn, proc) -> None:
    """Feed ``commands`` to simple_switch_CLI once the switch listens; raise when it refuses one."""
    end = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"simple_switch exited with status {proc.returncode}: see {log.parent}")
        p = subprocess.run([cli, "--thrift-port", str(thrift_port)], input="\n".join(commands) + "\n",
                           capture_output=True, text=True, timeout=60, preexec_fn=preexec_fn)
        if "Could not connect" not in p.stdout + p.stderr:
            break
        if time.monotonic() > end:
            raise RuntimeError(f"simple_switch did not listen on thrift port {thrift_port} within 30 s")
        time.sleep(0.2)
    log.write_text(p.stdout + p.stderr)
    if p.returncode or "Error" in p.stdout or "Invalid" in p.stdout:
        raise RuntimeError(f"simple_switch_CLI refused the configuration: see {log}")


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("vectors", "allreduce"))
    ap.add_argument("--keep", type=Path, help="leave the run's files (JSON, pcaps, logs) in this folder")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--size", type=int, default=1 << 16, help="bytes of float32 per worker")
    ap.add_argument("--chunk", type=int, default=256, choices=(256, 1024))
    args = ap.parse_args()
    for name, cmd in tools().items():
        print(f"{name:18} {cmd or 'not found'}")
    try:
        if args.mode == "allreduce":
            r = run_allreduce(args.workers, args.size, args.chunk, keep=args.keep)
            print(f"{r.workers} workers, {r.size} bytes each, C = {r.chunk_bytes}: "
                  f"{'exact' if r.exact else 'WRONG'} sum in {r.seconds:.2f} s ({r.goodput_mbps:.2f} Mb/s), "
                  f"{r.resent} contributions resent")
            print("switch counters: " + ", ".join(f"{k} {v}" for k, v in r.counters.items() if v))
            return 0 if r.exact else 1
        report = run_vectors(keep=args.keep)
    except FileNotFoundError as e:
        print(f"skipped: {e}")
        return 2
    for line in report.mismatches:
        print(f"MISMATCH {line}")
    print(f"{report.frames_in} frames in, {report.frames_out} out, {len(report.mismatches)} mismatches")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
