"""Build the switch's Verilog for Verilator once per parameter set and run cocotb test modules on it.

Each parameter set gets its own folder under ``sim_build/`` at the top of
the repository; the Verilog is rewritten only when it changes, so cocotb's
runner (``always=False``) reuses the Verilated model across test runs. A
lock file in the folder keeps processes (pytest-xdist workers) that want the
same build from compiling it at once.
``WAVES=1`` in the environment builds with tracing (a build folder of its
own) and writes the waveform of each run, ``dump.vcd``, into that folder.
"""

from __future__ import annotations

import fcntl
import os
import re
import sys
from pathlib import Path

from inagg.testbench import toolchain

__all__ = ["ROOT", "TOPLEVEL", "waves_enabled", "build_switch", "run"]

ROOT = Path(__file__).resolve().parents[1]
TOPLEVEL = "inagg_switch"


def waves_enabled() -> bool:
    """True when ``WAVES=1`` asks for waveforms."""
    return os.environ.get("WAVES", "0") not in ("", "0")


def _build_dir(params: dict) -> Path:
    tag = "_".join(f"{k[0]}{v}" for k, v in sorted(params.items()))
    return ROOT / "sim_build" / f"switch_{tag}{'_waves' if waves_enabled() else ''}"


_PORT = re.compile(r"^\s*(input|output)\s+(?:\[[^\]]*\]\s*)?(\w+);", re.M)
# The exception engine's instances, whose state testbench.collisions.engine_state reads.
_ENGINE = ("core.divert.engine", "core.divert.engine.core")


def _control_file(verilog: str, internals: tuple[str, ...]) -> str:
    """The Verilator control file that makes public what a testbench reaches through VPI, and nothing more.

    The top's inputs are writable, its outputs readable; each of ``internals`` (an instance path below
    the top) has every signal readable.
    """
    top = verilog[verilog.index(f"module {TOPLEVEL}("):]
    top = top[:top.index("endmodule")]
    rules = [("public_flat_rw" if d == "input" else "public_flat_rd", TOPLEVEL, name) for d, name in _PORT.findall(top)]
    rules += [("public_flat_rd", f"{TOPLEVEL}.{path}", "*") for path in internals]
    return "`verilator_config\n" + "".join(f'{rule} -module "{module}" -var "{var}"\n' for rule, module, var in rules)


def build_switch(**params):
    """Verilate :class:`~inagg.hdl.switch.SwitchTop` with ``params``; return (runner, build folder).

    The testbench reaches the top's ports and, in a build with an exception path, the signals of
    the exception engine; nothing else is visible through VPI.
    """
    from cocotb_tools import runner as cocotb_runner

    from inagg.hdl.switch import generate_verilog

    toolchain.activate()
    build_dir = _build_dir(params)
    build_dir.mkdir(parents=True, exist_ok=True)
    text = generate_verilog(TOPLEVEL, **params)
    files = {f"{TOPLEVEL}.v": text, f"{TOPLEVEL}.vlt": _control_file(text, _ENGINE if params.get("exc_table") else ())}
    # The machines this runs on are shared: one compiler process at a time.
    cocotb_runner.MAX_PARALLEL_BUILD_JOBS = 1
    runner = cocotb_runner.get_runner("verilator")
    # Amaranth's output trips Verilator's style warnings (see docs/rtl.md, "Lint"); none is an error.
    # cocotb's runner would make every signal public (--public-flat-rw), which keeps Verilator from
    # optimizing the logic between them: the control file names what the testbench reaches instead.
    args = ["-Wno-fatal", "-Wno-lint", "-Wno-style", "-O2", "--no-public-flat-rw"]
    with open(build_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name, content in files.items():
            if not (build_dir / name).exists() or (build_dir / name).read_text() != content:
                (build_dir / name).write_text(content)
        runner.build(sources=[build_dir / name for name in files], hdl_toplevel=TOPLEVEL, build_dir=build_dir,
                     always=False, build_args=args, waves=waves_enabled())
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
        runner.test(test_module=test_module, hdl_toplevel=TOPLEVEL, hdl_toplevel_lang="verilog", build_dir=build_dir,
                    test_dir=build_dir,
                    results_xml=str(results), waves=waves_enabled(), extra_env=env)
    finally:
        sys.path.remove(str(module_dir))
    tests, failed = get_results(results)
    if tests == 0 or failed:
        raise AssertionError(f"{failed} of {tests} cocotb tests of {test_module} failed (see {results})")
