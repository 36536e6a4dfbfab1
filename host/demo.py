"""``inagg demo``: the main job -- workers all-reduce float32 tensors through the switch.

N workers per job (default 4) each all-reduce a random float32 tensor
(default 16 MiB) through the fast software switch, the reference model switch
(``--switch model``) or, with ``--switch rtl``,
the Verilated RTL switch cycle by cycle (``docs/emulation.md``), over the
in-memory network (default) or Linux network namespaces (a tree of model
switches too: a namespace per switch and per rank), or on a named interface
cabled to a board (``--net iface:NAME --switch remote``, ``docs/board.md``),
with optional loss, duplication,
reordering and corruption. The run checks every worker's result against a
float64 numpy reference, element by element, within the bound of
``docs/host.md`` ("Error bound"), prints a summary (or JSON) and exits 1 when
the bound is missed.

Only argparse is imported at module import time: ``inagg --help`` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from inagg.host import sizes

__all__ = ["register", "parse_size", "stdout_to_stderr"]


def parse_size(text: str) -> int:
    """Tensor bytes in ``"16MiB"``, ``"4096"``, ``"1 GB"`` (:mod:`inagg.host.sizes`): whole float32 elements."""
    n = sizes.parse_size(text)
    if n % 4:
        raise ValueError(f"size must be a multiple of 4 bytes (whole float32 elements), not {n}")
    return n


@contextlib.contextmanager
def stdout_to_stderr():
    """Send everything written to standard output to standard error while the context lasts.

    Both the Python stream and file descriptor 1 are redirected, so child
    processes (Verilator's build, the simulator's banner) and libraries that
    print are caught too: the summary the demo prints afterwards is then the
    only thing on standard output, and ``--json`` pipes into a JSON reader.
    """
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _rate_arg(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a rate is a number in [0, 1), not {text!r}") from None
    if not 0.0 <= x < 1.0:
        raise argparse.ArgumentTypeError(f"a rate is a number in [0, 1), not {text!r}")
    return x


def _net_arg(text: str) -> str:
    if text in ("memory", "netns") or text.startswith("iface:") and len(text) > len("iface:"):
        return text
    raise argparse.ArgumentTypeError(f"expected memory, netns or iface:NAME (an interface cabled to a board), "
                                     f"not {text!r}")


def _positive_int(text: str) -> int:
    try:
        x = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {text!r}") from None
    if x < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {text!r}")
    return x


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``inagg demo`` to the command line."""
    p = subparsers.add_parser(
        "demo", help="all-reduce random tensors through the switch and check the sums",
        description="N workers per job all-reduce random float32 tensors through the Mode II switch "
                    "and check every sum against a float64 numpy reference.")
    p.add_argument("--workers", type=_positive_int, help="workers per job (default 4; with --tree its ranks)")
    p.add_argument("--size", type=_size_arg, default=16 << 20,
                   help="tensor bytes per worker, a multiple of 4 (default 16MiB); " + sizes.SIZE_GRAMMAR)
    p.add_argument("--jobs", type=_positive_int, default=1, help="concurrent jobs on the switch; with --tree, jobs at once each over every rank (default 1)")
    p.add_argument("--loss", type=_rate_arg, default=0.0, help="frame loss rate on the link (default 0)")
    p.add_argument("--dup", type=_rate_arg, default=0.0, help="frame duplication rate (default 0)")
    p.add_argument("--reorder", type=_rate_arg, default=0.0, help="rate of frames held back and overtaken (default 0)")
    p.add_argument("--corrupt", type=_rate_arg, default=0.0, help="rate of frames with one bit flipped (default 0)")
    p.add_argument("--net", type=_net_arg, default="memory",
                   help="memory: one process, virtual time (default); netns: a Linux namespace per worker and "
                        "for the switch (with --tree per switch and per rank), veth pairs, AF_PACKET (needs root); "
                        "iface:NAME: the workers on interface NAME, cabled to a board (--switch remote; needs "
                        "CAP_NET_RAW)")
    p.add_argument("--switch", choices=("fast", "model", "rtl", "remote"), default=None,
                   help="fast: the compiled software switch (the default for a UC AllReduce on one switch); "
                        "model: the reference numpy model switch (the default for --mode I/II/III, --tree and "
                        "--collective); "
                        "rtl: the Verilated RTL switch, cycle by cycle "
                        "(built on first use, cached in sim_build/; with netns the workers reach it through TAP "
                        "devices); "
                        "remote: the board at the far end of --net iface:NAME, not started by the demo")
    p.add_argument("--mgmt-key-file", metavar="FILE",
                   help="--switch remote: the board's management key (32 hex digits); the demo then configures "
                        "the jobs on the board by management frames, reads its counters and tears the jobs down; "
                        "without it the board must hold the jobs already")
    p.add_argument("--board-port", type=int, default=0,
                   help="--switch remote: the board's switch port the interface is cabled to (default 0; "
                        "configuring by frames needs the port of the board's management bridge)")
    p.add_argument("--switch-mac", metavar="MAC",
                   help="--switch remote: the board's MAC, the destination of the workers' frames (default "
                        "02:00:00:00:00:fe, the plans'); with --mgmt-key-file the demo writes it to the board's "
                        "MAC_HI and MAC_LO, without it the board must have it already")
    p.add_argument("--switch-ip", metavar="IP",
                   help="--switch remote: the board's IPv4 address (default 10.0.0.254); with --mgmt-key-file the "
                        "demo writes it to the board's IP register")
    p.add_argument("--mode", choices=("uc", "I", "II", "III"), default="uc",
                   help="uc: UC queue pairs, hosts keep reliability (default; every switch); I: EPIC's Mode I, "
                        "the switch is every host's RC endpoint; II: Mode II, RC end to end, the switch "
                        "reflects ACKs; III: Mode III, RC with reliability on the hop (model switches, memory network, "
                        "one switch or a --tree, a --tree also with --net netns; every --collective; "
                        "II and III also on one RTL switch for AllReduce, over the memory network, II in "
                        "namespaces too)")
    p.add_argument("--width", type=int, default=512, choices=(64, 256, 512),
                   help="--switch rtl: beat width of the RTL in bits (default 512)")
    p.add_argument("--waves", metavar="FILE.fst",
                   help="--switch rtl: dump the run's waveforms to FILE.fst (or FILE.vcd; FST needs the lz4 headers)")
    p.add_argument("--compare", action="store_true",
                   help="--switch rtl: run the model switch on the same traffic and report every frame that differs")
    p.add_argument("--tree", metavar="SPEC",
                   help="run on a tree of model switches: fan-out per level, root first (4: one switch of four "
                        "ranks; 2x4: a root over two switches of four ranks each); faults hit every hop; the "
                        "summary tells per hop where losses were repaired (end to end or on the hop)")
    p.add_argument("--collective", default="allreduce",
                   choices=("allreduce", "reduce", "broadcast", "barrier", "reduce-scatter", "allgather"),
                   help="the collective the ranks run (default allreduce); every other one runs on model switches "
                        "(one switch, or --tree) and is checked bit for bit against numpy")
    p.add_argument("--root", type=int, default=0, help="root rank of reduce and broadcast (default 0)")
    p.add_argument("--window", type=_positive_int, default=128,
                   help="chunks outstanding per worker, a power of two (default 128)")
    p.add_argument("--chunk-bytes", type=int, default=1024, choices=(256, 512, 1024, 2048, 4096),
                   help="payload bytes per packet (default 1024)")
    p.add_argument("--seed", type=int, default=0, help="seed of the tensors and the link faults (default 0)")
    p.add_argument("--pcap", metavar="FILE",
                   help="write every frame on the link (memory) or at the switch's ports (netns) to FILE (pcap)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    import json

    from inagg.host.demo_run import DemoConfig, format_summary, run_demo
    from inagg.host.mgmt import read_key_file

    try:
        workers = args.workers
        if workers is None:
            from inagg.models.tree import Tree

            workers = Tree.parse(args.tree).ranks if args.tree is not None else 4
        cfg = DemoConfig(workers=workers, tree=args.tree, collective=args.collective, root=args.root,
                         size=args.size, jobs=args.jobs, loss=args.loss, dup=args.dup,
                         reorder=args.reorder, corrupt=args.corrupt, net=args.net, switch=args.switch,
                         window=args.window, chunk_bytes=args.chunk_bytes, seed=args.seed, pcap=args.pcap,
                         width=args.width, waves=args.waves, compare=args.compare, mode=args.mode,
                         mgmt_key=None if args.mgmt_key_file is None else read_key_file(args.mgmt_key_file),
                         board_port=args.board_port, switch_mac=args.switch_mac, switch_ip=args.switch_ip)
    except ValueError as e:
        print(f"inagg demo: error: {e}", file=sys.stderr)
        return 2
    progress = not (args.json or args.no_progress) and sys.stderr.isatty()
    try:
        with stdout_to_stderr():
            summary = run_demo(cfg, progress=progress)
    except Exception as e:  # a protocol failure ends the demo with its message, not a traceback
        from inagg.host.demo_run import RtlUnavailable
        from inagg.host.iface import InterfaceError
        from inagg.host.mgmt import MgmtError
        from inagg.host.netns import NetnsUnavailable
        from inagg.host.worker import ProtocolError

        if isinstance(e, (ProtocolError, NetnsUnavailable, RtlUnavailable, InterfaceError, MgmtError)):
            print(f"inagg demo: error: {e}", file=sys.stderr)
            return 1
        raise
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        format_summary(summary)
    return 0 if summary["ok"] else 1

