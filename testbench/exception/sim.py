"""Build the exception engine as Verilog, Verilate it once, and run its cocotb testbench.

The testbench (:mod:`.engine_tb`) rebuilds the same engine's Python object
from ``EXC_TABLE``, ``EXC_KICKS``, ``EXC_STASH`` and ``EXC_DEPTH`` (for its
layouts) and takes its stimulus from ``EXC_REQUESTS``, ``EXC_SEED``,
``EXC_JOBS`` and ``EXC_SLOTS``.
"""

from __future__ import annotations

from pathlib import Path

from amaranth.back import verilog

from inagg import hdl
from inagg.hdl.exception import ExceptionEngine
from inagg.testbench import toolchain

__all__ = ["TOPLEVEL", "Build", "engine_from_env"]

TOPLEVEL = "exception_engine"
LINT_WAIVERS = Path(hdl.__file__).parent / "lint.vlt"


def engine_from_env(env) -> ExceptionEngine:
    """The engine a build was made of, from its ``EXC_*`` settings."""
    return ExceptionEngine(int(env["EXC_TABLE"]), int(env["EXC_KICKS"]), int(env["EXC_STASH"]),
                           depth=int(env["EXC_DEPTH"]))


class Build:
    """One Verilated engine in ``build_dir``, ready to run the testbench against."""

    def __init__(self, engine: ExceptionEngine, build_dir: Path):
        from cocotb_tools.runner import get_runner

        toolchain.activate()
        self.engine, self.build_dir = engine, Path(build_dir)
        self.build_dir.mkdir(parents=True, exist_ok=True)
        source = self.build_dir / f"{TOPLEVEL}.v"
        source.write_text(verilog.convert(engine, name=TOPLEVEL, emit_src=False))
        self._runner = get_runner("verilator")
        # The project's waivers for habits of Amaranth's Verilog writer (each explained there).
        self._runner.build(sources=[source], hdl_toplevel=TOPLEVEL, build_dir=self.build_dir,
                           build_args=[str(LINT_WAIVERS)])

    def test(self, requests: int, seed: int, jobs: int, slots: int) -> None:
        """Run the testbench: ``requests`` random requests seeded with ``seed`` on the keys of ``jobs``
        jobs of ``slots`` slots each, and a fifth as many back to back; raise if a test fails."""
        e = self.engine
        env = {"EXC_TABLE": e.table, "EXC_KICKS": e.max_kicks, "EXC_STASH": e.stash, "EXC_DEPTH": e.depth,
               "EXC_REQUESTS": requests, "EXC_SEED": seed, "EXC_JOBS": jobs, "EXC_SLOTS": slots}
        self._runner.test(test_module="inagg.testbench.exception.engine_tb", hdl_toplevel=TOPLEVEL,
                                    build_dir=self.build_dir, extra_env={k: str(v) for k, v in env.items()})
