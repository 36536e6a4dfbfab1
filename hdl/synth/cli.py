"""``inagg synth``: build a core for an FPGA and report resources and Fmax.

Only argparse is imported at start-up; Amaranth and the tools load inside
the handler.
"""

from __future__ import annotations

import argparse
import json

__all__ = ["register", "CORES"]

# Core name -> what it builds (see _make_core).
CORES = {
    "switch": "the switch top (inagg.hdl.switch.Switch) with --ports/--width/--slots/--chunk-bytes/--jobs/--workers"
              " and, with --exc-table, the cuckoo exception path",
    "fp32-adder": "the pipelined binary32 adder of the promoted lanes (inagg.hdl.fp32.FP32Adder)",
    "int-to-fp32": "the 33-bit integer to binary32 converter (inagg.hdl.fp32.IntToFP32)",
}


def _make_core(args: argparse.Namespace):
    if args.core == "switch":
        from inagg.hdl.switch import Switch

        return Switch(ports=args.ports, width=args.width, slots=args.slots, chunk_bytes=args.chunk_bytes,
                      jobs=args.jobs, workers=args.workers, exc_table=args.exc_table)
    if args.core == "fp32-adder":
        from inagg.hdl.fp32 import FP32Adder

        return FP32Adder()
    from inagg.hdl.fp32 import IntToFP32

    return IntToFP32(33)


def _pct(used: int, avail: int) -> str:
    return f"{100.0 * used / avail:5.1f}%" if avail else "  -  "


def format_result(r) -> str:
    """The human-readable report of a :class:`~inagg.hdl.synth.ecp5.SynthResult`."""
    lines = [f"device {r.device}   build {r.build_dir}", "",
             f"{'resource':<10}{'used':>9}{'of':>9}{'':>8}"]
    for key, label in (("luts", "LUT4"), ("ffs", "FF"), ("ebr", "EBR"), ("dsp", "DSP")):
        used, avail = getattr(r, key), getattr(r, f"{key}_avail")
        lines.append(f"{label:<10}{used:>9,}{avail:>9,}  {_pct(used, avail)}")
    if not r.placed:
        fits = "fits the device" if r.fits() else "DOES NOT FIT the device"
        lines += ["", f"not placed (stopped after packing): {fits}; no Fmax"]
    else:
        met = "met" if r.timing_met else "MISSED"
        lines += ["", f"Fmax {r.fmax_mhz:.1f} MHz (constraint {r.constraint_mhz:.1f} MHz: {met})"]
    if r.width and r.placed:
        lines.append(f"W x Fmax = {r.width} x {r.fmax_mhz:.1f} MHz = {r.width * r.fmax_mhz / 1000:.1f} Gb/s")
    if r.modules:
        lines += ["", "yosys cells per module (LUT4, CCU2C carry pairs, FF):"]
        for mod, c in r.modules.items():
            lines.append(f"  {mod:<28} {c['luts']:>8,} {c['carries']:>7,} {c['ffs']:>8,}")
        lines.append(f"  wrapper cost: {r.wrapper['ffs']:,} FF (scan chain {r.wrapper['input_bits']:,}, "
                     f"MISR {r.wrapper['output_bits']:,}), about {r.wrapper['output_bits']:,} LUT4")
    return "\n".join(lines)


def _cmd_synth(args: argparse.Namespace) -> int:
    core = _make_core(args)
    if args.target == "vivado":
        from inagg.hdl.synth import vivado

        files = vivado.write_project(core, args.out, width=args.width if args.core == "switch" else None,
                                     part=args.part, clock_mhz=args.clock_mhz or 250.0)
        print("wrote " + ", ".join(str(f) for f in files))
        print(f"run on a machine with Vivado: cd {args.out} && vivado -mode batch -source build.tcl")
        return 0
    from inagg.hdl.synth.ecp5 import synthesize

    width = args.width if args.core == "switch" else None
    r = synthesize(core, args.out, device=args.device, speed=args.speed, clock_mhz=args.clock_mhz or 200.0, width=width,
                   breakdown=not args.no_breakdown, seed=args.seed, place=not args.pack_only,
                   router=args.router)
    if args.json:
        print(json.dumps(r.as_dict(), indent=2))
    else:
        print(format_result(r))
    return 0


def register(sub) -> None:
    """Add ``inagg synth`` to the CLI's subparsers."""
    p = sub.add_parser("synth", help="synthesize a core for an FPGA; report utilization and Fmax",
                       description="Synthesize for an ECP5 with the YoWASP tools (place, route, bitstream), "
                                   "or write a Vivado project for an UltraScale+ part.",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="cores:\n" + "\n".join(f"  {k:<12} {v}" for k, v in CORES.items()))
    p.add_argument("--target", choices=("ecp5", "vivado"), default="ecp5")
    p.add_argument("--core", choices=tuple(CORES), default="switch")
    p.add_argument("--device", default="LFE5UM5G-85F", help="ECP5 device in caBGA381 (default %(default)s)")
    p.add_argument("--speed", default=None, help="speed grade (default: 8 for LFE5UM5G, else 6)")
    p.add_argument("--clock-mhz", type=float, default=None,
                   help="clock constraint (default: 200 for ecp5, 250 for vivado)")
    p.add_argument("--part", default="xcu280-fsvh2892-2L-e", help="Vivado part (default %(default)s)")
    p.add_argument("--ports", type=int, default=2)
    p.add_argument("--width", type=int, default=64, help="stream data width in bits")
    p.add_argument("--slots", type=int, default=64)
    p.add_argument("--chunk-bytes", type=int, default=256)
    p.add_argument("--jobs", type=int, default=4, help="jobs the tables hold (default %(default)s)")
    p.add_argument("--workers", type=int, default=8, help="most workers per job (default %(default)s)")
    p.add_argument("--exc-table", type=int, default=0,
                   help="entries per cuckoo table of the exception path (default 0: none)")
    p.add_argument("--seed", type=int, default=1, help="nextpnr placement seed")
    p.add_argument("--router", choices=("router1", "router2"), default="router1",
                   help="nextpnr's router (default %(default)s; see docs/synth.md)")
    p.add_argument("--no-breakdown", action="store_true", help="skip the per-module synthesis")
    p.add_argument("--pack-only", action="store_true",
                   help="stop after nextpnr's packer: utilization (also of a design too large for the device), no Fmax")
    p.add_argument("--json", action="store_true", help="machine-readable result")
    p.add_argument("--out", default="build/synth", help="build folder (default %(default)s)")
    p.set_defaults(func=_cmd_synth)

