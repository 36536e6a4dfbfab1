"""``inagg synth``: build a core for an FPGA and report resources and Fmax; ``inagg board``: build and program a board.

Only argparse is imported at start-up; Amaranth and the tools load inside
the handlers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

__all__ = ["register", "CORES", "format_result", "program_commands"]

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
                      jobs=args.jobs, workers=args.workers, exc_table=args.exc_table, augmented=args.mode_iii)
    if args.core == "fp32-adder":
        from inagg.hdl.fp32 import FP32Adder

        return FP32Adder()
    from inagg.hdl.fp32 import IntToFP32

    return IntToFP32(33)


def _pct(used: int, avail: int) -> str:
    return f"{100.0 * used / avail:5.1f}%" if avail else "  -  "


def format_result(r) -> str:
    """The human-readable report of a :class:`~inagg.hdl.synth.ecp5.SynthResult`."""
    lines = [f"{'board ' + r.board + '   ' if r.board else ''}device {r.device}   build {r.build_dir}", "",
             f"{'resource':<10}{'used':>9}{'of':>9}{'':>8}"]
    for key, label in (("luts", "LUT4"), ("ffs", "FF"), ("ebr", "EBR"), ("dsp", "DSP")):
        used, avail = getattr(r, key), getattr(r, f"{key}_avail")
        lines.append(f"{label:<10}{used:>9,}{avail:>9,}  {_pct(used, avail)}")
    if not r.placed:
        fits = "fits the device" if r.fits() else "DOES NOT FIT the device"
        lines += ["", f"not placed (stopped after packing): {fits}; no Fmax"]
    elif len(r.clocks) > 1:
        lines += ["", f"{'clock':<28}{'Fmax (MHz)':>12}{'constraint':>12}"]
        for net, c in r.clocks.items():
            met = "met" if c["fmax_mhz"] >= c["constraint_mhz"] else "MISSED"
            lines.append(f"{net:<28}{c['fmax_mhz']:>12.1f}{c['constraint_mhz']:>12.1f}  {met}")
    else:
        met = "met" if r.timing_met else "MISSED"
        lines += ["", f"Fmax {r.fmax_mhz:.1f} MHz (constraint {r.constraint_mhz:.1f} MHz: {met})"]
    if r.width and r.placed and not r.board:
        lines.append(f"W x Fmax = {r.width} x {r.fmax_mhz:.1f} MHz = {r.width * r.fmax_mhz / 1000:.1f} Gb/s")
    if r.modules:
        lines += ["", "yosys cells per module (LUT4, CCU2C carry pairs, FF):"]
        for mod, c in r.modules.items():
            lines.append(f"  {mod:<28} {c['luts']:>8,} {c['carries']:>7,} {c['ffs']:>8,}")
    if r.modules and r.wrapper:
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
    """Add ``inagg synth`` and ``inagg board`` to the CLI's subparsers."""
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
    p.add_argument("--mode-iii", action="store_true", help="a switch that takes Mode III jobs too")
    p.add_argument("--seed", type=int, default=1, help="nextpnr placement seed")
    p.add_argument("--router", choices=("router1", "router2"), default="router1",
                   help="nextpnr's router (default %(default)s; see docs/synth.md)")
    p.add_argument("--no-breakdown", action="store_true", help="skip the per-module synthesis")
    p.add_argument("--pack-only", action="store_true",
                   help="stop after nextpnr's packer: utilization (also of a design too large for the device), no Fmax")
    p.add_argument("--json", action="store_true", help="machine-readable result")
    p.add_argument("--out", default="build/synth", help="build folder (default %(default)s)")
    p.set_defaults(func=_cmd_synth)
    _register_board(sub)



