"""``inagg verilog``: write the switch top as Verilog (Amaranth is imported only when the command runs)."""

from __future__ import annotations

import argparse
import sys

from inagg.models.mgmt import parse_key

__all__ = ["register"]


def _cmd_verilog(args: argparse.Namespace) -> int:
    from inagg.hdl.switch import generate_verilog

    try:
        text = generate_verilog(args.name, ports=args.ports, width=args.width, slots=args.slots,
                                chunk_bytes=args.chunk_bytes, jobs=args.jobs, workers=args.workers,
                                exc_table=args.exc_table, exc_max_kicks=args.exc_max_kicks, exc_stash=args.exc_stash,
                                divert_frames=args.divert_frames, mgmt_port=args.mgmt_port, mgmt_key=args.mgmt_key,
                                augmented=args.mode_iii)
    except ValueError as e:
        print(f"inagg verilog: error: {e}", file=sys.stderr)
        return 2
    if args.output == "-":
        print(text, end="")
    else:
        with open(args.output, "w") as f:
            f.write(text)
    return 0


def _key(text: str) -> bytes:
    try:
        return parse_key(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def register(subparsers) -> None:
    """Add ``verilog`` to the ``inagg`` command line."""
    p = subparsers.add_parser("verilog", help="write the switch RTL as Verilog",
                              description="Write the switch top (AXI-Stream ports, AXI4-Lite registers) as Verilog; "
                                          "docs/rtl.md describes its ports and registers.")
    p.add_argument("--ports", type=int, default=4, help="Ethernet ports (default 4)")
    p.add_argument("--width", type=int, default=512, choices=(64, 256, 512), help="beat width in bits (default 512)")
    p.add_argument("--slots", type=int, default=256, help="direct-mapped slots, a power of two (default 256)")
    p.add_argument("--chunk-bytes", type=int, default=1024, help="payload bytes per contribution (default 1024)")
    p.add_argument("--jobs", type=int, default=4, help="jobs the tables hold (default 4)")
    p.add_argument("--workers", type=int, default=8, help="most workers per job (default 8)")
    p.add_argument("--exc-table", type=int, default=0,
                   help="entries per cuckoo table of the exception path, a power of two; 0 (default): no exception "
                        "path, a colliding contribution is dropped (docs/exception.md)")
    p.add_argument("--exc-max-kicks", type=int, default=16, help="longest cuckoo kick-out chain (default 16)")
    p.add_argument("--exc-stash", type=int, default=4, help="stash entries of the exception path (default 4)")
    p.add_argument("--divert-frames", type=int, default=4,
                   help="colliding frames the divert queue holds while the exception engine answers (default 4)")
    p.add_argument("--mgmt-port", type=int, default=None,
                   help="port whose management frames (EtherType 0x88B5, docs/protocol.md section 12) reach the "
                        "registers; default: none, the registers on AXI4-Lite alone")
    p.add_argument("--mgmt-key", type=_key, default=None,
                   help="the management bridge's 128-bit key, 32 hex digits (with --mgmt-port; keep it secret: "
                        "docs/security.md)")
    p.add_argument("--mode-iii", action="store_true",
                   help="take Mode III (connection augmented) jobs too (docs/rtl.md)")
    p.add_argument("--name", default="inagg_switch", help="Verilog module name (default inagg_switch)")
    p.add_argument("-o", "--output", default="-", help="output file (default: standard output)")
    p.set_defaults(func=_cmd_verilog)
