"""The fast switch against the reference model switch, side by side in one run; and ``make demo``'s goodput.

Writes docs/results/fastswitch.md. Run: ``.venv/bin/python bench/fastswitch.py`` (``--quick``: fewer, shorter
runs). Every figure is the median of several runs in one process on one core. Rates are per second of the
process's CPU time (``time.process_time``): the machine is shared, and CPU time moves far less with the
others' load than wall time does; the demo rows give both. The load average is recorded before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import platform
import pstats
import statistics
import time
from pathlib import Path

import numpy as np

from _report import head_commit, publish

from inagg.host.controller import plan
from inagg.host.demo_run import DemoConfig, run_demo
from inagg.host.fastpath import ContribTemplate
from inagg.host.memnet import Traffic
from inagg.models.fastswitch import FastSwitch
from inagg.models.switch import ModelSwitch

OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "fastswitch.md"


def traffic(workers: int, chunks: int, promote: bool) -> tuple[object, list[tuple[int, bytes]]]:
    """A job of ``workers`` and every worker's contribution to ``chunks`` 1 KB chunks, chunk by chunk."""
    p = plan([workers], window=min(512, 1 << (chunks.bit_length() - 1)))
    job = p.jobs[0]
    rng = np.random.default_rng(0)
    hi = 1 << 31 if promote else 1 << 20
    frames = []
    for r, w in enumerate(job.workers):
        lanes = rng.integers(-hi, hi, (chunks, p.switch.lanes), dtype=np.int64).astype(np.int32)
        built = ContribTemplate(p.switch, job, r).build(np.arange(chunks), lanes)
        frames.append([(w.port, row.tobytes()) for row in built])
    return p, [frames[r][c] for c in range(chunks) for r in range(workers)]


def switch_rate(cls, p, frames, *, batch: int | None) -> float:
    """Contributions in per second, results built included; ``batch`` frames per receive_batch call, or receive."""
    sw = cls(p.switch)
    sw.add_job(p.jobs[0])
    if batch is None:
        t0 = time.process_time()
        for port, f in frames:
            sw.receive(port, f)
    else:
        t0 = time.process_time()
        for i in range(0, len(frames), batch):
            sw.receive_batch(frames[i:i + batch])
    return len(frames) / (time.process_time() - t0)


def median_of(runs: int, fn) -> float:
    return statistics.median(fn() for _ in range(runs))


@contextlib.contextmanager
def frame_by_frame():
    """The host path before issue 24's batching: the memory network hands a worker one result per call."""
    batched = Traffic._to_hosts

    def one_by_one(self, now, batch):
        for port, frame in batch:
            self._deliver(now, port, frame)

    Traffic._to_hosts = one_by_one
    try:
        yield
    finally:
        Traffic._to_hosts = batched


