"""Utilization and Fmax of the gateware on an ECP5-85F, per configuration, and of the board tops on their boards.

A configuration whose label names another device (the MAC on the Colorlight's LFE5U-25F) is built on that one.

Writes docs/results/synth.md. Run: ``make synth-report`` (or
``.venv/bin/python bench/synth.py [--quick] [--only TEXT] [--synth-only [WHY]]``).
With ``--at REV`` the build is of that commit's tree (exported to
``build/synth-src/``), not of the shared working tree. Each configuration
is one full YoWASP build (synthesis, place and route,
bitstream) into ``build/synth-report/<slug>/``, or with ``--synth-only``
one that stops after nextpnr's packer (utilization, no Fmax; a design too
large for the device is reported so, whatever the flag). Its figures are
kept, with the date, commit and command of the build, as
``docs/results/synth/<slug>.json``, a committed folder, so that a lost
build folder loses no row. The report is written from every
configuration's row, so that builds of hours can be run one at a time
(``--only``) and a partial run never drops the rows of earlier ones;
``--report`` only rewrites the report from the rows. The board tops
(``--only board-``) are built on their own boards' devices and pins by
``inagg.hdl.synth.ecp5.build_board``, with every clock's Fmax, in a table
of their own.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "results" / "synth.md"
BUILD = ROOT / "build" / "synth-report"
ROWS = ROOT / "docs" / "results" / "synth"
SRC = ROOT / "build" / "synth-src"
_AT = "INAGG_SYNTH_AT"  # set for the process that builds an exported commit


@dataclass(frozen=True)
class Config:
    """One row of the report: what is built, its stream width (for W x Fmax), the clock constraint, and the device
    and speed grade (``ECP5Platform``'s) when the label names one other than the report's."""

    slug: str
    label: str
    make: Callable
    width: int | None
    mhz: float = 200.0
    ports: int | None = None
    board: str | None = None
    device: str = "LFE5UM5G-85F"
    speed: str | None = None


def _fp32_adder():
    from inagg.hdl.fp32 import FP32Adder

    return FP32Adder()


def _int_to_fp32():
    from inagg.hdl.fp32 import IntToFP32

    return IntToFP32(33)


def _mac():
    """The Ethernet MAC (W = 64) with its receive, transmit and switch domains all on the wrapper's one clock.

    The wrapper has one clock; the crossings then join one domain to itself, which keeps all their logic,
    and the row's Fmax is the slowest of the three domains' paths.
    """
    from amaranth import DomainRenamer, Module
    from amaranth.lib import wiring

    from inagg.hdl.mac import MAC

    class OneClockMAC(wiring.Component):
        def __init__(self):
            self.mac = MAC(64)
            super().__init__(dict(self.mac.signature.members))

        def elaborate(self, platform):
            m = Module()
            m.submodules.mac = mac = DomainRenamer({"rx": "sync", "tx": "sync"})(self.mac)
            wiring.connect(m, wiring.flipped(self), mac)
            return m

    return OneClockMAC()


def _emitter_w512():
    """One port's result emitter of the W = 512 switch row alone: the block its worst path sits in."""
    from inagg.hdl.emitter import ResultEmitter

    return ResultEmitter(width=512, chunk_bytes=1024, slots=64, jobs=4, workers=8, port=1, port_bits=1)


def _mgmt_w64():
    """The management bridge at W = 64 alone (SipHash-2-4 rounds, the AXI4-Lite manager, the response), with the
    address width of the switch rows' register map (4 jobs of 8 workers) and a fixed key."""
    from inagg.hdl.mgmt import MgmtBridge
    from inagg.models.regmap import RegMap

    return MgmtBridge(width=64, key=bytes(range(16)), addr_width=RegMap(4, 8).addr_width)


def _switch_config(ports, width, slots, chunk_bytes, jobs=4, workers=8, exc_table=0, fp32=None, mgmt=False,
                   mode_iii=False):
    """A switch row; ``fp32``: the FP32 units' (conversion, adder) latencies, the switch's defaults if None;
    ``mgmt``: with the management bridge on port 0 (a fixed key); ``mode_iii``: a build that takes Mode III
    jobs too (``inagg synth --mode-iii``)."""
    latencies = {} if fp32 is None else dict(convert_latency=fp32[0], add_latency=fp32[1])
    bridge = dict(mgmt_port=0, mgmt_key=bytes(range(16))) if mgmt else {}

    def make():
        from inagg.hdl.switch import Switch

        return Switch(ports=ports, width=width, slots=slots, chunk_bytes=chunk_bytes, jobs=jobs, workers=workers,
                      exc_table=exc_table, augmented=mode_iii, **latencies, **bridge)
    slug = f"switch-p{ports}-w{width}-s{slots}-c{chunk_bytes}"
    label = f"switch P={ports} W={width} S={slots} C={chunk_bytes}"
    if (jobs, workers) != (4, 8):
        slug, label = f"{slug}-j{jobs}-k{workers}", f"{label} J={jobs} K={workers}"
    if exc_table:
        slug, label = f"{slug}-x{exc_table}", f"{label} + cuckoo T={exc_table}"
    if fp32 is not None:
        slug, label = f"{slug}-l{fp32[0]}-{fp32[1]}", f"{label} FP32 {fp32[0]}+{fp32[1]}"
    if mgmt:
        slug, label = f"{slug}-mgmt", f"{label} + management bridge"
    if mode_iii:
        slug, label = f"{slug}-m3", f"{label} + Mode III"
    return Config(slug, label, make, width, ports=ports)


FAST_FP32 = (2, 4)
# The smallest switch is the one the test suite builds (tests/synth/test_synth.py).
SMALLEST = _switch_config(1, 64, 8, 256, jobs=1, workers=2)
CONFIGS = [
    Config("fp32-adder", "FP32Adder", _fp32_adder, None),
    Config("int-to-fp32", "IntToFP32 (33 bit)", _int_to_fp32, None),
    SMALLEST,
    _switch_config(2, 64, 64, 256),
    _switch_config(2, 64, 64, 256, exc_table=64),
    _switch_config(2, 256, 64, 1024),
    _switch_config(2, 512, 64, 1024),
    _switch_config(4, 512, 256, 1024),
    # Deeper FP32 units (docs/results/fp32.md: IntToFP32 of 2 cycles at 143 MHz, FP32Adder of 4 at 134 MHz
    # alone), for the 100 MHz goal of issue 19; the defaults' units alone stop at 82 and 91 MHz.
    _switch_config(2, 64, 64, 256, fp32=FAST_FP32),
    _switch_config(2, 256, 64, 1024, fp32=FAST_FP32),
    _switch_config(2, 512, 64, 1024, fp32=FAST_FP32),
    # The block of the W = 512 switch's worst path (issue 19), placed alone.
    Config("emitter-w512", "ResultEmitter W=512 C=1024 (one port)", _emitter_w512, 512),
    # The Ethernet MAC of the board tops (issue 23), at the GMII byte clock.
    Config("mac-w64", "Ethernet MAC (GMII, W=64, one clock)", _mac, None, mhz=125.0),
    # The same on the Colorlight 5A-75B's device and speed grade, where the board build's MAC clocks stop short
    # of their 125 MHz (docs/board.md, "The board tops").
    Config("mac-w64-25f", "Ethernet MAC (GMII, W=64, one clock) on LFE5U-25F speed 6", _mac, None, mhz=125.0,
           device="LFE5U-25F", speed="6"),
    # The management bridge a board's switch carries on one port (issue 23), alone and in the smallest board switch.
    Config("mgmt-w64", "Management bridge (W=64, alone)", _mgmt_w64, None),
    _switch_config(2, 64, 64, 256, mgmt=True),
    # What Mode III (issue 18) costs: its ACK state, timers and resend path beside the default build.
    _switch_config(2, 64, 64, 256, mode_iii=True),
]
QUICK = CONFIGS[:5]


def _board_config(name: str) -> Config:
    """A board's default build (inagg.hdl.board.BOARDS) on its own device and pins, with a fixed key."""
    def make():
        from inagg.hdl.board import BoardTop

        return BoardTop(name, mgmt_key=bytes(range(16)))
    return Config(f"board-{name}", f"board {name}, default build", make, 64, mhz=0.0, ports=2, board=name)


# The board tops (issue 23): not on the 85F, so a table of their own, with every clock.
BOARD_CONFIGS = [_board_config("colorlight-5a75b"), _board_config("versa-ecp5")]


def _export(rev: str) -> tuple[Path, str]:
    """The tree of commit ``rev`` in ``build/synth-src/<sha>/``, laid out so that it imports as ``inagg``.

    The folders map to the package as pyproject.toml's ``package-dir`` says, by symlinks under the
    export's ``inagg/``; a PYTHONPATH of the export then comes before the editable install.
    """
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    src = SRC / sha
    if not (src / "inagg" / "hdl").exists():
        src.mkdir(parents=True, exist_ok=True)
        tree = subprocess.run(["git", "archive", sha], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=tree, check=True)
        dirs = tomllib.loads((src / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
        for package, folder in dirs.items():
            if package.startswith("inagg."):
                (src / "inagg" / package.removeprefix("inagg.")).symlink_to(Path("..") / folder)
    return src, sha


def _commit() -> str:
    if os.environ.get(_AT):
        return os.environ[_AT]
    p = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "hdl"], cwd=ROOT).returncode
    return p.stdout.strip() + ("+" if dirty else "") if p.returncode == 0 else "?"


def build(cfg: Config, command: str, unplaced: str | None = None, router: str = "router1") -> dict:
    """Build ``cfg`` and keep its row (figures, build time, commit, command) in ``ROWS``.

    ``unplaced`` (why) stops the build after packing; ``router`` is nextpnr's. A row may hold a
    ``note``, which the report prints: why it has no Fmax, for one.
    """
    from inagg.hdl.synth.ecp5 import build_board, synthesize

    t0, commit = time.perf_counter(), _commit()  # the sources are read now, at elaboration
    if cfg.board:
        from inagg.hdl.board import board

        r = build_board(cfg.make(), board(cfg.board).make_platform(), BUILD / cfg.slug, board=cfg.board,
                        width=cfg.width, place=unplaced is None)
    else:
        r = synthesize(cfg.make(), BUILD / cfg.slug, device=cfg.device, speed=cfg.speed, clock_mhz=cfg.mhz,
                       width=cfg.width, place=unplaced is None, router=router)
    row = {"result": r.as_dict(), "seconds": round(time.perf_counter() - t0), "commit": commit,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.machine(),
           "command": command}
    if not r.placed:
        row["note"] = "synthesis only: " + ("fits; " + unplaced if r.fits() else "does not fit: " + _overuse(r.as_dict()))
    ROWS.mkdir(parents=True, exist_ok=True)
    (ROWS / f"{cfg.slug}.json").write_text(json.dumps(row, indent=1) + "\n")
    return row


def _overuse(r: dict) -> str:
    names = {"TRELLIS_COMB": "LUT4", "TRELLIS_FF": "FF", "DP16KD": "EBR", "MULT18X18D": "DSP"}
    return ", ".join(f"{what} {names.get(cell, cell)}" for cell, what in r["overused"].items())


def fp32_cells(modules: dict) -> dict:
    """Cells of the slot engine's FP32 units (``core.engine[.promotion].conv<k>``, ``...add<k>``: the engine's
    promotion stage holds them since b151c80) and their count."""
    units = [c for name, c in modules.items() if re.fullmatch(r"core\.engine\.(promotion\.)?(conv|add)\d+", name)]
    return {"units": len(units), **{k: sum(c[k] for c in units) for k in ("luts", "carries", "ffs")}}


def _core_cells(modules: dict) -> dict:
    # The core and every module below it (core.engine, core.ingress0, ...).
    return {k: sum(c[k] for name, c in modules.items() if name == "core" or name.startswith("core."))
            for k in ("luts", "carries", "ffs")}


def _replaced(slug: str, commit: str) -> dict | None:
    """The row that the latest build of ``slug`` (at ``commit``) replaced: its newest committed version built at
    another commit, from the git history of its file; None if it has none."""
    path = f"{ROWS.relative_to(ROOT).as_posix()}/{slug}.json"
    log = subprocess.run(["git", "log", "--format=%H", "--", path], cwd=ROOT, capture_output=True, text=True)
    for sha in log.stdout.split():
        shown = subprocess.run(["git", "show", f"{sha}:{path}"], cwd=ROOT, capture_output=True, text=True)
        if shown.returncode == 0 and (row := json.loads(shown.stdout))["commit"] != commit:
            return row
    return None


def _before_after(rows: dict) -> list[str]:
    """Report lines: each placed row against the placed build it replaced, if any."""
    pairs = [(cfg, old, rows[cfg.slug]) for cfg in CONFIGS if cfg.slug in rows
             and rows[cfg.slug]["result"].get("placed", True)
             and (old := _replaced(cfg.slug, rows[cfg.slug]["commit"])) and old["result"].get("placed", True)]
    if not pairs:
        return []
    lines = ["", "## Before and after", "",
             "Each placed row against the placed build of the same configuration that it replaced (from the git",
             "history of its row); what changed between the two commits is in `docs/synth.md` (\"Timing closure\").",
             "", "| configuration | built | Fmax (MHz) | LUT4 | FF | EBR | worst path (ns): from |",
             "|---|---|---:|---:|---:|---:|---|"]

    def path(r):
        c = r.get("critical_path")
        return f"{c['ns']:.2f}: `{c['source'].removeprefix('wrapper.')}`" if c else "-"

    for cfg, old, new in pairs:
        a, b = old["result"], new["result"]
        lines.append(f"| {cfg.label} | {old['commit']} → {new['commit']} | {a['fmax_mhz']:.1f} → {b['fmax_mhz']:.1f} | "
                     f"{a['luts']:,} → {b['luts']:,} | {a['ffs']:,} → {b['ffs']:,} | {a['ebr']} → {b['ebr']} | "
                     f"{path(a)} → {path(b)} |")
    return lines


def _boards() -> list[str]:
    """Report lines: each board build's resources on its own device and every clock's Fmax."""
    rows = [(cfg, json.loads(p.read_text())) for cfg in BOARD_CONFIGS if (p := ROWS / f"{cfg.slug}.json").exists()]
    lines = ["", "## Boards", "",
             "The board tops (`inagg.hdl.board`, `docs/board.md`) at each board's default build, on the board's own",
             "device, pins and clocks, without the wrapper: two RGMII MACs, the switch with its management bridge on",
             "port 0, the PLL. Fmax per clock, by nextpnr's net names: `clk` is the switch's (`sync`), `clk_op` the",
             "MACs' transmit clock, `ethN.i` port N's receive clock.", "",
             "| board | device | LUT4 | FF | EBR | Fmax per clock (MHz, constraint) | build time | built |",
             "|---|---|---:|---:|---:|---|---:|---|"]
    if not rows:
        return lines + ["| not built yet |" + " |" * 7]
    for cfg, row in rows:
        r = row["result"]
        clocks = ", ".join(f"`{net}` {c['fmax_mhz']:.1f} ({c['constraint_mhz']:.0f})" for net, c in r["clocks"].items())
        notes = "".join(f"; {row[k]}" for k in ("note",) if k in row)
        lines.append(f"| {r['board']} | {r['device']} | {r['luts']:,} of {r['luts_avail']:,} "
                     f"({100 * r['luts'] / r['luts_avail']:.1f}%) | {r['ffs']:,} | {r['ebr']} of {r['ebr_avail']} | "
                     f"{clocks or '-'} | {row['seconds']:,} s | {row['date']}, {row['commit']}, `{row['command']}`"
                     f"{notes} |")
    return lines


def report(failures: dict[str, str]) -> str:
    """docs/results/synth.md from every configuration's latest row."""
    rows = {c.slug: json.loads(p.read_text()) for c in CONFIGS if (p := ROWS / f"{c.slug}.json").exists()}
    tools = next((r["result"]["tools"] for r in rows.values()), {})
    lines = [
        "# Synthesis on Lattice ECP5 (LFE5UM5G-85F, speed 8)",
        "",
        "Written by `make synth-report` (`.venv/bin/python bench/synth.py`); each row gives the command, date",
        "and commit of its own build (`+`: the build had uncommitted changes under hdl/).",
        f"Tools: {tools.get('yosys', '?')}; {tools.get('nextpnr-ecp5', '?')} (YoWASP, WebAssembly).",
        "Each row is one build inside the scan/MISR wrapper of `inagg.hdl.synth.wrapper` (3 pins); totals include",
        "the wrapper, whose cost is one flip-flop per core port bit (less the scan chain's last bits where they",
        "feed inputs the core ignores) plus about one LUT4 per output bit;",
        "the core columns are yosys cells of the core alone from a non-flattened synthesis (LUT4 + carry pairs).",
        "A row whose label names another device was built on that device (its LUT4 share is of that device's).",
        "nextpnr runs with `--timing-allow-fail`: Fmax is what the placed design reaches, met or not.",
        "A row marked \"synthesis only\" stopped after nextpnr's packer (`--synth-only`, or a design larger than",
        "the device): its utilization is nextpnr's count of the packed cells, as in a placed row, of the per-module",
        "synthesis flattened (one synthesis, without the flattened one's optimizations across modules); no Fmax.",
        "The rows are kept in `docs/results/synth/<slug>.json`. A row \"recovered from the report\" was built before",
        "that folder existed and its build folder is lost: only the report's columns survive (no per-module cells).",
        "",
        "| configuration | LUT4 | FF | EBR | DSP | core LUT4 + CCU2C | core FF | Fmax (MHz) | constraint"
        " | W x Fmax (Gb/s) | build time | built |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for cfg in CONFIGS:
        if cfg.slug in failures:
            lines.append(f"| {cfg.label} | build failed: {failures[cfg.slug]} |" + " |" * 11)
            continue
        if cfg.slug not in rows:
            lines.append(f"| {cfg.label} | not built yet |" + " |" * 11)
            continue
        row = rows[cfg.slug]
        r, core = row["result"], _core_cells(row["result"]["modules"])
        placed = r.get("placed", True)
        fmax = f"{r['fmax_mhz']:.1f}" if placed else "-"
        gbps = f"{r['width'] * r['fmax_mhz'] / 1000:.1f}" if r["width"] and placed else "-"
        notes = "".join(f"; {row[k]}" for k in ("note", "recovered") if k in row)
        lines.append(
            f"| {cfg.label} | {r['luts']:,} ({100 * r['luts'] / r['luts_avail']:.1f}%) | {r['ffs']:,} | {r['ebr']} | "
            f"{r['dsp']} | {core['luts']:,} + {core['carries']:,} | {core['ffs']:,} | {fmax} | "
            f"{r['constraint_mhz']:.0f} | {gbps} | {row['seconds']:,} s | {row['date']}, {row['commit']}, "
            f"`{row['command']}`{notes} |")
    lines += ["", "The FP32 units alone, at every latency, are in `docs/results/fp32.md`; the cuckoo exception engine",
              "alone in `docs/results/exception.md`. Without the FP32 units in the slot engine, the switch at",
              "P=2 W=64 S=64 C=256 took 16,706 LUT4, 4,345 FF, 14 EBR and reached 65.5 MHz (commit 9408749, the",
              "registers before their PSN copies)."]
    fp32 = [(cfg, fp32_cells(rows[cfg.slug]["result"]["modules"]), _core_cells(rows[cfg.slug]["result"]["modules"]))
            for cfg in CONFIGS if cfg.slug in rows]
    fp32 = [(cfg, f, core) for cfg, f, core in fp32 if f["units"]]
    if fp32:
        lines += ["", "## The FP32 lanes' share", "",
                  "Yosys cells of the slot engine's FP32 units (one `IntToFP32` and one `FP32Adder` per 32-bit lane)",
                  "in each switch row's per-module synthesis, against the core's; a CCU2C is two LUT4 sites.", "",
                  "| configuration | FP32 units | their LUT4 + CCU2C | their FF | share of the core's LUT4 sites |",
                  "|---|---:|---:|---:|---:|"]
        for cfg, f, core in fp32:
            share = (f["luts"] + 2 * f["carries"]) / (core["luts"] + 2 * core["carries"])
            lines.append(f"| {cfg.label} | {f['units']} | {f['luts']:,} + {f['carries']:,} | {f['ffs']:,} | "
                         f"{share:.0%} |")
    paths = [(cfg, rows[cfg.slug]["result"]["critical_path"]) for cfg in CONFIGS
             if cfg.slug in rows and rows[cfg.slug]["result"].get("critical_path")]
    if paths:
        lines += ["", "## Worst paths", "",
                  "nextpnr's worst path of each placed row (`top.tim`), by the blocks it crosses in turn and the delay",
                  "when it leaves each (`core` is the switch's own glue). nextpnr names a cell after a net, so a cell at",
                  "a block's edge may carry its neighbour's name.", "",
                  "| configuration | delay (ns) | logic + routing (ns) | from | through |", "|---|---:|---:|---|---|"]
        for cfg, path in paths:
            through = " → ".join(f"{block} ({ns:.1f})" for block, ns in path["blocks"])
            lines.append(f"| {cfg.label} | {path['ns']:.2f} | {path['logic_ns']:.2f} + {path['routing_ns']:.2f} | "
                         f"`{path['source'].removeprefix('wrapper.')}` | {through} |")
    lines += _before_after(rows)
    lines += _boards()
    lines += ["", "## The 100 Gb/s goal", "",
              "W x Fmax of the best switch row of each width against 100 Gb/s; what limits each width is in",
              "`docs/synth.md` (\"What limits Fmax\", \"The 100 Gb/s goal\").", "",
              "| W | Fmax for 100 Gb/s (MHz) | best measured Fmax (MHz) | W x Fmax (Gb/s) | share of the goal"
              " | P = 2 switch without the exception path: LUT4 of 83,640 |",
              "|---:|---:|---:|---:|---:|---:|"]
    switches = [c for c in CONFIGS if c.width and c.ports]  # a block placed alone is no switch row
    for width in sorted({c.width for c in switches}):
        built = [rows[c.slug]["result"] for c in switches if c.width == width and c.slug in rows]
        best = max((r["fmax_mhz"] for r in built if r.get("placed", True)), default=None)
        measured = (f"{best:.1f} | {width * best / 1000:.1f} | {width * best / 1e5:.0%}" if best is not None
                    else "not placed: synthesis only (see its row) | | " if built else "not built yet | | ")
        two = [rows[c.slug]["result"] for c in CONFIGS
               if c.width == width and c.ports == 2 and "cuckoo" not in c.label and c.slug in rows]
        size = f"{two[0]['luts']:,} ({two[0]['luts'] / two[0]['luts_avail']:.0%})" if two else "not built yet"
        lines.append(f"| {width} | {1e5 / width:,.0f} | {measured} | {size} |")
    lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only the small configurations")
    ap.add_argument("--only", help="build only the configuration of this slug, or those whose label contains this text")
    ap.add_argument("--report", action="store_true", help="build nothing; rewrite the report from the kept rows")
    ap.add_argument("--synth-only", nargs="?", const="not placed (`--synth-only`)", metavar="WHY",
                    help="stop each build after nextpnr's packer: utilization without Fmax; WHY goes in the row")
    ap.add_argument("--router", choices=("router1", "router2"), default="router1",
                    help="nextpnr's router (default %(default)s); see docs/synth.md")
    ap.add_argument("--at", metavar="REV", help="build the committed tree of REV (e.g. HEAD), not the working tree, "
                                                "which others sharing the checkout may be editing")
    args = ap.parse_args(argv)
    command = shlex.join(["bench/synth.py", *(sys.argv[1:] if argv is None else argv)])
    if args.at and not os.environ.get(_AT):
        src, sha = _export(args.at)
        env = {**os.environ, "PYTHONPATH": str(src), _AT: sha}
        return subprocess.run([sys.executable, __file__, *(sys.argv[1:] if argv is None else argv)], env=env).returncode
    if os.environ.get(_AT):
        import inagg.hdl

        if not Path(inagg.hdl.__file__).resolve().is_relative_to(SRC.resolve()):
            raise RuntimeError(f"inagg.hdl comes from {inagg.hdl.__file__}, not from the export of {os.environ[_AT]}")
    configs = [] if args.report else QUICK if args.quick else CONFIGS + BOARD_CONFIGS
    if args.only:
        configs = [c for c in configs if args.only == c.slug or args.only in c.label]
    failures = {}
    for i, cfg in enumerate(configs):
        print(f"[{i + 1}/{len(configs)}] {cfg.label} ...", flush=True)
        try:
            r = build(cfg, command, args.synth_only, args.router)["result"]
        except Exception as e:  # noqa: BLE001 - a failed build is a row of the report, not a crash
            failures[cfg.slug] = f"{type(e).__name__}: {e}".splitlines()[0]
            print(f"    failed: {failures[cfg.slug]}", flush=True)
            continue
        fmax = f"{r['fmax_mhz']:.1f} MHz" if r["placed"] else "not placed"
        print(f"    {r['luts']} LUT4, {r['ffs']} FF, {r['ebr']} EBR, {fmax}", flush=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(report(failures))
    print(f"wrote {OUT}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
