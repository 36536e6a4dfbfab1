"""The ``inagg`` command line.

Each subcommand imports what it needs when it runs, so ``inagg --help`` and
the host-side commands never pull in Amaranth or cocotb.
"""

from __future__ import annotations

import argparse
import sys

from inagg import __version__

__all__ = ["main", "build_parser"]


def _cmd_version(args: argparse.Namespace) -> int:
    print(f"inagg {__version__}")
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from inagg import doctor

    return doctor.main(json_output=args.json)


def _cmd_demo(args: argparse.Namespace) -> int:
    from inagg.host import demo

    return demo.run_cli(args)


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

    p = sub.add_parser("demo", help="all-reduce random tensors from several workers through a switch")
    from inagg.host import demo

    demo.add_arguments(p)
    p.set_defaults(func=_cmd_demo)
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
