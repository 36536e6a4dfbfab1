"""Build the switch's Verilog for Verilator once per parameter set and run cocotb test modules on it.

Each parameter set gets its own folder under ``sim_build/`` at the top of
the repository; the Verilog is rewritten only when it changes, so cocotb's
runner (``always=False``) reuses the Verilated model across test runs.
``WAVES=1`` in the environment builds with tracing (a build folder of its
own) and writes the waveform of each run, ``dump.vcd``, into that folder.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from . import toolchain

__all__ = ["ROOT", "TOPLEVEL", "waves_enabled", "build_switch", "run"]

ROOT = Path(__file__).resolve().parents[1]
TOPLEVEL = "inagg_switch"


def waves_enabled() -> bool:
    """True when ``WAVES=1`` asks for waveforms."""
    return os.environ.get("WAVES", "0") not in ("", "0")


def _build_dir(params: dict) -> Path:
    tag = "_".join(f"{k[0]}{v}" for k, v in sorted(params.items()))
    return ROOT / "sim_build" / f"switch_{tag}{'_waves' if waves_enabled() else ''}"


def build_switch(**params):
    """Verilate :class:`~inagg.hdl.switch.SwitchTop` with ``params``; return (runner, build folder)."""
    from cocotb_tools import runner as cocotb_runner

    from ..hdl.switch import generate_verilog

    toolchain.activate()
    build_dir = _build_dir(params)
    build_dir.mkdir(parents=True, exist_ok=True)
    source = build_dir / f"{TOPLEVEL}.v"
    text = generate_verilog(TOPLEVEL, **params)
    if not source.exists() or source.read_text() != text:
        source.write_text(text)
    # The machines this runs on are shared: one compiler process at a time.
    cocotb_runner.MAX_PARALLEL_BUILD_JOBS = 1
    runner = cocotb_runner.get_runner("verilator")
    # Amaranth's output trips Verilator's style warnings (see docs/rtl.md, "Lint"); none is an error.
    runner.build(sources=[source], hdl_toplevel=TOPLEVEL, build_dir=build_dir, always=False,
                 build_args=["-Wno-fatal", "-Wno-lint", "-Wno-style", "-O2"], waves=waves_enabled())
    return runner, build_dir


def run(runner, build_dir: Path, test_module: str, module_dir: Path, **env: str) -> None:
    """Run the cocotb tests of ``test_module`` (a module in ``module_dir``); raise if any failed.

    The simulation runs in the build folder, so its results and waveforms land there.
    """
    from cocotb_tools.check_results import get_results

    results = build_dir / f"results_{test_module}.xml"
    # The runner hands this process's sys.path to the simulator as PYTHONPATH.
    sys.path.insert(0, str(module_dir))
    try:
        runner.test(test_module=test_module, hdl_toplevel=TOPLEVEL, build_dir=build_dir, test_dir=build_dir,
                    results_xml=str(results), waves=waves_enabled(), extra_env=env)
    finally:
        sys.path.remove(str(module_dir))
    tests, failed = get_results(results)
    if tests == 0 or failed:
        raise AssertionError(f"{failed} of {tests} cocotb tests of {test_module} failed (see {results})")
