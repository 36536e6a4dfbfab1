"""``inagg schedule``, ``inagg schedule compare`` and ``inagg alltoall``.

``inagg.cli`` calls :func:`register` with its subparsers.
"""

from __future__ import annotations

import argparse
import json
import sys

from inagg.host.sizes import SIZE_GRAMMAR, size_arg

__all__ = ["register", "parse_size", "parse_sizes"]

# The one size grammar of the command line (inagg.host.sizes), as an argparse type.
parse_size = size_arg


def parse_sizes(text: str) -> list[int]:
    """``1KiB..1GiB`` (every power of two in between), ``LO..HI:F`` (factor F), or ``a,b,c``."""
    if ".." in text:
        lo, _, rest = text.partition("..")
        hi, _, f = rest.partition(":")
        lo, hi = parse_size(lo), parse_size(hi)
        factor = float(f) if f else 2.0
        if lo < 1 or hi < lo or factor <= 1:
            raise argparse.ArgumentTypeError(f"bad size range {text!r}")
        out, x = [], float(lo)
        while x <= hi * (1 + 1e-9):
            out.append(int(round(x)))
            x *= factor
        return out
    return [parse_size(t) for t in text.split(",")]




#: up to this many ranks ``inagg schedule`` runs the executor's exact check, above it the symbolic one
EXACT_CHECK_RANKS = 512


def register(subparsers) -> None:
    """Add ``schedule`` and ``alltoall`` to an argparse sub-parser collection."""
    from inagg.host.schedules.registry import ALGORITHMS
    from inagg.host.schedules.topology import GRAMMAR

    algos = "\n".join(f"  {k:<13} {v[1]}" for k, v in ALGORITHMS.items())
    p = subparsers.add_parser(
        "schedule", help="build, check and cost a collective schedule (or compare algorithms)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Build a schedule, check it with the executor, and cost it on a topology.\n"
                    "`inagg schedule compare` costs every applicable algorithm over a size range.",
        epilog=f"algorithms:\n{algos}\n\n{GRAMMAR}\n\nsizes: {SIZE_GRAMMAR}; ranges LO..HI[:FACTOR]")
    p.add_argument("mode", nargs="?", choices=["compare"], help="compare all applicable algorithms")
    p.add_argument("--algo", choices=list(ALGORITHMS), help="algorithm (see below)")
    p.add_argument("--topo", required=True, help="topology spec (see below)")
    p.add_argument("--ranks", type=int, help="number of ranks (must match the topology)")
    p.add_argument("--collective", default="allreduce", help="allreduce (default), reduce_scatter, allgather, ...")
    p.add_argument("--size", type=parse_size, default=1 << 20, help="collective size in bytes (default 1MiB)")
    p.add_argument("--sizes", type=parse_sizes, default=None, help="size range for compare (default 1KiB..1GiB)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--plot", metavar="FILE.png", help="plot the schedule (or, for compare, time against size)")
    p.add_argument("--export-msccl", metavar="FILE.xml",
                   help="write the schedule as an MSCCL XML algorithm (validated, then read back and checked)")
    p.add_argument("--msccl-proto", choices=["Simple", "LL", "LL128"], default="Simple",
                   help="protocol named in the MSCCL file (default Simple)")
    p.add_argument("--no-check", action="store_true",
                   help=f"skip the check (the executor up to {EXACT_CHECK_RANKS} ranks, the symbolic check above)")
    p.set_defaults(func=_cmd_schedule)

    a = subparsers.add_parser("alltoall", help="plan a skewed all-to-all with FAST")
    a.add_argument("--servers", type=_positive_int, required=True)
    a.add_argument("--gpus-per-server", type=_positive_int, required=True)
    a.add_argument("--zipf", type=float, default=0.8, help="skew of the per-source destination sizes")
    a.add_argument("--mean-bytes", type=parse_size, default=1 << 20, help="mean bytes per GPU pair")
    a.add_argument("--nic-gbps", type=float, default=400.0, help="NIC rate in Gb/s")
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=_cmd_alltoall)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text!r}")
    return value


def _fail(msg: str) -> int:
    print(f"inagg: error: {msg}", file=sys.stderr)
    return 2


