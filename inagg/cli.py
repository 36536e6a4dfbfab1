"""The ``inagg`` command line.

Each part of inagg contributes its subcommands through a module listed in
:data:`COMMAND_MODULES` that exposes ``register(subparsers)``. Those modules
import only argparse-level code at import time and pull in their heavy
dependencies (Amaranth, cocotb, scapy) inside the command handlers, so
``inagg --help`` and the host-side commands never load the gateware stack.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from inagg import __version__

__all__ = ["main", "build_parser", "COMMAND_MODULES"]

COMMAND_MODULES = (
    "inagg.host.demo",
    "inagg.hdl.synth.cli",
    "inagg.host.schedules.cli",
    "inagg.host.service_cli",
    "inagg.hdl.cli",
)


def _cmd_version(args: argparse.Namespace) -> int:
    print(f"inagg {__version__}")
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from inagg import doctor

    return doctor.main(json_output=args.json)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand (also used by the tests)."""
    parser = argparse.ArgumentParser(
        prog="inagg",
        description="In-network aggregation: gateware, models, hosts and schedules.",
    )
    parser.add_argument("--version", action="version", version=f"inagg {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("version", help="print the version")
    p.set_defaults(func=_cmd_version)

    p = sub.add_parser("doctor", help="check that every tool of the flow is installed and works")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_doctor)

    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
