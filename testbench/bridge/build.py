"""Verilate :class:`~inagg.testbench.bridge.harness.BridgeHarness` once per parameter set; run cocotb modules on it.

Each parameter set (and the choice of waveforms) gets its own folder
``sim_build/bridge_<params>[_fst|_vcd]`` at the top of the repository. The
Verilog is rewritten only when it changes, so cocotb's runner
(``always=False``) reuses the Verilated model across runs and processes.
"""

from __future__ import annotations

import functools
import os
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from inagg.models.job import SwitchSpec
from inagg.testbench import toolchain

__all__ = ["HarnessParams", "TOPLEVEL", "WAVE_FORMATS", "build_dir", "wave_format", "check_fst", "build", "run"]

TOPLEVEL = "inagg_bridge"
_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class HarnessParams:
    """The parameters of one harness build (those of :class:`~inagg.testbench.bridge.harness.BridgeHarness`)."""

    ports: int
    width: int
    slots: int
    chunk_bytes: int
    jobs: int
    workers: int
    depth: int = 8
    order_depth: int = 256

    @classmethod
    def for_switch(cls, spec: SwitchSpec, *, width: int, jobs: int, workers: int, **kw) -> "HarnessParams":
        """The harness of a switch described by ``spec``, built for job numbers below ``jobs``."""
        return cls(ports=spec.ports, width=width, slots=spec.slots, chunk_bytes=spec.chunk_bytes, jobs=jobs,
                   workers=workers, **kw)

    def tag(self) -> str:
        return "_".join(f"{k}{v}" for k, v in asdict(self).items())


WAVE_FORMATS = ("fst", "vcd")


def build_dir(params: HarnessParams, waves: str | None = None) -> Path:
    """Where the build of ``params`` lives (``waves``: the waveform format it writes, or None)."""
    return _ROOT / "sim_build" / f"bridge_{params.tag()}{f'_{waves}' if waves else ''}"


def wave_format(path: str | os.PathLike) -> str:
    """The waveform format a file name asks for: ``fst`` or ``vcd``; ValueError for any other suffix."""
    fmt = Path(path).suffix.lstrip(".").lower()
    if fmt not in WAVE_FORMATS:
        raise ValueError(f"a waveform file ends in .fst or .vcd, not {Path(path).name!r}")
    return fmt


def check_fst() -> None:
    """Raise :class:`~inagg.testbench.toolchain.MissingTool` when the lz4 headers are missing.

    Verilator's FST writer compiles against them, and no wheel ships them.
    """
    probe = subprocess.run(["g++", "-E", "-x", "c++", "-"], input="#include <lz4.h>\n", capture_output=True, text=True)
    if probe.returncode:
        raise toolchain.MissingTool("FST waveforms need the lz4 headers (Debian/Ubuntu: apt-get install liblz4-dev); "
                                    "VCD needs nothing more: name the file .vcd")


@functools.cache
def _sources(params: HarnessParams) -> dict[str, str]:
    """The harness's Verilog and Verilator control file (generated once per process: it takes seconds)."""
    from amaranth.back import verilog
    from amaranth.lib.wiring import In

    from inagg.testbench.bridge.harness import BridgeHarness

    harness = BridgeHarness(**asdict(params))
    g = harness.geometry
    # What the testbench reaches through VPI: the harness's ports and rings, nothing inside the switch. Only
    # what it writes is writable: Verilator evaluates the logic that reads a writable signal again at every
    # eval call, as it does for an input.
    members = harness.signature.members
    writes = [*(name for name, m in members.items() if m.flow == In), *g.ring_names[:g.ports]]
    reads = [*(name for name, m in members.items() if m.flow != In), *g.ring_names[g.ports:]]
    rules = [("public_flat_rw", name) for name in writes] + [("public_flat_rd", name) for name in reads]
    return {f"{TOPLEVEL}.v": verilog.convert(harness, name=TOPLEVEL, emit_src=False),
            f"{TOPLEVEL}.vlt": "`verilator_config\n" + "".join(f'{rule} -module "{TOPLEVEL}" -var "{name}"\n'
                                                                for rule, name in rules)}


def build(params: HarnessParams, *, waves: str | None = None):
    """Verilate the harness of ``params`` (tracing in format ``waves``, "fst" or "vcd"); return (runner, build folder)."""
    from cocotb_tools import runner as cocotb_runner

    toolchain.activate()
    if waves == "fst":
        check_fst()
    folder = build_dir(params, waves)
    folder.mkdir(parents=True, exist_ok=True)
    files = _sources(params)
    for name, text in files.items():
        if not (folder / name).exists() or (folder / name).read_text() != text:
            (folder / name).write_text(text)
    # The machines this runs on are shared: one compiler process at a time.
    cocotb_runner.MAX_PARALLEL_BUILD_JOBS = 1
    runner = cocotb_runner.get_runner("verilator")
    # Amaranth's output trips Verilator's style warnings; none is an error. cocotb's runner makes every
    # signal public, which sends all combinational logic through the input region of every evaluation
    # (each clock edge) and costs most of the run time; the harness's ports and rings are enough.
    # The model's C++ is compiled with -O3 rather than Verilator's default -Os (-O2: 1.45x the cycles per
    # second, -O3 with X values resolved at build time another 10%). -rdynamic exports the VPI's array
    # functions from the executable, which cocotb's library does not use, for vpi.RowMemory.
    args = (["-Wno-fatal", "-Wno-lint", "-Wno-style", "-O3", "--x-assign", "fast", "--x-initial", "fast",
             "--no-public-flat-rw", "-CFLAGS", "-O3", "-LDFLAGS", "-rdynamic"]
            + (["--trace-fst"] if waves == "fst" else []))
    runner.build(sources=[folder / name for name in files], hdl_toplevel=TOPLEVEL, build_dir=folder, always=False,
                 build_args=args, waves=waves is not None)
    return runner, folder


def run(runner, folder: Path, test_module: str, *, waves_file: str | os.PathLike | None = None,
        env: dict[str, str] | None = None) -> None:
    """Run the cocotb tests of ``test_module`` (an importable module); raise if any failed.

    ``waves_file`` names the waveform file of the run (the build must trace in its format).
    """
    from cocotb_tools.check_results import get_results

    results = folder / f"results_{test_module.rsplit('.', 1)[-1]}_{os.getpid()}.xml"
    args = ["--trace-file", str(Path(waves_file).resolve())] if waves_file is not None else []
    runner.test(test_module=test_module, hdl_toplevel=TOPLEVEL, hdl_toplevel_lang="verilog", build_dir=folder, test_dir=folder,
                results_xml=str(results), waves=waves_file is not None, test_args=args, extra_env=env or {})
    tests, failed = get_results(results)
    results.unlink()
    if tests == 0 or failed:
        raise AssertionError(f"{failed} of {tests} cocotb tests of {test_module} failed")