def _cmd_schedule(args: argparse.Namespace) -> int:
    from inagg.host.schedules import cost, executor, topology
    from inagg.host.schedules.registry import CONCRETE_ONLY, generate

    try:
        topo = topology.parse(args.topo)
        if args.mode == "compare":
            return _compare(args, topo)
        if not args.algo:
            return _fail("--algo is required (or use `inagg schedule compare`)")
        # the executor holds every chunk of every rank; past EXACT_CHECK_RANKS the symbolic check does
        exact = not args.no_check and (topo.nhosts <= EXACT_CHECK_RANKS or args.algo in CONCRETE_ONLY)
        concrete = exact or args.export_msccl or args.algo in CONCRETE_ONLY
        sched = generate(args.algo, args.ranks, topo=topo, collective=args.collective, abstract=not concrete)
        if exact:
            executor.check(sched)
        elif not args.no_check:
            executor.check_symbolic(sched)
        c = cost.evaluate(sched, topo, args.size)
        if args.export_msccl:
            from inagg.host.schedules import msccl

            text = msccl.export(sched, proto=args.msccl_proto)
            if not args.no_check:  # the file itself, read back, must compute the collective
                executor.check(msccl.load(text))
            with open(args.export_msccl, "w", encoding="utf-8") as f:
                f.write(text)
    except (ValueError, TypeError, OSError) as e:
        return _fail(str(e))
    if args.plot:
        from inagg.host.schedules import plot

        plot.plot_schedule(sched, args.plot, args.size)
    d = c.as_dict()
    d["checked"] = not args.no_check
    d["check"] = "none" if args.no_check else "exact" if exact else "symbolic"
    if args.export_msccl:
        d["msccl"] = args.export_msccl
    if args.json:
        print(json.dumps(d, indent=2))
    else:
        print(f"{c.algo} {c.collective} on {c.topology} ({c.ranks} ranks), {c.size_bytes:.0f} B: "
              f"{c.steps} steps, {c.bytes_per_rank:.0f} B/rank, {c.time_s * 1e6:.2f} us, Xi {c.xi:.3f}")
        if args.export_msccl:
            print(f"wrote MSCCL algorithm {args.export_msccl}")
    return 0


def _compare(args: argparse.Namespace, topo) -> int:
    from inagg.host.schedules import cost
    from inagg.host.schedules.registry import CONCRETE_ONLY, applicable, generate

    sizes = args.sizes or parse_sizes("1KiB..1GiB")
    algos = applicable(topo, args.collective)
    results = {}
    for a in algos:
        s = generate(a, topo=topo, collective=args.collective, abstract=a not in CONCRETE_ONLY)
        results[a] = [cost.evaluate(s, topo, x) for x in sizes]
    from inagg.host.schedules import plot

    if args.plot:
        plot.plot_compare(sizes, results, args.plot, f"{args.collective} on {topo.spec}")
    ts = plot.trivance_vs_swing(sizes, {a: [c.time_s for c in cs] for a, cs in results.items()})
    if args.json:
        print(json.dumps({"topology": topo.spec, "sizes": sizes,
                          "algos": {a: [c.as_dict() for c in cs] for a, cs in results.items()},
                          "trivance_vs_swing": ts}, indent=2))
        return 0
    print("size".rjust(12) + "".join(a.rjust(14) for a in results))
    for i, x in enumerate(sizes):
        row = [results[a][i].time_s * 1e6 for a in results]
        best = min(range(len(row)), key=row.__getitem__)
        print(f"{x:12d}" + "".join((f"{t:13.2f}" + ("*" if j == best else " ")) for j, t in enumerate(row)))
    print("times in us; * marks the fastest")
    if ts is not None:
        won = ts["trivance_faster"]
        print("fastest Trivance beats fastest Swing: "
              + (f"at {len(won)} of {len(sizes)} sizes, {won[0]} B to {won[-1]} B" if won else "at no size")
              + "; crossovers: " + (", ".join(f"{x:.0f} B" for x in ts["crossovers"]) or "none"))
    return 0


def _cmd_alltoall(args: argparse.Namespace) -> int:
    from inagg.host.schedules import alltoall

    try:
        n = args.servers * args.gpus_per_server
        if n < 2:
            raise ValueError(f"an all-to-all needs at least 2 GPUs, not {args.servers} x {args.gpus_per_server}")
        m = alltoall.zipf_matrix(n, args.zipf, mean_bytes=args.mean_bytes, seed=args.seed)
        plan = alltoall.fast_plan(m, args.gpus_per_server)
    except (ValueError, TypeError) as e:
        return _fail(str(e))
    bw = args.nic_gbps * 1e9 / 8
    d = {"servers": plan.servers, "gpus_per_server": plan.gpus_per_server, "stages": len(plan.stages),
         "lower_bound": plan.lower_bound(bw), "makespan": plan.makespan(bw), "compute_us": plan.compute_s * 1e6,
         "lower_bound_bytes": plan.lower_bound_bytes,
         "plan": [{"send_to": perm.tolist(), "bytes": w} for perm, w in plan.stages]}
    if args.json:
        print(json.dumps(d, indent=2))
    else:
        print(f"FAST: {d['stages']} stages, makespan {d['makespan'] * 1e6:.1f} us, lower bound "
              f"{d['lower_bound'] * 1e6:.1f} us, planned in {d['compute_us']:.0f} us")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run these subcommands on their own (``python -m inagg.host.schedules.cli``)."""
    parser = argparse.ArgumentParser(prog="inagg")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