def demo(switch: str, size: int, runs: int, *, batched: bool = True) -> dict:
    """The median-goodput run of ``make demo`` (4 workers, memory network) on ``switch``, with its CPU time;
    ``batched=False``: results handed to the workers one by one."""
    out = []
    for _ in range(runs):
        t0 = time.process_time()
        with contextlib.nullcontext() if batched else frame_by_frame():
            s = run_demo(DemoConfig(workers=4, size=size, switch=switch))
        s["cpu_time_s"] = time.process_time() - t0  # set-up and check included: an upper bound
        assert s["ok"], "a demo run missed its bound"
        out.append(s)
    out.sort(key=lambda s: s["goodput_gbit_s"])
    return out[len(out) // 2]


def profile_demo(size: int) -> str:
    """Where a fast-switch demo run spends its time: the top functions by own time."""
    prof = cProfile.Profile()
    prof.enable()
    run_demo(DemoConfig(workers=4, size=size, switch="fast"))
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(12)
    lines = [ln for ln in text.getvalue().splitlines() if ln.strip()]
    start = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls"))
    return "\n".join(lines[start:start + 13])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer and shorter runs (a smoke test of the bench)")
    args = ap.parse_args()
    runs, chunks, size = (3, 256, 1 << 20) if args.quick else (5, 4096, 16 << 20)
    load0 = os.getloadavg()
    FastSwitch(plan([2]).switch).receive(0, b"")  # compile (or load numba's cache) outside the timings
    rows = []
    for workers, promote in ((2, False), (4, False), (8, False), (4, True)):
        p, frames = traffic(workers, chunks if workers <= 4 else chunks // 2, promote)
        model_frames = frames[:max(len(frames) // 8, 512)]
        ref = median_of(runs, lambda: switch_rate(ModelSwitch, p, model_frames, batch=None))
        one = median_of(runs, lambda: switch_rate(FastSwitch, p, frames, batch=None))
        batched = median_of(runs, lambda: switch_rate(FastSwitch, p, frames, batch=256))
        rows.append((workers, promote, ref, one, batched))
        print(f"{workers} workers{' promoting' if promote else ''}: model {ref:,.0f}/s, fast receive {one:,.0f}/s, "
              f"fast receive_batch {batched:,.0f}/s", flush=True)
    demos = {"model": demo("model", size, max(3, runs - 2))}
    # Old and new host paths alternate, so the machine's load changes hit both alike.
    old, new = [], []
    for _ in range(max(3, runs - 2)):
        old.append(demo("fast", size, 1, batched=False))
        new.append(demo("fast", size, 1))
    demos["fast, results one by one (old host path)"] = sorted(old, key=lambda d: d["goodput_gbit_s"])[len(old) // 2]
    demos["fast, results in batches (new)"] = sorted(new, key=lambda d: d["goodput_gbit_s"])[len(new) // 2]
    for s, d in demos.items():
        print(f"demo {s}: {d['goodput_gbit_s'] * 1e3:.0f} Mb/s, {d['wall_time_s']:.2f} s", flush=True)
    prof = profile_demo(size)
    load1 = os.getloadavg()
    lines = [
        "# Fast switch: speed against the reference model",
        "",
        f"Measured with `.venv/bin/python bench/fastswitch.py{' --quick' if args.quick else ''}` at commit "
        f"{head_commit()} on "
        f"{platform.machine()}, Python {platform.python_version()}, numpy {np.__version__}, one core of a machine "
        f"with {os.cpu_count()} cores shared with other jobs: load average {load0[0]:.1f} before the run and "
        f"{load1[0]:.1f} after it. Every figure is the median of {runs} runs ({max(3, runs - 2)} for the demo).",
        "",
        "## Contributions in per second (1 KB chunks, one job, results built and ICRC'd)",
        "",
        "`ModelSwitch.receive` and `FastSwitch.receive` take one frame per call; `FastSwitch.receive_batch` 256.",
        "The lanes are within +-2**20 (no promotion) or anywhere in INT32 (most lanes promote to FP32).",
        "",
        "| workers | lanes | ModelSwitch | FastSwitch.receive | FastSwitch.receive_batch | ratio (batch / model) |",
        "|---:|---|---:|---:|---:|---:|",
        *[f"| {w} | {'promoting' if pr else 'INT32'} | {ref:,.0f} | {one:,.0f} | {b:,.0f} | {b / ref:.0f}x |"
          for w, pr, ref, one, b in rows],
        "",
        f"## `make demo` goodput (4 workers x {size >> 20} MiB, memory network)",
        "",
        "Goodput and frames/s are what `inagg demo` prints (wall time of the all-reduce); the CPU time is the",
        "whole `run_demo` call (tensors, set-up and the check included), so goodput per CPU second is a lower bound.",
        "The two fast rows run alternately in one run: the memory network hands each worker the results due at",
        "the same time in one `receive_batch` (parsed and placed as arrays), or one per call as before.",
        "",
        "| switch | wall time | goodput | switch frames/s | ratio | CPU time | goodput per CPU second |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *[f"| {s} | {d['wall_time_s']:.2f} s | {d['goodput_gbit_s'] * 1e3:,.0f} Mb/s | "
          f"{d['switch_frames_per_s']:,.0f} | {d['goodput_gbit_s'] / demos['model']['goodput_gbit_s']:.1f}x | "
          f"{d['cpu_time_s']:.2f} s | {d['size_bytes'] * 4 * 8 / d['cpu_time_s'] / 1e6:,.0f} Mb/s |"
          for s, d in demos.items()],
        "",
        "Where one fast-switch demo run spends its time (cProfile, own time, top 12):",
        "",
        "```",
        prof,
        "```",
        "",
    ]
    publish(OUT, lines)


if __name__ == "__main__":
    main()
