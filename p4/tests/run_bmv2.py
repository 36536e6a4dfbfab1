"""Run the stored reference vectors through BMv2 ``simple_switch`` and compare what comes out, byte for byte.

    .venv/bin/python p4/tests/run_bmv2.py [FOLDER]   (FOLDER: keep the run's files there)

The PTF-style check of ``p4/v1model/inagg.p4`` against the P4 profile model:

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


def _wait_for_port(port: int, proc: subprocess.Popen, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"simple_switch exited with status {proc.returncode} before it listened")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"simple_switch did not listen on thrift port {port} within {timeout} s")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# simple_switch_CLI prints "InaggIngress.ingress_counters[3]= (4416 bytes, 4 packets)".
_COUNTER = re.compile(r"_counters\[(\d+)\]=\s*\((\d+) bytes, (\d+) packets\)")


def _counters(cli: str, thrift_port: int) -> dict[str, int]:
    cmds = [f"counter_read {block}.{name} {c.value}"
            for block, name in (("InaggIngress", "ingress_counters"), ("InaggEgress", "egress_counters"))
            for c in Counter]
    p = subprocess.run([cli, "--thrift-port", str(thrift_port)], input="\n".join(cmds) + "\n",
                       capture_output=True, text=True, timeout=60, check=True)
    found = _COUNTER.findall(p.stdout)
    if len(found) != len(cmds):
        raise RuntimeError(f"simple_switch_CLI answered {len(found)} of {len(cmds)} counter reads:\n{p.stdout}")
    got = {c.name: 0 for c in Counter}
    names = [c.name for c in Counter]
    for index, _, packets in found:
        got[names[int(index)]] += int(packets)
    return got


def run(vectors: Path = VECTORS, keep: Path | None = None) -> Report:
    """Run the v1model vectors through simple_switch; ``keep`` names a folder to leave the run's files in."""
    found = tools()
    missing = [name for name, cmd in found.items() if cmd is None]
    if missing:
        raise FileNotFoundError(f"not found: {', '.join(missing)} (set {', '.join(v for v, n in TOOLS if n in missing)} "
                                "or put them on PATH)")
    meta = json.loads((vectors / "v1model.json").read_text())
    ins, outs = _pcap(vectors / "v1model_in.pcap"), _pcap(vectors / "v1model_out.pcap")
    spec, jobs = _spec_and_jobs(meta)
    commands = bmv2.commands(plan(V1MODEL, spec, jobs))
    report = Report(frames_in=len(ins))
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = keep or Path(tmp_name)
        tmp.mkdir(parents=True, exist_ok=True)
        subprocess.run([found["p4c-bm2-ss"], f"-DINAGG_LANES={spec.lanes}", f"-DINAGG_SLOTS={spec.slots}",
                        "-o", str(tmp / "inagg.json"), str(PROGRAM)], check=True, capture_output=True, timeout=600)
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
            _wait_for_port(thrift_port, proc, START_DELAY)
            cli = subprocess.run([found["simple_switch_CLI"], "--thrift-port", str(thrift_port)],
                                 input="\n".join(commands) + "\n", capture_output=True, text=True, timeout=60)
            (tmp / "cli.log").write_text(cli.stdout + cli.stderr)
            if cli.returncode or "Error" in cli.stdout or "Invalid" in cli.stdout:
                raise RuntimeError(f"simple_switch_CLI refused the configuration: see {tmp / 'cli.log'}")
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


def main() -> int:
    found = tools()
    for name, cmd in found.items():
        print(f"{name:18} {cmd or 'not found'}")
    keep = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    try:
        report = run(keep=keep)
    except FileNotFoundError as e:
        print(f"skipped: {e}")
        return 2
    for line in report.mismatches:
        print(f"MISMATCH {line}")
    print(f"{report.frames_in} frames in, {report.frames_out} out, {len(report.mismatches)} mismatches")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
