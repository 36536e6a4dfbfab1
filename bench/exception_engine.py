"""Cycles per request of the exception engine (`inagg.hdl.exception`) by outcome, and its size on ECP5.

Cycles come from the Amaranth simulator (they are exact and the same on
any simulator): a seeded random stream runs back to back against the
switch's default exception path (256 entries per table, 16 kicks, 4 stash
entries) while the request queue stays full, so the interval between two
responses is the time the second request held the engine. Each request's
outcome (hit, direct insert, insert after k kicks, ...) is what the model
decided for it. A second stream fills an empty table with fresh keys and
gives the cycles per insertion against the load.

Size and clock: ``inagg.hdl.synth.ecp5.synthesize`` (yosys, nextpnr-ecp5,
inside the scan wrapper) at the default and at a larger table.

Writes docs/results/exception.md. Run: ``.venv/bin/python bench/exception_engine.py``
(``--no-synth`` skips the FPGA builds, which need the ``synth`` extra).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import platform
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from inagg.hdl.exception import ExceptionEngine, Op, Status
from inagg.models.job import ExceptionSpec
from inagg.testbench.exception.drive import simulate
from inagg.testbench.exception.reference import Reference
from inagg.testbench.exception.stimulus import keys_with, random_requests

OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "exception.md"
_COLLISIONS = "<!-- bench/collisions.py: begin -->"
COMMAND = ".venv/bin/python bench/exception_engine.py"
JOBS, SLOTS = 32, 64
LOAD_BINS = (0.0, 0.2, 0.3, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9, 1.01)


def outcomes(spec: ExceptionSpec, ops: np.ndarray, keys: np.ndarray) -> tuple[list[str], list[float]]:
    """The model's outcome of each request, as a row name of the table, and the load before it."""
    ref = Reference(spec.table, spec.max_kicks, spec.stash, JOBS, SLOTS)
    names, loads = [], []
    for op, key in zip(ops, keys):
        op = Op(int(op))
        before = dataclasses.asdict(ref.switch.exception.stats)
        full = ref.full
        loads.append(ref.load)
        status, _ = ref.request(op, int(key))
        s = ref.switch.exception.stats
        if op == Op.TEARDOWN:
            names.append(f"TEARDOWN ({SLOTS} indices)")
        elif status == Status.INSERTED and s.stashed > before["stashed"]:
            names.append("LOCATE: chain failed, into the stash")
        elif status == Status.INSERTED:
            k = s.kicks - before["kicks"]
            names.append("LOCATE: inserted, no kick" if k == 0 else f"LOCATE: inserted after {k} kicks")
        elif status == Status.REFUSED:
            names.append("LOCATE: refused, every entry in use" if ref.full > full
                         else "LOCATE: chain failed, stash full, refused")
        else:
            names.append(f"{op.name}: {status.name}")
    return names, loads


