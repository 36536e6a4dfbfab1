"""The frame codec on the demo's path, this tree against earlier commits in one run.

For each tree (this one and every ``--against`` commit, checked out in a
temporary git worktree) it measures, in a child process that imports that
tree's ``inagg``: ``wire.build`` of a 1 KB result, ``wire.parse`` of a 1 KB
contribution, ``ResultParser.parse`` of a 1 KB result (best of 5 each), and
``inagg demo --json`` goodput (median of ``--runs``, the trees taking turns so
that the machine's load falls on each alike). Writes docs/results/codec.md.

Run: ``.venv/bin/python bench/codec.py [--against b00ead1 979998b] [--size 16MiB] [--runs 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from inagg.host.sizes import parse_size

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "results" / "codec.md"
# Folder -> subpackage of the one distribution, as pyproject.toml's package-dir maps them.
PACKAGE_DIRS = {"models": "models", "hdl": "hdl", "host": "host", "testbench": "testbench"}


def rates() -> dict[str, float]:
    """Frames per second of the three codec paths, with whatever ``inagg`` this process imports."""
    import numpy as np

    from inagg.host.controller import plan
    from inagg.host.fastpath import ContribTemplate, ResultParser
    from inagg.models import wire
    from inagg.models.switch import ModelSwitch

    p = plan([4])
    sw_spec, job = p.switch, p.jobs[0]
    sw = ModelSwitch(sw_spec)
    sw.add_job(job)
    tpls = [ContribTemplate(sw_spec, job, r) for r in range(4)]
    lanes = np.random.default_rng(0).integers(-2**20, 2**20, (500, sw_spec.lanes)).astype(np.int32)
    contribs, results = [], []
    for c in range(500):
        for r in range(4):
            contribs.append(tpls[r].build(np.array([c]), lanes[c:c + 1])[0].tobytes())
            out = sw.receive(r, contribs[-1])
        results.append(out[0][1])
    parser = ResultParser(sw_spec, job, 0)
    w = job.workers[0]
    args = dict(eth_dst=wire.mac_bytes(w.mac), eth_src=wire.mac_bytes(sw_spec.mac), ip_src=wire.ip_bytes(sw_spec.ip),
                ip_dst=wire.ip_bytes(w.ip), udp_sport=0xC000, opcode=0x2B, dest_qpn=w.qpn, psn=1, va=0, rkey=w.rkey,
                payload=bytes(sw_spec.chunk_bytes), imm=1)

    def best(fn, n: int) -> float:
        t = float("inf")
        for _ in range(5):
            t0 = time.process_time()
            fn()
            t = min(t, time.process_time() - t0)
        return n / t

    assert all(not isinstance(parser.parse(f), int) for f in results)
    return {
        "build": best(lambda: [wire.build(**args) for _ in range(2000)], 2000),
        "parse": best(lambda: [wire.parse(f) for f in contribs], len(contribs)),
        "result": best(lambda: [parser.parse(f) for f in results], len(results)),
    }


def demo(size: int) -> dict[str, float]:
    """``inagg demo``'s goodput (Mb/s, wall time of the all-reduce) and the CPU seconds of the whole run."""
    from inagg.host.demo_run import DemoConfig, run_demo

    t0 = time.process_time()
    summary = run_demo(DemoConfig(size=size))
    return {"goodput": summary["goodput_gbit_s"] * 1e3, "cpu": time.process_time() - t0}


def shim(tree: Path, into: Path) -> Path:
    """A folder that makes ``import inagg`` load ``tree``'s code (its pyproject.toml package-dir layout)."""
    pkg = into / "inagg"
    pkg.mkdir(parents=True)
    for f in (tree / "inagg").iterdir():
        (pkg / f.name).symlink_to(f)
    for folder, sub in PACKAGE_DIRS.items():
        (pkg / sub).symlink_to(tree / folder)
    return into


def child(env: dict, *args: str) -> str:
    return subprocess.run([sys.executable, *args], env=env, cwd=tempfile.gettempdir(), check=True,
                          capture_output=True, text=True).stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", nargs="*", default=["b00ead1", "979998b"], help="commits to compare with")
    ap.add_argument("--size", default="16MiB", help="inagg demo --size")
    ap.add_argument("--runs", type=int, default=3, help="inagg demo runs per tree")
    ap.add_argument("--rates", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--demo", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rates or a.demo:
        print(json.dumps(rates() if a.rates else demo(a.demo)))
        return
    size = parse_size(a.size)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    this = f"{head.strip()}{' + changes' if dirty else ''}"
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        envs = {this: {**os.environ, "PYTHONSAFEPATH": "1"}}
        for rev in a.against:
            tree = Path(tmp) / f"tree-{rev}"
            subprocess.run(["git", "worktree", "add", "--detach", str(tree), rev], cwd=ROOT, check=True,
                           capture_output=True)
            envs[rev] = {**os.environ, "PYTHONSAFEPATH": "1", "PYTHONPATH": str(shim(tree, Path(tmp) / f"shim-{rev}"))}
        try:
            me = str(Path(__file__).resolve())
            micro = {name: json.loads(child(env, me, "--rates")) for name, env in envs.items()}
            runs = {name: [] for name in envs}
            for _ in range(a.runs):
                for name, env in envs.items():
                    runs[name].append(json.loads(child(env, me, "--demo", str(size))))
        finally:
            for rev in a.against:
                subprocess.run(["git", "worktree", "remove", "--force", str(Path(tmp) / f"tree-{rev}")], cwd=ROOT,
                               capture_output=True)
    load1 = os.getloadavg()
    cmd = "`.venv/bin/python bench/codec.py " + " ".join(
        ["--against", *a.against, "--size", a.size, "--runs", str(a.runs)]) + "`"
    lines = [
        "# Frame codec on the demo's path",
        "",
        f"Measured with {cmd} on {platform.machine()}, Python {platform.python_version()}, 2 cores shared with",
        f"other jobs (load average {load0[0]:.2f} at the start, {load1[0]:.2f} at the end). Every tree ran in the",
        "same run, in a process of its own, the demo runs taking turns. Rates are frames per second of CPU",
        "time, best of 5 runs (the machine's load inflates wall times, not CPU times, of one thread).",
        f"The demo is `inagg demo --size {a.size}` (4 workers, model switch, memory network), median of {a.runs}:",
        "goodput over the all-reduce's wall time, and the CPU time of the whole run.",
        "",
        "| tree | `wire.build`, 1 KB result | `wire.parse`, 1 KB contribution | `ResultParser.parse`, 1 KB result "
        "| demo goodput | demo CPU time |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in envs:
        m, r = micro[name], runs[name]
        lines.append(f"| {name} | {m['build']:,.0f} | {m['parse']:,.0f} | {m['result']:,.0f} | "
                     f"{statistics.median(x['goodput'] for x in r):.1f} Mb/s | "
                     f"{statistics.median(x['cpu'] for x in r):.2f} s |")
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
