"""A small Vivado project for an UltraScale+ part: Verilog, a build script and a clock constraint.

It is not run here (no Vivado on this machine); users run it on theirs. The
core is synthesized out of context (``synth_design -mode out_of_context``),
the usual way to measure a core without a board: no I/O buffers are
inserted and only the clock needs a constraint. The default is 250 MHz, the
beat rate at which W = 512 carries 128 Gb/s.
"""

from __future__ import annotations

from pathlib import Path

from amaranth.back import verilog
from amaranth.lib import wiring

__all__ = ["write_project", "BUILD_TCL", "CONSTRAINTS_XDC"]

BUILD_TCL = """\
# Out-of-context implementation of {top} on {part}; reports go to reports/.
# Run: vivado -mode batch -source build.tcl
set_part {part}
read_verilog {top}.v
read_xdc -mode out_of_context constraints.xdc
synth_design -top {top} -mode out_of_context -flatten_hierarchy rebuilt
opt_design
place_design
phys_opt_design
route_design
file mkdir reports
report_utilization -hierarchical -file reports/utilization.txt
report_timing_summary -max_paths 20 -file reports/timing.txt
write_checkpoint -force {top}_routed.dcp
"""

CONSTRAINTS_XDC = """\
# {mhz} MHz beat clock{width_note}.
create_clock -period {period:.3f} -name clk [get_ports clk]
"""


def write_project(core: wiring.Component, out_dir: str | Path, *, width: int | None = None,
                  part: str = "xcu280-fsvh2892-2L-e", clock_mhz: float = 250.0, top: str = "inagg_top") -> list[Path]:
    """Write ``{top}.v``, ``build.tcl`` and ``constraints.xdc`` to ``out_dir`` and return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = [out / f"{top}.v", out / "build.tcl", out / "constraints.xdc"]
    files[0].write_text(verilog.convert(core, name=top, emit_src=False))
    files[1].write_text(BUILD_TCL.format(top=top, part=part))
    note = f": W = {width} bits at this clock is {width * clock_mhz / 1000:.0f} Gb/s" if width else ""
    files[2].write_text(CONSTRAINTS_XDC.format(mhz=f"{clock_mhz:g}", period=1000.0 / clock_mhz, width_note=note))
    return files
