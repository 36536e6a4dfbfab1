"""Utilization and Fmax of the gateware on an ECP5-85F, per configuration.

Writes docs/results/synth.md. Run: ``make synth-report`` (or
``.venv/bin/python bench/synth.py [--quick]``). Each configuration is one
full YoWASP build (synthesis, place and route, bitstream); the large ones
take many minutes each on 2 cores.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

from inagg.hdl.synth.ecp5 import synthesize

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "results" / "synth.md"
BUILD = ROOT / "build" / "synth-report"


def _fp32_adder():
    from inagg.hdl.fp32 import FP32Adder

    return FP32Adder()


def _int_to_fp32():
    from inagg.hdl.fp32 import IntToFP32

    return IntToFP32(33)


def _switch(ports, width, slots, chunk_bytes=1024):
    def make():
        from inagg.hdl.switch import Switch

        return Switch(ports=ports, width=width, slots=slots, chunk_bytes=chunk_bytes)
    return make


# (label, factory, W or None, clock constraint in MHz)
CONFIGS = [
    ("FP32Adder", _fp32_adder, None, 200),
    ("IntToFP32 (33 bit)", _int_to_fp32, None, 200),
    ("switch P=2 W=64 S=64 C=256", _switch(2, 64, 64, 256), 64, 200),
    ("switch P=2 W=256 S=64 C=1024", _switch(2, 256, 64), 256, 200),
    ("switch P=2 W=512 S=64 C=1024", _switch(2, 512, 64), 512, 200),
    ("switch P=4 W=512 S=256 C=1024", _switch(4, 512, 256), 512, 200),
]
QUICK = CONFIGS[:3]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only the small configurations")
    ap.add_argument("--only", help="run only configurations whose label contains this text")
    args = ap.parse_args(argv)
    configs = QUICK if args.quick else CONFIGS
    if args.only:
        configs = [c for c in configs if args.only in c[0]]
    rows, tools, failures = [], None, []
    for i, (label, make, width, mhz) in enumerate(configs):
        t0 = time.perf_counter()
        print(f"[{i + 1}/{len(configs)}] {label} ...", flush=True)
        try:
            r = synthesize(make(), BUILD / f"cfg{i}", clock_mhz=mhz, width=width)
        except Exception as e:  # noqa: BLE001 - a failed build is a row of the report, not a crash
            failures.append((label, f"{type(e).__name__}: {e}".splitlines()[0]))
            print(f"    failed: {failures[-1][1]}", flush=True)
            continue
        tools = r.tools
        # The core and every module below it (core.engine, core.ingress0, ...).
        core = {k: sum(c[k] for name, c in r.modules.items() if name == "core" or name.startswith("core."))
                for k in ("luts", "carries", "ffs")}
        rows.append((label, r, core, time.perf_counter() - t0))
        print(f"    {r.luts} LUT4, {r.ffs} FF, {r.ebr} EBR, {r.fmax_mhz:.1f} MHz", flush=True)
    lines = [
        "# Synthesis on Lattice ECP5 (LFE5UM5G-85F, speed 8)",
        "",
        f"Measured with `{' '.join(['.venv/bin/python', 'bench/synth.py', *(argv or sys.argv[1:])])}` "
        f"on {time.strftime('%Y-%m-%d')} ({platform.machine()}).",
        f"Tools: {tools['yosys'] if tools else '?'}; {tools['nextpnr-ecp5'] if tools else '?'}.",
        "Each row is one build inside the scan/MISR wrapper of `inagg.hdl.synth.wrapper` (3 pins); totals include",
        "the wrapper, whose cost is exactly one flip-flop per core port bit plus about one LUT4 per output bit;",
        "the core columns are yosys cells of the core alone from a non-flattened synthesis (LUT4 + carry pairs).",
        "nextpnr runs with `--timing-allow-fail`: Fmax is what the placed design reaches, met or not.",
        "",
        "| configuration | LUT4 | FF | EBR | DSP | core LUT4 + CCU2C | core FF | Fmax (MHz) | constraint | W x Fmax (Gb/s) | build time |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, r, core, secs in rows:
        gbps = f"{r.width * r.fmax_mhz / 1000:.1f}" if r.width else "-"
        lines.append(
            f"| {label} | {r.luts:,} ({100 * r.luts / r.luts_avail:.1f}%) | {r.ffs:,} | {r.ebr} | {r.dsp} | "
            f"{core.get('luts', 0):,} + {core.get('carries', 0):,} | {core.get('ffs', 0):,} | {r.fmax_mhz:.1f} | "
            f"{r.constraint_mhz:.0f} | {gbps} | {secs:.0f} s |")
    for label, why in failures:
        lines.append(f"| {label} | build failed: {why} | | | | | | | | | |")
    lines.append("")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines))
    print(f"wrote {OUT}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