def busy_cycles(spec: ExceptionSpec, ops: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Cycles each request held the engine (NaN where the queue had run dry), latencies, total cycles."""
    run = simulate(ExceptionEngine(spec.table, spec.max_kicks, spec.stash), ops, keys)
    answered, accepted = np.array(run.answered), np.array(run.accepted)
    cost = np.full(len(ops), np.nan)
    cost[1:] = np.diff(answered)
    # A request whose predecessor answered before it could reach the decision stage was not waiting.
    waiting = np.zeros(len(ops), bool)
    waiting[1:] = accepted[1:] + 4 < answered[:-1]
    cost[~waiting] = np.nan
    return cost, answered - accepted, int(answered[-1])


def idle_latency(spec: ExceptionSpec) -> int:
    """Cycles from a request's transfer to its response's, in an idle engine (well after the sweep)."""
    gaps = itertools.chain([1] * (2 * spec.capacity), itertools.repeat(0))
    run = simulate(ExceptionEngine(spec.table, spec.max_kicks, spec.stash), np.array([Op.LOOKUP.value]),
                   np.array([0]), gaps=gaps)
    return run.answered[0] - run.accepted[0]


def cycle_table(spec: ExceptionSpec, seed: int, n: int) -> tuple[str, dict]:
    ops, keys = random_requests(np.random.default_rng(seed), n, JOBS, SLOTS, phase=n // 4)
    names, _ = outcomes(spec, ops, keys)
    t = time.perf_counter()
    cost, _, cycles = busy_cycles(spec, ops, keys)
    wall = time.perf_counter() - t
    rows = defaultdict(list)
    for name, c in zip(names, cost):
        if not np.isnan(c):
            rows[name].append(c)

    def order(name):
        kicks = name.split("after ")[1].split()[0] if "after" in name else ""
        return (name.split(":")[0], int(kicks) if kicks else -1, name)

    lines = ["| outcome (the model's decision) | requests | cycles min | mean | max |", "|---|---:|---:|---:|---:|"]
    for name in sorted(rows, key=order):
        c = np.array(rows[name])
        lines.append(f"| {name} | {len(c)} | {c.min():.0f} | {c.mean():.2f} | {c.max():.0f} |")
    return "\n".join(lines), {"requests": n, "cycles": cycles, "wall": wall, "measured": int((~np.isnan(cost)).sum())}


def load_table(spec: ExceptionSpec, seed: int) -> str:
    """Fresh keys into an empty table until the model refuses one in four: cycles per LOCATE by load."""
    rng = np.random.default_rng(seed)
    keys = rng.choice(keys_with(spec.table, JOBS, SLOTS), 3 * spec.table, replace=False)
    ops = np.full(len(keys), Op.LOCATE.value)
    names, loads = outcomes(spec, ops, keys)
    cost, _, _ = busy_cycles(spec, ops, keys)
    loads = np.array(loads)
    lines = ["| load before the insert | LOCATEs | mean cycles | kicks per insert | stashed | refused |",
             "|---|---:|---:|---:|---:|---:|"]
    for lo, hi in zip(LOAD_BINS, LOAD_BINS[1:]):
        sel = (loads >= lo) & (loads < hi) & ~np.isnan(cost)
        if not sel.any():
            continue
        chosen = [names[i] for i in np.flatnonzero(sel)]
        inserted = [n for n in chosen if n.startswith("LOCATE: inserted")]
        kicks = [int(n.split("after ")[1].split()[0]) if "after" in n else 0 for n in inserted]
        stashed = sum(n.endswith("stash") for n in chosen)
        refused = sum("refused" in n for n in chosen)
        lines.append(f"| {lo:.0%} - {min(hi, 1.0):.0%} | {sel.sum()} | {cost[sel].mean():.2f} | "
                     f"{np.mean(kicks) if kicks else 0:.2f} | {stashed} | {refused} |")
    return "\n".join(lines)


def synth_table(configs: list[ExceptionSpec]) -> str:
    from inagg.hdl.synth.ecp5 import synthesize

    lines = ["| table x 2 + stash | max_kicks | LUT4 | FF | EBR | core LUT4 + CCU2C | core FF | Fmax (MHz) | "
             "constraint | build time |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    tools = ""
    for spec in configs:
        engine = ExceptionEngine(spec.table, spec.max_kicks, spec.stash)
        with tempfile.TemporaryDirectory() as where:
            t = time.perf_counter()
            r = synthesize(engine, where, clock_mhz=200)
            wall = time.perf_counter() - t
        core = {"luts": 0, "carries": 0, "ffs": 0}
        for mod, row in r.modules.items():
            if mod.startswith("core"):
                for k in core:
                    core[k] += row[k]
        tools = f"{r.tools['yosys']}, {r.tools['nextpnr-ecp5']}"
        lines.append(f"| {spec.table} x 2 + {spec.stash} | {spec.max_kicks} | {r.luts} ({r.luts / r.luts_avail:.1%}) | "
                     f"{r.ffs} | {r.ebr} | {core['luts']} + {core['carries']} | {core['ffs']} | {r.fmax_mhz:.1f} | "
                     f"{r.constraint_mhz:.0f} | {wall:.0f} s |")
    return "\n".join(lines) + f"\n\nTools: {tools}; device LFE5UM5G-85F, speed 8."


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="requests of the random stream")
    parser.add_argument("--no-synth", action="store_true", help="skip the ECP5 builds")
    args = parser.parse_args(argv)
    spec = ExceptionSpec()
    cycles, info = cycle_table(spec, seed=1, n=args.requests)
    loads = load_table(spec, seed=2)
    latency = idle_latency(spec)
    synth = "(not run: --no-synth)" if args.no_synth else synth_table([spec, ExceptionSpec(table=1024)])
    k = spec.max_kicks
    text = f"""# Exception engine: cycles per request and size

Measured with `{COMMAND}` on {datetime.date.today()} ({platform.machine()}).
Engine: `ExceptionEngine({spec.table}, max_kicks={k}, stash={spec.stash})`, the switch's default exception
path (`ExceptionSpec()`); keys of {JOBS} jobs x {SLOTS} slots. `docs/exception.md` explains the pipeline.

## Cycles each request holds the engine, by outcome

A seeded random stream of {info['requests']} requests (`random_requests`, load rising past saturation and
falling, four phases) back to back with the response stream always ready; a request's cost is the interval
between its response and the one before, measured on the {info['measured']} requests that found the queue
non-empty. The whole stream took {info['cycles']} cycles ({info['wall']:.0f} s in the Amaranth simulator).
From request to response an idle engine takes {latency} cycles (request queue 2, hash, read, decide,
response register and queue). A LOCATE that hits with both its positions taken leaves the cycle after it
idle (the engine cannot know in time that it will not walk): that cycle shows on the request after it, the
maxima one above the minima.

{cycles}

So: lookups, direct inserts and deletes at one per cycle; one more cycle per kick; a chain that fails costs
2 x max_kicks + 1 = {2 * k + 1} cycles before the key goes to the stash or is refused; a teardown one cycle per
index.

## Cycles per insertion against the load

Fresh keys into an empty table ({3 * spec.table} LOCATEs); load is entries in use over the {2 * spec.table}
table entries, before the insert. The model's documented load (`tests/models/test_cuckoo.py`) is 45%.

{loads}

## Size and clock on ECP5

`inagg.hdl.synth.ecp5.synthesize(engine, clock_mhz=200)`: the engine inside the scan wrapper of
`inagg.hdl.synth.wrapper` (totals include the wrapper: one flip-flop per port bit); the core columns are
yosys cells of the engine alone from the non-flattened synthesis.

{synth}
"""
    # bench/collisions.py keeps its own section at the end of the same file (between its markers).
    kept = OUT.read_text() if OUT.exists() else ""
    if _COLLISIONS in kept:
        text = text.rstrip("\n") + "\n\n" + kept[kept.index(_COLLISIONS):]
    OUT.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