def _write_key(key: bytes, path: Path) -> None:
    """``key`` as 32 hex digits in ``path``, readable by its owner alone (docs/security.md)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key.hex() + "\n")


def _cmd_board_list(args: argparse.Namespace) -> int:
    from inagg.hdl.board import BOARDS

    for b in BOARDS.values():
        plat = b.make_platform()
        config = " ".join(f"{k}={v}" for k, v in b.switch.items())
        print(f"{b.name:<18} {plat.device}-{plat.speed}{plat.package}  switch P=2 {config}, "
              f"{b.sync_hz / 1e6:g} MHz  (amaranth_boards.{b.platform.replace(':', '.')})")
    return 0


def _cmd_board_build(args: argparse.Namespace) -> int:
    from inagg.hdl.board import BoardTop, board
    from inagg.host.mgmt import read_key_file

    out = Path(args.out or f"build/board-{args.board}")
    try:
        b = board(args.board)
        geometry = {k: getattr(args, k) for k in ("width", "slots", "chunk_bytes", "jobs", "workers")
                    if getattr(args, k) is not None}
        sync_hz = None if args.sync_mhz is None else round(args.sync_mhz * 1e6)
        key = os.urandom(16) if args.mgmt_key_file is None else read_key_file(args.mgmt_key_file)
        top = BoardTop(b.name, mgmt_key=key, mgmt_port=args.mgmt_port, sync_hz=sync_hz, **geometry)
    except (ValueError, TypeError) as e:
        print(f"inagg board build: error: {e}", file=sys.stderr)
        return 2
    where = args.mgmt_key_file
    if where is None:  # a new key for this bitstream, kept beside it
        where = out / "board.key"
        _write_key(key, where)
    from inagg.hdl.synth.ecp5 import build_board

    r = build_board(top, b.make_platform(), out, board=b.name, width=top.switch.width, seed=args.seed,
                    place=not args.pack_only)
    if args.json:
        print(json.dumps({**r.as_dict(), "mgmt_key_file": str(where), "mgmt_port": args.mgmt_port}, indent=2))
        return 0
    g = top.switch.geometry
    print(format_result(r))
    print(f"\nswitch P={g.ports} W={g.width} S={g.slots} C={g.chunk_bytes} J={g.jobs} K={g.workers}, "
          f"management bridge on port {args.mgmt_port}, key in {where}")
    if r.placed:
        print(f"bitstream {out / 'top.bit'}: inagg board program --board {b.name} --out {out}")
    return 0


def program_commands(name: str, bitstream: Path) -> list[tuple[str, str]]:
    """The commands that load ``bitstream`` on board ``name``, one per programmer: ``(programmer, command)``."""
    from inagg.hdl.board import board

    b = board(name)
    cmds = [("openFPGALoader", f"openFPGALoader --cable {b.cable} {bitstream}"),
            ("openFPGALoader, to flash", f"openFPGALoader --cable {b.cable} --write-flash {bitstream}")]
    if b.ecpprog:
        cmds += [("ecpprog", f"ecpprog -S {bitstream}"), ("ecpprog, to flash", f"ecpprog {bitstream}")]
    return cmds


def _cmd_board_program(args: argparse.Namespace) -> int:
    out = Path(args.out or f"build/board-{args.board}")
    bitstream = out / "top.bit"
    try:
        cmds = program_commands(args.board, bitstream)
    except ValueError as e:
        print(f"inagg board program: error: {e}", file=sys.stderr)
        return 2
    if not bitstream.exists():
        print(f"inagg board program: error: no bitstream {bitstream}: inagg board build --board {args.board}"
              f"{'' if args.out is None else ' --out ' + args.out} first", file=sys.stderr)
        return 2
    print(f"Load {bitstream} with the programmer you have (not run here; the first of each pair loads the FPGA "
          f"until power-off, the second writes the board's flash):")
    for tool, cmd in cmds:
        print(f"  {tool:<26} {cmd}")
    print("--cable names the JTAG adapter: openFPGALoader --list-cables lists the others.")
    return 0


def _register_board(sub) -> None:
    p = sub.add_parser("board", help="build a board's bitstream (two RGMII ports, the switch, its management bridge)",
                       description="Build the switch for an ECP5 board with two Gigabit Ethernet ports, and say how "
                                   "to load it (docs/board.md).")
    bsub = p.add_subparsers(dest="board_command", metavar="ACTION", required=True)
    q = bsub.add_parser("list", help="the boards, their devices and default builds")
    q.set_defaults(func=_cmd_board_list)
    q = bsub.add_parser("build", help="elaborate, synthesize, place and route, pack; report resources and Fmax")
    q.add_argument("--board", required=True, help="colorlight-5a75b or versa-ecp5 (inagg board list)")
    q.add_argument("--out", help="build folder (default build/board-BOARD)")
    q.add_argument("--mgmt-key-file", metavar="FILE",
                   help="the management key, 32 hex digits (default: a new random key in OUT/board.key)")
    q.add_argument("--mgmt-port", type=int, default=0, help="port of the management bridge (default %(default)s)")
    for flag, what in (("--width", "beat width in bits"), ("--slots", "direct-mapped slots"),
                       ("--chunk-bytes", "payload bytes per contribution"), ("--jobs", "jobs the tables hold"),
                       ("--workers", "most workers per job")):
        q.add_argument(flag, type=int, default=None, help=f"{what} (default: the board's, inagg board list)")
    q.add_argument("--sync-mhz", type=float, default=None, help="the switch's clock (default: the board's)")
    q.add_argument("--seed", type=int, default=1, help="nextpnr placement seed")
    q.add_argument("--pack-only", action="store_true",
                   help="stop after nextpnr's packer: utilization, no Fmax, no bitstream")
    q.add_argument("--json", action="store_true", help="machine-readable result")
    q.set_defaults(func=_cmd_board_build)
    q = bsub.add_parser("program", help="print the commands that load the bitstream (runs nothing)")
    q.add_argument("--board", required=True, help="colorlight-5a75b or versa-ecp5")
    q.add_argument("--out", help="build folder (default build/board-BOARD)")
    q.set_defaults(func=_cmd_board_program)
